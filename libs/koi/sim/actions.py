"""Applying a policy's actions to the simulated fleet: validate, then act or refuse.

Every action is checked (known job and deployment, a valid configuration for the job's
model, an offering that sells that accelerator, free capacity) and either applied or
refused with a reason; nothing here raises on a bad action. No tick loop, no request
accounting, no ``koi.predictor`` imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from koi.action_checks import ActionRefused, placed_config
from koi.catalog import Catalog, Offering
from koi.churn import placement_key
from koi.cluster import Action, ActionKind, ActionOutcome
from koi.space import DeploymentConfig

if TYPE_CHECKING:
    from koi.sim.fleet import Dep, Fleet
    from koi.sim.jobstate import JobState


class SimulatorView(Protocol):
    """What applying an action reads and changes of the simulator (``simulator.Simulator``
    is the one implementation); named here so this module does not import it back."""

    catalog: Catalog
    fleet: Fleet
    jobs: dict[str, JobState]
    now: float

    def emit(self, kind: str, job_id: str, detail: str = "", dep: str = "",
             before: str = "", after: str = "") -> None: ...

    def relaunched(self, dep: Dep) -> None: ...

    def new_deployment(self, js: JobState, cfg: DeploymentConfig, off: Offering,
                       replicas: int) -> Dep: ...


Refused = ActionRefused   # an action that cannot be applied; the message is the reason


def apply_action(sim: SimulatorView, a: Action) -> ActionOutcome:
    try:
        handler = HANDLERS[a.kind]
        handler(sim, a)
    except Refused as e:
        return ActionOutcome(a, False, str(e))
    return ActionOutcome(a, True, "")


def _job(sim: SimulatorView, a: Action):
    js = sim.jobs.get(a.job_id)
    if js is None or js.spec.submit_s > sim.now:
        raise Refused(f"unknown job {a.job_id!r}" if js is None
                      else f"job {a.job_id!r} is not submitted yet")
    return js


def _dep(sim: SimulatorView, a: Action) -> Dep:
    dep = sim.fleet.deps.get(a.deployment_id)
    if dep is None:
        raise Refused(f"unknown deployment {a.deployment_id!r}")
    if dep.job.id != a.job_id:
        raise Refused(f"deployment {a.deployment_id!r} serves job {dep.job.id!r},"
                      f" not {a.job_id!r}")
    return dep


def _config(sim: SimulatorView, a: Action, model: str) -> tuple[DeploymentConfig, Offering]:
    cfg, off = placed_config(a, sim.catalog, model)
    if cfg.pd_disaggregation:
        raise Refused("pd_disaggregation is not simulated")
    return cfg, off


def _need(sim: SimulatorView, offering: str, gpus: int) -> None:
    free = sim.fleet.free(offering)
    if gpus > free:
        raise Refused(f"capacity: needs {gpus} GPUs on {offering}, {free} free")


def _replicas(a: Action, cfg: DeploymentConfig) -> int:
    n = a.replicas or cfg.replicas
    if n < 1:
        raise Refused(f"replicas must be >= 1 (got {n})")
    return n


def _launch(sim: SimulatorView, a: Action) -> None:
    js = _job(sim, a)
    if js.rejected:
        raise Refused(f"job {a.job_id!r} was rejected")
    cfg, off = _config(sim, a, js.spec.model)
    n = _replicas(a, cfg)
    _need(sim, off.id, n * cfg.gpus_per_replica)
    dep = sim.new_deployment(js, cfg.with_(replicas=n), off, n)
    sim.emit("launch", js.spec.id, f"{n}×{cfg.accelerator} tp{cfg.tp} pp{cfg.pp}"
             f" {cfg.engine} on {off.id}: {a.reason}", dep.id,
             after=placement_key(cfg, off.id))


def _scale(sim: SimulatorView, a: Action) -> None:
    dep = _dep(sim, a)
    if dep.draining:
        raise Refused(f"deployment {dep.id} is draining")
    if a.replicas < 1:
        raise Refused(f"replicas must be >= 1 (got {a.replicas}); use DRAIN or STOP")
    live = sum(1 for s in dep.slots if not s.draining)
    _need(sim, dep.offering.id, max(a.replicas - live, 0) * dep.config.gpus_per_replica)
    planned = dep.desired   # the count before: equal to a.replicas for a repair
    sim.fleet.scale(dep, a.replicas, sim.now)
    sim.emit("scale", dep.job.id, f"{live} → {a.replicas} replicas: {a.reason}", dep.id,
             before=str(planned), after=str(a.replicas))


def _swap(sim: SimulatorView, a: Action) -> None:
    old = _dep(sim, a)
    cfg, off = _config(sim, a, old.job.model)
    n = _replicas(a, cfg) if (a.replicas or cfg.replicas) else old.desired
    _need(sim, off.id, n * cfg.gpus_per_replica)
    js = sim.jobs[old.job.id]
    dep = sim.new_deployment(js, cfg.with_(replicas=n), off, n)
    dep.replaces = old.id
    sim.emit("swap", old.job.id, f"{old.id} → {dep.id} ({n}×{cfg.accelerator} tp{cfg.tp}"
             f" on {off.id}), make-before-break: {a.reason}", dep.id,
             before=placement_key(old.config, old.offering.id), after=placement_key(cfg, off.id))


def _relaunch(sim: SimulatorView, a: Action) -> None:
    dep = _dep(sim, a)
    cfg, off = _config(sim, a, dep.job.model)
    if off.id != dep.offering.id:
        raise Refused(f"relaunch keeps the GPUs of {dep.offering.id}; use SWAP to move to"
                      f" {off.id}")
    held = sum(s.gpus for s in dep.slots)
    # the action's replicas when given: a re-shard (other GPUs per replica) changes them
    replicas = a.replicas if a.replicas > 0 else dep.desired
    _need(sim, off.id, replicas * cfg.gpus_per_replica - held)
    before = placement_key(dep.config, off.id)
    sim.fleet.relaunch(dep, cfg.with_(replicas=replicas), sim.now)
    sim.relaunched(dep)
    sim.emit("relaunch", dep.job.id, f"tp{cfg.tp} pp{cfg.pp} {cfg.engine},"
             f" down {sim.fleet.relaunch_ready_s(cfg):.0f}s: {a.reason}", dep.id,
             before=before, after=placement_key(cfg, off.id))


def _drain(sim: SimulatorView, a: Action) -> None:
    dep = _dep(sim, a)
    sim.fleet.drain(dep)
    sim.emit("drain", dep.job.id, a.reason, dep.id)


def _stop(sim: SimulatorView, a: Action) -> None:
    dep = _dep(sim, a)
    sim.fleet.stop(dep, sim.now, "stopped")
    sim.emit("stop", dep.job.id, a.reason, dep.id)


def _reject(sim: SimulatorView, a: Action) -> None:
    js = _job(sim, a)
    if js.admitted:
        raise Refused(f"job {a.job_id!r} is already admitted; STOP its deployments instead")
    if not js.rejected:
        js.rejected, js.reason = True, a.reason
        sim.emit("reject", js.spec.id, a.reason)


def _defer(sim: SimulatorView, a: Action) -> None:
    _job(sim, a)


HANDLERS = {
    ActionKind.LAUNCH: _launch, ActionKind.SCALE: _scale, ActionKind.SWAP: _swap,
    ActionKind.RELAUNCH: _relaunch, ActionKind.DRAIN: _drain, ActionKind.STOP: _stop,
    ActionKind.REJECT: _reject, ActionKind.DEFER: _defer,
}
