"""Tests for koi.wire.planning: the planning tick's messages round-trip exactly.

A few ticks of the simulator driven by the Koi planner give real snapshots, telemetry,
decisions, proposals, observations, plans, explanations and causal states; each must come
back from bytes equal to what went in, floats bit for bit. A second planner that sees
everything through the codecs (its causal state included) must decide exactly what the
in-process one decides. Hypothesis covers the odd floats and strings real runs rarely
produce; bad bytes must raise the documented ``InvalidSpecError``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.causal.observe import OutcomeObservation
from koi.causal.scope import ANY, Scope
from koi.causal.store import BeliefStore
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    DeploymentTelemetry,
    JobStatus,
    PlanDecision,
)
from koi.compose import ComposePlan
from koi.compose.types import Decision, JobChoice, SolverName
from koi.dro import DroCalibrator
from koi.errors import InvalidSpecError
from koi.jobs import shared_data_dir
from koi.lifecycle import job_finished
from koi.planner.explain import Explanation
from koi.planner.place import Target
from koi.planner.propose import Proposal
from koi.planner.stability import ChurnMemory, remember
from koi.planner.tick import (
    TickReport,
    active_mechanisms,
    mediator_hints,
    place_stable,
    propose_stage,
)
from koi.policies import make_policy
from koi.scenario import load_scenario
from koi.space import DeploymentConfig
from koi.v1 import causal_pb2, cluster_pb2, plan_pb2
from koi.wire import decode, encode
from koi.wire.planning import (
    EVENT_KINDS,
    SEVERITIES,
    decode_actions,
    decode_candidates,
    decode_causal_state,
    decode_observations,
    decode_plan,
    decode_plan_targets,
    decode_snapshot,
    decode_telemetry,
    encode_actions,
    encode_candidates,
    encode_causal_state,
    encode_observations,
    encode_plan,
    encode_snapshot,
    encode_telemetry,
    event_line,
    explanations_from_proto,
    make_event,
    plan_to_proto,
    scope_from_proto,
    scope_to_proto,
)

CATALOG = load_catalog()
TICKS = 14  # beliefs, mechanisms, a moving DRO radius (tick 4 on) and a scale (tick 13:
#             the churn holds keep a fresh launch's count, so none comes earlier)


def same(a: Any, b: Any) -> bool:
    """Equal, with floats bit-identical (NaN, -0.0) and types kept (no int → float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, np.ndarray):  # a trace's arrivals
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@dataclass
class Tick:
    snapshot: ClusterSnapshot
    telemetry: tuple[DeploymentTelemetry, ...]
    decision: PlanDecision
    report: TickReport
    beliefs: BeliefStore
    calibrator: DroCalibrator
    proposals: list[Proposal]
    observations: list[OutcomeObservation]
    bus_decision: PlanDecision      # what the planner fed through the codecs decided
    placed_from_bytes: list[Action]  # the placer's actions from the decoded plan targets


def _through_the_bus(policy: Any, snapshot: ClusterSnapshot,
                     telemetry: list[DeploymentTelemetry]) -> PlanDecision:
    """``policy.decide`` on decoded inputs and a decoded causal state; decoded output."""
    beliefs, calibrator, _ = decode_causal_state(encode_causal_state(
        policy.state.beliefs, policy.state.calibrator, policy.state.tick))
    policy.state = replace(policy.state, beliefs=beliefs, calibrator=calibrator)
    tick, tel = decode_telemetry(encode_telemetry(snapshot.tick, telemetry))
    assert tick == snapshot.tick
    decision = policy.decide(decode_snapshot(encode_snapshot(snapshot)), list(tel))
    out, plan_tick = decode_actions(encode_actions(decision, snapshot.tick))
    assert plan_tick == snapshot.tick
    return out


