"""Kernels and mixed passes measured on one GPU, against the kernel tables and the roofline.

``scripts/gpu_kernels.py`` times, on a GPU, (1) GEMMs and causal prefill attention at
cells of the shipped AIConfigurator table for that part (``tables.py``), and (2) one
decoder layer's pass over ``b`` decoding sequences together with a chunk of ``c`` prompt
tokens whose first ``past`` tokens are cached — the pass of chunked prefill. This module
sets

* each GEMM and attention cell against the table's own cell (table ÷ measured; decode
  attention at the faster of PyTorch's one-pass kernel and split-context
  flash-decoding, the best this card was seen to do), and
* each layer pass against the per-layer kernel time both predictors give for it: the
  tables' GEMMs over b + c tokens plus decode and prefill attention (``tables.pass_parts``,
  without the LM head and the all-reduce, before the kernel scale), and the roofline's
  kernels-only pass (``steps.kernels_only``) divided by the layers — which still counts
  the embedding and LM head among the bytes and FLOPs it shares out;
* each mixed pass's *additivity*: t(b, c) ÷ (t(b, 0) + t(0, c)) measured, against the
  same ratio from each predictor. This is what the composition of a mixed pass (one GEMM
  over all the pass's tokens, the two attentions added) is checked by, independently of
  each predictor's absolute level.

Nothing is fitted here; no CLI or transport code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.errors import KoiError
from koi.predictor import tables
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import IN
from koi.predictor.features import build_inputs
from koi.predictor.reference import pass_time
from koi.predictor.steps import Spread, kernels_only, load_measured, step_config
from koi.predictor.types import Workload

KERNELS_FILE = Path(__file__).parent / "data" / "gpu_kernels_h200.json"
GEMM_BANDS = ((1, 16), (32, 256), (512, 2048), (4096, 1 << 30))
ATTN_BANDS = ((1, 1024), (2048, 4096), (8192, 1 << 30))
DECODE_BANDS = ((1, 4), (16, 64), (256, 1 << 30))
DECODE_KIND = "decode attention bfloat16"
MIXED_GROUPS = ("decode only", "chunk only", "decode + chunk")
PARTS = ("gemm", "ctx_attn", "gen_attn", "mixed")   # what scripts/gpu_kernels.py writes


class KernelsFileError(KoiError, ValueError):
    """A kernel-time file that is missing or not in the format scripts/gpu_kernels.py
    writes."""


@dataclass(frozen=True)
class CellRow:
    """One GEMM or prefill-attention cell: measured (median over runs) against the table."""

    kind: str          # "gemm bfloat16" | "gemm fp8" | "prefill attention bfloat16" |
    #                    DECODE_KIND (the faster of one pass and split context, per run)
    shape: str
    size: int          # m (GEMM), prompt tokens (prefill), sequences (decode): the bands
    runs: int
    run_spread: float  # (max − min) / median over the runs
    measured_s: float
    table_s: float

    @property
    def ratio(self) -> float:
        return self.table_s / self.measured_s


@dataclass(frozen=True)
class MixedRow:
    """One decoder layer's pass over ``batch`` decodes and a ``chunk`` of a prompt."""

    model: str
    tp: int
    batch: int
    ctx: int
    chunk: int
    past: int
    runs: int
    run_spread: float
    measured_s: float
    tables_s: float      # per layer, kernels only, before the kernel scale
    roofline_s: float    # per layer, kernels only
    # t(b, c) / (t(b, 0) + t(0, c)): measured, tables, roofline; None for a pure pass
    additivity: tuple[float, float, float] | None

    @property
    def group(self) -> str:
        return MIXED_GROUPS[0] if not self.chunk else \
            MIXED_GROUPS[1] if not self.batch else MIXED_GROUPS[2]


