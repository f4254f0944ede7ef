"""The practitioner policies: registry, short simulated runs, and unit checks of each core.

The runs and core checks use the predictor-profiled variants (``<name>-unprofiled``): they
need no profile of a world; the profiled ones are tested in test_profiled_policies.py."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.cluster import (
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    DeploymentTelemetry,
    JobStatus,
    OfferingCapacity,
    PlanDecision,
)
from koi.jobs import Arrival, BatchJob, LengthDist, OnlineJob, Slo
from koi.metrics import metrics_for
from koi.policies import make_policy, policy_names
from koi.policies.bandit import LinUCB
from koi.policies.melange import Column, solve_mix
from koi.scenario import load_scenario
from koi.shapes import default_config
from koi.sim import Simulator

CAT = load_catalog()
NAMES = ("bandit-unprofiled", "evolve-unprofiled", "melange-ilp-unprofiled",
         "regress-autoscale-unprofiled")
H100_OD = "aws/us-east-1/h100-sxm/on_demand"
H100_SPOT = "aws/us-east-1/h100-sxm/spot"
L4_OD = "aws/us-east-1/l4/on_demand"
HORIZON_S = 600.0


def online(job_id: str, *, rate: float = 4.0, model: str = "llama-3.1-8b",
           ttft_ms: float = 1000, tpot_ms: float = 60) -> OnlineJob:
    return OnlineJob(id=job_id, model=model, arrival=Arrival.poisson(rate),
                     input_len=LengthDist.fixed(512), output_len=LengthDist.fixed(128),
                     slo=Slo(ttft_ms=ttft_ms, tpot_ms=tpot_ms))


def batch(job_id: str, *, n: int = 20000) -> BatchJob:
    return BatchJob(id=job_id, model="llama-3.1-8b", num_requests=n,
                    input_len=LengthDist.fixed(256), output_len=LengthDist.fixed(128),
                    deadline_s=3600.0)


def snap(jobs, capacity, deployments=(), *, tick: int = 0) -> ClusterSnapshot:
    statuses = tuple(j if isinstance(j, JobStatus) else JobStatus(j, False, False) for j in jobs)
    return ClusterSnapshot(tick, tick * 60.0, 60.0, 3 * 3600.0,
                           tuple(OfferingCapacity(o, t, u) for o, t, u in capacity),
                           tuple(deployments), statuses)


def gpus_claimed(decision: PlanDecision) -> dict[str, int]:
    used: dict[str, int] = defaultdict(int)
    for a in decision.actions:
        if a.kind in (ActionKind.LAUNCH, ActionKind.SWAP):
            assert a.config is not None
            used[a.offering] += a.replicas * a.config.gpus_per_replica
    return used


# --- registry and short runs ----------------------------------------------------------------

def test_registered_and_constructible() -> None:
    assert set(NAMES) <= set(policy_names())
    for name in NAMES:
        policy = make_policy(name, catalog=CAT, seed=3)
        assert policy.name == name and policy.seed == 3


def _run(name: str, seed: int = 0) -> tuple[dict, list[str], int]:
    scenario = dataclasses.replace(load_scenario("hetero-3h"), horizon_s=HORIZON_S)
    sim = Simulator(scenario, seed=seed, catalog=CAT)
    policy = make_policy(name, catalog=CAT, seed=seed)
    telemetry: list[DeploymentTelemetry] = []
    refused, actions = [], 0
    while not sim.done:
        decision = policy.decide(sim.snapshot(), telemetry)
        assert all(a.reason for a in decision.actions)
        actions += len(decision.actions)
        for out in sim.apply(decision):
            if not out.applied and out.action.kind in (ActionKind.LAUNCH, ActionKind.SCALE,
                                                       ActionKind.SWAP):
                refused.append(out.reason)
        telemetry = sim.advance()
    return metrics_for(sim.record(name), scenario, CAT).to_dict(), refused, actions


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[dict, list[str], int]]:
    return {name: _run(name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_short_run_end_to_end(runs, name: str) -> None:
    metrics, refused, actions = runs[name]
    assert actions > 0
    assert sum("capacity" in r for r in refused) <= 2, refused
    assert metrics["admit_online_pct"] > 50.0
    assert 0.0 <= metrics["overall_score"] <= 100.0


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_for_a_seed(runs, name: str) -> None:
    assert _run(name)[0] == runs[name][0]


# --- bandit ---------------------------------------------------------------------------------

def test_linucb_learns_the_better_arm() -> None:
    rng = np.random.default_rng(0)
    bandit = LinUCB(dim=2, alpha=0.5)
    x = np.array([1.0, 0.5])
    truth = {"a": 0.2, "b": 1.0}
    picks = []
    for _ in range(60):
        i = bandit.choose([("a", x), ("b", x)], rng)
        arm = "ab"[i]
        picks.append(arm)
        bandit.update(arm, x, truth[arm] + 0.05 * rng.standard_normal())
    assert picks[-20:].count("b") >= 18
    assert bandit.ucb("b", x)[0] > bandit.ucb("a", x)[0]


def test_bandit_first_placement_is_valid_and_within_capacity() -> None:
    jobs = [online(f"s{i}", rate=6.0) for i in range(4)] + [batch("b")]
    cap = [(H100_OD, 8, 2), (L4_OD, 4, 0)]
    d = make_policy("bandit-unprofiled", catalog=CAT).decide(snap(jobs, cap), ())
    used = gpus_claimed(d)
    assert used and all(used[o] <= t - u for o, t, u in cap)


# --- melange-ilp ----------------------------------------------------------------------------

def _columns() -> list[Column]:
    small = default_config("llama-3.1-8b", "l4", CAT, tp=1, precision="fp8")
    big = default_config("llama-3.1-8b", "h100-sxm", CAT, tp=1)
    assert small is not None and big is not None
    return [Column(0, small, CAT.offering(L4_OD), rate=2.0, usd_h=1.0),
            Column(0, big, CAT.offering(H100_OD), rate=10.0, usd_h=4.0)]


def test_melange_picks_the_cheapest_mix_meeting_the_rate() -> None:
    cols = _columns()
    x, short = solve_mix(cols, [10.0], {L4_OD: 8, H100_OD: 8})
    assert list(x) == [0, 1] and short[0] == pytest.approx(0.0)     # $4 beats 5 × $1
    x, short = solve_mix(cols, [12.0], {L4_OD: 8, H100_OD: 8})
    assert list(x) == [1, 1] and short[0] == pytest.approx(0.0)     # $5 beats $8 and $6
    x, short = solve_mix(cols, [10.0], {L4_OD: 8, H100_OD: 0})
    assert list(x) == [5, 0]                                        # no H100 left


def test_melange_serves_partially_when_the_fleet_is_short() -> None:
    x, short = solve_mix(_columns(), [30.0], {L4_OD: 2, H100_OD: 1})
    assert list(x) == [2, 1] and short[0] == pytest.approx(16.0)


# --- regress-autoscale ----------------------------------------------------------------------

def _telemetry(dep: str, job: str, ttft_p95: float, tpot_p95: float, rate: float) -> DeploymentTelemetry:
    return DeploymentTelemetry(
        tick=0, deployment_id=dep, job_id=job, window_s=60.0, requests_arrived=rate * 60,
        requests_finished=rate * 60, requests_dropped=0.0, prompt_tokens=0.0,
        generation_tokens=0.0, ttft_bucket_bounds_s=(), ttft_bucket_counts=(0.0,),
        tpot_bucket_bounds_s=(), tpot_bucket_counts=(0.0,), ttft_mean_s=ttft_p95 / 2,
        ttft_p95_s=ttft_p95, tpot_mean_s=tpot_p95 / 2, tpot_p95_s=tpot_p95,
        kv_cache_usage=0.5, num_running=8.0, num_waiting=20.0, num_preemptions=0.0,
        replica_preemptions=0, output_tok_s=500.0, gpu_seconds=120.0, cost_usd=0.2)


def _autoscale_case(ttft_p95: float, tpot_p95: float, free: int = 8):
    job = online("svc", rate=8.0, ttft_ms=1000, tpot_ms=60)
    cfg = default_config("llama-3.1-8b", "h100-sxm", CAT, tp=1)
    assert cfg is not None
    dep = Deployment("svc-d1", "svc", cfg.with_(offering=H100_OD, replicas=2), H100_OD,
                     DeploymentState.RUNNING, 2, 0, 0.0)
    s = snap([JobStatus(job, True, False, observed_rate_rps=8.0)], [(H100_OD, 2 + free, 2)],
             [dep], tick=3)
    return s, [_telemetry("svc-d1", "svc", ttft_p95, tpot_p95, 8.0)]


def test_autoscale_scales_up_when_p95_exceeds_the_slo() -> None:
    s, tel = _autoscale_case(ttft_p95=3.0, tpot_p95=0.05)
    d = make_policy("regress-autoscale-unprofiled", catalog=CAT).decide(s, tel)
    (scale,) = [a for a in d.actions if a.kind == ActionKind.SCALE]
    assert scale.deployment_id == "svc-d1" and scale.replicas >= 6 and scale.reason


def test_autoscale_scale_up_is_bounded_by_free_gpus() -> None:
    s, tel = _autoscale_case(ttft_p95=3.0, tpot_p95=0.05, free=1)
    d = make_policy("regress-autoscale-unprofiled", catalog=CAT).decide(s, tel)
    (scale,) = [a for a in d.actions if a.kind == ActionKind.SCALE]
    assert scale.replicas == 3


def test_autoscale_scales_down_only_slowly() -> None:
    policy = make_policy("regress-autoscale-unprofiled", catalog=CAT)
    kinds = []
    for _ in range(4):
        s, tel = _autoscale_case(ttft_p95=0.05, tpot_p95=0.005)
        d = policy.decide(s, tel)
        kinds.append([(a.kind, a.replicas) for a in d.actions if a.kind == ActionKind.SCALE])
    assert kinds[0] == [] and kinds[1] == []
    assert [(ActionKind.SCALE, 1)] in kinds[2:]


# --- evolve ---------------------------------------------------------------------------------

def test_evolve_respects_capacity() -> None:
    jobs = [online(f"s{i}", rate=20.0) for i in range(6)] + [batch("b", n=200000)]
    cap = [(H100_OD, 6, 1), (H100_SPOT, 4, 0), (L4_OD, 4, 0)]
    policy = make_policy("evolve-unprofiled", catalog=CAT, seed=1)
    s = snap(jobs, cap)
    d = policy.decide(s, ())
    used = gpus_claimed(d)
    assert used and all(used[o] <= t - u for o, t, u in cap)
    opts = policy.options(list(s.jobs), s)
    g, r, _ = policy.search(opts, list(s.jobs), s)
    use = policy.usage(opts, g[None, :], r[None, :])[0]
    assert np.all(use <= opts.capacity)
