"""Turn (configuration, workload) pairs into the predictor's input matrix.

Everything the kernel needs is resolved here once per candidate — per-GPU weight and
KV bytes, FLOPs per token, collective payloads, peak rates for the chosen precision,
efficiency factors, prices — so the numeric kernels see only numbers. No prediction
logic here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from koi.catalog import Accelerator, Catalog, Engine, Model, load_catalog
from koi.predictor import tables
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import (
    IN,
    MODE_BURST,
    MODE_CONCURRENCY,
    MODE_RATE,
    MODE_SATURATED,
    MODE_STATIC,
    N_IN,
)
from koi.predictor.types import LoadMode, Workload
from koi.space import (
    GIB,
    WEIGHT_BYTES,
    DeploymentConfig,
    Precision,
    SpecDecode,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    runtime_reserve_bytes,
    split_params,
    weight_bytes_per_gpu,
)

MODE_CODE = {
    LoadMode.SATURATED: MODE_SATURATED, LoadMode.CONCURRENCY: MODE_CONCURRENCY,
    LoadMode.RATE: MODE_RATE, LoadMode.STATIC: MODE_STATIC, LoadMode.BURST: MODE_BURST,
}
# Expected accepted tokens per verify step and verify-step cost, per method (typical
# acceptance on chat workloads; EAGLE reports ~2.5–3.5 tokens per step at k=3–5).
SPEC_GAIN = {SpecDecode.NGRAM: (0.35, 1.10), SpecDecode.EAGLE: (0.55, 1.25),
             SpecDecode.DRAFT: (0.50, 1.35)}
ACT_BYTES = 2.0  # activations travel in bf16/fp16


def peak_flops(accel: Accelerator, precision: Precision) -> float:
    """FLOP/s the matmuls run at: W8A8 uses fp8/int8 units, W4A16 dequantises to bf16."""
    if precision == Precision.FP8 and accel.fp8_tflops > 0:
        return accel.fp8_tflops * 1e12
    if precision == Precision.FP4 and accel.fp4_tflops > 0:
        return accel.fp4_tflops * 1e12
    if precision == Precision.INT8 and accel.int8_tops > 0:
        return accel.int8_tops * 1e12
    return accel.bf16_tflops * 1e12


def spec_factors(cfg: DeploymentConfig) -> tuple[float, float]:
    """(tokens per decode step, cost of a step relative to plain decode)."""
    if cfg.spec_decode == SpecDecode.NONE or cfg.spec_tokens == 0:
        return 1.0, 1.0
    accept, cost = SPEC_GAIN[cfg.spec_decode]
    k = cfg.spec_tokens
    # expected accepted prefix of k drafts with per-token acceptance a, plus the bonus token
    gain = (1.0 - accept ** (k + 1)) / (1.0 - accept)
    return gain, cost * (1.0 + 0.05 * k)


def attention_flops_per_ctx(model: Model) -> float:
    """FLOPs per (query token × context token) summed over layers, whole model."""
    if model.uses_mla:
        # absorbed MLA: scores and values computed against the latent (+ rope part)
        per_head = 2.0 * (model.mla_kv_lora_rank + model.mla_rope_head_dim) \
            + 2.0 * model.mla_kv_lora_rank
        return model.num_layers * model.num_attention_heads * per_head
    return 4.0 * model.num_layers * model.num_attention_heads * model.head_dim


def active_params(model: Model) -> float:
    return model.active_params_b * 1e9


def calibration_values(cal: Calibration, accel: Accelerator,
                       cfg: DeploymentConfig) -> dict[str, float]:
    """The input rows that come from the calibration table (the fit rewrites only these)."""
    ovh_base, ovh_seq = cal.overhead_s(cfg.engine)
    return {
        "eff_mem": cal.eff_mem(accel.id, cfg.engine),
        "eff_comp": cal.eff_comp(accel.id, cfg.weight_precision.value, cfg.engine),
        "eff_link": cal.eff_link(accel.interconnect.value),
        "ovh_base": ovh_base, "ovh_seq": ovh_seq,
        "attn_mem": cal.global_("attn_mem"), "moe_eff": cal.global_("moe_eff"),
        "serial_frac": cal.global_("serial_frac"), "ttft_ovh": cal.ttft_overhead_s(cfg.engine),
        "kscale": cal.kernel_scale(cfg.engine),
    }


def fill_column(X: np.ndarray, j: int, cfg: DeploymentConfig, wl: Workload, model: Model,
                accel: Accelerator, engine: Engine, cal: Calibration,
                usd_per_gpu_hour: float, kernels: bool = False) -> None:
    """Write candidate ``j``'s features into column ``j`` of ``X``; with ``kernels``, the
    shard's compiled kernel-table row where the tables cover it (else -1: roofline)."""
    g_attn = cfg.tp * cfg.pp  # GPUs one attention rank spans
    g_all = g_attn * cfg.dp_attention
    dense_b, expert_b = split_params(model)
    wbytes = WEIGHT_BYTES[cfg.weight_precision]
    # attention/dense weights are replicated on every attention-DP rank; experts are not
    w_dense = dense_b * 1e9 * wbytes / g_attn
    w_expert = expert_b * 1e9 * wbytes / g_all
    # routed-expert parameters one token touches (k of E experts)
    active_expert = expert_b * 1e9 * model.experts_per_token / model.num_experts \
        if model.is_moe else 0.0
    spec_gain, spec_cost = spec_factors(cfg)
    moe_layers = (model.num_layers - model.first_dense_layers) if model.is_moe else 0
    values = {
        "w_dense": w_dense,
        "w_expert": w_expert,
        "moe_ke": (model.experts_per_token / model.num_experts) if model.is_moe else 0.0,
        "flops_tok": 2.0 * (active_params(model) - active_expert) / g_all,
        "flops_tok_exp": 2.0 * active_expert / g_all,
        "attn_flops_ctx": attention_flops_per_ctx(model) / g_attn,
        "kv_tok": kv_bytes_per_token_per_gpu(model, cfg),
        "kv_cap": kv_capacity_tokens(model, accel, cfg, engine),
        "ar_bytes_tok": model.hidden_size * ACT_BYTES,
        "n_ar": 2.0 * model.num_layers / cfg.pp,
        "a2a_bytes_tok": model.experts_per_token * model.hidden_size * ACT_BYTES
        if model.is_moe else 0.0,
        "n_moe": moe_layers / cfg.pp,
        "tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp_attention, "ep": cfg.ep,
        "layers_gpu": model.num_layers / cfg.pp,
        "peak_flops": peak_flops(accel, cfg.weight_precision),
        "hbm_bw": accel.hbm_bandwidth_tb_s * 1e12,
        "link_bw": accel.interconnect_gb_s * 1e9 / 2.0,
        "link_lat": accel.interconnect_latency_us * 1e-6,
        **calibration_values(cal, accel, cfg),
        "max_seqs": cfg.max_num_seqs, "max_tokens": cfg.max_batched_tokens,
        "chunked": float(cfg.chunked_prefill),
        "kv_full_reserve": float(engine.reserves_full_kv),
        "cuda_graphs": float(cfg.cuda_graphs),
        "spec_gain": spec_gain, "spec_cost": spec_cost,
        "in_len": wl.input_len, "out_len": wl.output_len, "prefix_hit": wl.prefix_hit,
        "mode": MODE_CODE[wl.mode], "load": wl.load if wl.mode != LoadMode.SATURATED else 0.0,
        "window_s": wl.window_s,
        "slo_ttft": wl.slo_ttft_ms * 1e-3, "slo_tpot": wl.slo_tpot_ms * 1e-3,
        "usd_hour": usd_per_gpu_hour * cfg.gpus_per_replica,
        "replicas": cfg.replicas,
        "mem_total": accel.memory_gb * GIB,
        "mem_fixed": weight_bytes_per_gpu(model, cfg) + runtime_reserve_bytes(model, cfg),
        "ktab": tables.REGISTRY.index(model, cfg, accel) if kernels else -1.0,
    }
    for name, value in values.items():
        X[IN[name], j] = value