@pytest.fixture(scope="module")
def run() -> list[Tick]:
    """``TICKS`` ticks of hetero-3h (seed 1), the in-process planner's decisions applied."""
    from koi.sim.simulator import Simulator

    seen: list[list[OutcomeObservation]] = []
    real_update = BeliefStore.update

    def spy(self: BeliefStore, observations: Any, tick: int) -> BeliefStore:
        seen.append(list(observations))
        return real_update(self, seen[-1], tick)

    sim = Simulator(load_scenario("hetero-3h"), seed=1, catalog=CATALOG)
    policy = make_policy("koi", catalog=CATALOG, seed=1)
    bus = make_policy("koi", catalog=CATALOG, seed=1)
    ticks: list[Tick] = []
    telemetry: list[DeploymentTelemetry] = []
    memory = ChurnMemory()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BeliefStore, "update", spy)
        while len(ticks) < TICKS and not sim.done:
            snapshot = sim.snapshot()
            seen.clear()
            decision = policy.decide(snapshot, telemetry)
            observations = [o for batch in seen for o in batch]
            report = policy.reports[-1]
            active = [j for j in snapshot.jobs if not j.rejected and j.spec.submit_s
                      <= snapshot.time_s and not job_finished(j, snapshot.time_s)]
            proposals = propose_stage(snapshot, active_mechanisms(policy.state.beliefs),
                                      policy.settings, CATALOG, jobs=active,
                                      hints=mediator_hints(observations))
            _, targets, notes = decode_plan_targets(encode_plan(
                snapshot.tick, report.plan, report.explanations, report.belief_version))
            # the bus placer's stage: its own churn memory, brought up to each snapshot
            memory = remember(memory, snapshot)
            placed_decision, memory = place_stable(list(targets), notes, snapshot,
                                                   policy.settings, memory)
            placed = list(placed_decision.actions)
            bus_decision = _through_the_bus(bus, snapshot, telemetry)
            ticks.append(Tick(snapshot, tuple(telemetry), decision, report,
                              policy.state.beliefs, policy.state.calibrator, proposals,
                              observations, bus_decision, placed))
            sim.apply(decision)
            telemetry = sim.advance()
    return ticks


# --- real ticks ---------------------------------------------------------------------------

def test_run_exercises_everything(run: list[Tick]) -> None:
    last = run[-1]
    assert sum(len(t.snapshot.deployments) for t in run) > 0
    assert sum(len(t.telemetry) for t in run) > 0
    assert sum(len(t.observations) for t in run) > 0
    assert last.beliefs.beliefs and last.beliefs.cliffs and last.beliefs.mechanisms
    assert last.beliefs.tails
    assert last.calibrator.residuals
    kinds = {a.kind for t in run for a in t.decision.actions}
    assert {ActionKind.LAUNCH, ActionKind.SCALE} <= kinds
    assert any(a.config is None for t in run for a in t.decision.actions)


def test_snapshots_round_trip_exactly(run: list[Tick]) -> None:
    for t in run:
        back = decode_snapshot(encode_snapshot(t.snapshot))
        assert back == t.snapshot
        assert same(back, t.snapshot)


def test_telemetry_round_trips_exactly(run: list[Tick]) -> None:
    for t in run:
        tick, back = decode_telemetry(encode_telemetry(t.snapshot.tick, t.telemetry))
        assert tick == t.snapshot.tick
        assert back == t.telemetry and same(back, t.telemetry)


def test_decisions_round_trip_exactly(run: list[Tick]) -> None:
    for t in run:
        back, plan_tick = decode_actions(encode_actions(t.decision, t.snapshot.tick - 1))
        assert plan_tick == t.snapshot.tick - 1
        assert back == t.decision and same(back, t.decision)


def test_observations_round_trip_exactly(run: list[Tick]) -> None:
    for t in run:
        tick, back = decode_observations(encode_observations(t.snapshot.tick, t.observations))
        assert tick == t.snapshot.tick
        assert back == tuple(t.observations)
        # mappings come back sorted by key; the values are the same floats
        assert all(same(dict(b.observed), dict(o.observed)) and same(b.scope, o.scope)
                   for b, o in zip(back, t.observations, strict=True))


