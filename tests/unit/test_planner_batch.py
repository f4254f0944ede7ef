"""Koi's tick: batch jobs at the deadline's pace first, ahead of it on spare capacity,
and a late job only on capacity no job still on time wants; which DRO radii tighten it."""

from __future__ import annotations

import math

import pytest

from koi.catalog import load_catalog
from koi.cluster import ActionKind, ClusterSnapshot, JobStatus, OfferingCapacity
from koi.jobs import parse_job
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState, plan_tick

CAT = load_catalog()
H100 = "aws/us-east-1/h100-sxm/on_demand"
FAST = KoiSettings(backend="numpy", compose_time_limit_s=0.3)


def batch(jid: str, submit_s: float, deadline_s: float, requests: int = 20_000) -> JobStatus:
    spec = parse_job({"kind": "batch", "id": jid, "model": "llama-3.1-8b",
                      "num_requests": requests, "input_len": 1000, "output_len": 300,
                      "deadline_s": deadline_s, "submit_s": submit_s})
    return JobStatus(spec=spec, admitted=True, rejected=False)


def launches(jobs: list[JobStatus], gpus: int, now: float,
             settings: KoiSettings = FAST) -> dict[str, tuple[int, str]]:
    snap = ClusterSnapshot(0, now, 60.0, 10 * 3600.0, (OfferingCapacity(H100, gpus, 0),), (),
                           tuple(jobs))
    decision, _, _ = plan_tick(snap, [], KoiState(), settings, CAT)
    return {a.job_id: (a.replicas * a.config.gpus_per_replica, a.reason)
            for a in decision.actions if a.kind == ActionKind.LAUNCH and a.config}


def test_a_late_job_yields_to_one_on_time_and_finishes_on_spare_capacity() -> None:
    late = batch("late", submit_s=0.0, deadline_s=3600.0)       # 600 s past its deadline
    on_time = batch("on-time", submit_s=3600.0, deadline_s=3600.0, requests=200_000)
    alone = launches([late], gpus=8, now=4200.0)
    assert "late" in alone and "deadline passed: finishing on spare capacity" in alone["late"][1]
    both = launches([late, on_time], gpus=1, now=4200.0)
    assert set(both) == {"on-time"}


def test_pace_above_one_runs_ahead_only_with_spare_gpus() -> None:
    job = batch("bulk", submit_s=0.0, deadline_s=4 * 3600.0, requests=500_000)
    paced = launches([job], gpus=64, now=0.0,
                     settings=KoiSettings(backend="numpy", compose_time_limit_s=0.3,
                                          batch_pace=3.0))
    at_pace = launches([job], gpus=64, now=0.0, settings=FAST)
    assert paced["bulk"][0] > at_pace["bulk"][0]
    assert "ahead of it on spare capacity" in paced["bulk"][1]


def test_only_the_configured_outcomes_radius_tightens_the_plan() -> None:
    """The calibrator's prior radius (0.5) widens the robust TTFT p95 by e^0.5 when
    ``dro_outcomes`` names it (the default) and not otherwise; TPOT p95 keeps its own."""
    from koi.causal.store import BeliefStore
    from koi.dro import DroCalibrator
    from koi.planner.tick import evaluate_stage, propose_stage, tick_inputs

    chat = JobStatus(spec=parse_job({"kind": "online", "id": "chat", "model": "llama-3.1-8b",
                                     "arrival": {"rate_rps": 2}, "input_len": 800,
                                     "output_len": 200,
                                     "slo": {"ttft_ms": 2000, "tpot_ms": 100}}),
                     admitted=False, rejected=False)
    snap = ClusterSnapshot(0, 0.0, 60.0, 3600.0, (OfferingCapacity(H100, 8, 0),), (), (chat,))
    no_ttft = KoiSettings(backend="numpy", dro_outcomes=("tpot_p95", "throughput"))
    props = propose_stage(snap, [], FAST, CAT)
    ev = {name: evaluate_stage(props, tick_inputs(snap, BeliefStore(), DroCalibrator(), s,
                                                  CAT))
          for name, s in (("default", FAST), ("no_ttft", no_ttft))}
    assert set(FAST.dro_outcomes) == {"ttft_p95", "tpot_p95", "throughput"}
    ratio_ttft = ev["default"].ttft_p95_ms / ev["no_ttft"].ttft_p95_ms
    ratio_tpot = ev["default"].tpot_p95_ms / ev["no_ttft"].tpot_p95_ms
    assert ratio_ttft == pytest.approx(math.exp(0.5))
    assert ratio_tpot == pytest.approx(1.0)


def test_an_unknown_dro_outcome_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="dro_outcomes: ttft not among"):
        KoiSettings(dro_outcomes=("ttft", "tpot_p95"))


def test_a_batch_job_is_stopped_when_its_requests_are_done_not_its_token_total() -> None:
    """The sampled outputs sum to a little more or less than the expected total: a job
    with every request finished is stopped short of it (before, its replicas idled on);
    one with requests left keeps serving past it."""
    from koi.cluster import Deployment, DeploymentState
    from koi.space import engine_default_config

    def tick(job: JobStatus) -> list:
        cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", CAT, offering=H100,
                                    replicas=2)
        dep = Deployment("d-bulk", job.id, cfg, H100, DeploymentState.RUNNING, 2, 0, 0.0)
        snap = ClusterSnapshot(10, 600.0, 60.0, 10 * 3600.0,
                               (OfferingCapacity(H100, 8, dep.gpus),), (dep,), (job,))
        decision, _, _ = plan_tick(snap, [], KoiState(), FAST, CAT)
        return [a.kind for a in decision.actions if a.deployment_id == "d-bulk"]

    spec = batch("bulk", submit_s=0.0, deadline_s=3600.0).spec
    total, n = spec.total_output_tokens, spec.num_requests
    drained = JobStatus(spec=spec, admitted=True, rejected=False,
                        output_tokens_done=0.95 * total, requests_done=n)
    assert tick(drained) == [ActionKind.STOP]
    long_tail = JobStatus(spec=spec, admitted=True, rejected=False,
                          output_tokens_done=1.02 * total, requests_done=n - 50)
    assert ActionKind.STOP not in tick(long_tail)
