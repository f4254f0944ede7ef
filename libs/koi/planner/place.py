"""The placer: turn the composed plan into actions against what is running now.

For each job the plan says where it should run (configuration, offering, replicas) or
that it is deferred or rejected; the placer compares that with the job's live
deployments and emits the least disruptive actions that get there:

* nothing running → LAUNCH;
* same configuration and offering → SCALE when the replica count differs (this also
  re-places replicas lost to spot preemption or a stock-out);
* same offering, new parallelism or engine knobs → RELAUNCH (the ranks restart) on the
  same GPUs per replica for a batch job; with ``reshard_batch`` a batch job may also be
  re-sharded there to another number of GPUs per replica (its work waits through the
  restart). An online job changes shape make-before-break (a SWAP on the same offering)
  with ``make_before_break``; only where the offering can never hold both ends at once
  does it relaunch, and the action's reason says so;
* anything else → SWAP, make-before-break (the old deployment serves until the new one
  is ready);
* rejected → REJECT (and STOP anything running); deferred → DEFER with the reason
  (a deferred batch job's live deployments DRAIN; a deferred online job keeps serving);
* jobs that are finished → STOP.

Swaps and relaunches interrupt or cost capacity, so at most ``migration_budget`` of them
happen per tick; the rest keep their current deployment and say why. Last, an action
that needs more GPUs than are free when it runs (the plan may count GPUs a drain releases
only later) becomes a DEFER that says so, rather than be refused by the cluster. No
composition or prediction here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koi.cluster import Action, ActionKind, ClusterSnapshot, Deployment, DeploymentState
from koi.space import DeploymentConfig

PARALLELISM_KNOBS = ("tp", "pp", "dp_attention", "ep")
# the reason an online relaunch gives when the offering cannot hold both ends (koi.churn)
FORCED_RELAUNCH = "capacity forbids make-before-break"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the plan wants one job."""

    job_id: str
    decision: str                      # "place" | "defer" | "reject"
    reason: str
    config: DeploymentConfig | None = None
    offering: str = ""
    replicas: int = 0
    # the share of the job's demand the planned count serves (the composer's expected
    # goodput ÷ demand, at most 1): below 1 a lower count is the composer giving GPUs to
    # others, not demand falling (``stability``'s ``scale_down_short_hold``)
    served: float = 1.0