@dataclass(frozen=True)
class KernelsComparison:
    path: Path
    accelerator: str
    system: str
    envs: list[dict[str, Any]]
    cells: list[CellRow]
    mixed: list[MixedRow]
    off_grid: int    # measured cells the table has no value for

    def cell_bands(self) -> list[tuple[str, str, Spread | None]]:
        """(kind, band, spread of table ÷ measured) for every kind and size band."""
        out = []
        for kind in sorted({c.kind for c in self.cells}):
            bands, unit = (ATTN_BANDS, "tokens") if kind.startswith("prefill") else \
                (DECODE_BANDS, "sequences") if kind == DECODE_KIND else (GEMM_BANDS, "m")
            for lo, hi in bands:
                label = f"{unit} {lo}–{hi}" if hi < 1 << 30 else f"{unit} ≥ {lo}"
                out.append((kind, label, Spread.of([c.ratio for c in self.cells
                                                    if c.kind == kind and lo <= c.size <= hi])))
            out.append((kind, "all", Spread.of([c.ratio for c in self.cells if c.kind == kind])))
        return out

    def mixed_ratios(self) -> list[tuple[str, Spread | None, Spread | None]]:
        """(group, tables ÷ measured, roofline ÷ measured) per layer, by MIXED_GROUPS."""
        return [(g, Spread.of([r.tables_s / r.measured_s for r in self.mixed if r.group == g]),
                 Spread.of([r.roofline_s / r.measured_s for r in self.mixed if r.group == g]))
                for g in MIXED_GROUPS]

    def additivity_errors(self) -> tuple[Spread | None, Spread | None, Spread | None]:
        """Measured additivity, and |predicted − measured| additivity for tables, roofline."""
        adds = [r.additivity for r in self.mixed if r.additivity is not None]
        return (Spread.of([a[0] for a in adds]), Spread.of([abs(a[1] - a[0]) for a in adds]),
                Spread.of([abs(a[2] - a[0]) for a in adds]))

    def run_spread(self) -> Spread | None:
        spreads = [r.run_spread for r in self.cells if r.runs > 1]
        return Spread.of(spreads + [r.run_spread for r in self.mixed if r.runs > 1])


