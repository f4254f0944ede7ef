"""Forward-pass time from measured kernel tables (GEMM, attention, all-reduce, MoE).

The shipped tables (``data/kernels/<system>.npz``, reduced from NVIDIA AIConfigurator's
public measurements by ``scripts/extract_kernel_tables.py``) give kernel latencies on real
GPUs with TensorRT-LLM's kernels. For one shard of a model (accelerator, model, TP, EP,
weight precision, KV dtype) this module *compiles* them once into a dense row of
``curves()``: per-layer sums as functions of the pass's shape on fixed power-of-two grids,

* ``L(m)``: every layer's GEMMs (QKV, O, gate/up, down — or the fused MoE) at m tokens;
* ``A(m)``: every layer's two TP all-reduces of m × hidden bf16 elements;
* ``H(m)``: the LM head at m rows (one per decoding sequence and finishing prompt);
* ``G(b, c)``: decode attention of b sequences at c cached tokens, all layers;
* ``C(q, s)``: prefill attention of q prompts of s tokens, all layers;

so that a pass is ``L(b+p) + A(b+p) + H(b) + (p/s)·H(1) + G(b, ctx_dec) + C(p/s, s)``
with a few interpolations (``pass_from_tables``; the numba twin is in ``kernel.py``). Shards the
tables do not cover (other parts and engines, pipeline or attention-DP parallelism, MLA,
shapes never measured) get no row and the roofline serves them.

No prediction logic beyond the pass; no I/O but reading the shipped files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from koi.catalog import Accelerator, Interconnect, Model
from koi.space import DeploymentConfig, KvDtype, Precision

DATA_DIR = Path(__file__).parent / "data" / "kernels"
# catalog accelerator → table system (A100-40GB runs the A100-80GB's kernels)
SYSTEM_OF = {"h200": "h200_sxm", "h100-sxm": "h100_sxm", "b200": "b200_sxm",
             "a100-80gb": "a100_sxm", "a100-40gb": "a100_sxm", "l40s": "l40s"}
ENGINES = ("trtllm",)  # the tables time TensorRT-LLM's kernels
GEMM_DTYPE = {Precision.BF16: "bfloat16", Precision.FP16: "bfloat16", Precision.FP8: "fp8",
              Precision.FP4: "nvfp4"}

# dense grids of a compiled row (powers of two; beyond the top, linear extrapolation)
NM, NB, NC, NQ, NS = 17, 12, 18, 9, 11   # m 1..65536, b 1..2048, c 1..131072, q 1..256
S0 = 16.0                                 # prompt grid s = 16 · 2^i, 16..16384
OFF_L, OFF_A, OFF_H = 0, NM, 2 * NM
OFF_G = 3 * NM
OFF_C = OFF_G + NB * NC
OFF_FLAG = OFF_C + NQ * NS   # 1.0: the roofline's collectives replace A (PCIe parts)
ROW = OFF_FLAG + 1
MS = 1e-3  # tables are in milliseconds
# whether build_inputs uses the tables when not told (the planner's default predictor)
DEFAULT = False


@dataclass(frozen=True)
class SystemTables:
    system: str
    header: dict
    arrays: dict[str, np.ndarray]

    @property
    def label(self) -> str:
        return f"{self.system}/{self.header['engine']}-{self.header['engine_version']}"


@cache
def load_system(system: str) -> SystemTables | None:
    path = DATA_DIR / f"{system}.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        arrays = {k: (z[k].astype(np.float64) if z[k].dtype.kind == "f" else z[k])
                  for k in z.files if k != "header"}
        header = json.loads(str(z["header"]))
    return SystemTables(system, header, arrays)


# --- 1-D helpers over measured axes ----------------------------------------------------

def _interp(xs: np.ndarray, ys: np.ndarray, x: np.ndarray, *, log: bool = False
            ) -> np.ndarray:
    """ys(x) through the measured (finite) points: linear between them (in log-log when
    ``log``), held below the first, extrapolated linearly beyond the last."""
    ok = np.isfinite(ys)
    xs, ys = np.asarray(xs, dtype=float)[ok], ys[ok]
    x = np.asarray(x, dtype=float)
    if len(xs) == 0:
        return np.full(x.shape, np.nan)
    if len(xs) == 1:
        return np.where(x > xs[0], ys[0] * x / xs[0], ys[0])
    inside = np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))) if log else np.interp(x, xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), inside)


def _bracket(grid: np.ndarray, v: float) -> tuple[int, int, float]:
    """Neighbours of v in grid and the weight of the upper one (clamped to the grid)."""
    j = int(np.clip(np.searchsorted(grid, v), 1, len(grid) - 1))
    lo, hi = float(grid[j - 1]), float(grid[j])
    return j - 1, j, float(np.clip((v - lo) / (hi - lo), 0.0, 1.0))


M_GRID = 2.0 ** np.arange(NM)
B_GRID = 2.0 ** np.arange(NB)
C_GRID = 2.0 ** np.arange(NC)
Q_GRID = 2.0 ** np.arange(NQ)
S_GRID = S0 * 2.0 ** np.arange(NS)


def gemm_curve(t: SystemTables, dtype: str, n: int, k: int) -> np.ndarray | None:
    """Seconds of an (m × k) · (k × n) GEMM at every M_GRID m, or None if not covered."""
    a = t.arrays
    dtypes = [str(d) for d in a["gemm_dtypes"]]
    if dtype not in dtypes or n < 1 or k < 1:
        return None
    n_max, k_max = float(a["gemm_n"][-1]), float(a["gemm_k"][-1])
    split = math.ceil(n / n_max) * math.ceil(k / k_max)  # too wide: run as equal pieces
    n_eff, k_eff = n / math.ceil(n / n_max), k / math.ceil(k / k_max)
    table = a["gemm"][dtypes.index(dtype)]
    n0, n1, wn = _bracket(a["gemm_n"], n_eff)
    k0, k1, wk = _bracket(a["gemm_k"], k_eff)
    by_m = ((1 - wn) * (1 - wk) * table[:, n0, k0] + wn * (1 - wk) * table[:, n1, k0]
            + (1 - wn) * wk * table[:, n0, k1] + wn * wk * table[:, n1, k1])
    curve = _interp(a["gemm_m"], by_m, M_GRID)
    return None if not np.all(np.isfinite(curve)) else curve * split * MS


def allreduce_curve(t: SystemTables, gpus: int, hidden: int) -> np.ndarray | None:
    a = t.arrays
    if gpus <= 1:
        return np.zeros(NM)
    g = list(a["allreduce_gpus"])
    if gpus not in g:
        return None
    curve = _interp(a["allreduce_elems"], a["allreduce"][g.index(gpus)], M_GRID * hidden,
                    log=True)
    return None if not np.all(np.isfinite(curve)) else curve * MS


def moe_curve(t: SystemTables, dtype: str, model: Model, tp: int, ep: int
              ) -> np.ndarray | None:
    a = t.arrays
    dtypes = [str(d) for d in a["moe_dtypes"]]
    if dtype not in dtypes or len(a["moe_keys"]) == 0:
        return None
    key = np.array([dtypes.index(dtype), model.hidden_size, model.moe_intermediate_size,
                    model.experts_per_token, model.num_experts, tp // ep, ep])
    hit = np.flatnonzero(np.all(a["moe_keys"] == key, axis=1))
    if len(hit) == 0:
        return None
    curve = _interp(a["moe_tokens"], a["moe"][hit[0]], M_GRID)
    return None if not np.all(np.isfinite(curve)) else curve * MS


def _attention_slice(t: SystemTables, prefix: str, kv: str, heads: int, kv_heads: int,
                     head_dim: int) -> np.ndarray | None:
    a = t.arrays
    axes = [list(a[f"{prefix}_head_dim"]), list(a[f"{prefix}_heads"]),
            list(a[f"{prefix}_kv_heads"])]
    want = (head_dim, heads, kv_heads)
    if any(w not in ax for w, ax in zip(want, axes, strict=False)):
        return None
    kv_i = ("bfloat16", "fp8").index(kv)
    return a[f"{prefix}_attn"][kv_i, axes[0].index(head_dim), axes[1].index(heads),
                                axes[2].index(kv_heads)]


def attention_grid(t: SystemTables, prefix: str, kv: str, heads: int, kv_heads: int,
                   head_dim: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
    """Seconds of one layer's attention on the (rows × cols) grid: decode (batch ×
    context) or prefill (prompts × prompt length), measured points interpolated along
    each axis (the batch axis extrapolates where long contexts ran out of memory)."""
    sl = _attention_slice(t, prefix, kv, heads, kv_heads, head_dim)
    if sl is None:
        return None
    a = t.arrays
    tb, tl = a[f"{prefix}_batch"], a[f"{prefix}_len"]
    # along the length axis first (rows of measured batches), then along the batch
    by_len = np.stack([_interp(tl, sl[i], cols) for i in range(len(tb))])
    out = np.stack([_interp(tb, by_len[:, j], rows) for j in range(len(cols))], axis=1)
    return None if not np.all(np.isfinite(out)) else out * MS


# --- compiling one shard ----------------------------------------------------------------

def shard_row(model: Model, cfg: DeploymentConfig, accel: Accelerator
              ) -> tuple[np.ndarray, str] | tuple[None, str]:
    """(compiled row, label) for this shard, or (None, why the roofline serves it).

    On PCIe parts the all-reduce depends on the host's PCIe topology (switches, P2P), not
    only on the GPU: the tables' L40S all-reduce (custom and NCCL alike) is ~3x slower
    than what TRT-LLM's published tp4 L40S throughput implies, so there the roofline's
    collectives (catalog link, fitted eff_link) stand in for A."""
    accelerator = accel.id
    system = SYSTEM_OF.get(accelerator)
    if system is None:
        return None, f"no kernel tables for {accelerator}"
    if cfg.engine not in ENGINES:
        return None, f"kernel tables time TensorRT-LLM, not {cfg.engine}"
    if cfg.pp > 1 or cfg.dp_attention > 1:
        return None, "pipeline or attention-DP parallelism"
    if model.uses_mla:
        return None, "MLA attention"
    t = load_system(system)
    dtype = GEMM_DTYPE.get(cfg.weight_precision)
    if t is None or dtype is None:
        return None, f"no {cfg.weight_precision} kernels for {accelerator}"
    tp = cfg.tp
    kv = "fp8" if cfg.kv_dtype == KvDtype.FP8 else "bfloat16"
    heads, kv_heads = model.num_attention_heads // tp, max(model.num_kv_heads // tp, 1)
    layers = _layer_gemms(t, dtype, model, tp, max(cfg.ep, 1), heads, kv_heads)
    head = gemm_curve(t, dtype, model.vocab_size // tp, model.hidden_size)
    ar = allreduce_curve(t, tp, model.hidden_size)
    if layers is None or head is None or ar is None:
        return None, "a GEMM, MoE or all-reduce shape not in the tables"
    hd = model.head_dim
    gen = attention_grid(t, "gen", kv, heads, kv_heads, hd, B_GRID, C_GRID)
    ctx = attention_grid(t, "ctx", kv, heads, kv_heads, hd, Q_GRID, S_GRID)
    if gen is None or ctx is None:
        return None, f"attention with {heads} heads / {kv_heads} KV heads not in the tables"
    pcie = accel.interconnect == Interconnect.PCIE
    # more work never takes less time: measured repeats wobble by ~0.1% at small shapes
    layers, ar, head = (np.maximum.accumulate(x) for x in (layers, ar, head))
    gen, ctx = (np.maximum.accumulate(np.maximum.accumulate(x, axis=0), axis=1)
                for x in (gen, ctx))
    row = np.concatenate([layers, 0.0 * ar if pcie else 2.0 * model.num_layers * ar, head,
                          model.num_layers * gen.ravel(), model.num_layers * ctx.ravel(),
                          [1.0 if pcie else 0.0]])
    return row, t.label + (" + roofline all-reduce" if pcie and tp > 1 else "")


def _gemms(t: SystemTables, dtype: str, shapes: list[tuple[int, int]]) -> np.ndarray | None:
    """Summed M-grid curve of GEMMs of (n, k) shapes, or None if one is not covered."""
    total = np.zeros(NM)
    for n, k in shapes:
        curve = gemm_curve(t, dtype, n, k)
        if curve is None:
            return None
        total += curve
    return total


def _layer_gemms(t: SystemTables, dtype: str, model: Model, tp: int, ep: int, heads: int,
                 kv_heads: int) -> np.ndarray | None:
    """Every layer's GEMMs (QKV, O; dense FFN or fused MoE + shared experts) at m tokens."""
    h, hd = model.hidden_size, model.head_dim
    attn = _gemms(t, dtype, [((heads + 2 * kv_heads) * hd, h), (h, heads * hd)])
    n_moe = model.num_layers - model.first_dense_layers if model.is_moe else 0
    ffn_w = model.intermediate_size // tp
    ffn = _gemms(t, dtype, [(2 * ffn_w, h), (h, ffn_w)]) if n_moe < model.num_layers \
        else np.zeros(NM)
    if attn is None or ffn is None:
        return None
    layers = (model.num_layers - n_moe) * (attn + ffn)
    if n_moe:
        moe = moe_curve(t, dtype, model, tp, ep)
        inter = model.num_shared_experts * model.moe_intermediate_size // tp
        shared = _gemms(t, dtype, [(2 * inter, h), (h, inter)] if inter else [])
        if moe is None or shared is None:
            return None
        layers = layers + n_moe * (attn + moe + shared)
    return layers


