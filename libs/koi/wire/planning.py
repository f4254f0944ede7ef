"""The planning tick's boundary types ⇄ protobuf: what the planner's services exchange.

One pair per message on the bus — snapshot, telemetry, observations, candidates, plan,
actions, causal state — each ``decode(encode(x)) == x`` exactly (floats travel as
doubles, bit for bit), so a tick run through the bus plans as the in-process one does.
Two things are not carried as such: the insertion order of string→value mappings
(``notes``, observation ``predicted``/``observed``, a plan's per-offering GPUs) comes
back sorted by key, and a domain ``Scope`` field may not be ``""`` (its wildcard is
``"*"``, which travels as the proto's empty string). A plan's explanations travel inside
their decisions, so they come back in plan order (the order ``explain_choices`` gives).
Operator events are built and printed here too.

Every ``decode_*`` raises ``koi.errors.InvalidSpecError`` — and nothing else — for bytes
that do not parse, a required field that is missing (ids, embedded configs, specs and
scopes, the causal state's store and calibrator), an unknown enum value or an invalid
embedded config or job: ``field`` is the proto path (``deployments[2].config.tp``; the
message's full name when the bytes do not parse) and ``source`` the message's full name,
so a service can dead-letter the message with the reason; the text is one line of bounded length
(``koi.errors.bounded_spec_error``), whatever the input held. Protobuf parses leniently,
so bytes of another message type are not always caught. No transport (NATS, gRPC)
code and no policy here.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from google.protobuf.message import Message

from koi.catalog import Catalog, load_catalog
from koi.causal.beliefs import CLIFF_GRID, ThresholdBelief
from koi.causal.observe import OutcomeObservation
from koi.causal.scope import Scope
from koi.causal.store import BeliefStore
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    DeploymentTelemetry,
    JobStatus,
    OfferingCapacity,
    PlanDecision,
)
from koi.compose import ComposePlan
from koi.compose.types import Decision, JobChoice, SolverName
from koi.dro import DroCalibrator
from koi.errors import InvalidConfigError, InvalidSpecError, KoiError, bounded_spec_error
from koi.planner.explain import Explanation
from koi.planner.place import Target
from koi.planner.propose import Proposal
from koi.planner.tick import ActiveMechanism, plan_notes, plan_targets
from koi.predictor.passes import LOG_GRID
from koi.safe_text import printable
from koi.space import DeploymentConfig
from koi.v1 import bus_pb2, causal_pb2, cluster_pb2, common_pb2, events_pb2, plan_pb2
from koi.wire._enums import EnumCodec
from koi.wire.causal import (
    calibrator_from_proto,
    calibrator_to_proto,
    store_from_proto,
    store_to_proto,
)
from koi.wire.codec import decode, encode
from koi.wire.config import config_from_proto, config_to_proto
from koi.wire.jobs import job_from_proto, job_to_proto
from koi.wire.scope import scope_from_proto, scope_to_proto

M = TypeVar("M", bound=Message)
T = TypeVar("T")

DEPLOYMENT_STATE = EnumCodec(DeploymentState, cluster_pb2.DeploymentState)
ACTION_KIND = EnumCodec(ActionKind, cluster_pb2.PlacementActionKind)
DECISION_KIND = EnumCodec(Decision, plan_pb2.DecisionKind)
KV_CLIFF_EDGE = ("kv_pressure", "tpot")  # the edge a ThresholdBelief is about
TELEMETRY_FIELDS = tuple(f.name for f in fields(DeploymentTelemetry))
EXPLANATION_FIELDS = tuple(f.name for f in fields(Explanation))
_PAIR_FIELDS = frozenset({"multipliers", "radii"})  # tuple[tuple[str, float], ...]


def _check_mirrors(domain: type, message: Any) -> None:
    """A dataclass mirrored by name must have every field in its message (import-time)."""
    missing = {f.name for f in fields(domain)} - set(message.DESCRIPTOR.fields_by_name)
    if missing:
        raise RuntimeError(f"{message.DESCRIPTOR.full_name} lacks {sorted(missing)}"
                           f" of {domain.__name__}")


_check_mirrors(DeploymentTelemetry, bus_pb2.DeploymentTelemetry)
_check_mirrors(Explanation, plan_pb2.Explanation)


# --- errors -------------------------------------------------------------------------------

def _nested(path: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(...)`` with a nested config or job error re-raised under ``path``."""
    try:
        return fn(*args, **kwargs)
    except InvalidConfigError as e:
        raise InvalidSpecError(f"{path}.{e.knob}", e.reason) from None
    except InvalidSpecError as e:
        raise InvalidSpecError(f"{path}.{e.field}", e.reason) from None


