"""Koi's tick on random clusters: within capacity, valid knobs, never a silent drop."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.cluster import ActionKind, ClusterSnapshot, JobStatus, OfferingCapacity
from koi.jobs import parse_job
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState, plan_tick
from koi.space import validate

CAT = load_catalog()
OFFERINGS = ["aws/us-east-1/h100-sxm/on_demand", "aws/us-east-1/h100-sxm/spot",
             "azure/eastus/a100-80gb/spot", "runpod/us/l40s/spot", "aws/us-east-1/l4/on_demand"]
MODELS = ["llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "mixtral-8x7b"]
FAST = KoiSettings(backend="numpy", compose_time_limit_s=0.3)


def online(jid: str, model: str, rate: float, ttft: float, tpot: float) -> JobStatus:
    spec = parse_job({"kind": "online", "id": jid, "model": model,
                      "arrival": {"rate_rps": rate}, "input_len": 800, "output_len": 200,
                      "slo": {"ttft_ms": ttft, "tpot_ms": tpot}})
    return JobStatus(spec=spec, admitted=False, rejected=False)


def batch(jid: str, model: str, requests: int) -> JobStatus:
    spec = parse_job({"kind": "batch", "id": jid, "model": model, "num_requests": requests,
                      "input_len": 1000, "output_len": 300, "deadline_s": 3600})
    return JobStatus(spec=spec, admitted=False, rejected=False)


def snapshot(caps: list[int], jobs: list[JobStatus]) -> ClusterSnapshot:
    capacity = tuple(OfferingCapacity(o, c, 0) for o, c in zip(OFFERINGS, caps, strict=True))
    return ClusterSnapshot(0, 0.0, 60.0, 3600.0, capacity, (), tuple(jobs))


jobs_st = st.lists(
    st.one_of(
        st.builds(lambda m, r, t: ("online", m, r, t), st.sampled_from(MODELS),
                  st.floats(0.2, 30.0), st.sampled_from([300.0, 1000.0, 3000.0])),
        st.builds(lambda m, n: ("batch", m, n), st.sampled_from(MODELS),
                  st.integers(100, 200_000))),
    min_size=1, max_size=6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 64), min_size=len(OFFERINGS), max_size=len(OFFERINGS)),
       jobs_st)
def test_plan_within_capacity_with_valid_configs(caps: list[int], specs: list) -> None:
    jobs = [online(f"j{i}", s[1], s[2], s[3], 80.0) if s[0] == "online"
            else batch(f"j{i}", s[1], s[2]) for i, s in enumerate(specs)]
    snap = snapshot(caps, jobs)
    decision, report, _ = plan_tick(snap, [], KoiState(), FAST, CAT)
    used: dict[str, int] = defaultdict(int)
    decided = set()
    for a in decision.actions:
        decided.add(a.job_id)
        assert a.reason
        if a.kind == ActionKind.LAUNCH:
            assert a.config is not None and not validate(a.config, CAT)
            used[a.offering] += a.replicas * a.config.gpus_per_replica
    for off, cap in zip(OFFERINGS, caps, strict=True):
        assert used[off] <= cap
    # every job is launched, deferred or rejected — with a reason — never dropped
    assert decided == {j.id for j in jobs}
    assert len(report.explanations) == len(jobs)


def test_impossible_slo_is_rejected_with_the_reason() -> None:
    jobs = [online("fast", "llama-3.1-70b", 2.0, ttft=1.0, tpot=0.5),
            online("fine", "llama-3.1-8b", 2.0, ttft=2000.0, tpot=100.0)]
    decision, _, _ = plan_tick(snapshot([16, 16, 16, 16, 16], jobs), [], KoiState(), FAST, CAT)
    by_job = {a.job_id: a for a in decision.actions}
    assert by_job["fast"].kind == ActionKind.REJECT
    assert "SLO" in by_job["fast"].reason and "TTFT" in by_job["fast"].reason
    assert "at any load" in by_job["fast"].reason  # not only at the job's whole load
    assert by_job["fine"].kind == ActionKind.LAUNCH