def test_candidates_round_trip_exactly(run: list[Tick]) -> None:
    for t in run:
        version = t.beliefs.version
        tick, v, back = decode_candidates(encode_candidates(t.snapshot.tick, version,
                                                            t.proposals))
        assert (tick, v) == (t.snapshot.tick, version)
        assert back == tuple(t.proposals) and same(back, tuple(t.proposals))


def test_plan_gives_the_placer_its_targets_and_notes(run: list[Tick]) -> None:
    for t in run:
        plan = t.report.plan
        assert plan is not None
        tick, targets, notes = decode_plan_targets(encode_plan(
            t.snapshot.tick, plan, t.report.explanations, t.report.belief_version))
        assert tick == t.snapshot.tick
        assert targets == tuple(Target(c.job_id, c.decision.value, c.reason, c.config,
                                       c.offering, c.replicas,
                                       min(c.goodput_tok_s / c.demand_tok_s, 1.0)
                                       if c.demand_tok_s > 0 else 1.0)
                                for c in plan.choices)
        assert notes == t.decision.notes
        # the placer acting on the decoded targets does what the in-process tick did
        assert t.placed_from_bytes == list(t.decision.actions)


def _plan_fields_same(a: ComposePlan, b: ComposePlan) -> bool:
    return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(ComposePlan))


def test_plan_carries_explanations_and_the_whole_compose_plan(run: list[Tick]) -> None:
    for t in run:
        plan = t.report.plan
        assert plan is not None
        msg, back, explanations = decode_plan(encode_plan(
            t.snapshot.tick, plan, t.report.explanations, t.report.belief_version))
        assert explanations == t.report.explanations
        assert same(explanations, t.report.explanations)
        assert explanations_from_proto(msg) == t.report.explanations
        assert _plan_fields_same(back, plan)
        assert msg.causal_state_version == t.report.belief_version
        assert msg.source_tick == msg.tick == t.snapshot.tick and not msg.degraded
        assert msg.total_usd_per_hour == plan.usd_per_hour
        assert msg.robust_goodput_tok_s == plan.goodput_tok_s
        assert sum(msg.gpus_by_family.values()) == sum(plan.gpus_by_offering.values())
        assert sum(sum(d.gpus_by_family.values()) for d in msg.decisions) \
            == sum(c.gpus for c in plan.choices if c.offering)


def test_degraded_plan_keeps_its_source_tick(run: list[Tick]) -> None:
    t = run[-1]
    assert t.report.plan is not None
    msg = plan_to_proto(t.snapshot.tick + 1, t.report.plan, t.report.explanations, 3,
                        degraded=True, degraded_reason="evaluator missed its deadline",
                        source_tick=t.snapshot.tick)
    assert (msg.tick, msg.source_tick, msg.degraded) == (t.snapshot.tick + 1,
                                                         t.snapshot.tick, True)
    assert msg.degraded_reason == "evaluator missed its deadline"


def test_causal_state_round_trips_exactly(run: list[Tick]) -> None:
    for t in run:
        data = encode_causal_state(t.beliefs, t.calibrator, t.snapshot.tick)
        beliefs, calibrator, tick = decode_causal_state(data)
        assert tick == t.snapshot.tick
        assert beliefs == t.beliefs and calibrator == t.calibrator
        assert beliefs.to_bytes() == t.beliefs.to_bytes()
        assert calibrator.to_bytes() == t.calibrator.to_bytes()  # NaN spreads included
        msg = decode(data, causal_pb2.CausalState)
        assert len(msg.store.beliefs) == len(t.beliefs.beliefs)
        assert len(msg.calibrator_state.observations) == len(t.calibrator.observations)
        assert msg.version == t.beliefs.version
        assert len(msg.beliefs) == len(t.beliefs.beliefs) + len(t.beliefs.tails) \
            + len(t.beliefs.cliffs)
        assert [m.id for m in msg.mechanisms] == sorted(t.beliefs.mechanisms)
        assert [c.outcome for c in msg.calibration] == list(t.calibrator.outcomes)
        for c in msg.calibration:
            assert c.dro_radius == t.calibrator.radius(c.outcome)
            assert c.target_coverage == t.calibrator.coverage