def _decoded(data: bytes, message_type: type[M], build: Callable[[M], T]) -> T:
    """Parse ``data`` and ``build`` the domain value; any failure is an InvalidSpecError."""
    name = message_type.DESCRIPTOR.full_name
    try:
        return build(decode(data, message_type))
    except InvalidSpecError as e:
        raise bounded_spec_error(e.field, e.reason, source=name) from None
    except InvalidConfigError as e:
        raise bounded_spec_error(e.knob, e.reason, source=name) from None
    except (KoiError, ValueError, TypeError, LookupError, AttributeError, zlib.error) as e:
        raise bounded_spec_error(name, f"cannot decode: {e!r}", source=name) from None


def _required(value: T, path: str) -> T:
    if not value:
        raise InvalidSpecError(path, "missing (required)")
    return value


def _message(msg: Message, name: str, path: str) -> Any:
    """Sub-message ``name`` of ``msg``, which must be present."""
    if not msg.HasField(name):
        raise InvalidSpecError(f"{path}{name}", "missing (required)")
    return getattr(msg, name)


def _config(msg: Message, name: str, path: str, catalog: Catalog | None
            ) -> DeploymentConfig | None:
    """The optional config field ``name`` of ``msg`` (None when absent)."""
    if not msg.HasField(name):
        return None
    return _nested(f"{path}{name}", config_from_proto, getattr(msg, name), catalog=catalog)


def _sorted_dict(mapping: Mapping[str, T]) -> dict[str, T]:
    return {k: mapping[k] for k in sorted(mapping)}


# --- scopes -------------------------------------------------------------------------------

# --- snapshot -----------------------------------------------------------------------------

def snapshot_to_proto(s: ClusterSnapshot) -> cluster_pb2.ClusterSnapshot:
    msg = cluster_pb2.ClusterSnapshot(tick=s.tick, time_s=s.time_s, tick_s=s.tick_s,
                                      horizon_s=s.horizon_s)
    for c in s.capacity:
        msg.capacity.add(offering=c.offering, total_gpus=c.total_gpus, used_gpus=c.used_gpus)
    for d in s.deployments:
        msg.deployments.add(deployment_id=d.id, job_id=d.job_id, config=config_to_proto(d.config),
                            offering=d.offering, state=DEPLOYMENT_STATE.to_proto(d.state),
                            replicas_ready=d.replicas_ready,
                            replicas_starting=d.replicas_starting, started_s=d.started_s)
    for j in s.jobs:
        msg.jobs.add(spec=job_to_proto(j.spec), admitted=j.admitted, rejected=j.rejected,
                     reason=j.reason, output_tokens_done=j.output_tokens_done,
                     observed_rate_rps=j.observed_rate_rps, requests_done=j.requests_done)
    return msg


def snapshot_from_proto(msg: cluster_pb2.ClusterSnapshot, *,
                        catalog: Catalog | None = None) -> ClusterSnapshot:
    capacity = tuple(OfferingCapacity(_required(c.offering, f"capacity[{i}].offering"),
                                      c.total_gpus, c.used_gpus)
                     for i, c in enumerate(msg.capacity))
    deployments = []
    for i, d in enumerate(msg.deployments):
        at = f"deployments[{i}]."
        deployments.append(Deployment(
            id=_required(d.deployment_id, at + "deployment_id"),
            job_id=_required(d.job_id, at + "job_id"),
            config=_nested(at + "config", config_from_proto, _message(d, "config", at),
                           catalog=catalog),
            offering=d.offering,
            state=DEPLOYMENT_STATE.from_proto(d.state, at + "state", InvalidSpecError),
            replicas_ready=d.replicas_ready, replicas_starting=d.replicas_starting,
            started_s=d.started_s))
    jobs = tuple(JobStatus(
        spec=_nested(f"jobs[{i}].spec", job_from_proto, _message(j, "spec", f"jobs[{i}]."),
                     catalog=catalog),
        admitted=j.admitted, rejected=j.rejected, reason=j.reason,
        output_tokens_done=j.output_tokens_done, observed_rate_rps=j.observed_rate_rps,
        requests_done=j.requests_done)
        for i, j in enumerate(msg.jobs))
    return ClusterSnapshot(tick=msg.tick, time_s=msg.time_s, tick_s=msg.tick_s,
                           horizon_s=msg.horizon_s, capacity=capacity,
                           deployments=tuple(deployments), jobs=jobs)


