"""How Koi's tick paces batch jobs: at the deadline's pace first, ahead of it on spare
capacity, and a late job only on capacity no job still on time wants."""

from __future__ import annotations

from koi.catalog import load_catalog
from koi.cluster import ActionKind, ClusterSnapshot, JobStatus, OfferingCapacity
from koi.jobs import parse_job
from koi.planner.tick import KoiSettings, KoiState, plan_tick

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
