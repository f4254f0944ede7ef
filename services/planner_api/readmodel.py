"""The planner-api's read model: what the bus has said, kept in memory and queried.

``ReadModel`` is fed decoded protobuf messages by the service's NATS adapter (one
``on_*`` call per message, ``hypotheses.on_round`` for the language-model rounds; every
feed is idempotent and ignores stale input, so at-least-once delivery is harmless) and
answered from by the gRPC servicer. It keeps
the last ``max_plans`` plans by tick, every job it has heard of, the latest snapshot's
deployments, the latest causal state and the last few ticks' candidates, and derives
each job's state from them. It also answers what-if questions and predicts Explain's
alternatives, robustly as the evaluator does (``alternatives.robust_predictor``).
Thread-safe: one lock guards the state; the predictor runs outside it.

It must not contain NATS or gRPC code, nor any planning decision: it only reads.
Query problems are raised as ``InvalidQuery`` / ``NotFound`` / ``FailedPrecondition``
with an operator-readable message; the transport maps them to status codes.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from koi.catalog import Catalog, load_catalog
from koi.causal.store import BeliefStore
from koi.errors import InvalidConfigError, InvalidSpecError
from koi.planner.robust import Kernel
from koi.planner.settings import KoiSettings, settings_for
from koi.predictor.types import LoadMode, Workload
from koi.space import DeploymentConfig, config_hash, validate
from koi.v1 import (
    bus_pb2,
    causal_pb2,
    cluster_pb2,
    config_pb2,
    jobs_pb2,
    plan_pb2,
    plan_service_pb2,
    prediction_pb2,
)
from koi.wire.config import KNOB_ENUMS, REQUIRED_IDS, config_from_proto
from koi.wire.jobs import job_from_proto
from koi.wire.predictor import prediction_to_proto, workload_from_proto
from services.planner_api.alternatives import (
    RobustPredictor,
    alternatives,
    belief_store_of,
    job_workload,
    other_candidates,
    robust_predictor,
    scope_covers,
)
from services.planner_api.hypotheses import HypothesisBook
from services.planner_api.watch import PlanWatch

log = structlog.get_logger(__name__)

MAX_PLANS = 500

JobState = plan_service_pb2.JobState
PLACE, DEFER, REJECT = (plan_pb2.DECISION_KIND_PLACE, plan_pb2.DECISION_KIND_DEFER,
                        plan_pb2.DECISION_KIND_REJECT)
# A deployment in one of these states holds (or is about to hold) replicas for its job.
LIVE_DEPLOYMENT_STATES = frozenset({cluster_pb2.DEPLOYMENT_STATE_STARTING,
                                    cluster_pb2.DEPLOYMENT_STATE_RUNNING,
                                    cluster_pb2.DEPLOYMENT_STATE_DRAINING})
# Ticks whose CandidateBatch is kept (as bytes) for Explain's alternatives: a batch is
# the biggest message of a tick, and operators explain recent decisions.
MAX_CANDIDATE_TICKS = 32


class QueryError(Exception):
    """A query the read model cannot answer; the message says why, for the caller."""


class InvalidQuery(QueryError):
    """The request itself is malformed (gRPC INVALID_ARGUMENT)."""


class NotFound(QueryError):
    """The request names something the read model does not hold (gRPC NOT_FOUND)."""


class FailedPrecondition(QueryError):
    """The request is fine but what it needs is not usable here (FAILED_PRECONDITION)."""


@dataclass(slots=True)
class _Job:
    spec: jobs_pb2.JobSpec
    submitted_tick: int
    rejected: str | None = None          # submission rejection reason
    decision: plan_pb2.Decision | None = None
    decision_tick: int = -1
    decision_version: int = 0            # causal-state version of the deciding plan
    completed: bool = False

    @property
    def kind(self) -> str:
        return self.spec.WhichOneof("kind") or ""


class ReadModel:
    """Plans, jobs, deployments and the causal state, as last heard on the bus.

    Robust predictions follow ``settings`` (the planner's, default Koi's: which outcomes
    are widened, beliefs and DRO on or off); ``kernel`` replaces the predictor's kernel
    (default: the numba one). Messages handed to the ``on_*`` feeds are copied, and
    messages handed out must not be mutated by the caller.
    """

    def __init__(self, *, kernel: Kernel | None = None, settings: KoiSettings | None = None,
                 catalog: Catalog | None = None, max_plans: int = MAX_PLANS) -> None:
        if max_plans < 1:
            raise ValueError(f"max_plans must be >= 1 (got {max_plans})")
        self._catalog = catalog
        self._kernel = kernel
        self._settings = settings or settings_for("koi")
        self._max_plans = max_plans
        self._lock = threading.RLock()
        self._plans: dict[int, plan_pb2.ClusterPlan] = {}
        self._ticks: list[int] = []  # sorted keys of _plans
        self._jobs: dict[str, _Job] = {}
        self._deployments: dict[str, list[cluster_pb2.Deployment]] = {}
        self._deployments_tick = -1
        self._causal: causal_pb2.CausalState | None = None
        self._beliefs: BeliefStore | None = None
        self._watches: set[PlanWatch] = set()
        self._candidates: dict[int, bytes] = {}  # tick → CandidateBatch, the last few
        # the language-model rounds heard (koi.tick.<n>.hypotheses), for Explain
        self.hypotheses = HypothesisBook()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    # --- feeds (one per bus message) ----------------------------------------------------

    def on_plan(self, plan: plan_pb2.ClusterPlan) -> None:
        """Hold ``plan`` (a re-delivery of a tick replaces it) and tell the watchers."""
        msg = plan_pb2.ClusterPlan()
        msg.CopyFrom(plan)
        with self._lock:
            if msg.tick not in self._plans:
                bisect.insort(self._ticks, msg.tick)
            self._plans[msg.tick] = msg
            while len(self._ticks) > self._max_plans:
                del self._plans[self._ticks.pop(0)]
            for d in msg.decisions:
                job = self._jobs.get(d.job_id)
                if job is None:  # decided before we heard its spec (we started late)
                    job = self._jobs[d.job_id] = _Job(jobs_pb2.JobSpec(id=d.job_id), msg.tick)
                if msg.tick >= job.decision_tick:
                    job.decision, job.decision_tick = d, msg.tick
                    job.decision_version = msg.causal_state_version
            for w in list(self._watches):
                w.push(msg)
                if w.closed:
                    self._watches.discard(w)
        log.debug("plan_held", tick=msg.tick, decisions=len(msg.decisions))

    def on_candidates(self, tick: int, batch: bytes) -> None:
        """The proposer's CandidateBatch of ``tick``, kept serialised for the last
        ``MAX_CANDIDATE_TICKS`` ticks; decoded only when Explain asks."""
        with self._lock:
            self._candidates[tick] = bytes(batch)
            while len(self._candidates) > MAX_CANDIDATE_TICKS:
                del self._candidates[min(self._candidates)]

    def on_job(self, spec: jobs_pb2.JobSpec, tick: int) -> None:
        """An accepted job, submitted in ``tick`` (< 0 = not known). Hearing of it again
        updates its spec and keeps the earliest known tick."""
        msg = jobs_pb2.JobSpec()
        msg.CopyFrom(spec)
        with self._lock:
            job = self._jobs.get(msg.id)
            if job is None:
                self._jobs[msg.id] = _Job(msg, tick)
                return
            job.spec = msg
            if tick >= 0 and (job.submitted_tick < 0 or tick < job.submitted_tick):
                job.submitted_tick = tick
            job.rejected = None  # accepted now, whatever an earlier submission got

    def on_job_rejected(self, job_id: str, reason: str, tick: int,
                        spec: jobs_pb2.JobSpec | None = None) -> None:
        """A submission that was rejected (``spec`` if it could be read)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                msg = jobs_pb2.JobSpec(id=job_id)
                if spec is not None:
                    msg.CopyFrom(spec)
                job = self._jobs[job_id] = _Job(msg, tick)
            elif job.submitted_tick < 0:
                job.submitted_tick = tick
            job.rejected = reason or "rejected at submission"

    def on_job_completed(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                job = self._jobs[job_id] = _Job(jobs_pb2.JobSpec(id=job_id), -1)
            job.completed = True

    def on_deployments(self, tick: int, deployments: list[cluster_pb2.Deployment]) -> None:
        """The deployments of the snapshot of ``tick`` (an older snapshot is ignored)."""
        by_job: dict[str, list[cluster_pb2.Deployment]] = {}
        for d in deployments:
            msg = cluster_pb2.Deployment()
            msg.CopyFrom(d)
            by_job.setdefault(d.job_id, []).append(msg)
        with self._lock:
            if tick < self._deployments_tick:
                return
            self._deployments, self._deployments_tick = by_job, tick

    def on_causal(self, state: causal_pb2.CausalState,
                  beliefs: BeliefStore | None = None) -> None:
        """The causal state (an older version is ignored). ``beliefs`` is the decoded
        belief store when the caller has it; else the message's ``store`` is
        decoded when a what-if first needs it (not on every tick: it is the costliest
        thing here, and most ticks nobody asks)."""
        msg = causal_pb2.CausalState()
        msg.CopyFrom(state)
        with self._lock:
            if self._causal is not None and msg.version < self._causal.version:
                return
            self._causal, self._beliefs = msg, beliefs

    def _robust_predictor(self) -> tuple[causal_pb2.CausalState | None, RobustPredictor]:
        """The causal state held and the planner's robust predictor under it."""
        causal, beliefs = self._belief_store()
        return causal, robust_predictor(causal, beliefs, self._settings, self.catalog,
                                        self._kernel)

    def _belief_store(self) -> tuple[causal_pb2.CausalState | None, BeliefStore | None]:
        with self._lock:
            causal, beliefs = self._causal, self._beliefs
        if causal is not None and beliefs is None:
            beliefs = belief_store_of(causal)
            with self._lock:
                if self._causal is causal:
                    self._beliefs = beliefs
        return causal, beliefs

    def close_watches(self) -> None:
        """End every open watch (the server is stopping)."""
        with self._lock:
            watches, self._watches = self._watches, set()
        for w in watches:
            w.close()

    # --- reads --------------------------------------------------------------------------

    def plan(self, tick: int | None = None) -> plan_pb2.ClusterPlan:
        with self._lock:
            if not self._ticks:
                raise NotFound("no plan yet: the evaluator has not published one")
            if tick is None:
                return self._plans[self._ticks[-1]]
            plan = self._plans.get(tick)
            if plan is None:
                raise NotFound(f"no plan of tick {tick} is held (held: {self._held()})")
            return plan

    def _held(self) -> str:
        lo, hi, n = self._ticks[0], self._ticks[-1], len(self._ticks)
        return f"ticks {lo}..{hi}" if n == hi - lo + 1 else f"{n} plans, ticks {lo}..{hi}"

    def causal_state(self) -> causal_pb2.CausalState | None:
        with self._lock:
            return self._causal

    def job(self, job_id: str) -> plan_service_pb2.JobRecord:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"unknown job {job_id!r}: never submitted, planned or rejected")
            return self._record(job)

    def jobs(self, state: int = 0, kind: str = "") -> list[plan_service_pb2.JobRecord]:
        """Every job (``state`` 0 = any, ``kind`` "" = both), by id."""
        with self._lock:
            records = [self._record(j) for _, j in sorted(self._jobs.items())
                       if not kind or j.kind == kind]
        return [r for r in records if not state or r.state == state]

    def _record(self, job: _Job) -> plan_service_pb2.JobRecord:
        state, reason = self._state(job)
        rec = plan_service_pb2.JobRecord(spec=job.spec, state=state, reason=reason,
                                         submitted_tick=job.submitted_tick,
                                         deployments=self._deployments.get(job.spec.id, []))
        if job.decision is not None:
            rec.decision.CopyFrom(job.decision)
        return rec

    def _state(self, job: _Job) -> tuple[int, str]:
        """(JobState, reason). With no decision held, a live deployment still means
        RUNNING: the read model may have started after the job was placed."""
        if job.completed:
            return JobState.JOB_STATE_COMPLETED, ""
        if job.rejected is not None:
            return JobState.JOB_STATE_REJECTED, job.rejected
        d = job.decision
        if d is not None and d.kind == REJECT:
            return JobState.JOB_STATE_REJECTED, d.reason
        if d is not None and d.kind == DEFER:
            return JobState.JOB_STATE_DEFERRED, d.reason
        live = any(dep.state in LIVE_DEPLOYMENT_STATES
                   for dep in self._deployments.get(job.spec.id, ()))
        return (JobState.JOB_STATE_RUNNING if live else JobState.JOB_STATE_PENDING), ""

    def decision(self, job_id: str, tick: int | None = None
                 ) -> tuple[int, plan_pb2.Decision, int]:
        """(tick, decision, causal-state version) of the job's decision in the plan of
        ``tick``, or its latest decision."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"unknown job {job_id!r}: never submitted, planned or rejected")
            if tick is None:
                if job.decision is None:
                    raise NotFound(f"no plan has decided job {job_id!r} yet")
                return job.decision_tick, job.decision, job.decision_version
            plan = self.plan(tick)
            for d in plan.decisions:
                if d.job_id == job_id:
                    return tick, d, plan.causal_state_version
            raise NotFound(f"the plan of tick {tick} has no decision for job {job_id!r}")

    def alternatives(self, tick: int, decision: plan_pb2.Decision
                     ) -> tuple[list[plan_service_pb2.Alternative], str]:
        """(the candidates of ``tick`` for the decision's job that it did not choose,
        predicted under the job's workload, at the rate each placed replica is planned to
        carry when the job is online and placed, best first; why there are none, if none)."""
        with self._lock:
            blob = self._candidates.get(tick)
        if blob is None:
            return [], (f"alternatives: the candidates of tick {tick} are not held here"
                        f" (the last {MAX_CANDIDATE_TICKS} ticks heard are)")
        others = other_candidates(bus_pb2.CandidateBatch.FromString(blob), decision)
        if not others:
            return [], f"alternatives: none (tick {tick} had no other candidate for it)"
        try:
            workload = self._workload(None, decision.job_id)
        except QueryError as e:
            return [], f"alternatives: not predicted ({e})"
        per_replica = decision.explanation.planned_rate_rps
        if workload.mode == LoadMode.RATE and per_replica > 0:
            # judged at the load each replica of the plan carries, not the whole job's
            workload = replace(workload, load=per_replica)
        _, predict = self._robust_predictor()
        return alternatives(others, workload, decision, predict, self.catalog), ""

    def watch(self, from_tick: int | None = None,
              notify: Callable[[], None] | None = None) -> PlanWatch:
        """A subscription to new plans; with ``from_tick``, the held plans of ticks >=
        ``from_tick`` come first (oldest first), with none missed or repeated. ``notify``
        see ``PlanWatch``."""
        w = PlanWatch(max_queued=self._max_plans + 64, notify=notify)
        with self._lock:
            if from_tick is not None:
                for t in self._ticks[bisect.bisect_left(self._ticks, from_tick):]:
                    w.push(self._plans[t])
            self._watches.add(w)
        return w

    @property
    def watching(self) -> int:
        """Open watches (WatchPlans streams)."""
        with self._lock:
            return len(self._watches)

    def unwatch(self, w: PlanWatch) -> None:
        with self._lock:
            self._watches.discard(w)
        w.close()

    # --- what-if ------------------------------------------------------------------------

    def what_if(self, config: config_pb2.DeploymentConfig, *,
                workload: prediction_pb2.Workload | None = None,
                job_id: str | None = None) -> plan_service_pb2.WhatIfResponse:
        """Predict ``config`` under ``workload`` (or job ``job_id``'s), nominal and robust.

        An undecodable config (a required id or enum missing) is an ``InvalidQuery``; a
        config that decodes but cannot run is answered ``valid=false`` with every
        violation. Robust outcomes are the evaluator's at the calibrated margin
        (``koi.planner.robust``): the learnt model of the causal state's belief store
        (none: the prior model), then the worst case inside the DRO radii of its
        ``calibration`` — the p95s and the rate sustained within the SLO are the numbers
        the planner scored.
        """
        cfg, violations = decode_config(config, self.catalog)
        wl = self._workload(workload, job_id)
        causal, predict = self._robust_predictor()
        resp = plan_service_pb2.WhatIfResponse(
            causal_state_version=causal.version if causal is not None else 0)
        if cfg is not None:
            resp.config_hash = config_hash(cfg)
        if violations or cfg is None:
            resp.violations.extend(violations)
            return resp
        try:
            pred, robust = predict(cfg, wl)
        except InvalidConfigError as e:  # the predictor knows a limit validation does not
            resp.violations.add(knob=e.knob, reason=e.reason)
            return resp
        resp.valid = True
        resp.predicted.CopyFrom(prediction_to_proto(pred))
        resp.robust.CopyFrom(prediction_to_proto(robust).outcomes)
        if causal is not None:
            resp.mechanism_ids.extend(m.id for m in causal.mechanisms
                                      if m.active and scope_covers(m.scope, cfg, self.catalog))
        return resp

    def _workload(self, workload: prediction_pb2.Workload | None,
                  job_id: str | None) -> Workload:
        if workload is not None:
            try:
                return workload_from_proto(workload)
            except InvalidSpecError as e:
                raise InvalidQuery(f"workload.{e.field}: {e.reason}") from None
        if not job_id:
            raise InvalidQuery("target is required: set workload or a non-empty job_id")
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"unknown job {job_id!r}: never submitted, planned or rejected")
        if job.kind == "":
            raise FailedPrecondition(f"job {job_id!r} has no spec here to take a workload from")
        try:
            spec = job_from_proto(job.spec, catalog=self.catalog)
        except InvalidSpecError as e:
            raise FailedPrecondition(f"job {job_id!r}'s spec cannot be decoded here: {e}") \
                from None
        return job_workload(spec)


def decode_config(msg: config_pb2.DeploymentConfig, catalog: Catalog
                  ) -> tuple[DeploymentConfig | None, list[plan_service_pb2.ConfigViolation]]:
    """(config, violations). Raises ``InvalidQuery`` when it cannot be decoded at all (a
    required id or an enum is missing). Every knob outside its own bounds or unknown to
    the catalog is a violation (found by clearing it and decoding again); cross-knob
    checks (``koi.space.validate``) run only when every knob is in bounds, since they
    would judge defaults rather than what was asked."""
    work = config_pb2.DeploymentConfig()
    work.CopyFrom(msg)
    found: list[plan_service_pb2.ConfigViolation] = []
    for _ in range(len(work.DESCRIPTOR.fields) + 1):
        try:
            cfg = config_from_proto(work, catalog=catalog)
        except InvalidConfigError as e:
            if e.knob in KNOB_ENUMS or (e.knob in REQUIRED_IDS and not getattr(work, e.knob)):
                raise InvalidQuery(f"config.{e.knob}: {e.reason}") from None
            found.append(plan_service_pb2.ConfigViolation(knob=e.knob, reason=e.reason))
            if e.knob in REQUIRED_IDS:  # an unknown model/accelerator/engine: cannot go on
                return None, found
            work.ClearField(e.knob)
            continue
        if found:
            return None, found
        return cfg, [plan_service_pb2.ConfigViolation(knob=v.knob, reason=v.reason)
                     for v in validate(cfg, catalog)]
    return None, found