def encode_snapshot(s: ClusterSnapshot) -> bytes:
    return encode(snapshot_to_proto(s))


def decode_snapshot(data: bytes, *, catalog: Catalog | None = None) -> ClusterSnapshot:
    return _decoded(data, cluster_pb2.ClusterSnapshot,
                    lambda m: snapshot_from_proto(m, catalog=catalog))


# --- telemetry ----------------------------------------------------------------------------

def telemetry_to_proto(t: DeploymentTelemetry) -> bus_pb2.DeploymentTelemetry:
    return bus_pb2.DeploymentTelemetry(**{n: getattr(t, n) for n in TELEMETRY_FIELDS})


def telemetry_from_proto(msg: bus_pb2.DeploymentTelemetry, path: str = "") -> DeploymentTelemetry:
    _required(msg.deployment_id, path + "deployment_id")
    values = {n: getattr(msg, n) for n in TELEMETRY_FIELDS}
    for n, v in values.items():
        if not isinstance(v, (int, float, str)):  # repeated double
            values[n] = tuple(v)
    return DeploymentTelemetry(**values)


def encode_telemetry(tick: int, telemetry: Sequence[DeploymentTelemetry]) -> bytes:
    return encode(bus_pb2.TelemetryBatch(tick=tick,
                                         telemetry=[telemetry_to_proto(t) for t in telemetry]))


def decode_telemetry(data: bytes) -> tuple[int, tuple[DeploymentTelemetry, ...]]:
    return _decoded(data, bus_pb2.TelemetryBatch, lambda m: (m.tick, tuple(
        telemetry_from_proto(t, f"telemetry[{i}].") for i, t in enumerate(m.telemetry))))


# --- observations -------------------------------------------------------------------------

def observation_to_proto(o: OutcomeObservation) -> bus_pb2.CausalObservation:
    return bus_pb2.CausalObservation(deployment_id=o.deployment_id, job_id=o.job_id,
                                     tick=o.tick, scope=scope_to_proto(o.scope),
                                     predicted=dict(o.predicted), observed=dict(o.observed),
                                     weight=o.weight,
                                     curves={k: bus_pb2.PassCurve(log_ms=list(v))
                                             for k, v in o.curves.items()})


def _curves(msg: bus_pb2.CausalObservation, path: str) -> dict[str, tuple[float, ...]]:
    """Pass curves by outcome: one finite value per ``LOG_GRID`` point, or the learner
    fails on every redelivery (np.interp of unequal lengths) or learns NaN for good."""
    out = {}
    for k in sorted(msg.curves):
        values = tuple(msg.curves[k].log_ms)
        if len(values) != len(LOG_GRID) or not all(math.isfinite(v) for v in values):
            raise InvalidSpecError(f"{path}curves[{k!r}]",
                                   f"needs {len(LOG_GRID)} finite values, one per pass"
                                   f" multiplier (got {len(values)})")
        out[k] = values
    return out


def _weight(msg: bus_pb2.CausalObservation, path: str) -> float:
    """The requests behind an observation: finite and >= 0, or one NaN learnt would
    poison its belief's mean for good (found by fuzzing)."""
    if not (math.isfinite(msg.weight) and msg.weight >= 0.0):
        raise InvalidSpecError(f"{path}weight", f"must be a finite count >= 0 (got {msg.weight})")
    return msg.weight


def observation_from_proto(msg: bus_pb2.CausalObservation, path: str = ""
                           ) -> OutcomeObservation:
    return OutcomeObservation(
        deployment_id=_required(msg.deployment_id, path + "deployment_id"),
        job_id=msg.job_id, tick=msg.tick,
        scope=scope_from_proto(_message(msg, "scope", path)),
        predicted=_sorted_dict(msg.predicted), observed=_sorted_dict(msg.observed),
        weight=_weight(msg, path),
        curves=_curves(msg, path))


def encode_observations(tick: int, observations: Sequence[OutcomeObservation]) -> bytes:
    return encode(bus_pb2.ObservationBatch(
        tick=tick, observations=[observation_to_proto(o) for o in observations]))


def decode_observations(data: bytes) -> tuple[int, tuple[OutcomeObservation, ...]]:
    return _decoded(data, bus_pb2.ObservationBatch, lambda m: (m.tick, tuple(
        observation_from_proto(o, f"observations[{i}].")
        for i, o in enumerate(m.observations))))