class Registry:
    """Append-only store of compiled rows; a row's index goes into the input matrix."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._labels: list[str] = []
        self._index: dict[tuple, int] = {}
        self._why: dict[tuple, str] = {}
        self._stacked = np.zeros((1, ROW))

    def index(self, model: Model, cfg: DeploymentConfig, accel: Accelerator) -> int:
        key = (model.id, accel.id, cfg.engine, cfg.tp, cfg.pp, cfg.ep, cfg.dp_attention,
               cfg.weight_precision, cfg.kv_dtype)
        if key in self._index:
            return self._index[key]
        if key in self._why:
            return -1
        row, label = shard_row(model, cfg, accel)
        if row is None:
            self._why[key] = label
            return -1
        self._rows.append(row)
        self._labels.append(label)
        self._index[key] = len(self._rows) - 1
        self._stacked = np.ascontiguousarray(np.stack(self._rows))
        return self._index[key]

    def curves(self) -> np.ndarray:
        """(rows, ROW) float64: every compiled row (one zero row when there is none)."""
        return self._stacked

    def label(self, index: int) -> str:
        return f"kernel tables {self._labels[index]}" if index >= 0 else "roofline"


REGISTRY = Registry()


# --- the pass (numpy; kernel.py has the numba twin) ----------------------------------------

def _pow2_pos(x: np.ndarray, n: int, x0: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(lower grid index, weight of the upper point) of x on the grid x0 · 2^i, i < n;
    clamped at the bottom, extrapolated linearly at the top."""
    u = np.maximum(x / x0, 1.0)
    i = np.minimum(np.frexp(u)[1] - 1, n - 2)
    return i, u / np.exp2(i.astype(float)) - 1.0


