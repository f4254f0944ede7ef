"""Where a held-out prediction's pass time goes: kernel parts against the roofline.

For each chosen case (by default the TPOT rows), both predictors are fitted without the
case's source (as ``compare.compare_held_out`` does) and the decode pass at the batch
each predicts is split into its parts: for the kernel tables GEMM, all-reduce, LM head,
decode and prefill attention (``tables.PARTS``, times the kernel scale) plus the
engine's overhead; for the roofline memory, compute and collectives. This says which
part of a step a row's error can come from; it fits nothing of its own.

Pure computation plus a markdown rendering for ``koi bench accuracy --compare --parts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.predictor import tables
from koi.predictor.accuracy import METRIC_OUT
from koi.predictor.calibration import Calibration
from koi.predictor.columns import IN, OUT
from koi.predictor.features import build_inputs
from koi.predictor.measurements import Case, load_cases
from koi.predictor.reference import pass_time, predict_reference

MS = 1e3


@dataclass(frozen=True)
class PassSplit:
    """One predictor's held-out view of one case: its prediction, the batch it runs at
    and that batch's decode pass split into parts (seconds)."""

    predicted: float
    batch: float
    decode_pass: float
    overhead: float
    parts: dict[str, float]   # kernel-table parts (scaled), or roofline mem/comp/comm


@dataclass(frozen=True)
class Breakdown:
    case: Case
    roofline: PassSplit
    kernels: PassSplit
    pass_model: str


def _split(case: Case, cat: Catalog, cal: Calibration, kernels: bool) -> PassSplit:
    X = build_inputs([(case.config, case.workload)], cat, cal, kernels=kernels)
    Y = predict_reference(X)
    name, scale = METRIC_OUT[case.metric]
    b = np.array([max(float(Y[OUT["batch"], 0]), 1.0)])
    I, O = float(case.workload.input_len), float(max(case.workload.output_len, 1))
    zero, ctx, pre = np.zeros(1), np.array([I + 0.5 * O]), np.array([0.5 * I])
    total, t_mem, t_comp, t_comm = pass_time(X, b, zero, ctx, pre)
    overhead = float(X[IN["ovh_base"], 0] + X[IN["ovh_seq"], 0] * b[0])
    k = int(X[IN["ktab"], 0])
    if k >= 0:
        raw = tables.pass_parts(tables.REGISTRY.curves(), np.array([k]), b, zero, ctx,
                                2.0 * pre, t_comm / X[IN["kscale"], 0])
        parts = {n: float(v[0]) * float(X[IN["kscale"], 0]) for n, v in raw.items()}
    else:
        parts = {"memory": float(t_mem[0]), "compute": float(t_comp[0]),
                 "collectives": float(t_comm[0])}
    return PassSplit(float(Y[OUT[name], 0]) * scale, float(b[0]), float(total[0]), overhead,
                     parts)


def held_out_breakdown(kinds: Sequence[str] = ("tpot",), rows: Sequence[int] | None = None,
                       cases: Sequence[Case] | None = None,
                       catalog: Catalog | None = None) -> list[Breakdown]:
    """Every case of these kinds (or these ``rows``), split as each predictor fitted on
    all ``cases`` but those of its source."""
    from koi.predictor.fit import fit

    cat = catalog or load_catalog()
    every = list(cases) if cases is not None else load_cases(catalog=cat)
    shown = [c for c in every if (c.row in rows if rows is not None else c.kind in kinds)]
    out = []
    for source in sorted({c.source for c in shown}):
        train = [c for c in every if c.source != source]
        roof, kern = fit(train, cat, kernels=False), fit(train, cat, kernels=True)
        for c in shown:
            if c.source != source:
                continue
            X = build_inputs([(c.config, c.workload)], cat, kern, kernels=True)
            out.append(Breakdown(c, _split(c, cat, roof, False), _split(c, cat, kern, True),
                                 tables.REGISTRY.label(int(X[IN["ktab"], 0]))))
    return out


def _err(s: PassSplit, value: float) -> str:
    return f"{s.predicted:,.1f} ({100 * (s.predicted / value - 1):+.0f}%)"


def markdown(results: Sequence[Breakdown]) -> str:
    out = ["Held-out decode pass at the predicted batch, by part (ms; kernel parts include "
           "the kernel scale):", "",
           "| row | case | measured | roofline | tables | batch (roof / tables) | "
           "roofline pass: mem / comp / comm + ovh | tables pass: "
           + " / ".join(tables.PARTS) + " + ovh |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        roof, kern = r.roofline, r.kernels
        roof_parts = " / ".join(f"{MS * v:.2f}" for v in roof.parts.values())
        kern_parts = " / ".join(f"{MS * v:.2f}" for v in kern.parts.values())
        out.append(f"| {r.case.row} | {r.case.label} | {r.case.value:,.1f} | "
                   f"{_err(roof, r.case.value)} | {_err(kern, r.case.value)} | "
                   f"{roof.batch:.0f} / {kern.batch:.0f} | {roof_parts} + "
                   f"{MS * roof.overhead:.2f} = {MS * roof.decode_pass:.2f} | {kern_parts} + "
                   f"{MS * kern.overhead:.2f} = {MS * kern.decode_pass:.2f} |")
    return "\n".join(out)