# --- candidates ---------------------------------------------------------------------------

def proposal_to_proto(p: Proposal, candidate_id: str = "") -> plan_pb2.Candidate:
    """``config_hash`` is left empty: hashing every candidate costs more than readers
    gain (``koi.space.config_hash`` computes it on demand)."""
    return plan_pb2.Candidate(candidate_id=candidate_id, job_id=p.job_id,
                              config=config_to_proto(p.config), hypothesis=p.hypothesis,
                              mechanism_ids=p.mechanism_ids, priority=p.priority)


def proposal_from_proto(msg: plan_pb2.Candidate, path: str = "", *,
                        catalog: Catalog | None = None) -> Proposal:
    config = _config(msg, "config", path, catalog)
    if config is None:
        raise InvalidSpecError(path + "config", "missing (required)")
    return Proposal(job_id=_required(msg.job_id, path + "job_id"), config=config,
                    hypothesis=msg.hypothesis, mechanism_ids=tuple(msg.mechanism_ids),
                    priority=msg.priority)


def candidates_to_proto(tick: int, causal_version: int,
                        proposals: Sequence[Proposal]) -> bus_pb2.CandidateBatch:
    """The CandidateBatch message; a candidate's id is ``<job id>#<n>``, its position
    among its job's candidates (unique in a tick: a job's candidates come from one
    proposer work item, so items' batches can be joined by concatenating bytes)."""
    seen: dict[str, int] = {}
    out = []
    for p in proposals:
        n = seen.get(p.job_id, 0)
        seen[p.job_id] = n + 1
        out.append(proposal_to_proto(p, f"{p.job_id}#{n}"))
    return bus_pb2.CandidateBatch(tick=tick, causal_state_version=causal_version,
                                  candidates=out)


def encode_candidates(tick: int, causal_version: int, proposals: Sequence[Proposal]) -> bytes:
    return encode(candidates_to_proto(tick, causal_version, proposals))


def decode_candidates(data: bytes, *, catalog: Catalog | None = None
                      ) -> tuple[int, int, tuple[Proposal, ...]]:
    return _decoded(data, bus_pb2.CandidateBatch, lambda m: (
        m.tick, m.causal_state_version,
        tuple(proposal_from_proto(c, f"candidates[{i}].", catalog=catalog)
              for i, c in enumerate(m.candidates))))


# --- plan ---------------------------------------------------------------------------------

def _families(gpus_by_offering: Iterable[tuple[str, int]], catalog: Catalog) -> dict[str, int]:
    out: dict[str, int] = {}
    for offering, gpus in gpus_by_offering:
        if gpus:
            family = catalog.accelerator(catalog.offering(offering).accelerator).family
            out[family] = out.get(family, 0) + gpus
    return out


def _explanation_to_proto(e: Explanation) -> plan_pb2.Explanation:
    values: dict[str, Any] = {n: getattr(e, n) for n in EXPLANATION_FIELDS}
    for n in _PAIR_FIELDS:
        values[n] = [plan_pb2.NamedValue(name=k, value=v) for k, v in values[n]]
    return plan_pb2.Explanation(**values)


def _explanation_from_proto(msg: plan_pb2.Explanation) -> Explanation:
    values: dict[str, Any] = {n: getattr(msg, n) for n in EXPLANATION_FIELDS}
    for n in _PAIR_FIELDS:
        values[n] = tuple((p.name, p.value) for p in values[n])
    for n in ("mechanisms", "mechanism_ids"):
        values[n] = tuple(values[n])
    return Explanation(**values)


def _decision_to_proto(c: JobChoice, explanation: Explanation | None,
                       catalog: Catalog) -> plan_pb2.Decision:
    msg = plan_pb2.Decision(
        job_id=c.job_id, kind=DECISION_KIND.to_proto(c.decision), reason=c.reason,
        offering=c.offering, replicas=c.replicas, gpus=c.gpus, goodput_tok_s=c.goodput_tok_s,
        demand_tok_s=c.demand_tok_s, usd_per_hour=c.usd_per_hour,
        score_usd_per_hour=c.objective, stays=c.stays,
        gpus_by_family=_families([(c.offering, c.gpus)], catalog) if c.offering else {})
    if c.candidate_id is not None:
        msg.candidate_id = c.candidate_id
    if c.config is not None:
        msg.config.CopyFrom(config_to_proto(c.config))
    if explanation is not None:
        msg.explanation.CopyFrom(_explanation_to_proto(explanation))
    return msg


