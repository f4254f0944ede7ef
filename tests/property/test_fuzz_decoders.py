"""Fuzzing every decoder a service runs on input from outside: bytes, YAML, gRPC requests.

Each decoder is fed random bytes, whole messages of its type with extreme field values
(``proto_strategies.messages``: NaN/±inf/±1e308 doubles, integer bounds, unknown enum
numbers, 20,000-character strings, thousands of repeats) and *valid* messages with one
to three fields anywhere in the tree set to such values (``mutated``). The property, per
decoder:

* it returns, or raises only its documented "invalid input" error — for every bus
  decoder (``koi.wire.planning.decode_*``, ``koi.wire.codec.decode*``, the message types
  services parse with ``codec.decode``: OperatorEvent, SimStatus, work items, run
  summary) that is ``InvalidSpecError`` or ``InvalidConfigError`` (both ``KoiError`` and
  ``ValueError``), so a service dead-letters the message and carries on;
* ``load_jobs_yaml`` / ``load_scenario`` raise only ``InvalidSpecError`` (file, line,
  field), for random text and for the shipped files with values replaced;
* the gRPC servicer never answers INTERNAL (an unexpected exception inside
  planner-api): a bad request is INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION;
* every error message (and ``event_line``) is one line of at most ``MAX_MESSAGE``
  characters, so it cannot echo a large input into a log line, a DLQ header or an ack;
* nothing hangs: ``deadline=None`` (a shared CI machine is slow), but the examples are
  few enough that the per-target tests run in well under a minute.

Then a longer hunt (``test_a_longer_hunt_within_a_time_budget``): every target again,
round after round of fresh examples, for ``KOI_FUZZ_HUNT_S`` seconds (60 by default, so
CI hunts deeper and still in bounded time; ``make fuzz`` hunts for 30 minutes).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto_strategies import messages, mutated, mutated_document

from koi.catalog import load_catalog
from koi.causal.observe import OutcomeObservation
from koi.causal.scope import Scope
from koi.errors import InvalidConfigError, InvalidSpecError
from koi.jobs import load_jobs_yaml
from koi.planner.propose import Proposal
from koi.planner.settings import settings_for
from koi.planner.tick import KoiState, learn_from
from koi.predictor.passes import LOG_GRID
from koi.rlm.hypothesis import CandidateTest, Direction, Dropped, Exploration, Hypothesis
from koi.rlm.loop import RoundOutcome
from koi.scenario import load_scenario, scenario_path
from koi.space import DeploymentConfig
from koi.v1 import (
    bus_pb2,
    causal_pb2,
    cluster_pb2,
    common_pb2,
    config_pb2,
    events_pb2,
    hypotheses_pb2,
    jobs_pb2,
    plan_pb2,
    plan_service_pb2,
    prediction_pb2,
    work_pb2,
)
from koi.wire import codec, config_to_proto, encode_job, planning
from koi.wire.hypotheses import decode_hypotheses, encode_hypotheses

pytestmark = pytest.mark.timeout(120)

CATALOG = load_catalog()
MAX_MESSAGE = 1000
DECODE_ERRORS = (InvalidSpecError, InvalidConfigError)
# per decoder and input kind: the per-target tests run in under a minute on a busy 2-core
# VM; the hunt then repeats them for HUNT_S seconds (KOI_FUZZ_HUNT_S=0: one round only)
EXAMPLES = int(os.environ.get("KOI_FUZZ_EXAMPLES", "25"))
HUNT_S = float(os.environ.get("KOI_FUZZ_HUNT_S", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
REPO = Path(__file__).resolve().parents[2]
# strings the decoders look up: without them a random message rarely gets past "model"
POOL = (*CATALOG.models, *CATALOG.accelerators, *CATALOG.engines, *CATALOG.offerings,
        "greedy", "milp", "vllm", "ttft", "tpot", "ttft_p95", "kv_pressure", "chat", "d-1")


def check_message(text: str) -> None:
    assert "\n" not in text and "\r" not in text, f"multi-line message: {text[:200]!r}"
    assert len(text) <= MAX_MESSAGE, f"{len(text)}-character message: {text[:200]!r}…"


def check_loader(load: Callable[[Path], Any], path: Path) -> None:
    """``load(path)`` returns or raises ``InvalidSpecError`` with a bounded message."""
    try:
        load(path)
    except InvalidSpecError as e:
        check_message(str(e))


def check_decoder(decode: Callable[[bytes], Any], data: bytes) -> None:
    """``decode(data)`` returns or raises a documented error with a bounded message."""
    try:
        decode(data)
    except DECODE_ERRORS as e:
        check_message(str(e))


# --- genuine messages, the seeds of mutation ------------------------------------------------

CFG = DeploymentConfig(model="llama-3.1-8b", accelerator="h100-sxm")
OFFERING = "aws/us-east-1/h100-sxm/on_demand"
SCOPE = Scope(accelerator="h100-sxm", engine="vllm", size_class="70b", parallelism="tp4",
              family="hopper")


def _job() -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec.FromString(encode_job(
        load_jobs_yaml(REPO / "examples/jobs/chat-online.yaml", catalog=CATALOG)[0]))


def _batch_job() -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec.FromString(encode_job(
        load_jobs_yaml(REPO / "examples/jobs/batch-summarize.yaml", catalog=CATALOG)[0]))


def _observation(tick: int) -> OutcomeObservation:
    return OutcomeObservation(
        deployment_id="d-1", job_id="chat-eu", tick=tick, scope=SCOPE, weight=50.0,
        predicted={"ttft_ms": 100.0, "tpot_ms": 20.0, "ttft_p95_ms": 200.0,
                   "tpot_p95_ms": 30.0, "kv_pressure": 0.4},
        observed={"ttft_ms": 150.0, "tpot_ms": 25.0, "ttft_p95_ms": 260.0,
                  "tpot_p95_ms": 40.0},
        curves={"ttft": tuple(4.0 + 0.1 * i for i in range(len(LOG_GRID))),
                "tpot": tuple(2.0 + 0.1 * i for i in range(len(LOG_GRID)))})


def _causal_state() -> causal_pb2.CausalState:
    koi = settings_for("koi")
    start = KoiState.initial(koi)
    beliefs, calibrator, _ = learn_from([_observation(3)], start.beliefs, start.calibrator,
                                        3, koi)
    return planning.causal_state_to_proto(beliefs, calibrator, 3)


def _decision(job_id: str) -> plan_pb2.Decision:
    return plan_pb2.Decision(
        job_id=job_id, kind=plan_pb2.DECISION_KIND_PLACE, replicas=2, gpus=2,
        reason="cheapest", config=config_to_proto(CFG), offering=OFFERING, usd_per_hour=6.2,
        goodput_tok_s=250, demand_tok_s=256, candidate_id=f"{job_id}#0",
        explanation=plan_pb2.Explanation(job_id=job_id, decision="place", mechanism_ids=["m"],
                                         ttft_p95_ms_robust=410, planned_rate_rps=1.5))


def _seeds() -> dict[str, Message]:
    deployment = cluster_pb2.Deployment(
        deployment_id="d-1", job_id="chat-eu", config=config_to_proto(CFG), offering=OFFERING,
        state=cluster_pb2.DEPLOYMENT_STATE_RUNNING, replicas_ready=2)
    snapshot = cluster_pb2.ClusterSnapshot(
        tick=3, time_s=180, tick_s=60, horizon_s=3600, deployments=[deployment],
        capacity=[cluster_pb2.OfferingCapacity(offering=OFFERING, total_gpus=8, used_gpus=2)],
        jobs=[cluster_pb2.JobStatus(spec=_job(), admitted=True),
              cluster_pb2.JobStatus(spec=_batch_job())])
    telemetry = bus_pb2.TelemetryBatch(tick=3, telemetry=[bus_pb2.DeploymentTelemetry(
        tick=3, deployment_id="d-1", job_id="chat-eu", window_s=60, requests_arrived=90,
        requests_finished=88, ttft_bucket_bounds_s=[0.1, 0.5, 1], ttft_bucket_counts=[50, 30, 8],
        ttft_p95_s=0.4, tpot_p95_s=0.03, output_tok_s=300)])
    proposal = Proposal(job_id="chat-eu", config=CFG, hypothesis="one H100",
                        mechanism_ids=("m",), priority=1.0)
    actions = cluster_pb2.PlacementActions(tick=3, plan_tick=3, notes={"a": "b"}, actions=[
        cluster_pb2.PlacementAction(kind=cluster_pb2.PLACEMENT_ACTION_KIND_LAUNCH,
                                    job_id="chat-eu", deployment_id="d-2",
                                    config=config_to_proto(CFG), offering=OFFERING,
                                    replicas=1)])
    return {
        "snapshot": snapshot, "telemetry": telemetry,
        "observations": bus_pb2.ObservationBatch.FromString(
            planning.encode_observations(3, [_observation(3)])),
        "causal": _causal_state(),
        "candidates": planning.candidates_to_proto(3, 1, [proposal]),
        "plan": plan_pb2.ClusterPlan(tick=3, source_tick=3, causal_state_version=1,
                                     solver="greedy", decisions=[_decision("chat-eu")],
                                     gpus_by_offering={OFFERING: 2}),
        "actions": actions, "job": _job(), "batch job": _batch_job(),
        "config": config_to_proto(CFG),
        "workload": prediction_pb2.Workload(
            input_len_tokens=512, output_len_tokens=128, mode=prediction_pb2.LOAD_MODE_RATE,
            load=2.0, slo_ttft_ms=800, slo_tpot_ms=50),
        "event": planning.make_event(kind="launch", severity="info", service="placer",
                                     message="launched", tick=3, job_id="chat-eu",
                                     mechanism_ids=["m"], event_id="e"),
        "hypotheses": _hypotheses(),
        "spend": jobs_pb2.SubmitSpend(replica="a1b2c3", spent={"flood": 40, "alice": 1}),
    }


def _hypotheses() -> hypotheses_pb2.HypothesisRound:
    """A round with one hypothesis holding a test configuration and an exploration."""
    h = Hypothesis(edge=("kv_pressure", "tpot"), scope=Scope("l4", "vllm", "≤10B", "tp1",
                                                             family="ada"),
                   direction=Direction.INCREASE, size=1.5, size_low=1.2, size_high=2.0,
                   expires_tick=30, source_model="m", round_id="r3",
                   why=("residual:chat-eu/tpot_p95",), tests=(CandidateTest("chat-eu", CFG),),
                   explore=(Exploration("chat-eu", "max_num_seqs", (96, 128)),))
    return hypotheses_pb2.HypothesisRound.FromString(encode_hypotheses(RoundOutcome(
        enters_tick=4, round_id="r3", round_tick=3, model="m", ok=True, hypotheses=(h,),
        dropped=(Dropped(1, "hallucinated accelerator"),))))


SEEDS = _seeds()


# --- the bus decoders ----------------------------------------------------------------------

def _mechanisms(data: bytes) -> Any:
    """The proposer's view of a causal message: the readable mechanism list alone."""
    return planning.mechanisms_from_proto(codec.decode(data, causal_pb2.CausalState))