def test_a_planner_fed_through_the_bus_decides_the_same(run: list[Tick]) -> None:
    for t in run:
        assert t.bus_decision == t.decision, f"tick {t.snapshot.tick}"


@pytest.mark.parametrize("name", ["hetero-3h", "hetero-12h", "homog-mixed-12h", "real-104",
                                  "trace-azure"])
def test_every_scenario_job_travels_exactly(name: str) -> None:
    if name == "trace-azure" and shared_data_dir() is None:
        pytest.skip("trace-azure replays traces from the shared data directory")
    jobs = tuple(JobStatus(j, admitted=True, rejected=False, output_tokens_done=0.5,
                           observed_rate_rps=1.25, requests_done=3.0)
                 for j in load_scenario(name).jobs)
    snapshot = ClusterSnapshot(0, 0.0, 60.0, 3600.0, (), (), jobs)
    back = decode_snapshot(encode_snapshot(snapshot))
    assert back == snapshot and same(back, snapshot)


# --- properties ---------------------------------------------------------------------------

FLOATS = st.floats(allow_nan=True, allow_infinity=True)
TEXT = st.text(max_size=12)
IDS = st.text(min_size=1, max_size=12)
SCOPE_VALUES = st.one_of(st.just(ANY), IDS)
SCOPES = st.builds(Scope, accelerator=SCOPE_VALUES, engine=SCOPE_VALUES,
                   size_class=SCOPE_VALUES, parallelism=SCOPE_VALUES, family=SCOPE_VALUES)
CONFIGS = st.sampled_from([
    DeploymentConfig(model="llama-3.1-8b", accelerator="l4", engine="vllm"),
    DeploymentConfig(model="llama-3.1-70b", accelerator="h100-sxm", engine="sglang", tp=4,
                     replicas=3, offering="aws/us-east-1/h100-sxm/spot"),
])
OFFERINGS = st.sampled_from(sorted(CATALOG.offerings))


@given(SCOPES)
def test_scope_round_trips(scope: Scope) -> None:
    assert scope_from_proto(scope_to_proto(scope)) == scope


def test_an_empty_scope_field_cannot_travel() -> None:
    with pytest.raises(InvalidSpecError, match=r"scope\.engine"):
        scope_to_proto(Scope(engine=""))


def _telemetry(draw: Any) -> DeploymentTelemetry:
    values: dict[str, Any] = {}
    for f in fields(DeploymentTelemetry):
        if f.name in ("tick", "replica_preemptions"):
            values[f.name] = draw(st.integers(0, 2**31 - 1))
        elif f.name in ("deployment_id", "job_id"):
            values[f.name] = draw(IDS)
        elif f.name.endswith(("_bounds_s", "_counts")):
            values[f.name] = tuple(draw(st.lists(FLOATS, max_size=4)))
        else:
            values[f.name] = draw(FLOATS)
    return DeploymentTelemetry(**values)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_telemetry_round_trips_any_floats(data: st.DataObject) -> None:
    batch = tuple(_telemetry(data.draw) for _ in range(data.draw(st.integers(0, 3))))
    tick, back = decode_telemetry(encode_telemetry(7, batch))
    assert tick == 7 and same(back, batch)


