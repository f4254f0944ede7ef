"""The placer: turn the composed plan into actions against what is running now.

For each job the plan says where it should run (configuration, offering, replicas) or
that it is deferred or rejected; the placer compares that with the job's live
deployments and emits the least disruptive actions that get there:

* nothing running → LAUNCH;
* same configuration and offering → SCALE when the replica count differs (this also
  re-places replicas lost to spot preemption or a stock-out);
* same offering, new parallelism or engine knobs → RELAUNCH (the ranks restart);
* anything else → SWAP, make-before-break (the old deployment serves until the new one
  is ready);
* rejected → REJECT (and STOP anything running); deferred → DEFER with the reason;
* jobs that are finished → STOP.

Swaps and relaunches interrupt or cost capacity, so at most ``migration_budget`` of them
happen per tick; the rest keep their current deployment and say why. No composition or
prediction here; the capacity check is the cluster's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from koi.cluster import Action, ActionKind, ClusterSnapshot, Deployment, DeploymentState
from koi.space import DeploymentConfig

PARALLELISM_KNOBS = ("tp", "pp", "dp_attention", "ep")


@dataclass(frozen=True, slots=True)
class Target:
    """Where the plan wants one job."""

    job_id: str
    decision: str                      # "place" | "defer" | "reject"
    reason: str
    config: DeploymentConfig | None = None
    offering: str = ""
    replicas: int = 0


def _live(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    return [d for d in snapshot.deployments_of(job_id)
            if d.state in (DeploymentState.STARTING, DeploymentState.RUNNING)]


def _same_shape(a: DeploymentConfig, b: DeploymentConfig) -> bool:
    return a.with_(offering="", replicas=1) == b.with_(offering="", replicas=1)


def _relaunchable(dep: Deployment, target: Target) -> bool:
    """Same GPUs (offering and accelerator), only knobs an engine restart can change."""
    cfg = target.config
    return (cfg is not None and dep.offering == target.offering
            and dep.config.accelerator == cfg.accelerator
            and dep.config.gpus_per_replica == cfg.gpus_per_replica)


def place(targets: Sequence[Target], snapshot: ClusterSnapshot, *, finished: Sequence[str] = (),
          migration_budget: int = 4) -> list[Action]:
    """Actions that move the cluster from ``snapshot`` towards ``targets``."""
    actions: list[Action] = []
    budget = migration_budget
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
            continue
        new, used = _move(t, live, budget)
        budget -= used
        actions += new
    return actions


def _move(t: Target, live: list[Deployment], budget: int) -> tuple[list[Action], int]:
    """Actions for one placed job, and how much migration budget they use."""
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
    primary = max(live, key=lambda d: (d.state == DeploymentState.RUNNING, d.replicas_ready))
    if primary.state != DeploymentState.RUNNING:
        return [], 0  # let a starting deployment come up before moving it again
    if budget <= 0:
        return [Action(ActionKind.DEFER, t.job_id,
                       f"migration budget spent this tick; keeping {primary.id} ({t.reason})")], 0
    kind = ActionKind.RELAUNCH if _relaunchable(primary, t) else ActionKind.SWAP
    return [Action(kind, t.job_id, t.reason, deployment_id=primary.id, config=cfg,
                   offering=t.offering, replicas=t.replicas)], 1