def plan_to_proto(tick: int, plan: ComposePlan, explanations: Sequence[Explanation],
                  causal_version: int, *, degraded: bool = False, degraded_reason: str = "",
                  source_tick: int | None = None, catalog: Catalog | None = None
                  ) -> plan_pb2.ClusterPlan:
    """The ClusterPlan of one tick. Each explanation goes with its job's decision; the
    catalog (default: the built-in one) gives the accelerator families."""
    cat = catalog if catalog is not None else load_catalog()
    by_job: dict[str, Explanation] = {}
    for e in explanations:
        if e.job_id in by_job:
            raise ValueError(f"two explanations for job {e.job_id!r}")
        by_job[e.job_id] = e
    unknown = set(by_job) - {c.job_id for c in plan.choices}
    if unknown:
        raise ValueError(f"explanations for jobs the plan does not decide: {sorted(unknown)}")
    msg = plan_pb2.ClusterPlan(
        tick=tick, causal_state_version=causal_version,
        decisions=[_decision_to_proto(c, by_job.get(c.job_id), cat) for c in plan.choices],
        total_usd_per_hour=plan.usd_per_hour,
        gpus_by_family=_families(sorted(plan.gpus_by_offering.items()), cat),
        robust_goodput_tok_s=plan.goodput_tok_s, degraded=degraded,
        degraded_reason=degraded_reason,
        source_tick=tick if source_tick is None else source_tick,
        solver=plan.solver.value, status=plan.status, objective=plan.objective,
        solve_s=plan.solve_s, milp_s=plan.milp_s, candidates_in=plan.candidates_in,
        candidates_kept=plan.candidates_kept, gpus_by_offering=plan.gpus_by_offering,
        free_by_offering=plan.free_by_offering)
    if plan.gap is not None:
        msg.optimality_gap = plan.gap
    if plan.objective_bound is not None:
        msg.objective_bound = plan.objective_bound
    return msg


def encode_plan(tick: int, plan: ComposePlan, explanations: Sequence[Explanation],
                causal_version: int, *, degraded: bool = False, degraded_reason: str = "",
                source_tick: int | None = None, catalog: Catalog | None = None) -> bytes:
    return encode(plan_to_proto(tick, plan, explanations, causal_version, degraded=degraded,
                                degraded_reason=degraded_reason, source_tick=source_tick,
                                catalog=catalog))


def _choice_from_proto(d: plan_pb2.Decision, path: str, catalog: Catalog | None) -> JobChoice:
    return JobChoice(
        job_id=_required(d.job_id, path + "job_id"),
        decision=DECISION_KIND.from_proto(d.kind, path + "kind", InvalidSpecError),
        reason=d.reason, candidate_id=d.candidate_id if d.HasField("candidate_id") else None,
        offering=d.offering, config=_config(d, "config", path, catalog), replicas=d.replicas,
        gpus=d.gpus, goodput_tok_s=d.goodput_tok_s, demand_tok_s=d.demand_tok_s,
        usd_per_hour=d.usd_per_hour, objective=d.score_usd_per_hour, stays=d.stays)


def compose_plan_from_proto(msg: plan_pb2.ClusterPlan, *,
                            catalog: Catalog | None = None) -> ComposePlan:
    """The ComposePlan back, every field as composed (mappings sorted by offering)."""
    try:
        solver = SolverName(msg.solver)
    except ValueError:
        known = ", ".join(s.value for s in SolverName)
        raise InvalidSpecError("solver", f"{msg.solver!r} is not one of {known}") from None
    return ComposePlan(
        choices=tuple(_choice_from_proto(d, f"decisions[{i}].", catalog)
                      for i, d in enumerate(msg.decisions)),
        solver=solver, status=msg.status, objective=msg.objective,
        objective_bound=msg.objective_bound if msg.HasField("objective_bound") else None,
        gap=msg.optimality_gap if msg.HasField("optimality_gap") else None,
        solve_s=msg.solve_s, milp_s=msg.milp_s, candidates_in=msg.candidates_in,
        candidates_kept=msg.candidates_kept,
        gpus_by_offering=_sorted_dict(msg.gpus_by_offering),
        free_by_offering=_sorted_dict(msg.free_by_offering))