@settings(max_examples=50, deadline=None)
@given(IDS, IDS, st.integers(-2**62, 2**62), SCOPES,
       st.dictionaries(TEXT, FLOATS, max_size=5), st.dictionaries(TEXT, FLOATS, max_size=5),
       # a weight is a request count: finite and >= 0 (anything else is refused, below)
       st.floats(0.0, 1e12),
       st.dictionaries(TEXT, st.lists(st.floats(allow_nan=False, allow_infinity=False),
                                             min_size=13, max_size=13).map(tuple), max_size=2))
def test_observations_round_trip_any_values(dep: str, job: str, tick: int, scope: Scope,
                                            predicted: dict[str, float],
                                            observed: dict[str, float], weight: float,
                                            curves: dict[str, tuple[float, ...]]) -> None:
    obs = OutcomeObservation(dep, job, tick, scope, predicted, observed, weight, curves)
    _, (back,) = decode_observations(encode_observations(tick, [obs]))
    assert same(back, replace(obs, predicted=dict(sorted(predicted.items())),
                              observed=dict(sorted(observed.items())),
                              curves=dict(sorted(curves.items()))))


ACTIONS = st.builds(Action, kind=st.sampled_from(list(ActionKind)), job_id=IDS, reason=TEXT,
                    deployment_id=TEXT, config=st.one_of(st.none(), CONFIGS),
                    offering=TEXT, replicas=st.integers(0, 2**31 - 1))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**62), st.lists(ACTIONS, max_size=4),
       st.dictionaries(TEXT, TEXT, max_size=4), st.integers(0, 2**62))
def test_actions_round_trip_any_values(tick: int, actions: list[Action],
                                       notes: dict[str, str], plan_tick: int) -> None:
    d = PlanDecision(tick, tuple(actions), notes)
    back, pt = decode_actions(encode_actions(d, plan_tick))
    assert pt == plan_tick and same(back, replace(d, notes=dict(sorted(notes.items()))))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.builds(Proposal, job_id=IDS, config=CONFIGS, hypothesis=TEXT,
                          mechanism_ids=st.lists(IDS, max_size=3).map(tuple),
                          priority=FLOATS), max_size=4))
def test_candidates_round_trip_any_values(proposals: list[Proposal]) -> None:
    _, _, back = decode_candidates(encode_candidates(3, 9, proposals))
    assert same(back, tuple(proposals))


PAIRS = st.lists(st.tuples(TEXT, FLOATS), max_size=3).map(tuple)


@st.composite
def plans(draw: Any) -> tuple[ComposePlan, tuple[Explanation, ...]]:
    choices, explanations = [], []
    for i in range(draw(st.integers(0, 3))):
        job = f"job-{i}"
        kind = draw(st.sampled_from(list(Decision)))
        placed = kind is Decision.PLACE
        choices.append(JobChoice(
            job, kind, draw(TEXT), candidate_id=draw(st.one_of(st.none(), TEXT)),
            offering=draw(OFFERINGS) if placed else "",
            config=draw(CONFIGS) if placed else None, replicas=draw(st.integers(0, 99)),
            gpus=draw(st.integers(0, 99)), goodput_tok_s=draw(FLOATS),
            demand_tok_s=draw(FLOATS), usd_per_hour=draw(FLOATS), objective=draw(FLOATS),
            stays=draw(st.booleans())))
        if draw(st.booleans()):
            explanations.append(Explanation(
                job, kind.value, draw(TEXT), draw(TEXT), draw(TEXT), draw(st.integers(0, 99)),
                draw(TEXT), draw(TEXT), *(draw(FLOATS) for _ in range(4)), draw(PAIRS),
                draw(PAIRS), tuple(draw(st.lists(TEXT, max_size=2))),
                tuple(draw(st.lists(IDS, max_size=2))), draw(FLOATS), draw(FLOATS)))
    plan = ComposePlan(
        tuple(choices), draw(st.sampled_from(list(SolverName))), draw(TEXT), draw(FLOATS),
        draw(st.one_of(st.none(), FLOATS)), draw(st.one_of(st.none(), FLOATS)), draw(FLOATS),
        draw(FLOATS), draw(st.integers(0, 2**40)), draw(st.integers(0, 2**40)),
        draw(st.dictionaries(OFFERINGS, st.integers(0, 999), max_size=3)),
        draw(st.dictionaries(OFFERINGS, st.integers(0, 999), max_size=3)))
    return plan, tuple(explanations)