def _event_line(data: bytes) -> None:
    """``koi events follow`` prints every event it reads: one bounded line, always."""
    check_message(planning.event_line(codec.decode(data, events_pb2.OperatorEvent)))


def _raw(message_type: type[Message]) -> Callable[[bytes], Any]:
    return lambda data: codec.decode(data, message_type)


# name → (message type, decoder, seeds for mutation)
DECODERS: dict[str, tuple[type[Message], Callable[[bytes], Any], tuple[Message, ...]]] = {
    "snapshot": (cluster_pb2.ClusterSnapshot, planning.decode_snapshot, (SEEDS["snapshot"],)),
    "telemetry": (bus_pb2.TelemetryBatch, planning.decode_telemetry, (SEEDS["telemetry"],)),
    "observations": (bus_pb2.ObservationBatch, planning.decode_observations,
                     (SEEDS["observations"],)),
    "causal state": (causal_pb2.CausalState, planning.decode_causal_state, (SEEDS["causal"],)),
    "causal mechanisms": (causal_pb2.CausalState, _mechanisms, (SEEDS["causal"],)),
    "candidates": (bus_pb2.CandidateBatch, planning.decode_candidates, (SEEDS["candidates"],)),
    "plan": (plan_pb2.ClusterPlan, planning.decode_plan, (SEEDS["plan"],)),
    "plan targets": (plan_pb2.ClusterPlan, planning.decode_plan_targets, (SEEDS["plan"],)),
    "actions": (cluster_pb2.PlacementActions, planning.decode_actions, (SEEDS["actions"],)),
    "job spec": (jobs_pb2.JobSpec, codec.decode_job, (SEEDS["job"], SEEDS["batch job"])),
    "config": (config_pb2.DeploymentConfig, codec.decode_config, (SEEDS["config"],)),
    "strict config": (config_pb2.DeploymentConfig,
                      lambda d: codec.decode_config(d, strict=True), (SEEDS["config"],)),
    "workload": (prediction_pb2.Workload, codec.decode_workload, (SEEDS["workload"],)),
    "prediction": (prediction_pb2.Prediction, codec.decode_prediction, ()),
    "operator event": (events_pb2.OperatorEvent, _event_line, (SEEDS["event"],)),
    "sim status": (bus_pb2.SimStatus, _raw(bus_pb2.SimStatus), ()),
    "propose work": (work_pb2.ProposeWork, _raw(work_pb2.ProposeWork), ()),
    "evaluate work": (work_pb2.EvaluateWork, _raw(work_pb2.EvaluateWork), ()),
    "evaluated slice": (work_pb2.EvaluatedSlice, _raw(work_pb2.EvaluatedSlice), ()),
    "run summary": (work_pb2.RunSummary, _raw(work_pb2.RunSummary), ()),
    "hypotheses": (hypotheses_pb2.HypothesisRound, decode_hypotheses, (SEEDS["hypotheses"],)),
    "submit spend": (jobs_pb2.SubmitSpend, codec.decode_spend, (SEEDS["spend"],)),
}


