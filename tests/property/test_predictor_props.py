"""Predictor invariants (hypothesis): finite everywhere, monotone where physics says so."""

from __future__ import annotations

import itertools
import math
from dataclasses import fields
from functools import lru_cache

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.predictor.api import predict
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig, KvDtype, Precision, validate

SETTINGS = settings(max_examples=40, deadline=None)
PLATEAU_DIP = 0.075  # see test_more_clients_never_lower_throughput_up_to_the_cap


@lru_cache(maxsize=1)
def valid_configs() -> tuple[DeploymentConfig, ...]:
    """Every valid single-node config of a grid over the catalog (pp=1, engine defaults)."""
    cat = load_catalog()
    grid = itertools.product(sorted(cat.models), sorted(cat.accelerators), sorted(cat.engines),
                             (1, 2, 4, 8), (Precision.BF16, Precision.FP8, Precision.INT4,
                                            Precision.FP4), (KvDtype.AUTO, KvDtype.FP8))
    out = []
    for model, accel, engine, tp, precision, kv in grid:
        cfg = DeploymentConfig(model=model, accelerator=accel, engine=engine, tp=tp,
                               weight_precision=precision, kv_dtype=kv)
        if not validate(cfg, cat):
            out.append(cfg)
    return tuple(out)


@st.composite
def configs(draw: st.DrawFn) -> DeploymentConfig:
    pool = valid_configs()
    cfg = pool[draw(st.integers(0, len(pool) - 1))]
    seqs = draw(st.sampled_from([8, 64, 256, 1024]))
    cfg = cfg.with_(
        max_num_seqs=seqs,
        max_batched_tokens=max(seqs, draw(st.sampled_from([2048, 8192, 16384]))),
        cuda_graphs=draw(st.booleans()),
        replicas=draw(st.integers(1, 4)),
        gpu_mem_fraction=draw(st.sampled_from([0.8, 0.9])),
    )
    assume(not validate(cfg))
    return cfg


lengths = st.integers(1, 16_000).map(float)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    mode = draw(st.sampled_from(list(LoadMode)))
    load = {
        LoadMode.SATURATED: st.just(0.0),
        LoadMode.CONCURRENCY: st.integers(1, 5000).map(float),
        LoadMode.RATE: st.floats(0.001, 1e4),
        LoadMode.STATIC: st.integers(1, 2000).map(float),
        LoadMode.BURST: st.integers(1, 20_000).map(float),
    }[mode]
    return Workload(
        input_len=draw(lengths), output_len=draw(lengths), mode=mode, load=draw(load),
        prefix_hit=draw(st.sampled_from([0.0, 0.3, 0.9])),
        window_s=draw(st.sampled_from([60.0, 600.0])),
        slo_ttft_ms=draw(st.sampled_from([0.0, 100.0, 2000.0])),
        slo_tpot_ms=draw(st.sampled_from([0.0, 20.0, 200.0])),
    )


def saturation(cfg: DeploymentConfig, i_len: float, o_len: float) -> Prediction:
    return predict(cfg, Workload(i_len, o_len))


@SETTINGS
@given(configs(), workloads())
def test_predictions_are_finite(cfg: DeploymentConfig, wl: Workload) -> None:
    pred = predict(cfg, wl)
    for f in fields(Prediction):
        assert math.isfinite(getattr(pred, f.name)), f.name
    assert pred.output_throughput_tok_s > 0
    assert pred.ttft_ms > 0 and pred.tpot_ms > 0
    assert pred.max_rate_under_slo_rps >= 0
    assert pred.cost_per_mtok_usd >= 0


@SETTINGS
@given(configs())
def test_more_tp_means_less_weight_memory_per_gpu(cfg: DeploymentConfig) -> None:
    wider = cfg.with_(tp=cfg.tp * 2, multi_node=cfg.tp * 2 > 8)
    assume(not validate(wider))
    wl = Workload(1000, 200)
    assert predict(wider, wl).weights_gb_per_gpu < predict(cfg, wl).weights_gb_per_gpu


@SETTINGS
@given(configs(), st.integers(16, 8000).map(float), st.integers(16, 2000).map(float),
       st.floats(1e-4, 0.9), st.floats(1e-4, 0.9))