@settings(max_examples=50, deadline=None)
@given(plans())
def test_plans_round_trip_any_values(case: tuple[ComposePlan, tuple[Explanation, ...]]
                                     ) -> None:
    plan, explanations = case
    msg, back, back_explanations = decode_plan(encode_plan(5, plan, explanations, 2))
    assert same(back_explanations, explanations)
    expected = replace(plan, gpus_by_offering=dict(sorted(plan.gpus_by_offering.items())),
                       free_by_offering=dict(sorted(plan.free_by_offering.items())))
    assert _plan_fields_same(back, expected)
    _, targets, notes = decode_plan_targets(encode(msg))
    assert [t.job_id for t in targets] == [c.job_id for c in plan.choices]
    assert notes == {"solver": str(plan.solver), "status": plan.status,
                     "objective": f"{plan.objective:.2f}"}


def test_explanations_must_belong_to_the_plan(run: list[Tick]) -> None:
    plan = run[-1].report.plan
    assert plan is not None
    stray = Explanation("no-such-job", "defer", "why")
    with pytest.raises(ValueError, match="no-such-job"):
        encode_plan(1, plan, [stray], 0)
    twice = Explanation(plan.choices[0].job_id, "defer", "why")
    with pytest.raises(ValueError, match="two explanations"):
        encode_plan(1, plan, [twice, twice], 0)


# --- errors -------------------------------------------------------------------------------

