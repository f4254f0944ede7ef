"""The world's step time: how long one forward pass of a replica really takes.

A roofline on the accelerator's HBM bandwidth and FLOP/s at the serving precision
(scaled by the hidden ``WorldParams`` efficiencies), tensor-parallel all-reduce on the
interconnect (with the PCIe penalty), MoE experts touched by the batch, pipeline bubbles
and a fixed per-step engine overhead. ``step_coef`` folds a deployment into a tuple of
floats once; ``step_time`` is then a handful of float operations per call, cheap enough
to call for every simulated segment.

Memory per GPU reuses ``koi.space``'s helpers (bytes are bytes, not beliefs). This is
the *world*: it must never import ``koi.predictor`` — the planner learns these numbers.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from koi.catalog import Accelerator, Catalog, Interconnect, Model, Offering
from koi.scenario.world import WorldParams
from koi.space import (
    DeploymentConfig,
    kv_bytes_per_token_per_gpu,
    split_params,
    weight_bytes_per_gpu,
)

ACT_BYTES = 2.0  # activations travel in bf16 between ranks


class StepCoef(NamedTuple):
    """Per-deployment constants of the step-time formula (SI units, per GPU)."""

    w_dense: float       # dense weight bytes read per pass
    w_expert: float      # routed-expert weight bytes (all experts) on the GPU
    touch_p: float       # chance one token routes to a given expert (0 = dense)
    kv_b: float          # KV bytes per token of context
    flops_tok: float     # linear-layer FLOPs per token
    attn_flops: float    # attention FLOPs per (query token × context token)
    bw: float            # achieved HBM bytes/s
    flops: float         # achieved FLOP/s at the serving precision
    comm_b_tok: float    # collective bytes per token
    comm_bw: float       # achieved collective bytes/s (PCIe penalty folded in)
    comm_lat: float      # fixed collective latency per pass, s
    overhead: float      # per-pass engine overhead, s
    pp: int
    bubble: float        # extra share of a pass lost to pipeline bubbles
    mult: float          # engine × drift × region multipliers


def peak_flops(accel: Accelerator, precision: str) -> float:
    """Dense FLOP/s the tensor cores offer for weights of ``precision``."""
    bf16 = accel.bf16_tflops
    if precision == "fp8":
        tf = accel.fp8_tflops or bf16
    elif precision == "fp4":
        tf = accel.fp4_tflops or accel.fp8_tflops or bf16
    elif precision == "int8":
        tf = accel.int8_tops or bf16
    else:  # bf16/fp16, and int4 which dequantises to bf16 (W4A16)
        tf = bf16
    return tf * 1e12


def step_coef(cfg: DeploymentConfig, catalog: Catalog, world: WorldParams,
              offering: Offering | None = None) -> StepCoef:
    """Fold one deployment configuration and the world into a ``StepCoef``."""
    model = catalog.model(cfg.model)
    accel = catalog.accelerator(cfg.accelerator)
    w_dense, w_expert, touch_p = _weights(model, cfg)
    ranks = cfg.tp * cfg.pp
    layers = model.num_layers / cfg.pp
    attn = 4.0 * layers * model.num_attention_heads * model.head_dim / cfg.tp
    comm_b, comm_bw, comm_lat = _collectives(model, accel, cfg, world, layers)
    mult = world.engine_mult.get(cfg.engine, 1.0) * world.engine_drift.get(cfg.engine, 1.0)
    if offering is not None:
        mult *= world.slow_regions.get(f"{offering.cloud}/{offering.region}", 1.0)
    return StepCoef(
        w_dense=w_dense, w_expert=w_expert, touch_p=touch_p,
        kv_b=kv_bytes_per_token_per_gpu(model, cfg),
        flops_tok=2.0 * model.active_params_b * 1e9 / ranks,
        attn_flops=attn,
        bw=accel.hbm_bandwidth_tb_s * 1e12 * world.mem_eff_of(accel.id),
        flops=peak_flops(accel, cfg.weight_precision.value) * world.comp_eff_of(accel.id),
        comm_b_tok=comm_b, comm_bw=comm_bw, comm_lat=comm_lat,
        overhead=world.overhead_s(cfg.engine, cfg.cuda_graphs),
        pp=cfg.pp, bubble=world.pp_bubble * (cfg.pp - 1) / cfg.pp, mult=mult)


def _weights(model: Model, cfg: DeploymentConfig) -> tuple[float, float, float]:
    total = weight_bytes_per_gpu(model, cfg)
    if not model.is_moe:
        return total, 0.0, 0.0
    dense_b, expert_b = split_params(model)
    expert = total * expert_b / (dense_b + expert_b)
    return total - expert, expert, model.experts_per_token / model.num_experts


def _collectives(model: Model, accel: Accelerator, cfg: DeploymentConfig, world: WorldParams,
                 layers: float) -> tuple[float, float, float]:
    """(bytes per token, bytes/s, latency per pass) of the pass's collectives."""
    if cfg.tp == 1 and cfg.ep == 1:
        return 0.0, 1.0, 0.0
    # Two all-reduces per layer (after attention and after the MLP); a ring moves
    # 2(tp-1)/tp of the buffer through each GPU.
    per_tok = 2.0 * layers * model.hidden_size * ACT_BYTES * 2.0 * (cfg.tp - 1) / cfg.tp
    if model.is_moe and cfg.ep > 1:
        # dispatch + combine all-to-all of each token's hidden state to its experts
        share = (cfg.ep - 1) / cfg.ep
        per_tok += 2.0 * layers * model.hidden_size * ACT_BYTES * model.experts_per_token * share
    bw = accel.interconnect_gb_s / 2.0 * 1e9 * world.collective_eff
    hops = 1.0 if cfg.custom_allreduce and cfg.tp <= 8 else 2.0 * (cfg.tp - 1)
    lat = 2.0 * layers * accel.interconnect_latency_us * 1e-6 * hops
    if accel.interconnect == Interconnect.PCIE and cfg.tp > 1:
        bw /= world.pcie_tp_penalty
        lat *= world.pcie_tp_penalty
    return per_tok, bw, lat