def test_every_seed_decodes() -> None:
    """The mutation seeds are valid, so mutants start deep inside each decoder."""
    for name, (message_type, decode, seeds) in DECODERS.items():
        for seed in seeds:
            assert isinstance(seed, message_type), name
            decode(codec.encode(seed))


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(data=st.data())
def test_random_bytes(name: str, data: st.DataObject) -> None:
    _, decode, seeds = DECODERS[name]
    blob = data.draw(st.one_of(
        st.binary(max_size=256),
        # a valid message's bytes, cut short or with bytes flipped
        st.sampled_from([codec.encode(s) for s in seeds] or [b"\x08\x01"]).flatmap(
            lambda b: st.tuples(st.just(b), st.integers(0, len(b)), st.binary(max_size=4))
        ).map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + len(t[2]):])))
    check_decoder(decode, blob)


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(data=st.data())
def test_structured_messages(name: str, data: st.DataObject) -> None:
    message_type, decode, _ = DECODERS[name]
    check_decoder(decode, codec.encode(data.draw(messages(message_type.DESCRIPTOR, POOL))))


@pytest.mark.parametrize("name", sorted(n for n, (_, _, seeds) in DECODERS.items() if seeds))
@FUZZ
@given(data=st.data())
def test_mutated_valid_messages(name: str, data: st.DataObject) -> None:
    _, decode, seeds = DECODERS[name]
    check_decoder(decode, codec.encode(data.draw(mutated(seeds, POOL))))