def read_kernels(path: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs' environments and the runs themselves ({gemm, ctx_attn, mixed} lists).

    Accepts one run as ``scripts/gpu_kernels.py`` writes it or several gathered as
    ``{about, runs: [run, …]}``."""
    target = path or KERNELS_FILE
    data = load_measured(target, KernelsFileError, "scripts/gpu_kernels.py")
    if not isinstance(data, dict):
        raise KernelsFileError(f"{target}: expected an object")
    runs = data.get("runs", [data])
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise KernelsFileError(f"{target}: expected a run as scripts/gpu_kernels.py writes "
                               "it, or {runs: [run, …]}")
    if not any(isinstance(r.get(p), list) and r[p] for r in runs for p in PARTS):
        raise KernelsFileError(f"{target}: no {', '.join(PARTS)} points in any run")
    envs = [r["env"] if isinstance(r.get("env"), dict) else {} for r in runs]
    return envs, runs


def _points(runs: list[dict], part: str, fields: tuple[str, ...], value: str, target: Path
            ) -> dict[tuple, list[float]]:
    """Every point of one part, keyed by ``fields``, with its value from each run (points
    a run failed to measure, ``value`` None, are left out)."""
    out: dict[tuple, list[float]] = {}
    for i, run in enumerate(runs):
        rows = run.get(part) or []
        if not isinstance(rows, list):
            raise KernelsFileError(f"{target}: run {i}: {part} is not a list")
        for k, row in enumerate(rows):
            where = f"{target}: run {i} {part} row {k}"
            if not isinstance(row, dict) or any(f not in row for f in (*fields, value)):
                raise KernelsFileError(f"{where}: needs {', '.join((*fields, value))}")
            t = row[value]
            if t is None:
                continue
            if not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
                raise KernelsFileError(f"{where}: {value} must be a positive number of "
                                       f"seconds (got {t!r})")
            key = tuple(row[f] for f in fields)
            if not all(isinstance(x, str) or (isinstance(x, int) and x >= 0) for x in key):
                raise KernelsFileError(f"{where}: {', '.join(fields)} must be names or "
                                       "non-negative integers")
            out.setdefault(key, []).append(float(t))
    return out


def _median_spread(values: list[float]) -> tuple[float, float]:
    median = float(np.median(values))
    return median, (max(values) - min(values)) / median


def _index(axis: np.ndarray, value: int) -> int | None:
    hits = np.nonzero(axis == value)[0]
    return int(hits[0]) if len(hits) else None


def _cells(runs: list[dict], arrays: dict[str, np.ndarray], target: Path
           ) -> tuple[list[CellRow], int]:
    rows, off = [], 0
    dtypes = [str(d) for d in arrays["gemm_dtypes"]]
    for (dtype, m, n, k), ts in sorted(_points(runs, "gemm", ("dtype", "m", "n", "k"), "s",
                                               target).items()):
        at = [_index(arrays[f"gemm_{a}"], v) for a, v in (("m", m), ("n", n), ("k", k))]
        cell = float(arrays["gemm"][dtypes.index(dtype), at[0], at[1], at[2]]) \
            if dtype in dtypes and None not in at else math.nan
        if not math.isfinite(cell):
            off += 1
            continue
        t, spread = _median_spread(ts)
        rows.append(CellRow(f"gemm {dtype}", f"m={m} n={n} k={k}", m, len(ts), spread, t,
                            cell * tables.MS))
    fields = ("heads", "kv_heads", "head_dim", "batch", "len")
    bf16 = 0   # the kv-dtype axis: bf16 first (extract_kernel_tables.KV_DTYPES)
    # (part, table prefix, kind, shape label, which of batch / length the bands group by)
    attention = (("ctx_attn", "ctx", "prefill attention bfloat16", "batch {b} × {n}", 1),
                 ("gen_attn", "gen", DECODE_KIND, "{b} × {n} cached", 0))
    for part, prefix, kind, label, by_length in attention:
        for (h, kvh, hd, b, n), ts in sorted(_points(runs, part, fields, "s", target).items()):
            at = [_index(arrays[f"{prefix}_{a}"], v) for a, v in (
                ("head_dim", hd), ("heads", h), ("kv_heads", kvh), ("batch", b), ("len", n))]
            cell = float(arrays[part][(bf16, *at)]) if None not in at else math.nan
            if not math.isfinite(cell):
                off += 1
                continue
            t, spread = _median_spread(ts)
            rows.append(CellRow(kind, f"heads {h}/{kvh} d={hd} " + label.format(b=b, n=n),
                                n if by_length else b, len(ts), spread, t, cell * tables.MS))
    return rows, off


def _mixed(runs: list[dict], accelerator: str, cat: Catalog, cal: Calibration, target: Path
           ) -> list[MixedRow]:
    fields = ("model", "tp", "batch", "ctx", "chunk", "past")
    points = sorted(_points(runs, "mixed", fields, "layer_s", target).items())
    if not points:
        return []
    try:
        pairs = [(step_config(k[0], k[1], accelerator, cat),
                  Workload(input_len=max(k[3], 1), output_len=1)) for k, _ in points]
    except KoiError as e:
        raise KernelsFileError(f"{target}: {e}") from None
    b = np.array([k[2] for k, _ in points], dtype=float)
    ctx_dec = np.array([k[3] + 1 for k, _ in points], dtype=float)   # the new token's slot
    p = np.array([k[4] for k, _ in points], dtype=float)
    past = np.array([k[5] for k, _ in points], dtype=float)
    ctx_pre = past + 0.5 * p    # the chunk's causal average context
    per_layer = {}
    for use_tables in (True, False):
        X = kernels_only(build_inputs(pairs, cat, cal, kernels=use_tables))
        layers = X[IN["layers_gpu"]]
        if use_tables:
            k = X[IN["ktab"]].astype(np.int64)
            if (k < 0).any():
                raise KernelsFileError(f"{target}: no kernel tables for a measured shard on "
                                       f"{accelerator}")
            parts = tables.pass_parts(tables.REGISTRY.curves(), k, b, p, ctx_dec, 2.0 * ctx_pre,
                                      np.zeros(len(points)))
            kern = parts["gemm"] + parts["decode_attention"] + parts["prefill_attention"]
            per_layer[True] = kern / layers
        else:
            per_layer[False] = pass_time(X, b, p, ctx_dec, ctx_pre)[0] / layers
    measured = {key: _median_spread(ts) for key, ts in points}
    at = {key: j for j, (key, _) in enumerate(points)}
    rows = []
    for j, (key, ts) in enumerate(points):
        model, tp, batch, ctx, chunk, past_ = key
        dec, pre = (model, tp, batch, ctx, 0, 0), (model, tp, 0, ctx, chunk, past_)
        additivity = None
        if batch and chunk and dec in at and pre in at:
            times = (np.array([measured[k][0] for k, _ in points]), per_layer[True],
                     per_layer[False])
            i, d, c = j, at[dec], at[pre]
            m, t, r = (float(x[i] / (x[d] + x[c])) for x in times)
            additivity = (m, t, r)
        rows.append(MixedRow(model, tp, batch, ctx, chunk, past_, len(ts), measured[key][1],
                             measured[key][0], float(per_layer[True][j]),
                             float(per_layer[False][j]), additivity))
    return rows


def compare_kernels(path: Path | None = None, accelerator: str = "h200",
                    catalog: Catalog | None = None,
                    calibration: Calibration | None = None) -> KernelsComparison:
    """Every measured cell against the tables, every layer pass against both predictors."""
    target = path or KERNELS_FILE
    envs, runs = read_kernels(target)
    system = tables.SYSTEM_OF.get(accelerator)
    shipped = tables.load_system(system) if system else None
    if shipped is None:
        raise KernelsFileError(f"no kernel tables ship for {accelerator!r} (tables exist for "
                               f"{', '.join(sorted(tables.SYSTEM_OF))})")
    cells, off = _cells(runs, shipped.arrays, target)
    mixed = _mixed(runs, accelerator, catalog or load_catalog(),
                   calibration or load_calibration(), target)
    return KernelsComparison(target, accelerator, shipped.label, envs, cells, mixed, off)
