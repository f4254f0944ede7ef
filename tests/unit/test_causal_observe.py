"""Observations from telemetry, residuals, and applying a correction to a prediction."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from koi.causal import (
    BeliefStore,
    Scope,
    apply_correction,
    log_residuals,
    observation_from_telemetry,
)
from koi.causal.observe import tail_residuals
from koi.cluster import DeploymentTelemetry
from koi.predictor.types import Prediction

L4 = Scope("l4", "vllm", "≤10B", "tp1", family="ada")


def prediction(**kw: float) -> Prediction:
    base = {f.name: 1.0 for f in fields(Prediction)}
    base.update(ttft_ms=100.0, ttft_p50_ms=90.0, ttft_p95_ms=200.0, tpot_ms=20.0,
                tpot_p50_ms=19.0, tpot_p95_ms=30.0, output_throughput_tok_s=1000.0,
                total_throughput_tok_s=3000.0, cost_per_mtok_usd=2.0, e2e_latency_s=2.1,
                kv_pressure=0.9, comm_overhead_frac=0.1, queue_util=0.5)
    base.update(kw)
    return Prediction(**base)


def telemetry(finished: float = 200.0, tpot_s: float = 0.03) -> DeploymentTelemetry:
    return DeploymentTelemetry(
        tick=4, deployment_id="dep-1", job_id="job-1", window_s=60.0, requests_arrived=210,
        requests_finished=finished, requests_dropped=0, prompt_tokens=1e5,
        generation_tokens=6e4, ttft_bucket_bounds_s=(), ttft_bucket_counts=(0.0,),
        tpot_bucket_bounds_s=(), tpot_bucket_counts=(0.0,), ttft_mean_s=0.12,
        ttft_p95_s=0.25, tpot_mean_s=tpot_s, tpot_p95_s=0.045, kv_cache_usage=0.97,
        num_running=40, num_waiting=3, num_preemptions=12, replica_preemptions=0,
        output_tok_s=900.0, gpu_seconds=60.0, cost_usd=0.02)


def test_observation_from_telemetry() -> None:
    o = observation_from_telemetry(telemetry(), prediction(), L4)
    assert o is not None
    assert (o.deployment_id, o.job_id, o.tick, o.scope, o.weight) == \
        ("dep-1", "job-1", 4, L4, 200.0)
    assert o.observed["ttft_ms"] == pytest.approx(120.0)
    assert o.observed["tpot_p95_ms"] == pytest.approx(45.0)
    assert (o.observed["kv_usage"], o.observed["preemptions"]) == (0.97, 12)
    assert o.mediators()["comm_overhead"] == 0.1
    r = log_residuals(o)
    assert r["tpot"] == pytest.approx(math.log(30 / 20))
    assert r["throughput"] == pytest.approx(math.log(0.9))
    assert observation_from_telemetry(telemetry(finished=19), prediction(), L4) is None
    no_tpot = observation_from_telemetry(telemetry(tpot_s=0.0), prediction(), L4)
    assert no_tpot is not None and "tpot" not in log_residuals(no_tpot)


def test_store_learns_from_telemetry_observations() -> None:
    store = BeliefStore()
    for t in range(6):
        store = store.update([observation_from_telemetry(telemetry(), prediction(), L4)], t)
    assert store.correction(L4, {"kv_pressure": 0.9})["tpot"] == pytest.approx(1.5, rel=0.05)
    assert {m.line().split(" on ")[0] for m in store.active_mechanisms()} == \
        {"kv_pressure > 0.85 → TPOT ×1.49", "compute-bound prefill → TTFT ×1.19"}


def test_apply_correction() -> None:
    p = prediction()
    q = apply_correction(p, {"ttft": 2.0, "tpot": 1.5, "throughput": 0.5})
    assert (q.ttft_ms, q.ttft_p95_ms, q.tpot_ms, q.tpot_p95_ms) == (200.0, 400.0, 30.0, 45.0)
    assert (q.output_throughput_tok_s, q.cost_per_mtok_usd) == (500.0, 4.0)
    assert q.e2e_latency_s == pytest.approx((200.0 + 2000.0 * 1.5) / 1000.0)
    assert q.kv_pressure == p.kv_pressure
    assert apply_correction(p, {}) == p
    # a p95's own multiplier (mean × tail) replaces its mean's
    q = apply_correction(p, {"ttft": 2.0, "ttft_p95": 3.0, "tpot_p95": 0.5})
    assert (q.ttft_ms, q.ttft_p95_ms, q.tpot_ms, q.tpot_p95_ms) == (200.0, 600.0, 20.0, 15.0)


def test_tail_residuals_are_the_p95_error_beyond_the_mean() -> None:
    o = observation_from_telemetry(telemetry(), prediction(), L4)
    assert o is not None
    r = tail_residuals(o)
    assert r["ttft_p95"] == pytest.approx(math.log((250 / 120) / (200 / 100)))
    assert r["tpot_p95"] == pytest.approx(math.log((45 / 30) / (30 / 20)))
    no_tpot = observation_from_telemetry(telemetry(tpot_s=0.0), prediction(), L4)
    assert no_tpot is not None and set(tail_residuals(no_tpot)) == {"ttft_p95"}