def decode_plan_targets(data: bytes, *, catalog: Catalog | None = None
                        ) -> tuple[int, tuple[Target, ...], dict[str, str]]:
    """(tick, targets in plan order, notes): what the placer acts on, built from the
    decoded ComposePlan by the planner's own ``plan_targets`` and ``plan_notes``."""
    return _decoded(data, plan_pb2.ClusterPlan, lambda m: plan_targets_from_proto(m, catalog))


def plan_targets_from_proto(msg: plan_pb2.ClusterPlan, catalog: Catalog | None = None
                            ) -> tuple[int, tuple[Target, ...], dict[str, str]]:
    plan = compose_plan_from_proto(msg, catalog=catalog)
    return msg.tick, tuple(plan_targets(plan)), plan_notes(plan)


def decode_plan(data: bytes, *, catalog: Catalog | None = None
                ) -> tuple[plan_pb2.ClusterPlan, ComposePlan, tuple[Explanation, ...]]:
    """The message itself (for its tick, version and degraded flags), the ComposePlan
    and the explanations."""
    def build(m: plan_pb2.ClusterPlan) -> tuple[plan_pb2.ClusterPlan, ComposePlan,
                                                 tuple[Explanation, ...]]:
        return m, compose_plan_from_proto(m, catalog=catalog), explanations_from_proto(m)
    return _decoded(data, plan_pb2.ClusterPlan, build)


def explanations_from_proto(msg: plan_pb2.ClusterPlan) -> tuple[Explanation, ...]:
    """The explanations, in plan order, of the decisions that carry one."""
    return tuple(_explanation_from_proto(d.explanation) for d in msg.decisions
                 if d.HasField("explanation"))


# --- actions ------------------------------------------------------------------------------

def action_to_proto(a: Action) -> cluster_pb2.PlacementAction:
    msg = cluster_pb2.PlacementAction(kind=ACTION_KIND.to_proto(a.kind), job_id=a.job_id,
                                      reason=a.reason, deployment_id=a.deployment_id,
                                      offering=a.offering, replicas=a.replicas)
    if a.config is not None:
        msg.config.CopyFrom(config_to_proto(a.config))
    return msg


def action_from_proto(msg: cluster_pb2.PlacementAction, path: str = "", *,
                      catalog: Catalog | None = None) -> Action:
    return Action(kind=ACTION_KIND.from_proto(msg.kind, path + "kind", InvalidSpecError),
                  job_id=_required(msg.job_id, path + "job_id"), reason=msg.reason,
                  deployment_id=msg.deployment_id, config=_config(msg, "config", path, catalog),
                  offering=msg.offering, replicas=msg.replicas)


def actions_to_proto(d: PlanDecision, plan_tick: int) -> cluster_pb2.PlacementActions:
    return cluster_pb2.PlacementActions(tick=d.tick, plan_tick=plan_tick,
                                        actions=[action_to_proto(a) for a in d.actions],
                                        notes=d.notes)


def encode_actions(d: PlanDecision, plan_tick: int) -> bytes:
    return encode(actions_to_proto(d, plan_tick))


def decode_actions(data: bytes, *, catalog: Catalog | None = None
                   ) -> tuple[PlanDecision, int]:
    """(the decision, the tick of the plan it implements)."""
    return _decoded(data, cluster_pb2.PlacementActions, lambda m: (PlanDecision(
        tick=m.tick, notes=_sorted_dict(m.notes), actions=tuple(
            action_from_proto(a, f"actions[{i}].", catalog=catalog)
            for i, a in enumerate(m.actions))), m.plan_tick))


# --- causal state -------------------------------------------------------------------------

def _cliff_to_proto(c: ThresholdBelief, beliefs: BeliefStore) -> causal_pb2.Belief:
    """A KV-cliff belief as a THRESHOLD belief: the cliff position's mean and variance
    given there is one, and the probability that there is."""
    post = c.posterior(beliefs.config.noise("tpot"), beliefs.config.prior_sd)
    p_cliff = 1.0 - post[-1]
    mean = var = math.nan
    if p_cliff > 0.0:
        mean = sum(x * p for x, p in zip(CLIFF_GRID, post, strict=False)) / p_cliff
        var = sum((x - mean) ** 2 * p for x, p in zip(CLIFF_GRID, post, strict=False)) / p_cliff
    return causal_pb2.Belief(
        edge=common_pb2.Edge(cause=KV_CLIFF_EDGE[0], effect=KV_CLIFF_EDGE[1]),
        scope=scope_to_proto(c.scope), kind=causal_pb2.EFFECT_KIND_THRESHOLD,
        posterior_mean=mean, posterior_variance=var, support=c.support,
        existence_probability=p_cliff)


