"""Physical bounds on telemetry windows (koi.plausibility): each bound refuses what it
should, and the simulator's genuine windows pass every one of them."""

from __future__ import annotations

import dataclasses

import pytest

from koi.catalog import load_catalog
from koi.cluster import Deployment, DeploymentState, DeploymentTelemetry
from koi.plausibility import (
    ROOFLINE_SLACK,
    basic_reason,
    implausible_window,
    output_ceiling_tok_s,
)
from koi.sim import Simulator
from koi.sim.testing import FixedPolicy, batch_job, online_job, tiny_scenario
from koi.space import engine_default_config

CAT = load_catalog()
OD = "aws/us-east-1/h100-sxm/on_demand"
TICK, TICK_S = 5, 60.0


def _dep(replicas: int = 2) -> Deployment:
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", CAT, offering=OD)
    return Deployment("d1", "chat", cfg, OD, DeploymentState.RUNNING, replicas, 0, 0.0)


def _window(**kw) -> DeploymentTelemetry:
    base = DeploymentTelemetry(
        tick=TICK, deployment_id="d1", job_id="chat", window_s=TICK_S, requests_arrived=600.0,
        requests_finished=590.0, requests_dropped=0.0, prompt_tokens=600_000.0,
        generation_tokens=120_000.0, ttft_bucket_bounds_s=(), ttft_bucket_counts=(0.0,),
        tpot_bucket_bounds_s=(), tpot_bucket_counts=(0.0,), ttft_mean_s=0.2,
        ttft_p95_s=0.5, tpot_mean_s=0.02, tpot_p95_s=0.04, kv_cache_usage=0.4,
        num_running=30.0, num_waiting=1.0, num_preemptions=0.0, replica_preemptions=0,
        output_tok_s=2000.0, gpu_seconds=120.0, cost_usd=0.1)
    return dataclasses.replace(base, **kw)


def _why(t: DeploymentTelemetry, dep: Deployment | None = None) -> str | None:
    return implausible_window(t, TICK, TICK_S, dep if dep is not None else _dep(), CAT)


def test_a_genuine_window_passes() -> None:
    assert _why(_window()) is None


@pytest.mark.parametrize("field", ["ttft_mean_s", "ttft_p95_s", "tpot_mean_s", "tpot_p95_s"])
def test_a_negative_latency_is_refused(field: str) -> None:
    reason = _why(_window(**{field: -0.01}))
    assert reason is not None and field in reason and "duration" in reason


@pytest.mark.parametrize(("field", "value"), [
    ("generation_tokens", -1.0), ("requests_finished", float("nan")),
    ("prompt_tokens", float("inf")), ("window_s", 0.0), ("kv_cache_usage", 2.0),
])
def test_counters_that_cannot_be_measured_are_refused(field: str, value: float) -> None:
    reason = basic_reason(_window(**{field: value}))
    assert reason is not None and field in reason


def test_a_window_of_another_tick_or_far_longer_than_a_tick_is_refused() -> None:
    assert "from the batch's tick" in (_why(_window(tick=TICK + 40)) or "")
    assert "from the batch's tick" in (_why(_window(tick=TICK - 2)) or "")
    assert _why(_window(tick=TICK - 1)) is None  # the window began the tick before
    assert "spans more than" in (_why(_window(window_s=3600.0)) or "")
    assert _why(_window(window_s=TICK_S * 1.5)) is None  # a late scrape is not a lie


def test_output_above_the_roofline_is_refused_and_just_below_it_is_not() -> None:
    dep = _dep(replicas=2)
    ceiling = output_ceiling_tok_s(dep, CAT)
    # two H100s at dense bf16, 2 × 8 B FLOPs a token: about 1.2e5 tokens/s
    assert 0.5e5 < ceiling < 2.5e5
    below = ROOFLINE_SLACK * ceiling * 0.99
    assert _why(_window(generation_tokens=below * TICK_S, output_tok_s=below), dep) is None
    above = ROOFLINE_SLACK * ceiling * 1.01
    reason = _why(_window(generation_tokens=above * TICK_S), dep)
    assert reason is not None and "above the roofline" in reason and "h100-sxm" in reason
    # output_tok_s alone lying is caught too
    assert "roofline" in (_why(_window(output_tok_s=above), dep) or "")
    # more replicas, a higher ceiling: the same window is then plausible
    assert _why(_window(generation_tokens=above * TICK_S), _dep(replicas=4)) is None


def test_an_unknown_deployment_skips_only_the_roofline() -> None:
    far = _window(generation_tokens=1e15)
    assert implausible_window(far, TICK, TICK_S, None, CAT) is None
    assert implausible_window(_window(ttft_p95_s=-1.0), TICK, TICK_S, None, CAT)


def test_the_simulators_windows_are_all_plausible() -> None:
    """No bound refuses a genuine window: a saturated batch job and an online one,
    spot and on-demand, every tick of a short run."""
    sc = tiny_scenario([online_job("chat", rate=20), batch_job("bulk", 200_000)],
                       horizon_s=1800)
    sim = Simulator(sc, seed=1, catalog=CAT)
    policy = FixedPolicy(["aws/us-east-1/h100-sxm/spot", OD])
    checked = 0
    telemetry: list[DeploymentTelemetry] = []
    while not sim.done:  # as the sim service does: snapshot n, then the telemetry to n
        snap = sim.snapshot()
        deps = {d.id: d for d in snap.deployments}
        for t in telemetry:
            assert implausible_window(t, snap.tick, snap.tick_s, deps.get(t.deployment_id),
                                      CAT) is None, t
            checked += 1
        sim.apply(policy.decide(snap, telemetry))
        telemetry = sim.advance()
    assert checked > 10
