"""One Koi planning tick as a pure function: learn → propose → evaluate → compose → place.

``plan_tick(snapshot, telemetry, state, settings, catalog) -> (decision, report, state')``

1. **learn** — each deployment's last tick is predicted afresh at the load it actually
   saw; observed vs predicted updates the scoped causal beliefs, and the DRO calibrator
   re-scores its recent observations against the updated beliefs (what the learnt model
   still gets wrong);
2. **propose** — per job, candidate configurations guided by the playbook's mechanisms
   and, with ``KoiSettings.mediator_guidance`` (off), the running deployment's mediators;
3. **evaluate** — one numba kernel call scores every candidate robustly (belief
   multipliers and the DRO radius tighten the SLOs);
4. **compose** — candidates priced per offering; one MILP picks a candidate (or defer /
   reject) and integer replicas per job under per-offering capacity;
5. **place** — the least disruptive actions towards that plan, within a migration budget.

Time and randomness come from the snapshot; no I/O. The same code runs in the benchmark
and behind the services.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from koi.catalog import Catalog
from koi.causal.observe import (
    OutcomeObservation,
    log_residuals,
    observation_from_telemetry,
)
from koi.causal.scope import Scope, scope_of
from koi.causal.store import BeliefStore
from koi.cluster import (
    ClusterSnapshot,
    DeploymentState,
    DeploymentTelemetry,
    JobStatus,
    PlanDecision,
)
from koi.compose import ComposeInput, ComposePlan, compose
from koi.dro import OUTCOMES, SLO_OUTCOMES, DroCalibrator
from koi.lifecycle import job_finished
from koi.planner.candidates import job_demands, job_loads, scored_candidates
from koi.planner.evaluate import Evaluated, JobLoad, RiskLevel, evaluate
from koi.planner.explain import Explanation, explain_choices
from koi.planner.place import Target, place
from koi.planner.propose import Hints, MechanismHint, Proposal, propose
from koi.planner.robust import (
    Kernel,
    RobustnessFn,
    calibrated_radii,
    planned_radii,
    robustness_fn,
)
from koi.planner.settings import KoiSettings
from koi.planner.stability import (
    HOUR_S,
    ChurnMemory,
    binding_holds,
    estimate_sd,
    held_jobs,
    planning_view,
    remember,
    stabilise,
)
from koi.predictor.api import evaluate_matrix, predict_many
from koi.predictor.features import build_inputs
from koi.predictor.passes import pass_curves
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig


@dataclass(frozen=True)
class KoiState:
    beliefs: BeliefStore = field(default_factory=BeliefStore)
    calibrator: DroCalibrator = field(default_factory=DroCalibrator)
    tick: int = -1
    # deployments fully running at the last snapshot, and those also running at the one
    # before: only the latter's telemetry is steady state (a deployment's first running
    # tick serves the backlog that queued while it started)
    running: frozenset[str] = frozenset()
    steady: frozenset[str] = frozenset()
    churn: ChurnMemory = field(default_factory=ChurnMemory)

    @staticmethod
    def initial(settings: KoiSettings) -> KoiState:
        """The state before the first tick: no beliefs, a calibrator at ``settings``'
        coverage target."""
        return KoiState(calibrator=DroCalibrator(coverage=settings.coverage))


@dataclass(frozen=True)
class TickReport:
    tick: int
    plan: ComposePlan | None
    explanations: tuple[Explanation, ...]
    stage_s: dict[str, float]
    candidates: int
    # learning: median |log(observed / corrected prediction)| of this tick's observations
    abs_error: dict[str, float]
    radii: dict[str, float]
    coverage: dict[str, float]
    mechanisms_active: int
    mechanisms_applicable: int
    mechanisms_discovered: int
    belief_version: int


def plan_tick(snapshot: ClusterSnapshot, telemetry: Sequence[DeploymentTelemetry],
              state: KoiState, settings: KoiSettings, catalog: Catalog, *,
              widen: Callable[[list[Proposal]], list[Proposal]] | None = None
              ) -> tuple[PlanDecision, TickReport, KoiState]:
    """One whole tick in-process: the stages below in order (the services run the same
    stage functions, one per process). ``widen`` may add candidates to the proposer's
    (the language-model hypotheses' tests, ``koi.rlm.adopt.widen``) before evaluation."""
    stage: dict[str, float] = {}
    t0 = time.perf_counter()
    memory = remember(state.churn, snapshot)
    observations = observe(snapshot, telemetry, state.steady, settings, catalog)
    beliefs, calibrator, abs_error = learn_from(observations, state.beliefs,
                                                state.calibrator, snapshot.tick, settings)
    stage["learn"] = time.perf_counter() - t0

    t = time.perf_counter()
    # the plan's stages read each online job's rate as planned (stability.planned_rate)
    inputs = tick_inputs(planning_view(snapshot, memory, settings.churn), beliefs, calibrator,
                         settings, catalog)
    proposals = propose_stage(snapshot, active_mechanisms(beliefs), settings, catalog,
                              jobs=inputs.jobs, hints=mediator_hints(observations))
    if widen is not None:
        proposals = widen(proposals)
    stage["propose"] = time.perf_counter() - t

    t = time.perf_counter()
    ev = evaluate_stage(proposals, inputs)
    stage["evaluate"] = time.perf_counter() - t

    t = time.perf_counter()
    plan = compose_stage(ev, inputs)
    stage["compose"] = time.perf_counter() - t

    t = time.perf_counter()
    decision, memory = place_stable(plan_targets(plan), plan_notes(plan), snapshot,
                                    settings, memory)
    stage["place"] = time.perf_counter() - t
    stage["total"] = time.perf_counter() - t0

    explanations = explain_stage(plan, ev, inputs)
    report = tick_report(snapshot, plan, explanations, stage, len(ev), abs_error, beliefs,
                         calibrator, settings, catalog)
    running = running_deployments(snapshot)
    return decision, report, KoiState(beliefs, calibrator, snapshot.tick, running,
                                      running & state.running, memory)


def tick_report(snapshot: ClusterSnapshot, plan: ComposePlan | None,
                explanations: tuple[Explanation, ...], stage: dict[str, float],
                candidates: int, abs_error: dict[str, float], beliefs: BeliefStore,
                calibrator: DroCalibrator, settings: KoiSettings, catalog: Catalog
                ) -> TickReport:
    scopes = [scope_of(d.config, catalog) for d in snapshot.deployments]
    counts = beliefs.counts(scopes)
    return TickReport(
        tick=snapshot.tick, plan=plan, explanations=explanations, stage_s=stage,
        candidates=candidates, abs_error=abs_error,
        radii=calibrated_radii(calibrator, settings),
        coverage={o: calibrator.realised_coverage(o) for o in ("ttft_p95", "tpot_p95")},
        mechanisms_active=counts.active, mechanisms_applicable=counts.applicable,
        mechanisms_discovered=counts.discovered, belief_version=beliefs.version)


# --- the stages, one per service ------------------------------------------------------

def running_deployments(snapshot: ClusterSnapshot) -> frozenset[str]:
    """Deployments fully running (no replica still starting) at ``snapshot``."""
    return frozenset(d.id for d in snapshot.deployments
                     if d.state == DeploymentState.RUNNING and d.replicas_starting == 0)


def steady_deployments(previous: ClusterSnapshot | None,
                       before_previous: ClusterSnapshot | None) -> frozenset[str]:
    """Deployments whose telemetry at the next tick is steady state: fully running at
    both of the two snapshots before it (a first running tick serves the backlog)."""
    if previous is None or before_previous is None:
        return frozenset()
    return running_deployments(previous) & running_deployments(before_previous)


def active_jobs(snapshot: ClusterSnapshot) -> list[JobStatus]:
    """Jobs to plan: submitted by now, not rejected, not finished."""
    return [j for j in snapshot.jobs
            if not j.rejected and not job_finished(j, snapshot.time_s)
            and j.spec.submit_s <= snapshot.time_s]


def propose_stage(snapshot: ClusterSnapshot, mechanisms: Sequence[ActiveMechanism],
                  settings: KoiSettings, catalog: Catalog,
                  jobs: Sequence[JobStatus] | None = None,
                  hints: Mapping[str, Hints] | None = None) -> list[Proposal]:
    """Candidates for ``jobs`` (default: every active job), in job order, guided by the
    playbook's active mechanisms and, with ``settings.mediator_guidance``, by each
    running deployment's mediators (``hints`` by deployment id: ``mediator_hints`` of
    the tick's observations)."""
    todo = active_jobs(snapshot) if jobs is None else jobs
    guide = (hints or {}) if settings.mediator_guidance else {}
    return _propose_all(snapshot, todo, mechanisms, settings, catalog, guide)


def mediator_hints(observations: Sequence[OutcomeObservation]) -> dict[str, Hints]:
    """What each observed deployment's last tick says about its bottleneck, by
    deployment id: the KV-cache usage and KV preemptions it reported, and the
    communication share and queue utilisation the predictor gives at the load it saw
    (neither is on a vLLM endpoint)."""
    out = {}
    for o in observations:
        med = o.mediators()
        preempted = o.observed.get("preemptions")
        out[o.deployment_id] = Hints(
            kv_pressure=float(o.observed.get("kv_usage", med["kv_pressure"])),
            comm_overhead_frac=med["comm_overhead"], queue_util=med["queue_util"],
            kv_preemptions=None if preempted is None else float(preempted))
    return out


@dataclass(frozen=True)
class TickInputs:
    """What the evaluate, compose and explain stages of one tick read, built once
    (``tick_inputs``, after learning) and passed to each: the snapshot, the learnt
    model, the jobs to plan with their loads, and a configuration's robustness
    (``koi.planner.robust``; one cache for the tick)."""

    snapshot: ClusterSnapshot
    beliefs: BeliefStore
    calibrator: DroCalibrator
    settings: KoiSettings
    catalog: Catalog
    jobs: tuple[JobStatus, ...]          # active_jobs(snapshot)
    loads: Mapping[str, JobLoad]         # per job, at ``settings.rate_headroom``
    robustness: RobustnessFn


def tick_inputs(snapshot: ClusterSnapshot, beliefs: BeliefStore, calibrator: DroCalibrator,
                settings: KoiSettings, catalog: Catalog) -> TickInputs:
    jobs = tuple(active_jobs(snapshot))
    return TickInputs(snapshot, beliefs, calibrator, settings, catalog, jobs,
                      job_loads(jobs, snapshot, settings.rate_headroom),
                      tick_robustness(beliefs, calibrator, settings, catalog))


def tick_robustness(beliefs: BeliefStore, calibrator: DroCalibrator, settings: KoiSettings,
                    catalog: Catalog) -> RobustnessFn:
    """A configuration's robustness under ``settings`` (its switches: beliefs, DRO and the
    outcomes widened), as the evaluator, the explanation and the planner-api use it."""
    return robustness_fn(beliefs if settings.use_beliefs else None,
                         planned_radii(calibrated_radii(calibrator, settings), settings),
                         catalog)


def evaluate_stage(proposals: Sequence[Proposal], inputs: TickInputs,
                   kernel: Kernel | None = None) -> Evaluated:
    """Robust scores of ``proposals``; each job's candidates must all be present (a job's
    nominal fallback looks at all of them), so shards are cut at job boundaries."""
    calibrator, settings = inputs.calibrator, inputs.settings
    cache: dict[str, tuple[RiskLevel, ...]] = {}

    def levels(job_id: str) -> tuple[RiskLevel, ...]:
        if job_id not in cache:
            cache[job_id] = risk_levels(calibrator, settings, job_id)
        return cache[job_id]

    return evaluate(proposals, inputs.loads, robustness=inputs.robustness, levels=levels,
                    catalog=inputs.catalog, calibration=settings.calibration,
                    backend=settings.backend, kernel=kernel)


def compose_stage(ev: Evaluated, inputs: TickInputs) -> ComposePlan:
    """The composed plan; a job ``stability.held_jobs`` holds (pinned, cooling down)
    keeps its placement (only its current configuration is offered) and its reason
    says why. With ``KOI_CHURN_UNCERTAINTY_Z`` a running job's other options are
    discounted by their estimate's uncertainty (``stability.estimate_sd``)."""
    snapshot, settings, catalog, beliefs = (inputs.snapshot, inputs.settings, inputs.catalog,
                                            inputs.beliefs)
    held = binding_holds(held_jobs(snapshot, settings.churn), ev.proposals,
                         ev.slo_feasible.tolist(), snapshot)
    sd = None
    if settings.churn.uncertainty_z > 0 and settings.use_beliefs:
        by_scope: dict[Scope, float] = {}

        def sd(config: DeploymentConfig) -> float:
            scope = scope_of(config, catalog)
            if scope not in by_scope:
                by_scope[scope] = estimate_sd(beliefs, scope)
            return by_scope[scope]
    measured = settings.measure(ev, snapshot) if settings.measure else None
    table, capacity = scored_candidates(
        ev, snapshot, catalog, settings.churn_hours, reshard_batch=settings.reshard_batch,
        measured=measured, make_before_break=settings.churn.make_before_break,
        held=frozenset(held), estimate_sd=sd, uncertainty_z=settings.churn.uncertainty_z)
    demands = job_demands(inputs.jobs, inputs.loads, snapshot, ev,
                          batch_pace=settings.batch_pace)
    weights = replace(settings.weights, move_value_h=settings.churn.move_value_h) \
        if settings.churn.move_value_h else settings.weights
    plan = compose(ComposeInput(jobs=demands, candidates=table, capacity=capacity,
                                weights=weights, top_k=settings.top_k,
                                time_limit_s=settings.compose_time_limit_s))
    if not held:
        return plan
    return replace(plan, choices=tuple(
        replace(c, reason=f"{c.reason}; {held[c.job_id]}") if c.job_id in held else c
        for c in plan.choices))


def explain_stage(plan: ComposePlan, ev: Evaluated, inputs: TickInputs
                  ) -> tuple[Explanation, ...]:
    """Why each job is where ``plan`` puts it, with the numbers at the planned load."""
    settings = inputs.settings
    return explain_choices(plan, ev, inputs.beliefs, inputs.calibrator, inputs.catalog,
                           inputs.loads, inputs.robustness, use_beliefs=settings.use_beliefs,
                           calibration=settings.calibration, backend=settings.backend)


def plan_targets(plan: ComposePlan) -> list[Target]:
    return [Target(c.job_id, c.decision.value, c.reason, c.config, c.offering, c.replicas,
                   min(c.goodput_tok_s / c.demand_tok_s, 1.0) if c.demand_tok_s > 0 else 1.0)
            for c in plan.choices]


def plan_notes(plan: ComposePlan) -> dict[str, str]:
    return {"solver": str(plan.solver), "status": plan.status,
            "objective": f"{plan.objective:.2f}"}


def place_stage(plan: ComposePlan, snapshot: ClusterSnapshot,
                settings: KoiSettings) -> PlanDecision:
    return place_targets(plan_targets(plan), plan_notes(plan), snapshot, settings)


def place_targets(targets: Sequence[Target], notes: dict[str, str],
                  snapshot: ClusterSnapshot, settings: KoiSettings) -> PlanDecision:
    """The actions that move the fleet towards ``targets`` (the placer's stage)."""
    finished = [j.id for j in snapshot.jobs if job_finished(j, snapshot.time_s)]
    actions = place(targets, snapshot, finished=finished,
                    migration_budget=settings.migration_budget,
                    reshard_batch=settings.reshard_batch,
                    make_before_break=settings.churn.make_before_break)
    return PlanDecision(tick=snapshot.tick, actions=tuple(actions), notes=dict(notes))


def place_stable(targets: Sequence[Target], notes: dict[str, str], snapshot: ClusterSnapshot,
                 settings: KoiSettings, memory: ChurnMemory
                 ) -> tuple[PlanDecision, ChurnMemory]:
    """``place_targets`` after the placer's holds (``stability.stabilise``: the scale-down
    window, the per-job move limit), with ``memory`` already brought up to ``snapshot``;
    the memory to keep for the next tick."""
    held, memory = stabilise(targets, snapshot, memory, settings.churn)
    return place_targets(held, notes, snapshot, settings), memory


def churn_memory_span_s(settings: KoiSettings) -> float:
    """How far back the placer's churn memory reaches: moves are kept an hour, plans for
    the scale-down window; anything older has expired."""
    return max(HOUR_S, settings.churn.scale_down_window_s)


def replay_placements(history: Iterable[tuple[ClusterSnapshot, Sequence[Target] | None]],
                      settings: KoiSettings) -> ChurnMemory:
    """The churn memory a placer that saw ``history`` holds: each tick's snapshot and the
    targets of the plan placed against it (None: the tick was placed with no plan), in
    tick order, through the same ``remember`` and holds. Replaying the ticks of the last
    ``churn_memory_span_s`` (and one more) rebuilds the memory exactly: a placer taking
    over from another does so instead of starting with none."""
    memory = ChurnMemory()
    for snapshot, targets in history:
        memory = remember(memory, snapshot)
        if targets is not None:
            memory = stabilise(targets, snapshot, memory, settings.churn)[1]
    return memory


# --- learn ----------------------------------------------------------------------------

def observe(snapshot: ClusterSnapshot, telemetry: Sequence[DeploymentTelemetry],
            steady: frozenset[str], settings: KoiSettings, catalog: Catalog
            ) -> list[OutcomeObservation]:
    """Each steady deployment's last tick next to a fresh prediction at the load it saw
    (telemetry-ingest's stage)."""
    observations: list[OutcomeObservation] = []
    deps = {d.id: d for d in snapshot.deployments}
    pairs, keep = [], []
    batch_jobs = {j.id for j in snapshot.jobs if j.is_batch}
    for t in telemetry:
        dep = deps.get(t.deployment_id)
        if dep is None or t.requests_finished <= 0 or dep.replicas_ready < 1 \
                or t.deployment_id not in steady:
            continue
        n = max(t.requests_finished, 1.0)
        batch = t.job_id in batch_jobs
        # a batch job's backlog keeps its replicas saturated; an online job sees its rate
        mode, load = (LoadMode.SATURATED, 0.0) if batch else \
            (LoadMode.RATE, max(t.requests_arrived / max(t.window_s, 1e-9), 1e-3))
        pairs.append((dep.config.with_(replicas=dep.replicas_ready), Workload(
            input_len=max(t.prompt_tokens / n, 1.0), output_len=max(t.generation_tokens / n, 1.0),
            mode=mode, load=load)))
        keep.append((t, scope_of(dep.config, catalog), batch))
    preds: list[Prediction] = predict_many(pairs, catalog=catalog, validate=False,
                                           calibration=settings.calibration,
                                           backend=settings.backend) if pairs else []
    online = []
    for (t, scope, batch), pred, pair in zip(keep, preds, pairs, strict=True):
        obs = observation_from_telemetry(t, pred, scope)
        if obs is not None and batch:
            # a backlog's TTFT is time spent queued behind it, not a property of the config
            obs = replace(obs, observed={k: v for k, v in obs.observed.items()
                                         if not k.startswith("ttft")})
        if obs is not None:
            if not batch:
                online.append((len(observations), pair))
            observations.append(obs)
    if online and settings.use_beliefs:
        observations = _with_pass_curves(observations, online, settings, catalog)
    return observations


def _with_pass_curves(observations: list[OutcomeObservation],
                      online: Sequence[tuple[int, tuple]], settings: KoiSettings,
                      catalog: Catalog) -> list[OutcomeObservation]:
    """``observations`` with each online one's pass curves (``koi.predictor.passes``):
    its means predicted along the pass multipliers, for the store to invert."""
    X = build_inputs([pair for _, pair in online], catalog, settings.calibration)
    curves = pass_curves(X, lambda M: evaluate_matrix(M, backend=settings.backend))
    out = list(observations)
    for j, (i, _) in enumerate(online):
        out[i] = replace(out[i], curves={o: tuple(float(v) for v in c[j])
                                         for o, c in curves.items()})
    return out


def learn_from(observations: Sequence[OutcomeObservation], beliefs: BeliefStore,
               calibrator: DroCalibrator, tick: int, settings: KoiSettings
               ) -> tuple[BeliefStore, DroCalibrator, dict[str, float]]:
    """Update beliefs and the DRO calibrator from one tick's observations (the causal
    store's stage); also the median absolute log error before the update."""
    residuals = [beliefs.corrected_residuals(o) if settings.use_beliefs
                 else log_residuals(o) for o in observations]
    abs_error = {k: float(np.median([abs(r[k]) for r in residuals if k in r]))
                 for k in OUTCOMES
                 if any(k in r for r in residuals)}
    if not settings.learn or not observations:
        return beliefs, calibrator, abs_error
    at = max(tick, beliefs.tick)
    if not settings.use_beliefs:
        # the prior model's residuals never change, but re-scoring keeps the observations
        # (their spreads price SLO risk)
        return beliefs, calibrator.update(residuals, at, observations=observations,
                                          rescore=log_residuals), abs_error
    updated = beliefs.update(list(observations), at)
    # the radius measures the learnt model on the recent window (dro.py)
    return updated, calibrator.update(residuals, at, observations=observations,
                                      rescore=updated.corrected_residuals), abs_error


# --- propose / evaluate -----------------------------------------------------------------

def _propose_all(snapshot: ClusterSnapshot, jobs: Sequence,
                 mechanisms: Sequence[ActiveMechanism], settings: KoiSettings,
                 catalog: Catalog, hints: Mapping[str, Hints]) -> list:
    accels = sorted({catalog.offering(c.offering).accelerator for c in snapshot.capacity
                     if c.total_gpus > 0})
    mech_hints = _mechanism_hints(mechanisms) if settings.use_beliefs else []
    out = []
    for job in jobs:
        live = [d for d in snapshot.deployments_of(job.id)
                if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING)]
        current = live[0].config if live else None
        out += propose(job.id, job.spec.model, accels, catalog, current=current,
                       hints=hints.get(live[0].id) if live else None, mechanisms=mech_hints,
                       limits=settings.proposer)
    return out


