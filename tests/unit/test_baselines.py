"""Baseline policies driven tick by tick with small hand-built cluster snapshots."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import pytest

from koi.catalog import load_catalog
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
    OfferingCapacity,
    PlanDecision,
)
from koi.jobs import Arrival, BatchJob, JobSpec, LengthDist, OnlineJob, Slo
from koi.policies import make_policy, policy_names
from koi.policies.baselines import (
    MAX_BATCH_REPLICAS,
    ONLINE_DEADLINE_S,
    RPS_PER_REPLICA,
    BestFixed,
    edf_deadline_s,
)
from koi.policies.bookkeeping import CapacityLedger
from koi.shapes import smallest_fitting_config
from koi.space import validate

CAT = load_catalog()
H100_OD = "aws/us-east-1/h100-sxm/on_demand"
H100_SPOT = "aws/us-east-1/h100-sxm/spot"
L4_OD = "aws/us-east-1/l4/on_demand"
A10G_OD = "aws/us-east-1/a10g/on_demand"
H200_OD = "aws/us-east-1/h200/on_demand"


# --- builders -----------------------------------------------------------------------------

def online(job_id: str, *, rate: float = 2.0, submit: float = 0.0, model: str = "llama-3.1-8b",
           end: float | None = None, ttft_ms: float = 2000, tpot_ms: float = 100) -> OnlineJob:
    return OnlineJob(id=job_id, model=model, arrival=Arrival.poisson(rate),
                     input_len=LengthDist.fixed(512), output_len=LengthDist.fixed(128),
                     slo=Slo(ttft_ms=ttft_ms, tpot_ms=tpot_ms), submit_s=submit, end_s=end)


def batch(job_id: str, *, deadline: float = 3600.0, submit: float = 0.0,
          model: str = "llama-3.1-8b", n: int = 1000) -> BatchJob:
    return BatchJob(id=job_id, model=model, num_requests=n, input_len=LengthDist.fixed(256),
                    output_len=LengthDist.fixed(128), deadline_s=deadline, submit_s=submit)


def status(spec: JobSpec, **kw: object) -> JobStatus:
    kw.setdefault("admitted", False)
    kw.setdefault("rejected", False)
    return JobStatus(spec=spec, **kw)  # type: ignore[arg-type]


def snap(jobs: Sequence[JobSpec | JobStatus], capacity: Sequence[tuple[str, int, int]],
         deployments: Sequence[Deployment] = (), *, tick: int = 0,
         time_s: float = 0.0) -> ClusterSnapshot:
    statuses = tuple(j if isinstance(j, JobStatus) else status(j) for j in jobs)
    return ClusterSnapshot(
        tick=tick, time_s=time_s, tick_s=60.0, horizon_s=3 * 3600.0,
        capacity=tuple(OfferingCapacity(o, total, used) for o, total, used in capacity),
        deployments=tuple(deployments), jobs=statuses)


def deployment(dep_id: str, job: JobSpec, offering: str, *, replicas: int = 1, ready: int = 1,
               starting: int = 0, state: DeploymentState = DeploymentState.RUNNING) -> Deployment:
    accel = CAT.offering(offering).accelerator
    cfg = smallest_fitting_config(job.model, accel, CAT)
    assert cfg is not None
    return Deployment(id=dep_id, job_id=job.id,
                      config=cfg.with_(offering=offering, replicas=replicas),
                      offering=offering, state=state, replicas_ready=ready,
                      replicas_starting=starting, started_s=0.0)


def of_kind(decision: PlanDecision, kind: ActionKind) -> list[Action]:
    return [a for a in decision.actions if a.kind == kind]


def launched_gpus(decision: PlanDecision) -> dict[str, int]:
    used: dict[str, int] = defaultdict(int)
    for a in of_kind(decision, ActionKind.LAUNCH):
        assert a.config is not None
        used[a.offering] += a.replicas * a.config.gpus_per_replica
    return used


def decide(name: str, snapshot: ClusterSnapshot) -> PlanDecision:
    return make_policy(name, catalog=CAT).decide(snapshot, ())


# --- registry -----------------------------------------------------------------------------

def test_baselines_are_registered() -> None:
    assert {"fcfs-first-fit", "edf-first-fit", "best-fixed"} <= set(policy_names())


# --- first-fit placement ----------------------------------------------------------------

def test_fcfs_places_in_submission_order() -> None:
    first, second = batch("late-deadline", submit=0, deadline=7200), batch("urgent", submit=10,
                                                                           deadline=600)
    d = decide("fcfs-first-fit", snap([second, first], [(H100_OD, 8, 0)]))
    launch = of_kind(d, ActionKind.LAUNCH)
    assert [a.job_id for a in launch] == ["late-deadline"]
    assert launch[0].replicas == MAX_BATCH_REPLICAS      # takes everything, up to 8
    defer = of_kind(d, ActionKind.DEFER)
    assert [(a.job_id, a.reason) for a in defer] == [("urgent", "no capacity")]


def test_edf_places_the_earliest_deadline_first() -> None:
    first, second = batch("late-deadline", submit=0, deadline=7200), batch("urgent", submit=10,
                                                                           deadline=600)
    d = decide("edf-first-fit", snap([first, second], [(H100_OD, 8, 0)]))
    assert [a.job_id for a in of_kind(d, ActionKind.LAUNCH)] == ["urgent"]
    assert [a.job_id for a in of_kind(d, ActionKind.DEFER)] == ["late-deadline"]


def test_edf_puts_online_jobs_before_batch_due_later() -> None:
    svc = online("svc", submit=100, rate=2.0)
    work = batch("work", submit=0, deadline=3600)
    assert edf_deadline_s(status(svc)) == 100 + ONLINE_DEADLINE_S
    d = decide("edf-first-fit", snap([work, svc], [(H100_OD, 1, 0)]))
    assert [a.job_id for a in of_kind(d, ActionKind.LAUNCH)] == ["svc"]
    d = decide("fcfs-first-fit", snap([work, svc], [(H100_OD, 1, 0)]))
    assert [a.job_id for a in of_kind(d, ActionKind.LAUNCH)] == ["work"]


def test_first_offering_in_capacity_order_with_room() -> None:
    job = online("svc", rate=1.0)
    d = decide("fcfs-first-fit", snap([job], [(A10G_OD, 4, 4), (L4_OD, 2, 0), (H100_OD, 8, 0)]))
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.offering == L4_OD and launch.config is not None
    assert launch.config.accelerator == "l4" and launch.config.offering == L4_OD
    assert launch.config.tp == 1 and launch.config.weight_precision == "bf16"
    assert launch.config.engine == "vllm" and not validate(launch.config, CAT)
    assert launch.reason and launch.deployment_id


def test_offerings_where_the_model_does_not_fit_in_bf16_are_skipped() -> None:
    job = online("big", model="llama-3.1-405b", rate=1.0)
    assert smallest_fitting_config("llama-3.1-405b", "h100-sxm", CAT) is None
    d = decide("fcfs-first-fit", snap([job], [(H100_OD, 16, 0), (H200_OD, 8, 0)]))
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.offering == H200_OD and launch.config is not None
    assert launch.config.tp == 8


def test_smallest_tp_that_fits() -> None:
    job = online("mid", model="llama-3.1-70b", rate=1.0)
    d = decide("fcfs-first-fit", snap([job], [(H100_OD, 8, 0)]))
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.config is not None and launch.config.tp == 2
    assert validate(launch.config.with_(tp=1), CAT)  # tp1 would not fit


def test_online_replicas_follow_the_rule_of_thumb_and_shrink_to_fit() -> None:
    job = online("svc", rate=10.0)  # ceil(10 / 4) = 3
    d = decide("fcfs-first-fit", snap([job], [(H100_OD, 8, 0)]))
    assert of_kind(d, ActionKind.LAUNCH)[0].replicas == math.ceil(10.0 / RPS_PER_REPLICA)
    d = decide("fcfs-first-fit", snap([job], [(H100_OD, 8, 6)]))
    assert of_kind(d, ActionKind.LAUNCH)[0].replicas == 2
    d = decide("fcfs-first-fit", snap([online("slow", rate=0.1)], [(H100_OD, 8, 0)]))
    assert of_kind(d, ActionKind.LAUNCH)[0].replicas == 1


def test_deferral_when_nothing_fits() -> None:
    job = online("mid", model="llama-3.1-70b")
    d = decide("fcfs-first-fit", snap([job], [(H100_OD, 8, 7), (L4_OD, 4, 0)]))
    assert of_kind(d, ActionKind.LAUNCH) == []
    (defer,) = d.actions
    assert defer.kind == ActionKind.DEFER and defer.reason == "no capacity"


def test_launches_in_one_tick_never_over_commit() -> None:
    jobs = [batch(f"b{i}", submit=i) for i in range(3)]
    d = decide("fcfs-first-fit", snap(jobs, [(H100_OD, 10, 0)]))
    assert [a.replicas for a in of_kind(d, ActionKind.LAUNCH)] == [8, 2]
    assert [a.job_id for a in of_kind(d, ActionKind.DEFER)] == ["b2"]
    assert launched_gpus(d)[H100_OD] <= 10


def test_no_head_of_line_blocking() -> None:
    big = online("big", model="llama-3.1-70b", submit=0)
    small = online("small", submit=10)
    d = decide("fcfs-first-fit", snap([big, small], [(H100_OD, 1, 0)]))
    assert [a.job_id for a in of_kind(d, ActionKind.DEFER)] == ["big"]
    assert [a.job_id for a in of_kind(d, ActionKind.LAUNCH)] == ["small"]


# --- running jobs -------------------------------------------------------------------------

def test_healthy_deployments_are_left_alone_and_rejected_jobs_ignored() -> None:
    job, gone = online("svc"), online("refused")
    dep = deployment("d1", job, H100_OD)
    s = snap([status(job, admitted=True), status(gone, rejected=True)], [(H100_OD, 8, 1)], [dep])
    assert decide("fcfs-first-fit", s).actions == ()


def test_lost_deployment_is_stopped_and_relaunched_by_the_same_rule() -> None:
    job = batch("b")
    lost = deployment("d1", job, H100_SPOT, replicas=4, ready=0)
    s = snap([status(job, admitted=True)], [(H100_SPOT, 0, 0), (H100_OD, 8, 0)], [lost],
             tick=5, time_s=300)
    d = decide("fcfs-first-fit", s)
    (stop,) = of_kind(d, ActionKind.STOP)
    assert stop.deployment_id == "d1" and "lost" in stop.reason
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.offering == H100_OD and launch.replicas == 8


def test_finished_jobs_are_stopped() -> None:
    work, svc = batch("b", n=10), online("svc", end=600)
    deps = [deployment("d-b", work, H100_OD), deployment("d-s", svc, H100_OD)]
    # every request finished, its sampled outputs short of the expected total
    s = snap([status(work, admitted=True, output_tokens_done=0.9 * work.total_output_tokens,
                     requests_done=work.num_requests),
              status(svc, admitted=True)], [(H100_OD, 8, 2)], deps, time_s=600)
    d = decide("edf-first-fit", s)
    assert sorted(a.deployment_id for a in of_kind(d, ActionKind.STOP)) == ["d-b", "d-s"]
    assert of_kind(d, ActionKind.LAUNCH) == []


def test_batch_with_requests_left_is_not_done_at_its_token_total() -> None:
    # the sampled outputs ran long: the expected total is reached with a request left
    work = batch("b", n=10)
    s = snap([status(work, admitted=True, output_tokens_done=1.1 * work.total_output_tokens,
                     requests_done=work.num_requests - 1)],
             [(H100_OD, 8, 1)], [deployment("d-b", work, H100_OD)], time_s=600)
    assert of_kind(decide("edf-first-fit", s), ActionKind.STOP) == []


def test_partly_done_batch_keeps_running() -> None:
    work = batch("b", n=10)
    s = snap([status(work, admitted=True, output_tokens_done=work.total_output_tokens / 2,
                     requests_done=work.num_requests / 2)],
             [(H100_OD, 8, 1)], [deployment("d-b", work, H100_OD)], time_s=600)
    assert decide("fcfs-first-fit", s).actions == ()


def test_policies_are_deterministic() -> None:
    jobs = [online("a", rate=5.0), batch("b", submit=5), online("c", model="llama-3.1-70b",
                                                                  submit=9)]
    s = snap(jobs, [(L4_OD, 4, 1), (H100_SPOT, 8, 0), (H100_OD, 8, 3)])
    for name in ("fcfs-first-fit", "edf-first-fit", "best-fixed"):
        assert decide(name, s) == decide(name, s)


# --- best-fixed ---------------------------------------------------------------------------

def test_best_fixed_uses_one_config_for_every_job_of_a_model() -> None:
    a, b = online("a", rate=3.0), online("b", rate=12.0, submit=5)
    policy = make_policy("best-fixed", catalog=CAT)
    assert isinstance(policy, BestFixed)
    d = policy.decide(snap([a, b], [(H100_OD, 16, 0), (L4_OD, 8, 0)]), ())
    launches = of_kind(d, ActionKind.LAUNCH)
    assert [x.job_id for x in launches] == ["a", "b"]
    shapes = {(x.config.accelerator, x.config.tp, x.config.weight_precision)
              for x in launches if x.config is not None}
    assert len(shapes) == 1
    choice = policy.choices["llama-3.1-8b"]
    assert choice is not None and choice.rps_per_replica > 0
    for x in launches:
        rate = 3.0 if x.job_id == "a" else 12.0
        assert x.replicas == max(1, math.ceil(rate / choice.rps_per_replica - 1e-9))
        assert x.config is not None and not validate(x.config, CAT)


def test_best_fixed_choice_is_made_once_per_run() -> None:
    policy = make_policy("best-fixed", catalog=CAT)
    assert isinstance(policy, BestFixed)
    policy.decide(snap([online("a", rate=1.0)], [(H100_OD, 8, 0), (L4_OD, 8, 0)]), ())
    first = policy.choices["llama-3.1-8b"]
    # A later job with a much tighter SLO does not change the offline choice.
    later = online("b", rate=30.0, ttft_ms=50, tpot_ms=5, submit=60)
    d = policy.decide(snap([later], [(H100_OD, 8, 0), (L4_OD, 8, 0)], tick=1, time_s=60), ())
    assert policy.choices["llama-3.1-8b"] is first
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert first is not None and launch.config is not None
    assert launch.config.accelerator == first.config.accelerator
    assert launch.config.tp == first.config.tp


def test_best_fixed_places_on_the_cheapest_offering_of_its_part() -> None:
    job = online("a", rate=1.0)
    assert CAT.offering(H100_SPOT).usd_per_gpu_hour < CAT.offering(H100_OD).usd_per_gpu_hour
    d = decide("best-fixed", snap([job], [(H100_OD, 8, 0), (H100_SPOT, 8, 0)]))
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.offering == H100_SPOT
    # Spot full: falls back to the dearer market of the same part.
    d = decide("best-fixed", snap([job], [(H100_OD, 8, 0), (H100_SPOT, 8, 8)]))
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.offering == H100_OD


def test_best_fixed_defers_rather_than_changing_part() -> None:
    policy = make_policy("best-fixed", catalog=CAT)
    assert isinstance(policy, BestFixed)
    caps = [(H100_OD, 8, 0), (L4_OD, 8, 0)]
    policy.decide(snap([online("a")], caps), ())
    choice = policy.choices["llama-3.1-8b"]
    assert choice is not None
    full = [(o, t, t if CAT.offering(o).accelerator == choice.config.accelerator else 0)
            for o, t, _ in caps]
    d = policy.decide(snap([online("b", submit=60)], full, tick=1, time_s=60), ())
    (defer,) = d.actions
    assert defer.kind == ActionKind.DEFER and defer.reason.startswith("no capacity")


def test_best_fixed_batch_only_model_uses_throughput_per_dollar() -> None:
    policy = make_policy("best-fixed", catalog=CAT)
    assert isinstance(policy, BestFixed)
    d = policy.decide(snap([batch("b")], [(H100_OD, 8, 0), (L4_OD, 8, 0)]), ())
    choice = policy.choices["llama-3.1-8b"]
    assert choice is not None and choice.basis == "saturated throughput per $"
    (launch,) = of_kind(d, ActionKind.LAUNCH)
    assert launch.config is not None
    assert launch.config.accelerator == choice.config.accelerator
    assert 1 <= launch.replicas <= MAX_BATCH_REPLICAS
    assert launched_gpus(d)[launch.offering] <= 8


# --- shared helpers -----------------------------------------------------------------------

def test_ledger_refuses_to_over_commit() -> None:
    s = snap([], [(H100_OD, 8, 3), ("nowhere/x/h100-sxm/spot", 8, 0)])
    ledger = CapacityLedger(s, CAT)
    assert ledger.free(H100_OD) == 5 and ledger.free("nowhere/x/h100-sxm/spot") == 0
    assert ledger.max_replicas(H100_OD, 2, cap=8) == 2
    ledger.take(H100_OD, 4)
    with pytest.raises(ValueError):
        ledger.take(H100_OD, 2)
    assert ledger.offerings() == [CAT.offering(H100_OD)]