GARBAGE = [b"\x0a\x05ab", b"\x08", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"]
DECODERS = [decode_snapshot, decode_telemetry, decode_observations, decode_candidates,
            decode_plan_targets, decode_plan, decode_actions, decode_causal_state]


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("data", GARBAGE, ids=["truncated", "no-value", "bad-varint"])
def test_garbage_bytes_raise_invalid_spec_error(decoder: Any, data: bytes) -> None:
    with pytest.raises(InvalidSpecError) as info:
        decoder(data)
    assert info.value.field.startswith("koi.v1.")


def _snapshot_with(**deployment: Any) -> bytes:
    dep = cluster_pb2.Deployment(deployment_id="d1", job_id="j1",
                                 state=cluster_pb2.DEPLOYMENT_STATE_RUNNING)
    for name, value in deployment.items():
        if name == "config":
            dep.config.CopyFrom(value)
        else:
            setattr(dep, name, value)
    return encode(cluster_pb2.ClusterSnapshot(tick=1, deployments=[dep]))


def test_missing_and_invalid_fields_name_their_path(run: list[Tick]) -> None:
    from koi.wire import config_to_proto

    good = config_to_proto(DeploymentConfig(model="llama-3.1-8b", accelerator="l4",
                                            engine="vllm"))
    with pytest.raises(InvalidSpecError) as info:
        decode_snapshot(_snapshot_with())
    assert info.value.field == "deployments[0].config"
    assert info.value.source == "koi.v1.ClusterSnapshot"
    bad = config_to_proto(DeploymentConfig(model="llama-3.1-8b", accelerator="l4",
                                           engine="vllm"))
    bad.tp = 0
    with pytest.raises(InvalidSpecError, match=r"deployments\[0\]\.config\.tp"):
        decode_snapshot(_snapshot_with(config=bad))
    with pytest.raises(InvalidSpecError, match=r"deployments\[0\]\.state: .*UNSPECIFIED"):
        decode_snapshot(_snapshot_with(config=good, state=0))
    with pytest.raises(InvalidSpecError, match=r"deployments\[0\]\.deployment_id"):
        decode_snapshot(_snapshot_with(config=good, deployment_id=""))
    action = cluster_pb2.PlacementAction(kind=99, job_id="j")
    with pytest.raises(InvalidSpecError, match=r"actions\[0\]\.kind: unknown value 99"):
        decode_actions(encode(cluster_pb2.PlacementActions(actions=[action])))
    with pytest.raises(InvalidSpecError, match=r"candidates\[0\]\.config: missing"):
        decode_candidates(_candidate_without_config())
    plan = plan_to_proto(1, run[-1].report.plan, (), 0)
    plan.solver = "simplex"
    with pytest.raises(InvalidSpecError, match="'simplex' is not one of"):
        decode_plan_targets(encode(plan))


def _candidate_without_config() -> bytes:
    from koi.v1 import bus_pb2

    return encode(bus_pb2.CandidateBatch(candidates=[plan_pb2.Candidate(job_id="j")]))


def test_a_bad_causal_state_raises_invalid_spec_error(run: list[Tick]) -> None:
    t = run[-1]
    msg = decode(encode_causal_state(t.beliefs, t.calibrator, 8), causal_pb2.CausalState)
    for field, value, match in (("store", None, "store: missing"),
                                ("calibrator_state", None, "calibrator_state: missing"),
                                ("version", t.beliefs.version + 1, "belief store is at")):
        broken = causal_pb2.CausalState()
        broken.CopyFrom(msg)
        if value is None:
            broken.ClearField(field)
        else:
            setattr(broken, field, value)
        with pytest.raises(InvalidSpecError, match=match) as info:
            decode_causal_state(encode(broken))
        assert info.value.source == "koi.v1.CausalState"


# --- events -------------------------------------------------------------------------------

def test_events_are_built_by_name_and_read_as_one_line() -> None:
    ev = make_event(kind="deferral", severity="warning", service="placer",
                    message="no capacity on h100-sxm", tick=62, job_id="chat-a",
                    mechanism_ids=["m-kv-l4", "m-tp"], attributes={"offering": "aws"},
                    scenario_time_s=3720.0, event_id="62-chat-a", wall_time_s=1.5)
    assert (ev.tick, ev.service, ev.event_id, dict(ev.attributes)) == \
        (62, "placer", "62-chat-a", {"offering": "aws"})
    assert ev.time.ToNanoseconds() == 1_500_000_000
    line = event_line(ev)
    assert line.startswith("01:02:00 WARNING  deferral")
    assert "chat-a: no capacity on h100-sxm [m-kv-l4, m-tp]" in line
    fleet = make_event(kind="DEGRADED_TICK", severity="error", service="evaluator",
                       message="kept plan 61", tick=62, event_id="e2")
    assert " -: kept plan 61" in event_line(fleet) and not fleet.HasField("time")
    assert "launch" in EVENT_KINDS and "critical" in SEVERITIES
    with pytest.raises(ValueError, match=r"known: .*launch"):
        make_event(kind="explode", severity="info", service="s", message="m", tick=0,
                   event_id="e")
    with pytest.raises(ValueError, match="known: debug, info"):
        make_event(kind="launch", severity="loud", service="s", message="m", tick=0,
                   event_id="e")


def test_nan_survives_where_real_runs_put_it(run: list[Tick]) -> None:
    # realised coverage is NaN before any residual: the readable list carries it as such
    msg = decode(encode_causal_state(run[0].beliefs, run[0].calibrator, 0),
                 causal_pb2.CausalState)
    assert all(math.isnan(c.coverage) for c in msg.calibration)


def test_the_package_re_exports_the_planning_codecs() -> None:
    import koi.wire

    assert koi.wire.encode_snapshot is encode_snapshot
    assert koi.wire.make_event is make_event
    with pytest.raises(AttributeError):
        _ = koi.wire.no_such_codec
