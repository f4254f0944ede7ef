"""The true oracle's predictor: one replica of the hidden world, measured."""

from __future__ import annotations

from dataclasses import replace

from koi.catalog import load_catalog
from koi.sim.testing import batch_job, online_job
from koi.sim.truth import WorldTruth, client_latency_s, expected_slowdown
from koi.sim.world import load_world
from koi.space import engine_default_config

CAT = load_catalog()
L4 = CAT.offering("aws/us-east-1/l4/on_demand")
CFG = engine_default_config("llama-3.1-8b", "l4", "vllm", CAT)


def truth(**world: object) -> WorldTruth:
    return WorldTruth(load_world(dict(world)), CAT, requests=150)


def test_measurements_are_deterministic_and_cached() -> None:
    job = online_job("a", ttft_ms=2000, tpot_ms=100)
    t = truth()
    first = t.max_rate_rps(CFG, job, L4)
    runs = t.measured
    assert first > 0 and t.max_rate_rps(CFG, job, L4) == first and t.measured == runs
    assert truth().max_rate_rps(CFG, job, L4) == first


def test_a_faster_world_serves_more_and_a_slow_region_less() -> None:
    job = batch_job("b")
    base = truth().saturated_tok_s(CFG, job, L4)
    assert truth(mem_eff={"l4": 0.95}, comp_eff={"l4": 0.9}).saturated_tok_s(CFG, job, L4) > base
    assert truth(slow_regions={"aws/us-east-1": 1.5}).saturated_tok_s(CFG, job, L4) < base


def test_the_slo_bound_rate_grows_as_the_slo_loosens_and_is_0_when_impossible() -> None:
    t = truth()
    tight = t.max_rate_rps(CFG, online_job("tight", ttft_ms=600, tpot_ms=90), L4)
    loose = t.max_rate_rps(CFG, online_job("loose", ttft_ms=4000, tpot_ms=200), L4)
    assert 0 < tight < loose
    assert t.max_rate_rps(CFG, online_job("never", ttft_ms=1, tpot_ms=1), L4) == 0.0
    # no SLO to meet: the saturated request rate
    b = batch_job("b", out=200)
    assert t.max_rate_rps(CFG, b, L4) == t.saturated_tok_s(CFG, b, L4) / 200


def test_remote_clients_pay_the_cross_region_latency_on_every_ttft() -> None:
    world = load_world({"cross_region_latency_ms": 300.0})
    near = online_job("near", ttft_ms=350, tpot_ms=200, client_region="aws/us-east-1")
    far = replace(near, id="far", client_region="gcp/europe-west4")
    assert client_latency_s(world, far, L4) == 0.3
    t = WorldTruth(world, CAT, requests=150)
    assert t.max_rate_rps(CFG, far, L4) < t.max_rate_rps(CFG, near, L4)


def test_expected_slowdown_is_the_mean_of_straggling_and_throttling() -> None:
    world = load_world({"straggler_prob": 0.1, "straggler_slowdown": 2.0,
                        "throttle_share": {"l4": 0.5}, "throttle_slowdown": 1.2})
    assert abs(expected_slowdown(world, "l4") - 1.1 * 1.1) < 1e-12
    assert abs(expected_slowdown(world, "h100-sxm") - 1.1) < 1e-12