def _curve(K: np.ndarray, k: np.ndarray, off: int, x: np.ndarray) -> np.ndarray:
    """A 1-D M-grid curve at x (x < 1: the value at 1 scaled down to 0)."""
    i, w = _pow2_pos(x, NM)
    y0, y1 = K[k, off + i], K[k, off + i + 1]
    return (y0 + w * (y1 - y0)) * np.minimum(x, 1.0)


def _grid2(K: np.ndarray, k: np.ndarray, off: int, n_col: int, r: np.ndarray, n_row: int,
           ic: np.ndarray, wc: np.ndarray) -> np.ndarray:
    """A 2-D curve at row value r (pow2 grid; r < 1 scales to 0), column (ic, wc)."""
    i, w = _pow2_pos(r, n_row)
    base = off + i * n_col + ic

    def at(j: np.ndarray) -> np.ndarray:
        return K[k, j] + wc * (K[k, j + 1] - K[k, j])

    y0, y1 = at(base), at(base + n_col)
    return (y0 + w * (y1 - y0)) * np.minimum(r, 1.0)


PARTS = ("gemm", "allreduce", "lm_head", "decode_attention", "prefill_attention")


def pass_parts(K: np.ndarray, k: np.ndarray, b: np.ndarray, p: np.ndarray,
               ctx_dec: np.ndarray, prompt_len: np.ndarray, roof_comm: np.ndarray
               ) -> dict[str, np.ndarray]:
    """Kernel seconds of each part of the pass (``PARTS``) for rows ``k`` (≥ 0), before
    the kernel scale; ``roof_comm``: the roofline's collectives, used where the row's
    flag says so."""
    tokens = b + p
    q = p / np.maximum(prompt_len, 1.0)
    ic, wc = _pow2_pos(ctx_dec, NC)
    is_, ws = _pow2_pos(prompt_len, NS, S0)
    return {
        "gemm": _curve(K, k, OFF_L, tokens),
        "allreduce": _curve(K, k, OFF_A, tokens) + K[k, OFF_FLAG] * roof_comm,
        # the decoding rows, plus one row per finishing prompt at the one-row cost
        "lm_head": _curve(K, k, OFF_H, b) + q * K[k, OFF_H],
        "decode_attention": _grid2(K, k, OFF_G, NC, b, NB, ic, wc),
        "prefill_attention": _grid2(K, k, OFF_C, NS, q, NQ, is_, ws),
    }


def pass_from_tables(K: np.ndarray, k: np.ndarray, b: np.ndarray, p: np.ndarray,
                     ctx_dec: np.ndarray, prompt_len: np.ndarray, roof_comm: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(kernel seconds of the pass, of which all-reduce) for rows ``k`` (≥ 0)."""
    parts = pass_parts(K, k, b, p, ctx_dec, prompt_len, roof_comm)
    total = np.zeros(np.shape(b))
    for name in PARTS:
        total = total + parts[name]
    return total, parts["allreduce"]
