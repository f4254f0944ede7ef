"""planner-api: the read model and the gRPC PlanService, in process on 127.0.0.1:0.

The read model is fed hand-built protos (two plans with a placed, a deferred and a
rejected decision; job specs; a snapshot's deployments; a causal state with
mechanisms); every rpc is called through a real channel: happy paths, each error code
with its message, the WatchPlans stream, health checking, and a generic client that
knows the service only through server reflection.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from dataclasses import replace

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from koi import subjects
from koi.catalog import load_catalog
from koi.causal.store import BeliefStore
from koi.predictor.columns import IN, OUT
from koi.space import DeploymentConfig, config_hash
from koi.v1 import (
    bus_pb2,
    causal_pb2,
    cluster_pb2,
    common_pb2,
    jobs_pb2,
    plan_pb2,
    plan_service_pb2,
    plan_service_pb2_grpc,
    prediction_pb2,
)
from koi.wire import config_to_proto
from koi.wire.causal import store_to_proto
from services.planner_api.grpc_server import PlanServer, serve
from services.planner_api.main import feeds
from services.planner_api.readmodel import MAX_CANDIDATE_TICKS, NotFound, ReadModel

pytestmark = pytest.mark.timeout(30)

CATALOG = load_catalog()
MODEL = "llama-3.1-8b"
CFG = DeploymentConfig(model=MODEL, accelerator="h100-sxm")
OFFERING = "aws/us-east-1/h100-sxm/on_demand"
JS = plan_service_pb2.JobState
Code = grpc.StatusCode


# --- builders ---------------------------------------------------------------------------

def _lengths(tokens: int) -> jobs_pb2.LengthDist:
    return jobs_pb2.LengthDist(fixed=jobs_pb2.FixedLength(tokens=tokens))


def online_spec(job_id: str, rate: float = 2.0) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(id=job_id, model=MODEL, online=jobs_pb2.OnlineJob(
        arrival=jobs_pb2.Arrival(rate=jobs_pb2.RateArrival(rate_rps=rate)),
        input_len=_lengths(512), output_len=_lengths(128),
        slo=jobs_pb2.Slo(ttft_ms=800, tpot_ms=50)))


def batch_spec(job_id: str) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(id=job_id, model=MODEL, batch=jobs_pb2.BatchJob(
        num_requests=1000, input_len=_lengths(1024), output_len=_lengths(256),
        deadline_s=3600))


def placed(job_id: str, mechanism_ids: tuple[str, ...] = ()) -> plan_pb2.Decision:
    return plan_pb2.Decision(
        job_id=job_id, kind=plan_pb2.DECISION_KIND_PLACE, replicas=2, gpus=2,
        reason="cheapest configuration meeting the SLO robustly", config=config_to_proto(CFG),
        offering=OFFERING, usd_per_hour=6.2, goodput_tok_s=250, demand_tok_s=256,
        explanation=plan_pb2.Explanation(
            job_id=job_id, decision="place", config_label="h100-sxm tp1 bf16 vllm",
            hypothesis="one H100 holds the 8B model", ttft_p95_ms_robust=410,
            tpot_p95_ms_robust=12.5, planned_rate_rps=1.5, mechanism_ids=list(mechanism_ids)))


def plan(tick: int, *decisions: plan_pb2.Decision) -> plan_pb2.ClusterPlan:
    return plan_pb2.ClusterPlan(tick=tick, source_tick=tick, causal_state_version=3,
                                decisions=list(decisions), solver="greedy")


def mechanism(mid: str, confidence: float, *, active: bool = True,
              **scope: str) -> causal_pb2.Mechanism:
    return causal_pb2.Mechanism(
        id=mid, scope=common_pb2.Scope(**scope), confidence=confidence, active=active,
        edge=common_pb2.Edge(cause="kv_pressure", effect="tpot"),
        condition="kv_pressure > 0.85", effect_size=1.6, support=14,
        summary=f"{mid}: kv_pressure > 0.85 → TPOT ×1.6")


def causal_state(**extra: object) -> causal_pb2.CausalState:
    return causal_pb2.CausalState(
        version=3, tick=7,
        mechanisms=[mechanism("m-kv", 0.93, accelerator="h100-sxm", engine="vllm"),
                    mechanism("m-gen", 0.6),
                    mechanism("m-old", 0.8, active=False, accelerator="h100-sxm"),
                    mechanism("m-l4", 0.95, accelerator="l4")],
        calibration=[causal_pb2.OutcomeCalibration(outcome="ttft_p95", dro_radius=0.2),
                     causal_pb2.OutcomeCalibration(outcome="tpot_p95_ms", dro_radius=0.1),
                     causal_pb2.OutcomeCalibration(outcome="throughput", dro_radius=0.15)],
        **extra)


def fed_model(**kwargs: object) -> ReadModel:
    """Ticks 6 and 7; chat-a placed and running, chat-b deferred, batch-c rejected by the
    plan, batch-d pending, bad-e rejected at submission."""
    model = ReadModel(catalog=CATALOG, **kwargs)  # type: ignore[arg-type]
    for spec in (online_spec("chat-a"), online_spec("chat-b"), batch_spec("batch-c"),
                 batch_spec("batch-d")):
        model.on_job(spec, tick=5)
    model.on_job_rejected("bad-e", "model: 'gpt-9' is not in the catalog", tick=5)
    model.on_plan(plan(6, placed("chat-a")))
    model.on_plan(plan(7, placed("chat-a", ("m-kv", "m-gone")),
                       plan_pb2.Decision(job_id="chat-b", kind=plan_pb2.DECISION_KIND_DEFER,
                                         reason="no h100-sxm capacity this tick"),
                       plan_pb2.Decision(job_id="batch-c", kind=plan_pb2.DECISION_KIND_REJECT,
                                         reason="deadline cannot be met on any offering")))
    model.on_deployments(7, [cluster_pb2.Deployment(
        deployment_id="d-1", job_id="chat-a", config=config_to_proto(CFG), offering=OFFERING,
        state=cluster_pb2.DEPLOYMENT_STATE_RUNNING, replicas_ready=2)])
    model.on_causal(causal_state())
    return model


class Running:
    """One server on a free port with a channel and stubs to it."""

    def __init__(self, model: ReadModel) -> None:
        self.model = model
        self.server: PlanServer = serve(model, "127.0.0.1:0")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = plan_service_pb2_grpc.PlanServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace=None)


@pytest.fixture
def api() -> Iterator[Running]:
    running = Running(fed_model())
    yield running
    running.close()


@pytest.fixture
def empty_api() -> Iterator[Running]:
    running = Running(ReadModel(catalog=CATALOG))
    yield running
    running.close()


def rpc_error(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=5, **kwargs)  # type: ignore[operator]
    return info.value


def assert_error(err: grpc.RpcError, code: grpc.StatusCode, text: str) -> None:
    assert err.code() == code, err.details()
    assert text in err.details(), err.details()


# --- GetPlan / GetJob / ListJobs ---------------------------------------------------------

def test_get_plan_latest_and_by_tick(api: Running) -> None:
    assert api.stub.GetPlan(plan_service_pb2.GetPlanRequest(), timeout=5).plan.tick == 7
    got = api.stub.GetPlan(plan_service_pb2.GetPlanRequest(tick=6), timeout=5).plan
    assert got.tick == 6 and [d.job_id for d in got.decisions] == ["chat-a"]


def test_get_plan_errors(api: Running, empty_api: Running) -> None:
    assert_error(rpc_error(api.stub.GetPlan, plan_service_pb2.GetPlanRequest(tick=99)),
                 Code.NOT_FOUND, "no plan of tick 99 is held (held: ticks 6..7)")
    assert_error(rpc_error(api.stub.GetPlan, plan_service_pb2.GetPlanRequest(tick=-1)),
                 Code.INVALID_ARGUMENT, "tick must be >= 0 (got -1)")
    assert_error(rpc_error(empty_api.stub.GetPlan, plan_service_pb2.GetPlanRequest()),
                 Code.NOT_FOUND, "no plan yet")


def test_plans_are_bounded_to_the_last_n() -> None:
    model = ReadModel(catalog=CATALOG, max_plans=3)
    for t in range(10):
        model.on_plan(plan(t))
    assert model.plan().tick == 9 and model.plan(7).tick == 7
    with pytest.raises(NotFound, match=r"held: ticks 7\.\.9"):
        model.plan(6)


@pytest.mark.parametrize(("job_id", "state", "reason"), [
    ("chat-a", JS.JOB_STATE_RUNNING, ""),
    ("chat-b", JS.JOB_STATE_DEFERRED, "no h100-sxm capacity this tick"),
    ("batch-c", JS.JOB_STATE_REJECTED, "deadline cannot be met on any offering"),
    ("batch-d", JS.JOB_STATE_PENDING, ""),
    ("bad-e", JS.JOB_STATE_REJECTED, "model: 'gpt-9' is not in the catalog"),
])
def test_get_job_states(api: Running, job_id: str, state: int, reason: str) -> None:
    job = api.stub.GetJob(plan_service_pb2.GetJobRequest(job_id=job_id), timeout=5).job
    assert (job.spec.id, job.state, job.reason) == (job_id, state, reason)


def test_get_job_carries_spec_decision_and_deployments(api: Running) -> None:
    job = api.stub.GetJob(plan_service_pb2.GetJobRequest(job_id="chat-a"), timeout=5).job
    assert job.spec.online.slo.ttft_ms == 800 and job.submitted_tick == 5
    assert job.decision.kind == plan_pb2.DECISION_KIND_PLACE and job.decision.replicas == 2
    assert [d.deployment_id for d in job.deployments] == ["d-1"]
    batch = api.stub.GetJob(plan_service_pb2.GetJobRequest(job_id="batch-d"), timeout=5).job
    assert not batch.HasField("decision")


def test_job_state_follows_completion_and_deployments(api: Running) -> None:
    api.model.on_deployments(8, [])  # chat-a's deployment gone: placed, not running yet
    assert api.model.job("chat-a").state == JS.JOB_STATE_PENDING
    api.model.on_deployments(7, [cluster_pb2.Deployment(job_id="chat-a", state=2)])  # stale
    assert api.model.job("chat-a").state == JS.JOB_STATE_PENDING
    api.model.on_job_completed("chat-a")
    assert api.model.job("chat-a").state == JS.JOB_STATE_COMPLETED


def test_job_feeds_are_idempotent_and_keep_the_first_known_tick() -> None:
    model = ReadModel(catalog=CATALOG)
    model.on_job(online_spec("chat-x"), tick=-1)  # from the accepted-jobs feed: tick unknown
    model.on_job(online_spec("chat-x", rate=3.0), tick=9)  # from a snapshot
    model.on_job(online_spec("chat-x", rate=3.0), tick=10)
    job = model.job("chat-x")
    assert job.submitted_tick == 9 and job.spec.online.arrival.rate.rate_rps == 3.0
    model.on_job_rejected("chat-x", "", tick=11)
    assert (model.job("chat-x").state, model.job("chat-x").reason) == (
        JS.JOB_STATE_REJECTED, "rejected at submission")
    model.on_plan(plan(12, placed("chat-y")))  # decided before its spec was heard of
    assert model.job("chat-y").state == JS.JOB_STATE_PENDING
    assert [r.spec.id for r in model.jobs(kind="online")] == ["chat-x"]


def test_get_job_errors(api: Running) -> None:
    assert_error(rpc_error(api.stub.GetJob, plan_service_pb2.GetJobRequest(job_id="nope")),
                 Code.NOT_FOUND, "unknown job 'nope'")
    assert_error(rpc_error(api.stub.GetJob, plan_service_pb2.GetJobRequest()),
                 Code.INVALID_ARGUMENT, "job_id is required")


def list_ids(api: Running, **kwargs: object) -> tuple[list[str], str]:
    resp = api.stub.ListJobs(plan_service_pb2.ListJobsRequest(**kwargs), timeout=5)
    return [j.spec.id for j in resp.jobs], resp.next_page_token


def test_list_jobs_filters(api: Running) -> None:
    assert list_ids(api) == (["bad-e", "batch-c", "batch-d", "chat-a", "chat-b"], "")
    assert list_ids(api, kind="batch") == (["batch-c", "batch-d"], "")
    assert list_ids(api, state=JS.JOB_STATE_REJECTED) == (["bad-e", "batch-c"], "")
    assert list_ids(api, state=JS.JOB_STATE_REJECTED, kind="online") == ([], "")


def test_list_jobs_pages(api: Running) -> None:
    seen, token = [], ""
    for _ in range(5):
        ids, token = list_ids(api, page_size=2, page_token=token)
        seen += ids
        if not token:
            break
    assert seen == ["bad-e", "batch-c", "batch-d", "chat-a", "chat-b"]
    ids, token = list_ids(api, kind="batch", page_size=1)
    assert ids == ["batch-c"] and token
    assert list_ids(api, kind="batch", page_size=1, page_token=token) == (["batch-d"], "")


@pytest.mark.parametrize(("request_fields", "text"), [
    ({"page_size": -1}, "page_size must be >= 0 (got -1)"),
    ({"page_token": "not a token"}, "page_token is not a token this server issued"),
    ({"kind": "stream"}, "kind must be 'online', 'batch' or '' for both (got 'stream')"),
    ({"state": 42}, "state 42 is not a JobState"),
])
def test_list_jobs_errors(api: Running, request_fields: dict, text: str) -> None:
    err = rpc_error(api.stub.ListJobs, plan_service_pb2.ListJobsRequest(**request_fields))
    assert_error(err, Code.INVALID_ARGUMENT, text)


def test_list_jobs_token_belongs_to_its_filter(api: Running) -> None:
    _, token = list_ids(api, kind="batch", page_size=1)
    err = rpc_error(api.stub.ListJobs, plan_service_pb2.ListJobsRequest(page_token=token))
    assert_error(err, Code.INVALID_ARGUMENT, "issued for a different state/kind filter")


# --- Explain ----------------------------------------------------------------------------

def test_explain_latest_placement(api: Running) -> None:
    resp = api.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-a"), timeout=5)
    assert resp.tick == 7 and resp.causal_state_version == 3
    assert resp.decision.offering == OFFERING
    assert [m.id for m in resp.mechanisms] == ["m-kv"]
    assert resp.summary.startswith(f"tick 7: place job chat-a on 2× h100-sxm tp1 bf16 vllm"
                                   f" ({OFFERING}), 2 GPUs, 6.20 USD/h")
    assert "robust p95 at 1.50 req/s per replica: TTFT 410 ms, TPOT 12.5 ms" in resp.summary
    assert "because m-kv: kv_pressure > 0.85 → TPOT ×1.6" in resp.summary
    assert "cites m-gone, not in causal state v3 held here" in resp.summary


def slow_on_l4(X: np.ndarray) -> np.ndarray:
    """The real kernel, except that every L4 configuration (300 GB/s of HBM) has a 5 s
    TTFT p95."""
    from koi.predictor.api import evaluate_matrix

    Y = evaluate_matrix(X)
    Y[OUT["ttft_p95"], X[IN["hbm_bw"]] < 1e12] = 5.0
    return Y


def candidate(job_id: str, n: int, cfg: DeploymentConfig) -> plan_pb2.Candidate:
    return plan_pb2.Candidate(candidate_id=f"{job_id}#{n}", job_id=job_id,
                              config=config_to_proto(cfg), hypothesis=f"guess {n}")


def test_explain_lists_the_candidates_not_chosen() -> None:
    model = fed_model(kernel=slow_on_l4)
    l4, seqs64 = replace(CFG, accelerator="l4"), replace(CFG, max_num_seqs=64)
    batch = bus_pb2.CandidateBatch(tick=7, causal_state_version=3, candidates=[
        candidate("chat-a", 0, CFG),      # the one placed: not an alternative
        candidate("chat-a", 1, l4), candidate("chat-a", 2, seqs64),
        candidate("chat-a", 3, seqs64),   # the same configuration again: listed once
        candidate("chat-b", 0, l4)])      # another job's
    feeds(model)[subjects.tick_filter("candidates")]("koi.tick.7.candidates",
                                                      batch.SerializeToString())
    running = Running(model)
    try:
        resp = running.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-a"),
                                    timeout=30)
    finally:
        running.close()
    alts = list(resp.alternatives)
    assert [a.candidate.candidate_id for a in alts] == ["chat-a#2", "chat-a#1"]  # SLO met first
    met, breach = alts
    assert met.reason.startswith("meets the SLO robustly") and "h100-sxm tp1 bf16 vllm" in \
        met.reason
    assert breach.predicted.outcomes.ttft_p95_ms == 5000.0
    assert math.isclose(breach.robust.ttft_p95_ms, 5000.0 * math.exp(0.2))  # radius 0.2
    assert breach.reason.startswith(f"TTFT p95 {5000 * math.exp(0.2):.0f} ms > 800 (robust)")
    assert breach.reason.endswith("(robust) at 1.50 req/s")
    assert breach.predicted.outcomes.request_rate_rps == pytest.approx(1.5)  # a replica's load
    assert "alternatives:" not in resp.summary


def test_alternatives_are_kept_for_recent_ticks_only() -> None:
    model = fed_model()
    for t in range(MAX_CANDIDATE_TICKS + 8):
        model.on_candidates(t, bus_pb2.CandidateBatch(tick=t).SerializeToString())
    decision = model.decision("chat-a", 7)[1]
    assert model.alternatives(7, decision)[1].startswith(
        "alternatives: the candidates of tick 7 are not held here")
    assert model.alternatives(MAX_CANDIDATE_TICKS + 7, decision) == (
        [], f"alternatives: none (tick {MAX_CANDIDATE_TICKS + 7} had no other candidate for"
            " it)")


def test_explain_by_tick_and_non_placements(api: Running) -> None:
    resp = api.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-a", tick=6),
                            timeout=5)
    assert resp.tick == 6 and not resp.mechanisms
    defer = api.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-b"), timeout=5)
    assert defer.summary.splitlines() == [
        "tick 7: defer job chat-b: no h100-sxm capacity this tick",
        "alternatives: the candidates of tick 7 are not held here (the last 32 ticks heard"
        " are)"]


@pytest.mark.parametrize(("request_fields", "code", "text"), [
    ({}, Code.INVALID_ARGUMENT, "job_id is required"),
    ({"job_id": "chat-a", "tick": -2}, Code.INVALID_ARGUMENT, "tick must be >= 0 (got -2)"),
    ({"job_id": "nope"}, Code.NOT_FOUND, "unknown job 'nope'"),
    ({"job_id": "batch-d"}, Code.NOT_FOUND, "no plan has decided job 'batch-d' yet"),
    ({"job_id": "chat-b", "tick": 6}, Code.NOT_FOUND,
     "the plan of tick 6 has no decision for job 'chat-b'"),
    ({"job_id": "chat-a", "tick": 3}, Code.NOT_FOUND, "no plan of tick 3 is held"),
])
def test_explain_errors(api: Running, request_fields: dict, code: grpc.StatusCode,
                        text: str) -> None:
    err = rpc_error(api.stub.Explain, plan_service_pb2.ExplainRequest(**request_fields))
    assert_error(err, code, text)


# --- WhatIf -----------------------------------------------------------------------------

WORKLOAD = prediction_pb2.Workload(input_len_tokens=512, output_len_tokens=128,
                                   mode=prediction_pb2.LOAD_MODE_RATE, load=2.0)


def test_what_if_with_a_workload(api: Running) -> None:
    resp = api.stub.WhatIf(plan_service_pb2.WhatIfRequest(
        config=config_to_proto(CFG), workload=WORKLOAD), timeout=10)
    assert resp.valid and not resp.violations
    assert resp.config_hash == config_hash(CFG) and resp.causal_state_version == 3
    nominal = resp.predicted.outcomes
    assert nominal.ttft_p95_ms > 0 and nominal.output_throughput_tok_s > 0
    # no belief store in the state: robust = nominal widened by the radii
    assert math.isclose(resp.robust.ttft_p95_ms, nominal.ttft_p95_ms * math.exp(0.2))
    assert math.isclose(resp.robust.tpot_p95_ms, nominal.tpot_p95_ms * math.exp(0.1))
    assert math.isclose(resp.robust.ttft_ms, nominal.ttft_ms)  # no radius for the mean
    assert math.isclose(resp.robust.output_throughput_tok_s,
                        nominal.output_throughput_tok_s / math.exp(0.15))
    assert sorted(resp.mechanism_ids) == ["m-gen", "m-kv"]  # active, covering h100/vllm


def test_what_if_for_a_job_and_with_a_belief_store(api: Running) -> None:
    api.model.on_causal(causal_state(store=store_to_proto(BeliefStore())))
    resp = api.stub.WhatIf(plan_service_pb2.WhatIfRequest(
        config=config_to_proto(CFG), job_id="chat-a"), timeout=10)
    assert resp.valid
    # the prior belief corrects nothing: robust is still the widened nominal
    assert math.isclose(resp.robust.tpot_p95_ms,
                        resp.predicted.outcomes.tpot_p95_ms * math.exp(0.1))
    batch = api.stub.WhatIf(plan_service_pb2.WhatIfRequest(
        config=config_to_proto(CFG), job_id="batch-d"), timeout=10)
    assert batch.valid and batch.predicted.outcomes.output_throughput_tok_s > 0


@pytest.mark.parametrize(("knobs", "violations"), [
    ({"tp": 3}, [("tp", "does not divide the 32 attention heads")]),
    ({"gpu_mem_fraction": 0.99, "max_num_seqs": 0},
     [("gpu_mem_fraction", "above the maximum 0.98"), ("max_num_seqs", "below the minimum")]),
    ({"accelerator": "tpu-v9"}, [("accelerator", "tpu-v9")]),
])
def test_what_if_invalid_config_is_an_answer(api: Running, knobs: dict,
                                             violations: list[tuple[str, str]]) -> None:
    cfg = config_to_proto(CFG)
    for name, value in knobs.items():
        setattr(cfg, name, value)
    resp = api.stub.WhatIf(plan_service_pb2.WhatIfRequest(config=cfg, workload=WORKLOAD),
                           timeout=10)
    assert not resp.valid and not resp.HasField("predicted")
    got = [(v.knob, v.reason) for v in resp.violations]
    assert [k for k, _ in got][:len(violations)] == [k for k, _ in violations]
    for (_, reason), (_, text) in zip(got, violations, strict=False):
        assert text in reason


def test_what_if_errors(api: Running) -> None:
    def what_if(**fields: object) -> grpc.RpcError:
        return rpc_error(api.stub.WhatIf, plan_service_pb2.WhatIfRequest(**fields))

    no_model = config_to_proto(CFG)
    no_model.model = ""
    assert_error(what_if(config=no_model, workload=WORKLOAD), Code.INVALID_ARGUMENT,
                 "config.model: missing (required)")
    no_enum = config_to_proto(CFG)
    no_enum.ClearField("kv_dtype")
    assert_error(what_if(config=no_enum, workload=WORKLOAD), Code.INVALID_ARGUMENT,
                 "config.kv_dtype")
    assert_error(what_if(workload=WORKLOAD), Code.INVALID_ARGUMENT, "config is required")
    assert_error(what_if(config=config_to_proto(CFG)), Code.INVALID_ARGUMENT,
                 "target is required")
    assert_error(what_if(config=config_to_proto(CFG), job_id=""), Code.INVALID_ARGUMENT,
                 "job_id is required")
    assert_error(what_if(config=config_to_proto(CFG), job_id="nope"), Code.NOT_FOUND,
                 "unknown job 'nope'")
    assert_error(what_if(config=config_to_proto(CFG), job_id="bad-e"),
                 Code.FAILED_PRECONDITION, "job 'bad-e' has no spec")
    bad = prediction_pb2.Workload(input_len_tokens=0, output_len_tokens=1,
                                  mode=prediction_pb2.LOAD_MODE_SATURATED)
    assert_error(what_if(config=config_to_proto(CFG), workload=bad), Code.INVALID_ARGUMENT,
                 "workload.input_len_tokens: must be >= 1 token")


@pytest.mark.parametrize(("fields", "text"), [
    ({"input_len_tokens": 1e12}, "workload.input_len_tokens must be <= 262144 (got 1e+12)"),
    ({"output_len_tokens": 3e5}, "workload.output_len_tokens must be <= 262144"),
    ({"load": 1e300}, "workload.load must be <= 10000 requests/s (got 1e+300)"),
    ({"mode": prediction_pb2.LOAD_MODE_CONCURRENCY, "load": 1e7},
     "workload.load must be <= 600000 requests (got 1e+07)"),
    ({"slo_ttft_ms": 1e9}, "workload.slo_ttft_ms must be <= 3.6e+06"),
    ({"slo_tpot_ms": 1e6}, "workload.slo_tpot_ms must be <= 60000"),
    ({"window_s": 1e12}, "workload.window_s must be <= 2.592e+06"),
])
def test_what_if_refuses_workloads_beyond_physical_bounds(api: Running, fields: dict,
                                                          text: str) -> None:
    workload = prediction_pb2.Workload()
    workload.CopyFrom(WORKLOAD)
    for name, value in fields.items():
        setattr(workload, name, value)
    err = rpc_error(api.stub.WhatIf, plan_service_pb2.WhatIfRequest(
        config=config_to_proto(CFG), workload=workload))
    assert_error(err, Code.INVALID_ARGUMENT, text)


def test_job_ids_longer_than_any_job_are_refused(api: Running) -> None:
    long_id = "j" * 1000
    for call, request in ((api.stub.GetJob, plan_service_pb2.GetJobRequest(job_id=long_id)),
                          (api.stub.Explain, plan_service_pb2.ExplainRequest(job_id=long_id)),
                          (api.stub.WhatIf, plan_service_pb2.WhatIfRequest(
                              config=config_to_proto(CFG), job_id=long_id))):
        assert_error(rpc_error(call, request), Code.INVALID_ARGUMENT,
                     "job_id must be at most 63 characters (got 1000)")


def test_a_failing_predictor_is_internal_not_a_crash() -> None:
    def broken(X: object) -> object:
        raise RuntimeError("kernel exploded")

    running = Running(fed_model(kernel=broken))
    try:
        err = rpc_error(running.stub.WhatIf, plan_service_pb2.WhatIfRequest(
            config=config_to_proto(CFG), workload=WORKLOAD))
        assert_error(err, Code.INTERNAL, "WhatIf failed inside planner-api (RuntimeError)")
        assert running.stub.GetPlan(plan_service_pb2.GetPlanRequest(), timeout=5).plan.tick == 7
    finally:
        running.close()


# --- ListMechanisms ---------------------------------------------------------------------

def mechanism_ids(api: Running, **kwargs: object) -> list[str]:
    resp = api.stub.ListMechanisms(plan_service_pb2.ListMechanismsRequest(**kwargs),
                                   timeout=5)
    assert resp.causal_state_version == 3
    return [m.id for m in resp.mechanisms]


def test_list_mechanisms(api: Running) -> None:
    assert mechanism_ids(api) == ["m-l4", "m-kv", "m-gen"]
    assert mechanism_ids(api, include_retired=True) == ["m-l4", "m-kv", "m-old", "m-gen"]
    assert mechanism_ids(api, min_confidence=0.94) == ["m-l4"]
    scope = common_pb2.Scope(accelerator="h100-sxm")
    assert mechanism_ids(api, scope=scope, include_retired=True) == ["m-kv", "m-old"]
    assert mechanism_ids(api, scope=common_pb2.Scope(engine="vllm")) == ["m-kv"]


def test_list_mechanisms_errors_and_empty_playbook(api: Running, empty_api: Running) -> None:
    err = rpc_error(api.stub.ListMechanisms,
                    plan_service_pb2.ListMechanismsRequest(min_confidence=1.5))
    assert_error(err, Code.INVALID_ARGUMENT, "min_confidence must be in [0, 1] (got 1.5)")
    resp = empty_api.stub.ListMechanisms(plan_service_pb2.ListMechanismsRequest(), timeout=5)
    assert resp.causal_state_version == 0 and not resp.mechanisms


def test_older_causal_state_is_ignored(api: Running) -> None:
    api.model.on_causal(causal_pb2.CausalState(version=2))
    assert mechanism_ids(api) == ["m-l4", "m-kv", "m-gen"]


# --- WatchPlans -------------------------------------------------------------------------

def test_watch_plans_replays_held_then_follows(api: Running) -> None:
    call = api.stub.WatchPlans(plan_service_pb2.WatchPlansRequest(from_tick=0), timeout=10)
    assert [next(call).plan.tick, next(call).plan.tick] == [6, 7]
    api.model.on_plan(plan(8))
    assert next(call).plan.tick == 8
    call.cancel()
    deadline = time.monotonic() + 5  # the cancelled stream lets go of its watch
    while api.model.watching and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.model.watching == 0


def test_watch_plans_without_from_tick_gets_only_new_ones(api: Running) -> None:
    call = api.stub.WatchPlans(plan_service_pb2.WatchPlansRequest(), timeout=10)
    deadline = time.monotonic() + 5  # the subscription is registered asynchronously
    while not api.model.watching and time.monotonic() < deadline:
        time.sleep(0.01)
    api.model.on_plan(plan(9))
    assert next(call).plan.tick == 9
    call.cancel()


def test_watch_plans_ends_cleanly_when_the_server_stops() -> None:
    running = Running(fed_model())
    call = running.stub.WatchPlans(plan_service_pb2.WatchPlansRequest(from_tick=7), timeout=10)
    assert next(call).plan.tick == 7
    running.server.stop(grace=2)
    assert list(call) == []  # the stream completes (no error) once the watch is closed
    assert call.code() == Code.OK
    running.channel.close()


def test_watch_plans_rejects_a_negative_tick(api: Running) -> None:
    call = api.stub.WatchPlans(plan_service_pb2.WatchPlansRequest(from_tick=-1), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    assert_error(info.value, Code.INVALID_ARGUMENT, "from_tick must be >= 0 (got -1)")


# --- health and reflection --------------------------------------------------------------

def test_health_serving_then_not_serving_on_stop() -> None:
    running = Running(fed_model())
    health = health_pb2_grpc.HealthStub(running.channel)
    for service in ("", "koi.v1.PlanService"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    running.server.stop(grace=None)
    running.channel.close()
    for service in ("", "koi.v1.PlanService"):  # the servicer itself: the server is down
        resp = asyncio.run(running.server.health.Check(
            health_pb2.HealthCheckRequest(service=service), None))
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING


def reflect_unary(channel: grpc.Channel, service: str, method: str) -> tuple[type, type]:
    """Request and response classes of ``service/method``, learnt through reflection only
    (the generic client: it imports nothing generated for koi.v1)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    def ask(**request: str) -> reflection_pb2.ServerReflectionResponse:
        reply = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            **request)]), timeout=5)
        return next(iter(reply))

    listed = [s.name for s in ask(list_services="").list_services_response.service]
    assert service in listed
    files = {}
    blobs = list(ask(file_containing_symbol=service)
                 .file_descriptor_response.file_descriptor_proto)
    while blobs:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(blobs.pop())
        files[fdp.name] = fdp
        for dep in fdp.dependency:
            if dep not in files:
                blobs += ask(file_by_filename=dep).file_descriptor_response.file_descriptor_proto
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:  # dependencies first
        if name not in added:
            for dep in files[name].dependency:
                add(dep)
            pool.Add(files[name])
            added.add(name)

    for name in sorted(files):
        add(name)
    desc = pool.FindServiceByName(service).methods_by_name[method]
    return (message_factory.GetMessageClass(desc.input_type),
            message_factory.GetMessageClass(desc.output_type))


def test_generic_reflection_client_calls_get_plan(api: Running) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(api.channel)
    reply = next(iter(stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)))
    assert {s.name for s in reply.list_services_response.service} == {
        "koi.v1.PlanService", "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection"}
    request_cls, response_cls = reflect_unary(api.channel, "koi.v1.PlanService", "GetPlan")
    assert request_cls.__module__ != plan_service_pb2.GetPlanRequest.__module__
    get_plan = api.channel.unary_unary("/koi.v1.PlanService/GetPlan",
                                       request_serializer=request_cls.SerializeToString,
                                       response_deserializer=response_cls.FromString)
    request = request_cls()
    request.tick = 6
    resp = get_plan(request, timeout=5)
    assert resp.plan.tick == 6
    assert [d.job_id for d in resp.plan.decisions] == ["chat-a"]


def test_a_watcher_that_falls_behind_is_closed_not_buffered_forever() -> None:
    model = ReadModel(catalog=CATALOG, max_plans=2)
    watch = model.watch(from_tick=0)
    for t in range(100):
        model.on_plan(plan(t))
    assert watch.lagged and watch.closed and model.watching == 0
    assert 0 < len(list(watch)) < 100