def test_higher_rate_never_lowers_mean_ttft(cfg: DeploymentConfig, i_len: float, o_len: float,
                                            u1: float, u2: float) -> None:
    """Below saturation (≤ 90% of the saturation rate) TTFT mean grows with the rate.

    Only the mean and only below saturation: the p95 (wait/ρ·ln(ρ/0.05) falls with ρ for a
    fixed wait) and the jump from the loaded solver to the backlog formula at ρ = 0.999
    are known not to be monotone (see the known-gap tests in test_predictor_model.py).
    """
    lo, hi = sorted((u1, u2))
    mu = saturation(cfg, i_len, o_len).request_rate_rps
    slow = predict(cfg, Workload(i_len, o_len, LoadMode.RATE, lo * mu))
    fast = predict(cfg, Workload(i_len, o_len, LoadMode.RATE, hi * mu))
    assert fast.ttft_ms >= slow.ttft_ms * (1 - 1e-9)


@SETTINGS
@given(configs(), workloads(), st.integers(1, 8000))
def test_longer_input_never_lowers_kv_pressure(cfg: DeploymentConfig, wl: Workload,
                                               extra: int) -> None:
    longer = Workload(wl.input_len + extra, wl.output_len, wl.mode, wl.load, wl.prefix_hit,
                      wl.window_s)
    shorter = Workload(wl.input_len, wl.output_len, wl.mode, wl.load, wl.prefix_hit,
                       wl.window_s)
    assert predict(cfg, longer).kv_pressure >= predict(cfg, shorter).kv_pressure * (1 - 1e-9)


@SETTINGS
@given(configs(), st.integers(16, 8000).map(float), st.integers(16, 2000).map(float),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_more_clients_never_lower_throughput_up_to_the_cap(
        cfg: DeploymentConfig, i_len: float, o_len: float, u1: float, u2: float) -> None:
    """Up to the saturation batch, more clients never lower throughput by more than a
    plateau's dip.

    Not strictly monotone, by design: once a replica is prefill-bound (short outputs,
    long prompts), every extra decoding sequence takes one token of the chunked-prefill
    budget and a little step time, so completions — and output tokens — fall slightly as
    clients are added, as in an engine that schedules decodes first. CI found a 2e-5
    dip (qwen2.5-72b int4 on 4×l4, 609/16 tokens); 3,000 random draws of this test's
    space gave at most 1.5 %, a targeted search (1,024 seqs, 2,048-token budget, 16-token
    outputs) 1.0 %. On 2026-12-04 CI found 5.0 % for a compute-bound MoE: deepseek-v3
    int4 on 8×a100-80gb (sglang, 1216/16 tokens; the same on the code of the day before):
    throughput peaks at 57 clients and falls 5.1 % by the cap, 6.4 % with CUDA graphs
    (docs/NOTES.md: whether a MoE's dip is physical is open). A dip beyond 7.5 % would be
    a fault, not the plateau.
    """
    cap = saturation(cfg, i_len, o_len).batch_size * cfg.replicas
    lo, hi = sorted((1 + u1 * (cap - 1), 1 + u2 * (cap - 1)))
    assume(cap >= 1)
    few = predict(cfg, Workload(i_len, o_len, LoadMode.CONCURRENCY, lo))
    many = predict(cfg, Workload(i_len, o_len, LoadMode.CONCURRENCY, hi))
    assert many.output_throughput_tok_s >= few.output_throughput_tok_s * (1 - PLATEAU_DIP)


@SETTINGS
@given(configs())
def test_fp8_kv_doubles_kv_capacity(cfg: DeploymentConfig) -> None:
    bf16 = cfg.with_(kv_dtype=KvDtype.BF16)
    fp8 = cfg.with_(kv_dtype=KvDtype.FP8)
    assume(not validate(bf16) and not validate(fp8))
    wl = Workload(2000, 500)
    ratio = predict(fp8, wl).kv_capacity_tokens / predict(bf16, wl).kv_capacity_tokens
    assert abs(ratio - 2.0) <= 0.02