@dataclass(frozen=True, slots=True)
class ActiveMechanism:
    """What the proposer needs of an active mechanism (its id, scope, effect and the
    operator line); the proposer service reads these off the causal state's message."""

    id: str
    scope: Scope
    effect: float
    line: str


def active_mechanisms(beliefs: BeliefStore) -> tuple[ActiveMechanism, ...]:
    return tuple(ActiveMechanism(m.id, m.scope, m.effect, m.line())
                 for m in beliefs.active_mechanisms())


def _mechanism_hints(mechanisms: Sequence[ActiveMechanism]) -> list[MechanismHint]:
    hints = []
    for m in mechanisms:
        tp = int(m.scope.parallelism[2:]) if m.scope.parallelism[:2] == "tp" \
            and m.scope.parallelism[2:].isdigit() else 0
        hints.append(MechanismHint(id=m.id, accelerator=m.scope.accelerator,
                                   engine=m.scope.engine, tp=tp, effect=m.effect,
                                   text=m.line))
    return hints


# margins closer than this (log) to the previous level's on both SLOs add no choice
LEVEL_STEP = 0.02


def risk_levels(calibrator: DroCalibrator, settings: KoiSettings,
                job: str | None = None) -> tuple[RiskLevel, ...]:
    """The margins ``job``'s online candidates are scored at: the calibrated radii (level
    0), then those of ``settings.risk_coverages`` on the job's own residuals where it has
    enough (never below level 0's), each with its SLO risk — the larger of the two SLOs'
    expected miss shares (``DroCalibrator.slo_risk``, the job's own shrunk towards all).
    Without DRO, or before the calibrator has spreads, one level at risk 0."""
    radii = calibrated_radii(calibrator, settings)
    base = {o: radii.get(o, 0.0) if o in settings.dro_outcomes else 0.0 for o in SLO_OUTCOMES}
    first = [calibrator.slo_risk(o, base[o], job) for o in SLO_OUTCOMES]
    if not settings.use_dro or any(r is None for r in first):
        return (RiskLevel(base["ttft_p95"], base["tpot_p95"], 0.0),)
    margins = [base]
    for q in settings.risk_coverages:
        at = {o: max(base[o], calibrator.radius_at(o, q, job)) if o in settings.dro_outcomes
              else base[o] for o in SLO_OUTCOMES}
        if any(at[o] - margins[-1][o] > LEVEL_STEP for o in SLO_OUTCOMES):
            margins.append(at)
    risks = [max(r or 0.0 for r in first)]
    risks += [max(calibrator.slo_risk(o, m[o], job) or 0.0 for o in SLO_OUTCOMES)
              for m in margins[1:]]
    return tuple(RiskLevel(m["ttft_p95"], m["tpot_p95"], r)
                 for m, r in zip(margins, risks, strict=True))