def _live(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    return [d for d in snapshot.deployments_of(job_id)
            if d.state in (DeploymentState.STARTING, DeploymentState.RUNNING)]


def _shape(cfg: DeploymentConfig) -> DeploymentConfig:
    """The configuration without where it runs and how many replicas."""
    return cfg if cfg.offering == "" and cfg.replicas == 1 else cfg.with_(offering="",
                                                                          replicas=1)


def _same_shape(a: DeploymentConfig, b: DeploymentConfig) -> bool:
    return _shape(a) == _shape(b)


def _relaunchable(dep: Deployment, config: DeploymentConfig, offering: str,
                  reshard: bool = False) -> bool:
    """Same offering and accelerator, only knobs an engine restart can change; with
    ``reshard`` (a batch job) also another number of GPUs per replica (tp2 ×32 → tp1 ×64
    on the same 64 GPUs).

    Without it a batch job that holds a whole offering could never change its
    parallelism there: a swap needs the new replicas' GPUs while the old ones still
    serve. On hetero-12h seed 1 nightly-summarize-8b moved tp1 → tp2 on a prior that
    over-stated tp2 by 1.45×, learnt so, and stayed on tp2 at 66 % of its deadline's pace
    for 70 ticks, the offering full. Allowing it lost on hetero-12h (BENCHMARKS (t)), so
    ``KoiSettings.reshard_batch`` is off. An online job keeps its shape make-before-break:
    a restart drops its traffic."""
    return (dep.offering == offering and dep.config.accelerator == config.accelerator
            and (reshard or dep.config.gpus_per_replica == config.gpus_per_replica))


def _primary(live: list[Deployment]) -> Deployment:
    """The deployment a move starts from: running before starting, then the largest."""
    return max(live, key=lambda d: (d.state == DeploymentState.RUNNING, d.replicas_ready))


def _relaunch_source(live: list[Deployment]) -> Deployment | None:
    """The deployment a RELAUNCH would restart (the primary, once it runs), or None."""
    primary = _primary(live) if live else None
    return primary if primary is not None and primary.state == DeploymentState.RUNNING \
        else None


def reshardable(snapshot: ClusterSnapshot, enabled: bool) -> frozenset[str]:
    """The jobs whose deployment may be re-sharded on its GPUs (``_relaunchable``): the
    batch jobs, when ``enabled`` (``KoiSettings.reshard_batch``); the composer's rows and
    the placer's actions both ask here."""
    return frozenset(j.id for j in snapshot.jobs if j.is_batch) if enabled else frozenset()


def in_place(live: list[Deployment], *, reshard: bool = False, relaunch: bool = True
             ) -> Callable[[DeploymentConfig, str], bool]:
    """For one job's ``live`` deployments: whether running a configuration on an offering
    keeps one of them on the GPUs it holds — the matching one (scaled in place), or, with
    ``relaunch`` (not an online job changing shape make-before-break), the primary
    relaunched in place (``reshard``, a batch job: re-sharded too, ``_relaunchable``).
    Anything else is a swap, whose old GPUs serve until the new deployment is ready. (The
    job's part is done once: the planner asks per row.)"""
    shapes = {(_shape(d.config), d.offering) for d in live}
    source = _relaunch_source(live) if relaunch else None

    def keeps(config: DeploymentConfig, offering: str) -> bool:
        return (_shape(config), offering) in shapes or (
            source is not None and _relaunchable(source, config, offering, reshard))
    return keeps


def place(targets: Sequence[Target], snapshot: ClusterSnapshot, *, finished: Sequence[str] = (),
          migration_budget: int = 4, reshard_batch: bool = False,
          make_before_break: bool = True) -> list[Action]:
    """Actions that move the cluster from ``snapshot`` towards ``targets`` (``reshard_batch``:
    ``_relaunchable``; ``make_before_break``: an online job's change of shape on its
    offering is a SWAP there, not a RELAUNCH, module docstring)."""
    actions: list[Action] = []
    budget = migration_budget
    batch = {j.id for j in snapshot.jobs if j.is_batch}
    reshard = reshardable(snapshot, reshard_batch)
    for job_id in finished:
        actions += [Action(ActionKind.STOP, job_id, "job finished", deployment_id=d.id)
                    for d in _live(snapshot, job_id)]
    for t in targets:
        live = _live(snapshot, t.job_id)
        if t.decision == "reject":
            actions += [Action(ActionKind.STOP, t.job_id, t.reason, deployment_id=d.id)
                        for d in live]
            status = next((j for j in snapshot.jobs if j.id == t.job_id), None)
            if status is not None and not status.admitted and not status.rejected:
                actions.append(Action(ActionKind.REJECT, t.job_id, t.reason))
            continue
        if t.decision != "place" or t.config is None:
            if not live:
                actions.append(Action(ActionKind.DEFER, t.job_id, t.reason))
            elif t.job_id in batch:
                # the plan has better uses for these GPUs (or none worth their price):
                # finish what the replicas hold, then free them; an online job keeps
                # serving, since stopping it would serve no one
                actions += [Action(ActionKind.DRAIN, t.job_id, f"deferred: {t.reason}",
                                   deployment_id=d.id) for d in live]
            continue
        new, used = _move(t, live, budget, reshard=t.job_id in reshard,
                          swap_in_place=make_before_break and t.job_id not in batch)
        budget -= used
        actions += new
    return _within_free(actions, snapshot)


def _within_free(actions: list[Action], snapshot: ClusterSnapshot) -> list[Action]:
    """``actions`` with each one that needs more GPUs than are free when it runs turned
    into a DEFER that says so. The plan may count GPUs that drains started this tick
    release only when their replicas empty (a deferred batch job, a scale-down); what
    needs them waits a tick rather than be refused by the cluster."""
    free = {c.offering: c.free_gpus for c in snapshot.capacity}
    total = {c.offering: c.total_gpus for c in snapshot.capacity}
    deps = {d.id: d for d in snapshot.deployments}
    out = []
    for a in actions:
        dep = deps.get(a.deployment_id) if a.deployment_id else None
        if a.kind == ActionKind.STOP and dep is not None:
            free[dep.offering] = free.get(dep.offering, 0) + dep.gpus
        offering, need = _gpus_needed(a, dep)
        if (a.kind == ActionKind.SWAP and dep is not None and a.config is not None
                and _relaunchable(dep, a.config, a.offering)
                and need + dep.gpus > total.get(offering, 0)):
            # both ends can never fit on the offering: the shape changes break-first
            a = Action(ActionKind.RELAUNCH, a.job_id,
                       f"{FORCED_RELAUNCH}: the new shape needs {need} GPUs"
                       f" on {offering} beside the {dep.gpus} it holds, of"
                       f" {total.get(offering, 0)}; its traffic waits through the restart"
                       f" ({a.reason})", deployment_id=dep.id, config=a.config,
                       offering=a.offering, replicas=0)
            offering, need = _gpus_needed(a, dep)
        if need > free.get(offering, 0):
            a = Action(ActionKind.DEFER, a.job_id, f"waiting for GPUs: needs {need} on "
                       f"{offering}, {free.get(offering, 0)} free now ({a.reason})")
        elif need:
            free[offering] -= need
        out.append(a)
    return out


def _gpus_needed(a: Action, dep: Deployment | None) -> tuple[str, int]:
    """(offering, free GPUs) an action takes when the cluster applies it."""
    if a.kind in (ActionKind.LAUNCH, ActionKind.SWAP) and a.config is not None:
        return a.offering, a.replicas * a.config.gpus_per_replica
    if dep is None:
        return "", 0
    if a.kind == ActionKind.SCALE:
        have = dep.replicas_ready + dep.replicas_starting
        return dep.offering, max(a.replicas - have, 0) * dep.config.gpus_per_replica
    if a.kind == ActionKind.RELAUNCH and a.config is not None:
        replicas = a.replicas or dep.config.replicas
        return dep.offering, max(replicas * a.config.gpus_per_replica - dep.gpus, 0)
    return "", 0


def _move(t: Target, live: list[Deployment], budget: int, *, reshard: bool = False,
          swap_in_place: bool = False) -> tuple[list[Action], int]:
    """Actions for one placed job (``reshard``: a batch job, ``_relaunchable``;
    ``swap_in_place``: an online job, whose change of shape is a make-before-break SWAP),
    and how much migration budget they use."""
    assert t.config is not None
    cfg = t.config.with_(offering=t.offering, replicas=t.replicas)
    if not live:
        return [Action(ActionKind.LAUNCH, t.job_id, t.reason, config=cfg, offering=t.offering,
                       replicas=t.replicas)], 0
    matching = [d for d in live if _same_shape(d.config, cfg) and d.offering == t.offering]
    if matching:
        primary = matching[0]
        # others left from an earlier swap: the cluster drains a replaced deployment when
        # its successor is ready; anything else is consolidated once the primary runs
        tail = [Action(ActionKind.DRAIN, t.job_id, "consolidate onto one deployment",
                       deployment_id=d.id) for d in live
                if d is not primary and primary.state == DeploymentState.RUNNING]
        have = primary.replicas_ready + primary.replicas_starting
        if have != t.replicas or primary.config.replicas != t.replicas:
            scale = Action(ActionKind.SCALE, t.job_id, t.reason, deployment_id=primary.id,
                           replicas=t.replicas)
            return [scale, *tail], 0
        return tail, 0
    primary = _primary(live)
    if primary.state != DeploymentState.RUNNING:
        return [], 0  # let a starting deployment come up before moving it again
    if budget <= 0:
        return [Action(ActionKind.DEFER, t.job_id,
                       f"migration budget spent this tick; keeping {primary.id} ({t.reason})")], 0
    if swap_in_place or not _relaunchable(primary, cfg, t.offering, reshard):
        return [Action(ActionKind.SWAP, t.job_id, t.reason, deployment_id=primary.id,
                       config=cfg, offering=t.offering, replicas=t.replicas)], 1
    # a relaunch on as many GPUs per replica keeps its replica count (0; the next tick
    # scales it); a re-shard cuts the GPUs into the plan's count
    same = primary.config.gpus_per_replica == cfg.gpus_per_replica
    return [Action(ActionKind.RELAUNCH, t.job_id, t.reason, deployment_id=primary.id,
                   config=cfg, offering=t.offering, replicas=0 if same else t.replicas)], 1
