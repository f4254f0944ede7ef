"""Raw forward-pass step times measured on one GPU, against the predictor's roofline.

``scripts/gpu_steps.py`` times model-shaped layers (random bf16 weights, CUDA graphs) on a
GPU: decode passes of ``b`` sequences at ``ctx`` cached tokens, prefill passes of one
``p``-token prompt. Those are bare kernels — no engine overhead and, on one GPU, no
collectives — so each point is compared with the part of ``reference.pass_time`` that
models them: the roofline ``max(t_mem, t_comp) + serial_frac·min(t_mem, t_comp)``, for
TensorRT-LLM (the calibration's reference engine), bf16 weights and KV, pp=1.

The implied efficiencies divide the bytes and FLOPs the predictor counts by the
measured time, to be read next to the calibration table's ``eff_mem`` and ``eff_comp``.
Nothing is fitted here; no CLI or transport code.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.errors import KoiError
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import IN
from koi.predictor.features import build_inputs
from koi.predictor.reference import pass_time
from koi.predictor.types import Workload
from koi.space import DeploymentConfig, check, engine_default_config

STEPS_FILE = Path(__file__).parent / "data" / "gpu_steps_h200.json"
PHASES = ("decode", "prefill")
SMALL_BATCH = 8     # decode passes this small stream weights: memory-bound
LARGE_BATCH = 64
LONG_PROMPT = 4096  # prefill passes this long are compute-bound
GROUPS = (f"decode b ≤ {SMALL_BATCH}", f"decode b ≥ {LARGE_BATCH}", "prefill")


class StepsFileError(KoiError, ValueError):
    """A step-time file that is missing or not in the format scripts/gpu_steps.py writes."""


@dataclass(frozen=True)
class Measured:
    """One point's measured pass time, one value per run that measured it."""

    model: str
    tp: int
    phase: str    # decode | prefill
    batch: int    # decoding sequences (1 for a prefill)
    ctx: int      # cached tokens per sequence (decode) or prompt tokens (prefill)
    tokens: int   # tokens in the pass
    pass_s: tuple[float, ...]


@dataclass(frozen=True)
class StepRow:
    """One point: measured (median over runs) against the predictor's roofline."""

    model: str
    tp: int
    phase: str
    batch: int
    ctx: int
    tokens: int
    runs: int
    run_spread: float    # (max − min) / median over the runs
    measured_s: float
    predicted_s: float
    bound: str           # memory | compute, by the predictor
    mem_share: float     # predictor's bytes ÷ (catalog HBM bandwidth × measured time)
    comp_share: float    # predictor's FLOPs ÷ (catalog peak × measured time)

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s

    @property
    def group(self) -> str | None:
        if self.phase == "prefill":
            return GROUPS[2]
        if self.batch <= SMALL_BATCH:
            return GROUPS[0]
        return GROUPS[1] if self.batch >= LARGE_BATCH else None


@dataclass(frozen=True)
class Spread:
    n: int
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        if not values:
            return None
        return cls(len(values), float(np.median(values)), min(values), max(values))


@dataclass(frozen=True)
class StepsSummary:
    ratio: dict[str, Spread | None]   # predicted / measured, by GROUPS
    mem_share: Spread | None          # decode b ≤ SMALL_BATCH
    comp_share: Spread | None         # prefill ≥ LONG_PROMPT tokens
    eff_mem: float                    # the calibration table's, for this part and engine
    eff_comp: float
    hbm_bw: float                     # catalog bytes/s and bf16 FLOP/s
    peak_flops: float
    copy_bytes_per_s: float | None    # the card's measured ceilings, median over runs
    gemm_flops: float | None
    run_spread: Spread | None         # per point, over points measured more than once
    runs: int
    device: str

    @property
    def copy_share(self) -> float | None:
        return self.copy_bytes_per_s / self.hbm_bw if self.copy_bytes_per_s else None

    @property
    def gemm_share(self) -> float | None:
        return self.gemm_flops / self.peak_flops if self.gemm_flops else None


