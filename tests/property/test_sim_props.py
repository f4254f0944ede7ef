"""Invariants of the simulated fleet under random actions and capacity changes: a GPU is
never double-booked, used ≤ total per offering every tick, and every request is
accounted for (served, dropped with a reason, or still queued)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.cluster import Action, ActionKind, PlanDecision
from koi.scenario.types import CapacityEvent
from koi.sim import Simulator
from koi.sim.testing import batch_job, online_job, tiny_scenario
from koi.sim.world import load_world
from koi.space import engine_default_config

CAT = load_catalog()
OFFS = ("aws/us-east-1/h100-sxm/on_demand", "runpod/us/h100-sxm/spot",
        "aws/us-east-1/h100-sxm/spot")
JOBS = ("a", "b", "bulk")

action_st = st.tuples(st.sampled_from(["launch", "scale", "swap", "relaunch", "drain", "stop",
                                       "reject"]),
                      st.sampled_from(JOBS), st.sampled_from(OFFS), st.integers(1, 4),
                      st.sampled_from([1, 2]), st.integers(0, 3))


def _action(sim: Simulator, spec: tuple) -> Action:
    kind, job, off, n, tp, which = spec
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", CAT, offering=off, tp=tp)
    deps = [d for d in sim.snapshot().deployments if d.job_id == job]
    dep_id = deps[which % len(deps)].id if deps else "missing"
    return Action(ActionKind(kind), job, "prop", deployment_id=dep_id, config=cfg,
                  offering=off, replicas=n)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(st.lists(action_st, max_size=3), min_size=3, max_size=8),
       cut=st.integers(-12, 8), seed=st.integers(0, 5))
def test_fleet_invariants_hold_under_random_actions(plan, cut, seed) -> None:
    jobs = [online_job("a", rate=3), online_job("b", rate=2, out=300), batch_job("bulk", 800)]
    fleet = {OFFS[0]: 8, OFFS[1]: 6, OFFS[2]: 4}
    events = (CapacityEvent(120.0, OFFS[0], cut), CapacityEvent(240.0, OFFS[1], -3))
    sc = tiny_scenario(jobs, fleet, horizon_s=60 * len(plan), events=events)
    world = load_world({"preemption_mult": {"runpod": 3e4, "aws": 3e4}})
    sim = Simulator(sc, seed=seed, world=world)
    for tick_actions in plan:
        if sim.done:
            break
        outcomes = sim.apply(PlanDecision(sim.tick, tuple(_action(sim, a)
                                                          for a in tick_actions)))
        assert all(o.applied or o.reason for o in outcomes)
        sim.advance()
        sim.fleet.check_invariants()
        for c in sim.snapshot().capacity:
            assert 0 <= c.used_gpus <= c.total_gpus
    rec = sim.record("random")
    for j in rec.jobs:
        if j.kind == "online":
            assert j.served_requests + j.dropped_requests + j.queued_at_end == pytest.approx(
                j.offered_requests, abs=1e-6)
        else:
            assert 0 <= j.served_requests <= 800 + 1e-6
            assert j.served_requests + j.queued_at_end == pytest.approx(800)