@FUZZ
@given(batch=st.one_of(mutated((SEEDS["observations"],), POOL),
                       messages(bus_pb2.ObservationBatch.DESCRIPTOR, POOL)))
def test_observations_that_decode_can_be_learnt(batch: Message) -> None:
    """The causal store learns whatever decodes: a failure there is redelivered for ever
    (the consumer holds one message at a time), and a NaN learnt stays."""
    try:
        tick, observations = planning.decode_observations(codec.encode(batch))
    except DECODE_ERRORS:
        return
    koi = settings_for("koi")
    start = KoiState.initial(koi)
    beliefs, _, _ = learn_from(observations, start.beliefs, start.calibrator, max(tick, 0), koi)
    assert all(math.isfinite(b.mean) for b in beliefs.beliefs.values())


# regressions the fuzzing found, as plain examples
@pytest.mark.parametrize("weight", [math.nan, math.inf, -1.0])
def test_an_observation_weight_that_is_not_a_count_is_refused(weight: float) -> None:
    # a NaN weight decoded, was learnt, and left its belief's mean NaN for good
    batch = bus_pb2.ObservationBatch(tick=3, observations=[bus_pb2.CausalObservation(
        deployment_id="d-1", job_id="chat", tick=3, weight=weight,
        scope=common_pb2.Scope(accelerator="h100-sxm", engine="vllm",
                                  model_size_class="70b", parallelism_bucket="tp4",
                                  accelerator_family="hopper"))])
    with pytest.raises(InvalidSpecError, match="weight: must be a finite count"):
        planning.decode_observations(codec.encode(batch))