def causal_state_to_proto(beliefs: BeliefStore, calibrator: DroCalibrator, tick: int, *,
                          target_coverage: float | None = None,
                          readable_beliefs: bool = True,
                          abs_error: Mapping[str, float] | None = None
                          ) -> causal_pb2.CausalState:
    """The whole causal state: the belief store and the calibrator as their messages
    (lossless, ``koi.wire.causal``), and readable lists beside them.
    ``target_coverage`` defaults to the calibrator's own. ``readable_beliefs=False``
    leaves out the (long, costly) readable belief list — the tick's message does: its
    readers decode the store, and a reader that lists beliefs builds them from it.
    ``abs_error``: the tick's median |log residual| per outcome (``learn_from``)."""
    msg = causal_pb2.CausalState(version=beliefs.version, tick=tick,
                                 store=store_to_proto(beliefs),
                                 calibrator_state=calibrator_to_proto(calibrator),
                                 abs_error=dict(abs_error or {}))
    # edge beliefs and the p95 tail factors (pseudo-edges "ttft"→"ttft_p95", …), by
    # edge and scope
    every = [*beliefs.beliefs.items(), *beliefs.tails.items()]
    for (edge, scope), b in sorted(every, key=lambda kv: (kv[0][0], kv[0][1].key())):
        if not readable_beliefs:
            break
        msg.beliefs.add(edge=common_pb2.Edge(cause=edge[0], effect=edge[1]),
                        scope=scope_to_proto(scope), kind=causal_pb2.EFFECT_KIND_LOG_MULTIPLIER,
                        posterior_mean=b.mean, posterior_variance=1.0 / b.precision,
                        support=b.support, last_confirmed_tick=b.last_confirmed)
    for scope in sorted(beliefs.cliffs, key=Scope.key) if readable_beliefs else ():
        msg.beliefs.append(_cliff_to_proto(beliefs.cliffs[scope], beliefs))
    for _, m in sorted(beliefs.mechanisms.items()):
        msg.mechanisms.add(id=m.id, scope=scope_to_proto(m.scope),
                           edge=common_pb2.Edge(cause=m.edge[0], effect=m.edge[1]),
                           condition=m.condition, effect_size=m.effect, support=m.support,
                           confidence=m.confidence, first_seen_tick=m.first_seen,
                           last_confirmed_tick=m.last_confirmed, active=m.active,
                           summary=m.line(), retired_tick=m.retired_at, source=m.source)
    target = calibrator.coverage if target_coverage is None else target_coverage
    for o in calibrator.outcomes:
        msg.calibration.add(outcome=o, dro_radius=calibrator.radius(o),
                            coverage=calibrator.realised_coverage(o), target_coverage=target,
                            residuals=len(calibrator.residuals.get(o, ())))
    return msg


def encode_causal_state(beliefs: BeliefStore, calibrator: DroCalibrator, tick: int, *,
                        target_coverage: float | None = None,
                        readable_beliefs: bool = True,
                        abs_error: Mapping[str, float] | None = None) -> bytes:
    return encode(causal_state_to_proto(beliefs, calibrator, tick,
                                        target_coverage=target_coverage,
                                        readable_beliefs=readable_beliefs,
                                        abs_error=abs_error))


def mechanisms_from_proto(msg: causal_pb2.CausalState) -> tuple[ActiveMechanism, ...]:
    """The active mechanisms as the proposer uses them (``koi.planner.tick.ActiveMechanism``),
    read from the readable list alone: the proposer needs no belief store."""
    out = []
    for m in msg.mechanisms:
        if m.active:
            out.append(ActiveMechanism(id=m.id, scope=scope_from_proto(m.scope),
                                       effect=m.effect_size, line=m.summary))
    return tuple(sorted(out, key=lambda a: a.id))


def causal_state_from_proto(msg: causal_pb2.CausalState
                            ) -> tuple[BeliefStore, DroCalibrator, int]:
    """(beliefs, calibrator, tick) from ``store``, ``calibrator_state`` and the mechanisms
    (every one is listed); the readable beliefs and calibration are not read."""
    beliefs = store_from_proto(_message(msg, "store", ""), msg.mechanisms)
    calibrator = calibrator_from_proto(_message(msg, "calibrator_state", ""))
    if beliefs.version != msg.version:
        raise InvalidSpecError("version", f"{msg.version} but the belief store is at"
                                          f" version {beliefs.version}")
    return beliefs, calibrator, msg.tick