def step_time(k: StepCoef, b: float, ctx: float, p: float, p_ctx: float = 0.0) -> float:
    """Seconds for one pass: ``b`` decoding sequences of mean context ``ctx`` plus ``p``
    prefill tokens attending to ``p_ctx`` context tokens on average."""
    n = b + p
    if n <= 0:
        return 0.0
    pp = k.pp
    m = n / pp  # each pipeline stage sees one microbatch of the pass at a time
    w = k.w_dense
    if k.touch_p > 0.0:
        w += k.w_expert * (1.0 - math.pow(1.0 - k.touch_p, m))
    mem = (w + (b * ctx + n) / pp * k.kv_b) / k.bw
    cmp = (m * k.flops_tok + (b * ctx + p * p_ctx) / pp * k.attn_flops) / k.flops
    comm = m * k.comm_b_tok / k.comm_bw + k.comm_lat if k.comm_lat or k.comm_b_tok else 0.0
    stage = (mem if mem > cmp else cmp) + comm
    return (pp * stage * (1.0 + k.bubble) + k.overhead) * k.mult


def weight_load_s(cfg: DeploymentConfig, catalog: Catalog, world: WorldParams) -> float:
    """Seconds to load one replica's weights from storage."""
    model = catalog.model(cfg.model)
    total = weight_bytes_per_gpu(model, cfg) * cfg.gpus_per_replica
    return total / (world.storage_gb_s * 1e9)


def startup_s(cfg: DeploymentConfig, offering: Offering, catalog: Catalog,
              world: WorldParams) -> float:
    """Provisioning plus weight loading: how long a new replica takes to serve."""
    return world.provisioning_of(offering.cloud) + weight_load_s(cfg, catalog, world)