@dataclass(frozen=True)
class StepsComparison:
    path: Path
    accelerator: str
    rows: list[StepRow]
    summary: StepsSummary


def read_steps(path: Path | None = None) -> tuple[list[dict[str, Any]], list[Measured]]:
    """The runs' environments and every point's pass times.

    Accepts one run as ``scripts/gpu_steps.py`` writes it (``{env, rows}``) or several
    gathered as ``{about, runs: [{env, rows}, …]}``.
    """
    target = path or STEPS_FILE
    data = load_measured(target, StepsFileError, "scripts/gpu_steps.py")
    runs = ([data] if "rows" in data else data.get("runs")) if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs:
        raise StepsFileError(f"{target}: expected {{env, rows}} as scripts/gpu_steps.py "
                             "writes it, or {runs: [{env, rows}, …]}")
    envs: list[dict[str, Any]] = []
    points: dict[tuple[str, int, str, int, int, int], list[float]] = {}
    for i, run in enumerate(runs):
        rows = run.get("rows") if isinstance(run, dict) else None
        if not isinstance(rows, list) or not rows:
            raise StepsFileError(f"{target}: run {i} has no rows")
        env = run.get("env") or {}
        envs.append(env if isinstance(env, dict) else {})
        for k, row in enumerate(rows):
            key, pass_s = _parse_row(row, f"{target}: run {i} row {k}")
            points.setdefault(key, []).append(pass_s)
    return envs, [Measured(*key, pass_s=tuple(v)) for key, v in points.items()]


def load_measured(target: Path, error: type[KoiError], script: str) -> Any:
    """A JSON file a GPU script wrote; ``error`` says what is wrong with it and how to
    write one."""
    try:
        return json.loads(target.read_text())
    except FileNotFoundError:
        raise error(f"{target}: no such file (write one on a GPU machine with "
                    f"`python3 {script} --out FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{target}: not a readable JSON file ({e})") from None


def _parse_row(row: Any, where: str) -> tuple[tuple[str, int, str, int, int, int], float]:
    if not isinstance(row, dict):
        raise StepsFileError(f"{where}: not an object")
    missing = [k for k in ("model", "tp", "phase", "batch", "ctx", "tokens", "pass_s")
               if k not in row]
    if missing:
        raise StepsFileError(f"{where}: missing {', '.join(missing)}")
    if row["phase"] not in PHASES:
        raise StepsFileError(f"{where}: phase {row['phase']!r} is not one of {PHASES}")
    for k in ("tp", "batch", "ctx", "tokens"):
        if not isinstance(row[k], int) or row[k] < 1:
            raise StepsFileError(f"{where}: {k} must be a positive integer (got {row[k]!r})")
    pass_s = row["pass_s"]
    if not isinstance(pass_s, int | float) or not math.isfinite(pass_s) or pass_s <= 0:
        raise StepsFileError(f"{where}: pass_s must be a positive number of seconds "
                             f"(got {pass_s!r})")
    key = (str(row["model"]), row["tp"], row["phase"], row["batch"], row["ctx"], row["tokens"])
    return key, float(pass_s)


def step_config(model: str, tp: int, accelerator: str, catalog: Catalog) -> DeploymentConfig:
    """The deployment a measured shard stands for: TensorRT-LLM, bf16, CUDA graphs, pp=1."""
    cfg = engine_default_config(model, accelerator, "trtllm", catalog=catalog, tp=tp, pp=1,
                                weight_precision="bf16", kv_dtype="bf16", cuda_graphs=True)
    return check(cfg, catalog)


def kernels_only(X: np.ndarray) -> np.ndarray:
    """``X`` with what a raw-kernel pass on one GPU leaves out set to zero: the engine's
    per-pass and per-sequence overhead and the collectives (with pp=1, pass_time's total
    is then the roofline alone)."""
    raw = X.copy()
    for name in ("ovh_base", "ovh_seq", "n_ar", "n_moe"):
        raw[IN[name]] = 0.0
    return raw