def decode_causal_state(data: bytes) -> tuple[BeliefStore, DroCalibrator, int]:
    """(beliefs, calibrator, tick); the message's version is ``beliefs.version``."""
    return _decoded(data, causal_pb2.CausalState, causal_state_from_proto)


# --- operator events ----------------------------------------------------------------------

def _names(enum: Any, prefix: str) -> dict[str, int]:
    return {v.name.removeprefix(prefix).lower(): v.number for v in enum.DESCRIPTOR.values
            if v.number != 0}


EVENT_KINDS = _names(events_pb2.EventKind, "EVENT_KIND_")
SEVERITIES = _names(events_pb2.Severity, "SEVERITY_")
_KIND_NAMES = {n: k for k, n in EVENT_KINDS.items()}
_SEVERITY_NAMES = {n: k for k, n in SEVERITIES.items()}


def _lookup(table: dict[str, int], name: str, what: str) -> Any:
    """The enum number of ``name`` (``Any``: each generated enum has its own ValueType)."""
    number = table.get(name.lower())
    if number is None:
        raise ValueError(f"unknown event {what} {name!r}; known: {', '.join(table)}")
    return number


def make_event(*, kind: str, severity: str, service: str, message: str, tick: int,
               job_id: str = "", deployment_id: str = "", mechanism_ids: Iterable[str] = (),
               attributes: Mapping[str, str] | None = None, scenario_time_s: float = 0.0,
               event_id: str, wall_time_s: float | None = None) -> events_pb2.OperatorEvent:
    """One operator event; ``kind``/``severity`` by lower-case name (``"launch"``,
    ``"warning"``), unknown ones raise ValueError. The wall-clock ``time`` is set only
    from ``wall_time_s`` (Unix seconds): the clock is the caller's to read."""
    ev = events_pb2.OperatorEvent(
        tick=tick, severity=_lookup(SEVERITIES, severity, "severity"),
        kind=_lookup(EVENT_KINDS, kind, "kind"), service=service, job_id=job_id,
        deployment_id=deployment_id, message=message, mechanism_ids=list(mechanism_ids),
        attributes=dict(attributes or {}), event_id=event_id, scenario_time_s=scenario_time_s)
    if wall_time_s is not None:
        ev.time.FromNanoseconds(round(wall_time_s * 1e9))
    return ev


_CLOCK_MAX_S = 1_000_000 * 3600.0   # a million hours: no scenario is that long


def _clock(seconds: float) -> str:
    # int(nan) raises, and 1e100 s would print 100 digits: a bad event must still print
    if not math.isfinite(seconds) or seconds >= _CLOCK_MAX_S:
        return "--:--:--"
    s = max(int(seconds), 0)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


# field caps on an event line: a DNS-1123 job id is at most 63 characters, a readable
# message a few hundred; anything longer is cut (the --json output keeps it whole)
# at most ~950 characters in all, suffixes ("…[10,000 chars]") included
_LINE_JOB_CHARS, _LINE_MESSAGE_CHARS, _LINE_MECHANISMS, _LINE_MECHANISM_CHARS = 64, 480, 6, 40


def event_line(ev: events_pb2.OperatorEvent) -> str:
    """``01:02:00 WARNING  deferral             chat-a: no capacity [m-1, m-2]``: scenario
    clock, severity, kind, job ("-" for fleet-wide), message, mechanisms. Always one
    line of bounded length: the text fields are escaped and capped (``printable``)."""
    severity = _SEVERITY_NAMES.get(ev.severity, "unspecified").upper()
    kind = _KIND_NAMES.get(ev.kind, "unspecified")
    ids = [printable(m, _LINE_MECHANISM_CHARS) for m in ev.mechanism_ids[:_LINE_MECHANISMS]]
    if len(ev.mechanism_ids) > _LINE_MECHANISMS:
        ids.append(f"+{len(ev.mechanism_ids) - _LINE_MECHANISMS} more")
    mechs = f" [{', '.join(ids)}]" if ids else ""
    job = printable(ev.job_id, _LINE_JOB_CHARS) if ev.job_id else "-"
    return (f"{_clock(ev.scenario_time_s)} {severity:<8} {kind:<20} {job}:"
            f" {printable(ev.message, _LINE_MESSAGE_CHARS)}{mechs}")
