"""Held-out accuracy with and without the measured kernel tables, side by side.

Both predictors are scored on the same public rows by leave-one-source-out
cross-validation (``fit.cross_validate``: each source's rows are predicted by a table
fitted without them), so every median here is on rows not used for that prediction's
calibration. Groups: source, accelerator, engine, metric kind, and which pass model the
tables predictor used; then the rows where the two predictors disagree most.

Pure computation plus a plain-text (markdown) rendering for ``koi bench accuracy
--compare`` and docs/PREDICTOR.md; no CLI or transport code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.predictor import tables
from koi.predictor.calibration import prior_calibration
from koi.predictor.columns import IN
from koi.predictor.features import build_inputs
from koi.predictor.measurements import Case, load_cases

KINDS = ("throughput", "tpot", "ttft")


@dataclass(frozen=True)
class Compared:
    case: Case
    roofline: float   # held-out prediction, roofline everywhere
    kernels: float    # held-out prediction, kernel tables where they cover the config
    pass_model: str   # what the kernel-table predictor used for this row

    @property
    def ape_roofline(self) -> float:
        return abs(self.roofline - self.case.value) / self.case.value

    @property
    def ape_kernels(self) -> float:
        return abs(self.kernels - self.case.value) / self.case.value

    @property
    def disagreement(self) -> float:
        """|log(kernels / roofline)|: how far apart the two predictions are."""
        return abs(float(np.log(max(self.kernels, 1e-12) / max(self.roofline, 1e-12))))


def compare_held_out(cases: Sequence[Case] | None = None,
                     catalog: Catalog | None = None) -> list[Compared]:
    """Every case predicted held out by both predictors (two cross-validations)."""
    from koi.predictor.fit import cross_validate

    cat = catalog or load_catalog()
    rows = list(cases) if cases is not None else load_cases(catalog=cat)
    roof = {c.row: p for c, p in cross_validate(rows, cat, kernels=False)}
    kern = {c.row: p for c, p in cross_validate(rows, cat, kernels=True)}
    X = build_inputs([(c.config, c.workload) for c in rows], cat, prior_calibration(),
                     kernels=True)
    return [Compared(c, roof[c.row], kern[c.row],
                     tables.REGISTRY.label(int(X[IN["ktab"], j])))
            for j, c in enumerate(rows)]


GROUPINGS: dict[str, Callable[[Compared], str]] = {
    "source": lambda r: r.case.source,
    "accelerator": lambda r: r.case.config.accelerator,
    "engine": lambda r: r.case.config.engine,
    "pass model (tables predictor)": lambda r: r.pass_model,
}


def medians(results: Sequence[Compared], key: Callable[[Compared], str]
            ) -> dict[tuple[str, str], tuple[int, float, float]]:
    """(group, metric kind) → (n, median APE roofline, median APE kernel tables)."""
    groups: dict[tuple[str, str], list[Compared]] = defaultdict(list)
    for r in results:
        groups[(key(r), r.case.kind)].append(r)
    return {k: (len(v), float(np.median([r.ape_roofline for r in v])),
                float(np.median([r.ape_kernels for r in v]))) for k, v in sorted(groups.items())}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(results: Sequence[Compared], worst: int = 12) -> str:
    """The comparison as markdown tables: by metric, by each grouping, then the rows
    where the two predictors disagree most."""
    out = ["Held-out median APE (leave-one-source-out), roofline → kernel tables (n):", "",
           "| metric | n | roofline | kernel tables |", "|---|---|---|---|"]
    for (_, kind), (n, a, b) in medians(results, lambda r: "all").items():
        out.append(f"| {kind} | {n} | {_pct(a)} | {_pct(b)} |")
    for name, key in GROUPINGS.items():
        table = medians(results, key)
        out += ["", f"| {name} | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
        for group in sorted({g for g, _ in table}):
            cells = []
            for kind in KINDS:
                if (group, kind) in table:
                    n, a, b = table[(group, kind)]
                    cells.append(f"{_pct(a)} → {_pct(b)} ({n})")
                else:
                    cells.append("–")
            out.append(f"| {group} | " + " | ".join(cells) + " |")
    out += ["", f"Rows where the two disagree most (top {worst}, held out):", "",
            "| row | case | measured | roofline | kernel tables | pass model |",
            "|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: -r.disagreement)[:worst]:
        out.append(f"| {r.case.row} | {r.case.label} | {r.case.value:,.1f} | "
                   f"{r.roofline:,.1f} ({100 * (r.roofline / r.case.value - 1):+.0f}%) | "
                   f"{r.kernels:,.1f} ({100 * (r.kernels / r.case.value - 1):+.0f}%) | "
                   f"{r.pass_model} |")
    return "\n".join(out)
