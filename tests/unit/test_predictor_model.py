"""The serving model (``reference.py``, the specification) against hand checks.

Pass times come from ``reference.pass_time`` on a one-column input matrix built by
``build_inputs``; load-mode semantics come from ``predict`` with the numpy backend.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest

from koi.catalog import Catalog, load_catalog
from koi.predictor import reference
from koi.predictor.api import predict
from koi.predictor.columns import IN
from koi.predictor.features import build_inputs
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig, KvDtype, kv_capacity_tokens, weight_bytes_per_gpu

CHAT = Workload(input_len=1000, output_len=200)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def column(cfg: DeploymentConfig, wl: Workload = CHAT) -> np.ndarray:
    return build_inputs([(cfg, wl)])


def pass_time(cfg: DeploymentConfig, b: float, p: float, ctx_dec: float = 1024.0,
              ctx_pre: float = 512.0) -> tuple[float, float, float, float]:
    """(total, t_mem, t_comp, t_comm) in seconds of one pass of ``cfg``."""
    X = column(cfg)
    arr = lambda v: np.array([float(v)])  # noqa: E731
    out = reference.pass_time(X, arr(b), arr(p), arr(ctx_dec), arr(ctx_pre))
    return tuple(float(v[0]) for v in out)  # type: ignore[return-value]


def run(cfg: DeploymentConfig, wl: Workload) -> Prediction:
    return predict(cfg, wl, backend="numpy")


# ----------------------------------------------------------------------- pass times


def test_batch1_decode_is_near_the_bandwidth_floor(cat: Catalog) -> None:
    cfg = DeploymentConfig()
    accel = cat.accelerator("h100-sxm")
    floor = 8.03e9 * 2 / (accel.hbm_bandwidth_tb_s * 1e12)  # read every weight once
    total, t_mem, t_comp, t_comm = pass_time(cfg, b=1, p=0)
    assert floor <= total <= 3 * floor
    assert t_mem >= floor
    assert t_mem > t_comp  # batch-1 decode is memory-bound
    assert t_comm == 0.0


def test_large_prefill_is_compute_bound(cat: Catalog) -> None:
    total, t_mem, t_comp, _ = pass_time(DeploymentConfig(), b=0, p=8192, ctx_pre=4096)
    assert t_comp > t_mem
    # 2 FLOPs per parameter per token at bf16 peak is the floor
    peak = cat.accelerator("h100-sxm").bf16_tflops * 1e12
    assert total >= 2 * 8.03e9 * 8192 / peak


def test_tp1_has_no_collectives_and_tp2_does() -> None:
    assert pass_time(DeploymentConfig(tp=1), b=8, p=0)[3] == 0.0
    assert pass_time(DeploymentConfig(tp=2), b=8, p=0)[3] > 0.0


def test_pipeline_with_one_sequence_has_bubbles() -> None:
    pp = 2
    cfg = DeploymentConfig(pp=pp)
    total, t_mem, t_comp, _ = pass_time(cfg, b=1, p=0)
    # one micro-batch walks all pp stages in turn: pp/micro = 2 stage times
    assert total >= pp * max(t_mem, t_comp)
    # so a 2-stage pipeline is no faster than one GPU at batch 1
    single, *_ = pass_time(DeploymentConfig(), b=1, p=0)
    assert total >= 0.99 * single
    # with pp sequences in flight the bubbles fill: the pass costs less per sequence
    full, *_ = pass_time(cfg, b=pp, p=0)
    assert full / pp < total


def test_decode_pass_grows_with_batch_and_context() -> None:
    cfg = DeploymentConfig()
    assert pass_time(cfg, b=64, p=0)[0] > pass_time(cfg, b=1, p=0)[0]
    assert pass_time(cfg, b=64, p=0, ctx_dec=8192)[0] > pass_time(cfg, b=64, p=0)[0]


# ---------------------------------------------------------------------- predictions


@pytest.mark.parametrize("wl", [
    CHAT,
    Workload(1000, 200, LoadMode.CONCURRENCY, 16),
    Workload(1000, 200, LoadMode.RATE, 2.0, slo_ttft_ms=500, slo_tpot_ms=50),
    Workload(1000, 200, LoadMode.STATIC, 8),
    Workload(1000, 200, LoadMode.BURST, 2000),
], ids=lambda w: str(w.mode))
def test_prediction_fields_are_finite(wl: Workload) -> None:
    pred = run(DeploymentConfig(model="llama-3.1-70b", tp=4), wl)
    for f in fields(Prediction):
        value = getattr(pred, f.name)
        assert math.isfinite(value), f.name
    assert pred.output_throughput_tok_s > 0
    assert pred.ttft_ms > 0 and pred.tpot_ms > 0
    assert pred.ttft_p50_ms <= pred.ttft_p95_ms
    assert pred.tpot_ms <= pred.tpot_p95_ms


def test_prediction_context_matches_the_memory_model(cat: Catalog) -> None:
    for engine in ("vllm", "trtllm"):
        cfg = DeploymentConfig(engine=engine)
        model, accel = cat.model(cfg.model), cat.accelerator(cfg.accelerator)
        pred = run(cfg, CHAT)
        assert pred.weights_gb_per_gpu == pytest.approx(weight_bytes_per_gpu(model, cfg) / 1e9)
        expected = kv_capacity_tokens(model, accel, cfg, cat.engine(engine))
        assert pred.kv_capacity_tokens == pytest.approx(expected), engine
        assert float(column(cfg)[IN["kv_cap"], 0]) == pytest.approx(expected)


def test_static_batch_of_one_throughput_is_output_over_latency() -> None:
    wl = Workload(512, 256, LoadMode.STATIC, 1)
    pred = run(DeploymentConfig(), wl)
    assert pred.output_throughput_tok_s == pytest.approx(256 / pred.e2e_latency_s, rel=0.02)
    assert pred.batch_size == 1


def test_light_rate_is_served_in_full() -> None:
    rate = 0.05
    pred = run(DeploymentConfig(), Workload(1000, 200, LoadMode.RATE, rate))
    sat = run(DeploymentConfig(), CHAT)
    assert rate < 0.01 * sat.request_rate_rps  # far below capacity
    assert pred.output_throughput_tok_s == pytest.approx(rate * 200, rel=0.01)
    assert pred.request_rate_rps == pytest.approx(rate, rel=0.01)


@pytest.mark.parametrize("rate", [0.1, 1.0, 5.0, 20.0, 50.0, 1000.0])
def test_saturated_throughput_bounds_any_rate(rate: float) -> None:
    cfg = DeploymentConfig()
    sat = run(cfg, CHAT)
    at_rate = run(cfg, Workload(1000, 200, LoadMode.RATE, rate))
    assert sat.output_throughput_tok_s >= at_rate.output_throughput_tok_s
    assert sat.output_throughput_tok_s >= run(
        cfg, Workload(1000, 200, LoadMode.CONCURRENCY, rate)).output_throughput_tok_s


def test_cost_per_mtok_uses_the_offering_price(cat: Catalog) -> None:
    offering = cat.offerings_for(accelerator_id="h100-sxm")[-1]  # the dearest one
    cfg = DeploymentConfig(model="llama-3.1-70b", tp=4, replicas=2, offering=offering.id)
    pred = run(cfg, CHAT)
    expected = (offering.usd_per_gpu_hour * cfg.total_gpus
                / (pred.output_throughput_tok_s * 3600) * 1e6)
    assert cfg.total_gpus == 8
    assert pred.cost_per_mtok_usd == pytest.approx(expected, rel=1e-9)


def test_cost_without_offering_uses_the_cheapest_on_demand_price(cat: Catalog) -> None:
    cfg = DeploymentConfig()
    price = min(o.usd_per_gpu_hour
                for o in cat.offerings_for(accelerator_id="h100-sxm", market="on_demand"))
    pred = run(cfg, CHAT)
    assert pred.cost_per_mtok_usd == pytest.approx(
        price / (pred.output_throughput_tok_s * 3600) * 1e6, rel=1e-9)


def test_two_replicas_double_saturated_throughput() -> None:
    one = run(DeploymentConfig(), CHAT)
    two = run(DeploymentConfig(replicas=2), CHAT)
    assert two.output_throughput_tok_s == pytest.approx(2 * one.output_throughput_tok_s)
    assert two.cost_per_mtok_usd == pytest.approx(one.cost_per_mtok_usd)
    assert two.tpot_ms == pytest.approx(one.tpot_ms)


def test_concurrency_beyond_max_num_seqs_is_capped() -> None:
    cfg = DeploymentConfig(max_num_seqs=64)
    at_cap = run(cfg, Workload(512, 256, LoadMode.CONCURRENCY, 64))
    beyond = run(cfg, Workload(512, 256, LoadMode.CONCURRENCY, 100_000))
    assert beyond.output_throughput_tok_s == pytest.approx(at_cap.output_throughput_tok_s,
                                                           rel=0.01)
    assert beyond.batch_size <= 64
    assert beyond.ttft_ms > at_cap.ttft_ms  # the extra clients wait for a slot


def test_concurrency_beyond_kv_capacity_is_capped(cat: Catalog) -> None:
    cfg = DeploymentConfig(model="llama-3.1-70b", tp=4)
    i_len, o_len = 4000, 1000
    model, accel = cat.model(cfg.model), cat.accelerator(cfg.accelerator)
    # vLLM-style engines hold the prompt and (on average) half the output per sequence
    kv_seqs = kv_capacity_tokens(model, accel, cfg) / (i_len + 0.5 * o_len)
    assert kv_seqs < cfg.max_num_seqs
    at_cap = run(cfg, Workload(i_len, o_len, LoadMode.CONCURRENCY, math.ceil(kv_seqs)))
    beyond = run(cfg, Workload(i_len, o_len, LoadMode.CONCURRENCY, 100_000))
    assert beyond.output_throughput_tok_s == pytest.approx(at_cap.output_throughput_tok_s,
                                                           rel=0.01)
    assert beyond.batch_size == pytest.approx(kv_seqs, rel=1e-6)


def test_max_rate_under_slo_is_below_saturation_and_falls_with_the_slo() -> None:
    cfg = DeploymentConfig()
    sat = run(cfg, CHAT)
    rates = [run(cfg, Workload(1000, 200, slo_ttft_ms=slo)).max_rate_under_slo_rps
             for slo in (5000.0, 1000.0, 300.0, 100.0)]
    assert all(0 < r <= sat.request_rate_rps for r in rates)
    assert rates == sorted(rates, reverse=True)
    assert rates[-1] < rates[0]
    tpot_rates = [run(cfg, Workload(1000, 200, slo_tpot_ms=slo)).max_rate_under_slo_rps
                  for slo in (100.0, 30.0, 15.0)]
    assert all(0 < r <= sat.request_rate_rps for r in tpot_rates)
    assert tpot_rates[0] > tpot_rates[1] > tpot_rates[2]


def test_without_slo_max_rate_is_the_saturation_rate() -> None:
    cfg = DeploymentConfig()
    pred = run(cfg, CHAT)
    assert pred.max_rate_under_slo_rps == pytest.approx(pred.request_rate_rps, rel=0.002)


@pytest.mark.parametrize(("ttft", "tpot"), [(0.001, 0.0), (0.0, 0.001)])
def test_impossible_slo_gives_zero_rate(ttft: float, tpot: float) -> None:
    pred = run(DeploymentConfig(), Workload(1000, 200, slo_ttft_ms=ttft, slo_tpot_ms=tpot))
    assert pred.max_rate_under_slo_rps == 0.0


def test_fp8_kv_holds_more_sequences() -> None:
    cfg = DeploymentConfig(model="llama-3.1-70b", tp=4)
    wl = Workload(8000, 1000)
    bf16 = run(cfg, wl)
    fp8 = run(cfg.with_(kv_dtype=KvDtype.FP8), wl)
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens)
    assert fp8.batch_size > bf16.batch_size


# ------------------------------------------------------- regressions of fixed model gaps
# Deterministic examples of defects in reference.py/kernel.py found while writing these
# tests. ``strict=True``: when the model is fixed these XPASS and fail, so remove the mark.


def test_concurrency_throughput_never_falls_with_more_clients() -> None:
    cfg = DeploymentConfig()  # llama-3.1-8b on one H100, vLLM defaults, cap 256 sequences
    half = run(cfg, Workload(1000, 200, LoadMode.CONCURRENCY, 128))
    full = run(cfg, Workload(1000, 200, LoadMode.CONCURRENCY, 256))
    assert full.output_throughput_tok_s >= half.output_throughput_tok_s
    assert full.ttft_ms < 10 * half.ttft_ms


def test_rate_single_slot_engine_at_negligible_load() -> None:
    cfg = DeploymentConfig(max_num_seqs=1)
    alone = run(cfg, Workload(1000, 200, LoadMode.STATIC, 1))
    light = run(cfg, Workload(1000, 200, LoadMode.RATE, 0.001))
    assert light.ttft_ms < 2 * alone.ttft_ms