def test_a_plan_quoting_a_huge_solver_name_gives_a_short_error() -> None:
    plan = plan_pb2.ClusterPlan(solver="x" * 20_000)
    with pytest.raises(InvalidSpecError) as info:
        planning.decode_plan(codec.encode(plan))
    check_message(str(info.value))


def test_a_curve_of_the_wrong_length_is_refused_when_decoded() -> None:
    batch = bus_pb2.ObservationBatch.FromString(codec.encode(SEEDS["observations"]))
    del batch.observations[0].curves["tpot"].log_ms[3:]
    with pytest.raises(InvalidSpecError, match=r"curves\['tpot'\]: needs 13 finite"):
        planning.decode_observations(codec.encode(batch))


@pytest.mark.parametrize("text", ["\x1f", "gpus: .nan", "fleet: " + "[" * 100 + "]" * 100,
                                  "a: &a [*a, *a, *a, *a, *a, *a, *a]"])
def test_scenario_files_that_broke_the_loader(yaml_file: Path, text: str) -> None:
    doc = copy.deepcopy(SCENARIO_DOC)
    doc["fleet"][0]["gpus"] = math.nan
    yaml_file.write_text(_dump(doc) if text == "gpus: .nan" else text, encoding="utf-8")
    with pytest.raises(InvalidSpecError) as info:
        load_scenario(yaml_file, catalog=CATALOG)
    check_message(str(info.value))


# --- YAML: job files and scenarios ---------------------------------------------------------

@pytest.fixture(scope="module")
def yaml_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "fuzzed.yaml"


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:  # e.g. a float key: not writable, so not a file anyone has
        return "{}"


JOB_DOCS = [yaml.safe_load((REPO / "examples/jobs" / n).read_text())
            for n in ("chat-online.yaml", "batch-summarize.yaml")]
SCENARIO_DOC = yaml.safe_load(scenario_path("hetero-3h").read_text())
YAML_TEXT = st.one_of(st.text(max_size=200), st.sampled_from([
    "[", "{a: 1", "a: &x [*x]", "!!python/object:os.system {}", "- - - -", "\t", "---\n---",
    "a: 1\na: 2", "? [a]\n: 1", "x: !!binary AAAA", "jobs: " + "[" * 200]))


@FUZZ
@given(text=st.one_of(YAML_TEXT, st.sampled_from(JOB_DOCS).flatmap(mutated_document)
                      .map(_dump)))
def test_job_yaml_loader(yaml_file: Path, text: str) -> None:
    yaml_file.write_text(text, encoding="utf-8")
    check_loader(lambda p: load_jobs_yaml(p, catalog=CATALOG), yaml_file)


@FUZZ
@given(text=st.one_of(YAML_TEXT, mutated_document(SCENARIO_DOC).map(_dump)))
def test_scenario_loader(yaml_file: Path, text: str) -> None:
    yaml_file.write_text(text, encoding="utf-8")
    check_loader(lambda p: load_scenario(p, catalog=CATALOG), yaml_file)


# --- gRPC requests -------------------------------------------------------------------------

