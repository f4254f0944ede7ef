"""From the deployments a practitioner policy wants for a job to actions, within the tick's
GPUs.

``reconcile`` turns one job's ``DeploymentTarget``s into LAUNCH/SCALE/SWAP/DRAIN actions
against a ``CapacityLedger`` so that no tick over-commits GPUs; ``unfinished_jobs`` and
``serving_deployments`` say which jobs and deployments it works on. No choice of *what*
to run lives here (that is each policy's business, with ``koi.policies.profiles``), and
nothing reads clocks or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from koi.catalog import Market, Offering
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
)
from koi.lifecycle import is_lost, job_finished, live_deployments
from koi.policies.bookkeeping import CapacityLedger
from koi.policies.profiles import shape_key
from koi.shapes import shape_label
from koi.space import DeploymentConfig

# --- which jobs and deployments ------------------------------------------------------------

def unfinished_jobs(snapshot: ClusterSnapshot) -> list[JobStatus]:
    """Jobs that should be served this tick: submitted, not rejected, not finished."""
    return [j for j in snapshot.jobs
            if not j.rejected and not job_finished(j, snapshot.time_s)]


def serving_deployments(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    """The job's live deployments that still hold a replica and are not draining."""
    return [d for d in live_deployments(snapshot, job_id)
            if not is_lost(d) and d.state != DeploymentState.DRAINING]


# --- reconciling one job's target with what runs ----------------------------------------

@dataclass(frozen=True, slots=True)
class DeploymentTarget:
    """One deployment a policy wants for a job: shape, offering, replicas and why."""

    shape: DeploymentConfig
    offering: str
    replicas: int
    reason: str


@dataclass(slots=True)
class Budget:
    """Swaps left this tick (make-before-break moves are the expensive kind)."""

    swaps: int


def offers_for(ledger: CapacityLedger, accelerator: str, preferred: str) -> list[Offering]:
    """The preferred offering first, then that accelerator's others, cheapest first."""
    offers = sorted(ledger.known_offerings(), key=lambda o: (o.id != preferred,
                                                              o.usd_per_gpu_hour,
                                                              o.market != Market.ON_DEMAND))
    return [o for o in offers if o.accelerator == accelerator]


def reconcile(job: JobStatus, targets: Sequence[DeploymentTarget], snapshot: ClusterSnapshot,
              ledger: CapacityLedger, budget: Budget, tag: str) -> list[Action]:
    """Actions that move the job's deployments towards ``targets``, within the ledger.

    A target matched by (shape, offering) to a serving deployment is a SCALE (growth
    shrunk to what is free). One target against one different deployment is a SWAP,
    make-before-break, if the budget and the ledger allow it. Other unmatched targets are
    LAUNCHed (on the preferred offering, else the same part's cheapest with room, fewer
    replicas if fewer fit); unmatched deployments are DRAINed once every target is served.
    A job mid-swap (more than one deployment while one target is wanted) is left alone.
    """
    deps = serving_deployments(snapshot, job.id)
    if len(targets) == 1 and len(deps) > 1:
        return []  # a swap is in flight: let it finish
    matched: dict[str, DeploymentTarget] = {}
    unmatched: list[DeploymentTarget] = []
    for t in targets:
        dep = next((d for d in deps if d.id not in matched and d.offering == t.offering
                    and shape_key(d.config) == shape_key(t.shape)), None)
        if dep is None:
            unmatched.append(t)
        else:
            matched[dep.id] = t
    leftovers = [d for d in deps if d.id not in matched]
    actions = [a for d in deps if d.id in matched
               if (a := _scale(job, d, matched[d.id], ledger)) is not None]
    if len(unmatched) == 1 and len(leftovers) == 1 and len(targets) == 1:
        swap = _swap(job, leftovers[0], unmatched[0], ledger, budget)
        return actions + ([swap] if swap is not None else [])
    launched_all = True
    for t in unmatched:
        launch = _launch(job, t, ledger, tag)
        launched_all &= launch is not None
        if launch is not None:
            actions.append(launch)
    if not unmatched and all(d.state == DeploymentState.RUNNING for d in deps
                             if d.id in matched):
        actions += [Action(ActionKind.DRAIN, job.id, f"{tag}: no longer in the plan",
                           deployment_id=d.id) for d in leftovers]
    if not targets and not deps:
        actions.append(Action(ActionKind.DEFER, job.id, f"{tag}: no capacity in the plan"))
    elif unmatched and not launched_all and not deps:
        actions.append(Action(ActionKind.DEFER, job.id, f"{tag}: no capacity for its target"))
    return actions


def _scale(job: JobStatus, dep: Deployment, t: DeploymentTarget,
           ledger: CapacityLedger) -> Action | None:
    current = dep.config.replicas
    want = t.replicas
    if want > current:
        want = current + ledger.max_replicas(dep.offering, dep.config.gpus_per_replica,
                                             want - current)
        ledger.take(dep.offering, (want - current) * dep.config.gpus_per_replica)
    if want == current or want < 1:
        return None
    return Action(ActionKind.SCALE, job.id, f"{t.reason}; {current} → {want} replicas",
                  deployment_id=dep.id, replicas=want)


def _swap(job: JobStatus, dep: Deployment, t: DeploymentTarget, ledger: CapacityLedger,
          budget: Budget) -> Action | None:
    if budget.swaps <= 0:
        return None
    gpus = t.shape.gpus_per_replica
    n = ledger.max_replicas(t.offering, gpus, t.replicas)
    if n < max(1, math.ceil(t.replicas / 2)):
        return None  # not enough room to move without gutting the service
    ledger.take(t.offering, n * gpus)
    budget.swaps -= 1
    cfg = t.shape.with_(offering=t.offering, replicas=n)
    return Action(ActionKind.SWAP, job.id, f"{t.reason}; swap from {shape_label(dep.config)}"
                  f" on {dep.offering}",
                  deployment_id=dep.id, config=cfg, offering=t.offering, replicas=n)


def _launch(job: JobStatus, t: DeploymentTarget, ledger: CapacityLedger,
            tag: str) -> Action | None:
    gpus = t.shape.gpus_per_replica
    for off in offers_for(ledger, t.shape.accelerator, t.offering):
        n = ledger.max_replicas(off.id, gpus, t.replicas)
        if n >= 1:
            ledger.take(off.id, n * gpus)
            cfg = t.shape.with_(offering=off.id, replicas=n)
            where = "" if off.id == t.offering else f" (wanted {t.offering}, full)"
            return Action(ActionKind.LAUNCH, job.id, f"{t.reason}; × {n} on {off.id}{where}",
                          deployment_id=f"{job.id}.{tag}", config=cfg, offering=off.id,
                          replicas=n)
    return None