def at_full_efficiency(X: np.ndarray) -> np.ndarray:
    """``X`` at 100% of peak, so that t_mem × HBM bandwidth is the bytes the predictor
    counts and t_comp × peak its FLOPs."""
    ideal = X.copy()
    for name in ("eff_mem", "eff_comp", "attn_mem", "moe_eff"):
        ideal[IN[name]] = 1.0
    return ideal


def compare_steps(path: Path | None = None, accelerator: str = "h200",
                  catalog: Catalog | None = None,
                  calibration: Calibration | None = None) -> StepsComparison:
    """Every measured point against the predictor's roofline, and the summary."""
    target = path or STEPS_FILE
    envs, measured = read_steps(target)
    cat = catalog or load_catalog()
    cal = calibration or load_calibration()
    pairs = []
    for m in measured:
        try:
            cfg = step_config(m.model, m.tp, accelerator, cat)
        except KoiError as e:
            raise StepsFileError(f"{target}: {m.model} tp{m.tp} on {accelerator}: {e}") from None
        pairs.append((cfg, Workload(input_len=m.ctx, output_len=1)))
    X = kernels_only(build_inputs(pairs, cat, cal))
    decode = np.array([m.phase == "decode" for m in measured])
    batch = np.array([m.batch for m in measured], dtype=float)
    tokens = np.array([m.tokens for m in measured], dtype=float)
    ctx = np.array([m.ctx for m in measured], dtype=float)
    # decode: b sequences at ctx cached tokens; prefill: p tokens, causal average 0.5·p
    b, p = np.where(decode, batch, 0.0), np.where(decode, 0.0, tokens)
    shape = (b, p, ctx, 0.5 * p)
    predicted, t_mem, t_comp, _ = pass_time(X, *shape)
    # the bytes and FLOPs the predictor counts, as seconds at 100% of peak
    _, t_bytes, t_flops, _ = pass_time(at_full_efficiency(X), *shape)
    rows = []
    for j, m in enumerate(measured):
        median = float(np.median(m.pass_s))
        rows.append(StepRow(
            m.model, m.tp, m.phase, m.batch, m.ctx, m.tokens, runs=len(m.pass_s),
            run_spread=(max(m.pass_s) - min(m.pass_s)) / median, measured_s=median,
            predicted_s=float(predicted[j]),
            bound="memory" if t_mem[j] >= t_comp[j] else "compute",
            mem_share=float(t_bytes[j]) / median, comp_share=float(t_flops[j]) / median))
    return StepsComparison(target, accelerator, rows, _summarise(rows, envs, X))


def _summarise(rows: list[StepRow], envs: list[dict[str, Any]], X: np.ndarray) -> StepsSummary:
    def env_median(key: str) -> float | None:
        values = [float(e[key]) for e in envs if isinstance(e.get(key), int | float)]
        return float(np.median(values)) if values else None

    devices = sorted({str(e.get("device", "?")) for e in envs})
    return StepsSummary(
        ratio={g: Spread.of([r.ratio for r in rows if r.group == g]) for g in GROUPS},
        mem_share=Spread.of([r.mem_share for r in rows if r.group == GROUPS[0]]),
        comp_share=Spread.of([r.comp_share for r in rows
                              if r.phase == "prefill" and r.tokens >= LONG_PROMPT]),
        eff_mem=float(X[IN["eff_mem"], 0]), eff_comp=float(X[IN["eff_comp"], 0]),
        hbm_bw=float(X[IN["hbm_bw"], 0]), peak_flops=float(X[IN["peak_flops"], 0]),
        copy_bytes_per_s=env_median("copy_bytes_per_s"),
        gemm_flops=env_median("bf16_gemm_flops"),
        run_spread=Spread.of([r.run_spread for r in rows if r.runs > 1]),
        runs=len(envs), device=", ".join(devices))