class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class FakeContext:
    """What the servicer uses of a ``grpc.ServicerContext``: abort raises."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return True


def _servicer() -> Any:
    from services.planner_api.grpc_server import PlanServiceServicer
    from services.planner_api.readmodel import ReadModel

    model = ReadModel(catalog=CATALOG)
    model.on_job(SEEDS["job"], tick=2)
    model.on_job(SEEDS["batch job"], tick=2)
    model.on_plan(SEEDS["plan"])
    model.on_deployments(3, list(SEEDS["snapshot"].deployments))
    model.on_causal(SEEDS["causal"])
    return PlanServiceServicer(model)


SERVICER = _servicer()
RPCS = {"GetPlan": plan_service_pb2.GetPlanRequest, "GetJob": plan_service_pb2.GetJobRequest,
        "ListJobs": plan_service_pb2.ListJobsRequest, "Explain": plan_service_pb2.ExplainRequest,
        "WhatIf": plan_service_pb2.WhatIfRequest,
        "ListMechanisms": plan_service_pb2.ListMechanismsRequest}
REQUEST_POOL = (*POOL, "chat-eu", "batch-summarize", "online", "batch")


def _call(rpc: str, request: Message) -> None:
    try:
        getattr(SERVICER, rpc)(request, FakeContext())
    except Aborted as e:
        assert e.code != grpc.StatusCode.INTERNAL, f"{rpc} failed inside: {e.details}"
        check_message(e.details)


@pytest.mark.parametrize("rpc", sorted(RPCS))
@FUZZ
@given(data=st.data())
def test_grpc_requests(rpc: str, data: st.DataObject) -> None:
    _call(rpc, data.draw(messages(RPCS[rpc].DESCRIPTOR, REQUEST_POOL)))


def test_watch_plans_refuses_a_bad_tick() -> None:
    request = plan_service_pb2.WatchPlansRequest(from_tick=-1)
    with pytest.raises(Aborted) as info:
        next(iter(SERVICER.WatchPlans(request, FakeContext())))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


# --- the longer hunt ------------------------------------------------------------------------

def _targets(yaml_file: Path) -> list[tuple[str, Callable[[], None]]]:
    """Every fuzz test above as (name, run once with fresh examples)."""
    targets: list[tuple[str, Callable[[], None]]] = []
    for name in sorted(DECODERS):
        targets.append((f"random bytes: {name}", lambda n=name: test_random_bytes(name=n)))
        targets.append((f"structured: {name}", lambda n=name: test_structured_messages(name=n)))
        if DECODERS[name][2]:
            targets.append((f"mutated: {name}",
                            lambda n=name: test_mutated_valid_messages(name=n)))
    targets.append(("observations learnt", test_observations_that_decode_can_be_learnt))
    targets.append(("job yaml", lambda: test_job_yaml_loader(yaml_file=yaml_file)))
    targets.append(("scenario yaml", lambda: test_scenario_loader(yaml_file=yaml_file)))
    targets.extend((f"grpc: {rpc}", lambda r=rpc: test_grpc_requests(rpc=r)) for rpc in sorted(RPCS))
    return targets


@pytest.mark.timeout(HUNT_S + 300)
def test_a_longer_hunt_within_a_time_budget(yaml_file: Path) -> None:
    """Every target again, ``EXAMPLES`` fresh examples a run (Hypothesis draws a new seed
    each run), in a shuffled order, round after round until ``HUNT_S`` seconds are spent.

    A run is started only while time is left, after a first round that always completes,
    so the hunt takes the longer of ``HUNT_S`` and one round, plus at most one run of the
    slowest target (seconds), and is at least as deep as the per-target tests. A failure names its target and shows the
    falsifying example, shrunk, as any Hypothesis failure does."""
    targets = _targets(yaml_file)
    random.Random().shuffle(targets)
    deadline = time.monotonic() + HUNT_S
    runs = 0
    for name, run in itertools.cycle(targets):
        if runs >= len(targets) and time.monotonic() >= deadline:
            break
        try:
            run()
        except BaseException as e:
            e.add_note(f"fuzz hunt: target {name!r}, run {runs + 1}")
            raise
        runs += 1
    print(f"fuzz hunt: {runs} runs of {EXAMPLES} examples over {len(targets)} targets "
          f"({runs / len(targets):.1f} rounds)")
