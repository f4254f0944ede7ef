"""Baseline invariants (hypothesis): plans never exceed free capacity and name real jobs."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.cluster import (
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
    OfferingCapacity,
)
from koi.jobs import Arrival, BatchJob, JobSpec, LengthDist, OnlineJob, Slo
from koi.policies import make_policy
from koi.policies.bookkeeping import needs_placement
from koi.shapes import smallest_fitting_config
from koi.space import validate

CAT = load_catalog()
OFFERINGS = ("aws/us-east-1/l4/on_demand", "aws/us-east-1/a10g/spot",
             "aws/us-east-1/h100-sxm/on_demand", "aws/us-east-1/h100-sxm/spot",
             "gcp/us-central1/h200/on_demand", "azure/eastus/a100-80gb/on_demand",
             "runpod/us/l40s/on_demand")
MODELS = ("llama-3.1-8b", "mistral-7b", "qwen2.5-32b", "llama-3.1-70b")
POLICIES = ("fcfs-first-fit", "edf-first-fit", "best-fixed")
SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def job_specs(draw: st.DrawFn, idx: int) -> JobSpec:
    model = draw(st.sampled_from(MODELS))
    submit = draw(st.floats(0, 3000))
    lengths = dict(input_len=LengthDist.fixed(draw(st.integers(16, 4096))),
                   output_len=LengthDist.fixed(draw(st.integers(8, 1024))))
    if draw(st.booleans()):
        return OnlineJob(id=f"on{idx}", model=model,
                         arrival=Arrival.poisson(draw(st.floats(0.05, 60.0))),
                         slo=Slo(ttft_ms=draw(st.floats(100, 5000)),
                                 tpot_ms=draw(st.floats(10, 200))),
                         submit_s=submit, **lengths)
    return BatchJob(id=f"b{idx}", model=model, num_requests=draw(st.integers(1, 10_000)),
                    deadline_s=draw(st.floats(60, 20_000)), submit_s=submit, **lengths)


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    offerings = draw(st.lists(st.sampled_from(OFFERINGS), min_size=1, max_size=5, unique=True))
    capacity = []
    for o in offerings:
        total = draw(st.integers(0, 24))
        capacity.append(OfferingCapacity(o, total, draw(st.integers(0, total + 4))))
    n = draw(st.integers(1, 7))
    jobs, deployments = [], []
    for i in range(n):
        spec = draw(job_specs(i))
        state = draw(st.sampled_from(("pending", "running", "lost", "rejected", "done")))
        finished = state == "done" and isinstance(spec, BatchJob)
        jobs.append(JobStatus(spec=spec, admitted=state in ("running", "lost", "done"),
                              rejected=state == "rejected",
                              output_tokens_done=spec.total_output_tokens if finished else 0,
                              requests_done=spec.num_requests if finished else 0))
        if state in ("running", "lost", "done"):
            off = draw(st.sampled_from(offerings))
            cfg = smallest_fitting_config(spec.model, CAT.offering(off).accelerator, CAT)
            if cfg is None:
                continue
            ready = 0 if state == "lost" else draw(st.integers(1, 3))
            deployments.append(Deployment(
                id=f"dep-{i}", job_id=spec.id, config=cfg.with_(offering=off, replicas=max(1, ready)),
                offering=off, state=DeploymentState.RUNNING, replicas_ready=ready,
                replicas_starting=0, started_s=0.0))
    return ClusterSnapshot(tick=draw(st.integers(0, 100)), time_s=draw(st.floats(0, 3600)),
                           tick_s=60.0, horizon_s=4 * 3600.0, capacity=tuple(capacity),
                           deployments=tuple(deployments), jobs=tuple(jobs))


@SETTINGS
@given(snapshot=snapshots(), name=st.sampled_from(POLICIES))
def test_plans_fit_free_capacity_and_reference_known_jobs(snapshot: ClusterSnapshot,
                                                          name: str) -> None:
    decision = make_policy(name, catalog=CAT).decide(snapshot, ())
    free = {c.offering: c.free_gpus for c in snapshot.capacity}
    deployments = {d.id: d for d in snapshot.deployments}
    job_ids = {j.id for j in snapshot.jobs}
    claimed: dict[str, int] = defaultdict(int)
    for a in decision.actions:
        assert a.job_id in job_ids
        assert a.reason
        if a.kind in (ActionKind.LAUNCH, ActionKind.SCALE):
            cfg = a.config or deployments[a.deployment_id].config
            offering = a.offering or deployments[a.deployment_id].offering
            current = deployments[a.deployment_id].config.replicas if a.kind == ActionKind.SCALE else 0
            claimed[offering] += max(0, a.replicas - current) * cfg.gpus_per_replica
        if a.kind == ActionKind.LAUNCH:
            assert a.config is not None and a.replicas >= 1
            assert a.config.replicas == a.replicas and a.config.offering == a.offering
            assert a.config.model == next(j.spec.model for j in snapshot.jobs if j.id == a.job_id)
            assert not validate(a.config, CAT)
        if a.kind in (ActionKind.STOP, ActionKind.DRAIN):
            assert deployments[a.deployment_id].job_id == a.job_id
    for offering, gpus in claimed.items():
        assert gpus <= free.get(offering, 0), (offering, gpus, free)


@SETTINGS
@given(snapshot=snapshots(), name=st.sampled_from(POLICIES))
def test_every_job_needing_a_place_is_launched_or_deferred_once(snapshot: ClusterSnapshot,
                                                                 name: str) -> None:
    decision = make_policy(name, catalog=CAT).decide(snapshot, ())
    placed = [a.job_id for a in decision.actions
              if a.kind in (ActionKind.LAUNCH, ActionKind.DEFER)]
    assert len(placed) == len(set(placed))
    for job in snapshot.jobs:
        assert (job.id in placed) == needs_placement(job, snapshot)
        if job.rejected:
            assert job.id not in placed