def price_per_gpu_hour(cat: Catalog, cfg: DeploymentConfig) -> float:
    """The offering's price, else the cheapest on-demand price of the part (0 if none)."""
    if cfg.offering:
        return cat.offering(cfg.offering).usd_per_gpu_hour
    prices = [o.usd_per_gpu_hour for o in cat.offerings_for(accelerator_id=cfg.accelerator,
                                                           market="on_demand")]
    return min(prices) if prices else 0.0


WORKLOAD_ROWS = np.array([IN[k] for k in ("in_len", "out_len", "prefix_hit", "mode", "load",
                                           "window_s", "slo_ttft", "slo_tpot")])
_STATIC: dict[tuple, np.ndarray] = {}
_STATIC_MAX = 200_000
# the catalog and calibration objects a cached column was built with, kept alive so that
# their id() — part of the cache key — cannot be reused by another object
_OWNERS: dict[int, object] = {}


def build_inputs(pairs: Sequence[tuple[DeploymentConfig, Workload]],
                 catalog: Catalog | None = None,
                 calibration: Calibration | None = None,
                 kernels: bool | None = None,
                 slo_ms: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The (N_IN, n) input matrix for these candidates.

    ``kernels``: time passes from the measured kernel tables where they cover the shard
    (``tables.py``); None takes the pass model ``calibration`` was fitted for
    (``Calibration.kernels``), else ``tables.DEFAULT``. ``slo_ms``: (TTFT, TPOT) SLOs per
    pair, ms, in place of the workloads' own (the evaluator's tightened ones).

    Everything but the workload rows depends only on (config, catalog, calibration), so
    those columns are cached: the planner re-evaluates the same configurations under new
    loads every tick.
    """
    cat = catalog or load_catalog()
    use_tables = kernels if kernels is not None else \
        calibration.kernels if calibration is not None and calibration.kernels is not None \
        else tables.DEFAULT
    cal = calibration or load_calibration(kernels=use_tables)
    if len(_STATIC) > _STATIC_MAX:
        _STATIC.clear()
        _OWNERS.clear()
    _OWNERS[id(cat)], _OWNERS[id(cal)] = cat, cal
    columns: list[np.ndarray] = []
    last_cfg: DeploymentConfig | None = None
    column = np.zeros(0)
    for cfg, wl in pairs:
        if cfg is not last_cfg:  # consecutive rows often share one config (risk levels)
            last_cfg, key = cfg, (id(cat), id(cal), use_tables, cfg)
            cached = _STATIC.get(key)
            if cached is not None:
                column = cached
            else:
                one = np.zeros((N_IN, 1))
                fill_column(one, 0, cfg, wl, cat.model(cfg.model),
                            cat.accelerator(cfg.accelerator), cat.engine(cfg.engine), cal,
                            price_per_gpu_hour(cat, cfg), use_tables)
                column = _STATIC[key] = one[:, 0]
        columns.append(column)
    X = np.stack(columns, axis=1) if columns else np.zeros((N_IN, 0))
    X[WORKLOAD_ROWS] = np.array(
        [(wl.input_len, wl.output_len, wl.prefix_hit, MODE_CODE[wl.mode],
          wl.load if wl.mode != LoadMode.SATURATED else 0.0, wl.window_s, wl.slo_ttft_ms,
          wl.slo_tpot_ms) for _, wl in pairs], dtype=float).reshape(-1, 8).T
    if slo_ms is not None:
        X[IN["slo_ttft"]], X[IN["slo_tpot"]] = slo_ms
    X[IN["slo_ttft"]] *= 1e-3  # the SLOs in seconds
    X[IN["slo_tpot"]] *= 1e-3
    return X
