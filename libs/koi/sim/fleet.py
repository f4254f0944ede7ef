"""The simulated fleet: offerings' capacity over time, deployments and their replicas.

Tracks how many GPUs each offering can give (the scenario fleet plus stock-outs and
returns) and which replica holds which GPUs, through every lifecycle step: start-up
(provisioning + weight loading), serving, draining, spot preemption (with or without
notice), reclaim on stock-out, relaunch and stop. A GPU is never double-booked: every
reservation goes through ``_reserve``, which asserts used ≤ total per offering.

Requests displaced by a lifecycle step are handed back through ``evicted`` for the
simulator to re-route or drop; lifecycle events go to ``events``. Spend is accrued
here (GPUs held × $/GPU-hour × time). No routing, no request accounting, no policy, and
no ``koi.predictor`` imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from koi.catalog import Catalog, Market, Offering
from koi.cluster import Deployment, DeploymentState
from koi.jobs import BatchJob, JobSpec
from koi.records import EventRecord
from koi.scenario.types import CapacityEvent
from koi.scenario.world import WorldParams
from koi.sim.physics import StepCoef, startup_s, step_coef, weight_load_s
from koi.sim.replica import INF, Replica, ReplicaSpec, Req
from koi.space import DeploymentConfig, kv_capacity_tokens

STREAM_REPLICA = 11
STREAM_PREEMPT = 12


@dataclass(eq=False)
class Slot:
    """One replica holding GPUs of an offering."""

    id: int
    engine: Replica
    gpus: int
    ready_at: float
    held_since: float
    accept_until: float = INF   # spot notice: stops taking new requests from here
    kill_at: float = INF        # spot reclaim: gone at this time
    draining: bool = False

    def accepts(self, t: float) -> bool:
        return not self.draining and self.ready_at <= t < self.accept_until


@dataclass(eq=False)
class Dep:
    id: str
    job: JobSpec
    config: DeploymentConfig
    offering: Offering
    started_s: float
    coef: StepCoef
    net_s: float
    desired: int
    slots: list[Slot] = field(default_factory=list)
    draining: bool = False
    replaces: str = ""          # SWAP: the deployment this one takes over from
    cost_tick: float = 0.0
    gpu_s_tick: float = 0.0
    preempted_tick: int = 0

    def view(self, now: float) -> Deployment:
        ready = sum(1 for s in self.slots if s.ready_at <= now and not s.draining)
        starting = sum(1 for s in self.slots if s.ready_at > now)
        if self.draining:
            state = DeploymentState.DRAINING
        elif ready:
            state = DeploymentState.RUNNING
        else:
            state = DeploymentState.STARTING
        return Deployment(self.id, self.job.id, self.config.with_(replicas=self.desired),
                          self.offering.id, state, ready, starting, self.started_s)


class Fleet:
    """Capacity, deployments and replica lifecycles; see the module docstring."""

    def __init__(self, catalog: Catalog, world: WorldParams, seed: int,
                 fleet: dict[str, int], capacity_events: tuple[CapacityEvent, ...]) -> None:
        self.cat = catalog
        self.world = world
        self.seed = seed
        self.total: dict[str, int] = dict(fleet)
        self.used: dict[str, int] = dict.fromkeys(fleet, 0)
        self.cap_events = sorted(capacity_events, key=lambda e: (e.t_s, e.offering))
        self._next_cap = 0
        self.deps: dict[str, Dep] = {}
        self.events: list[EventRecord] = []
        self.evicted: list[tuple[str, Req, str]] = []   # (job id, request, reason)
        self.spend = 0.0
        # per job: GPU-seconds held by replicas still starting, and by draining ones
        self.startup_gpu_s: dict[str, float] = {}
        self.drain_gpu_s: dict[str, float] = {}
        self.tick = 0
        self.t0 = 0.0
        self._slot_serial = 0
        self._preempt_rng = np.random.default_rng([seed, STREAM_PREEMPT])

    # --- capacity ------------------------------------------------------------------------

    def free(self, offering: str) -> int:
        return max(self.total.get(offering, 0) - self.used.get(offering, 0), 0)

    def _reserve(self, offering: str, gpus: int) -> None:
        self.used[offering] = self.used.get(offering, 0) + gpus
        assert self.used[offering] <= self.total.get(offering, 0), \
            f"{offering}: {self.used[offering]} GPUs used > {self.total.get(offering, 0)}"

    def _release(self, offering: str, gpus: int) -> None:
        self.used[offering] -= gpus
        assert self.used[offering] >= 0

    def emit(self, t: float, kind: str, job_id: str, detail: str = "", dep: str = "",
             before: str = "", after: str = "") -> None:
        self.events.append(EventRecord(t, self.tick, kind, job_id, detail, dep, before, after))

    # --- deployments ---------------------------------------------------------------------

    def create(self, dep_id: str, job: JobSpec, cfg: DeploymentConfig, offering: Offering,
               replicas: int, now: float, client_region: str = "") -> Dep:
        """A new deployment with ``replicas`` starting replicas (capacity checked by the
        caller; ``_reserve`` asserts it)."""
        coef = step_coef(cfg, self.cat, self.world, offering)
        here = f"{offering.cloud}/{offering.region}"
        remote = client_region and client_region != here
        net = (self.world.cross_region_latency_ms if remote
               else self.world.same_region_latency_ms) / 1e3
        dep = Dep(dep_id, job, cfg, offering, now, coef, net, replicas)
        self.deps[dep_id] = dep
        for _ in range(replicas):
            self.add_slot(dep, now)
        return dep

    def add_slot(self, dep: Dep, now: float, extra_s: float = 0.0) -> Slot:
        cfg = dep.config
        self._reserve(dep.offering.id, cfg.gpus_per_replica)
        self._slot_serial += 1
        rng = np.random.default_rng([self.seed, STREAM_REPLICA, self._slot_serial])
        ready = now + extra_s + startup_s(cfg, dep.offering, self.cat, self.world)
        deadline = dep.job.due_s if isinstance(dep.job, BatchJob) else INF
        engine = Replica(self._spec(dep, rng), rng, ready, deadline)
        slot = Slot(self._slot_serial, engine, cfg.gpus_per_replica, ready, now)
        dep.slots.append(slot)
        return slot

    def _spec(self, dep: Dep, rng: np.random.Generator) -> ReplicaSpec:
        cfg, w = dep.config, self.world
        slow = 1.0
        if rng.random() < w.straggler_prob:
            slow *= w.straggler_slowdown
        if rng.random() < w.throttle_share.get(cfg.accelerator, 0.0):
            slow *= w.throttle_slowdown
        return replica_spec(cfg, self.cat, w, coef=dep.coef, slow=slow,
                            prefix_share=getattr(dep.job, "prefix_share", 0.0))

    def remove_slot(self, dep: Dep, slot: Slot, now: float, reason: str) -> None:
        """Free a replica's GPUs now; its requests go back to the simulator."""
        self._accrue(dep, slot, now)
        slot.held_since = now  # accrued up to now
        for r in slot.engine.evict_all():
            self.evicted.append((dep.job.id, r, reason))
        self._release(dep.offering.id, slot.gpus)
        dep.slots.remove(slot)

    def scale(self, dep: Dep, replicas: int, now: float) -> None:
        dep.desired = replicas
        live = [s for s in dep.slots if not s.draining]
        for _ in range(replicas - len(live)):
            self.add_slot(dep, now)
        # scale down newest first; a replica still starting is simply cancelled
        for slot in sorted(live, key=lambda s: s.id, reverse=True)[:max(len(live) - replicas, 0)]:
            if slot.ready_at > now:
                self.remove_slot(dep, slot, now, "scaled_down")
            else:
                slot.draining = True

    def drain(self, dep: Dep) -> None:
        dep.draining = True
        for s in dep.slots:
            s.draining = True

    def stop(self, dep: Dep, now: float, reason: str = "stopped") -> None:
        for slot in list(dep.slots):
            self.remove_slot(dep, slot, now, reason)
        del self.deps[dep.id]

    def relaunch(self, dep: Dep, cfg: DeploymentConfig, now: float) -> None:
        """Same offering, new knobs: every rank restarts and reloads its weights, as
        ``cfg.replicas`` replicas (another TP may cut the same GPUs into more or fewer)."""
        n = dep.desired = max(cfg.replicas, 1)
        for slot in list(dep.slots):
            self.remove_slot(dep, slot, now, "relaunch")
        dep.config = cfg
        dep.started_s = now   # restarted: the placement is new (the planner's cool-down)
        dep.coef = step_coef(cfg, self.cat, self.world, dep.offering)
        extra = self.world.relaunch_cost_s - self.world.provisioning_of(dep.offering.cloud)
        for _ in range(n):
            self.add_slot(dep, now, extra_s=extra)

    def relaunch_ready_s(self, cfg: DeploymentConfig) -> float:
        return self.world.relaunch_cost_s + weight_load_s(cfg, self.cat, self.world)

    # --- the tick ------------------------------------------------------------------------

    def begin_tick(self, tick: int, t0: float, t1: float) -> None:
        """Capacity events and spot preemption draws for the window [t0, t1)."""
        self.tick, self.t0 = tick, t0
        while self._next_cap < len(self.cap_events) and self.cap_events[self._next_cap].t_s < t1:
            self._capacity_event(self.cap_events[self._next_cap], t0)
            self._next_cap += 1
        for dep in list(self.deps.values()):
            dep.cost_tick = dep.gpu_s_tick = 0.0
            dep.preempted_tick = 0
            if dep.offering.market == Market.SPOT:
                self._draw_preemptions(dep, t0, t1)

    def _capacity_event(self, ev: CapacityEvent, now: float) -> None:
        off = ev.offering
        self.total[off] = max(self.total.get(off, 0) + ev.delta_gpus, 0)
        self.used.setdefault(off, 0)
        if ev.delta_gpus >= 0:
            return
        self.emit(now, "stockout", "", f"{off} {ev.delta_gpus:+d} GPUs → {self.total[off]}"
                                       f" {ev.note}".strip())
        while self.used[off] > self.total[off]:
            dep, slot = max(((d, s) for d in self.deps.values() if d.offering.id == off
                             for s in d.slots), key=lambda ds: ds[1].id)
            self.remove_slot(dep, slot, now, "stockout")
            self.emit(now, "stockout", dep.job.id, f"replica {slot.id} reclaimed on {off}",
                      dep.id)

    def _draw_preemptions(self, dep: Dep, t0: float, t1: float) -> None:
        off = dep.offering
        rate = off.preemption_rate_per_hour * self.world.preemption_mult.get(off.cloud, 1.0)
        for slot in dep.slots:
            u, v = self._preempt_rng.random(2)  # two draws per replica keep streams aligned
            if slot.kill_at < INF or rate <= 0:
                continue
            instances = math.ceil(slot.gpus / max(off.gpus_per_instance, 1))
            p = 1.0 - math.exp(-rate * instances * (t1 - t0) / 3600.0)
            if u < p:
                t_p = t0 + v * (t1 - t0)
                slot.accept_until = t_p
                slot.kill_at = t_p + off.preemption_notice_s
                dep.preempted_tick += 1
                self.emit(t_p, "preemption", dep.job.id, f"replica {slot.id} on {off.id},"
                          f" notice {off.preemption_notice_s:g}s", dep.id)

    def end_tick(self, t1: float) -> None:
        """Finish drains and swaps, then accrue spend for the window."""
        for dep in list(self.deps.values()):
            for slot in list(dep.slots):
                if slot.draining and slot.engine.empty:
                    self.remove_slot(dep, slot, t1, "drained")
            if dep.draining and not dep.slots:
                self.emit(t1, "stop", dep.job.id, "drained", dep.id)
                del self.deps[dep.id]
        for dep in list(self.deps.values()):
            self._finish_swap(dep, t1)
        for dep in self.deps.values():
            for slot in dep.slots:
                self._accrue(dep, slot, t1)
                slot.held_since = t1

    def _finish_swap(self, dep: Dep, t1: float) -> None:
        old = self.deps.get(dep.replaces)
        if not dep.replaces or old is None or old.draining:
            return
        ready = sum(1 for s in dep.slots if s.ready_at <= t1 and not s.draining)
        if ready >= dep.desired:
            self.drain(old)
            self.emit(t1, "drain", old.job.id, f"swap to {dep.id} complete", old.id)

    def _accrue(self, dep: Dep, slot: Slot, t: float) -> None:
        start = max(slot.held_since, self.t0)
        dt = max(t - start, 0.0)
        gpu_s = slot.gpus * dt
        job = dep.job.id
        if slot.draining:
            self.drain_gpu_s[job] = self.drain_gpu_s.get(job, 0.0) + gpu_s
        elif slot.ready_at > start:
            up = slot.gpus * max(min(t, slot.ready_at) - start, 0.0)
            self.startup_gpu_s[job] = self.startup_gpu_s.get(job, 0.0) + up
        cost = gpu_s * dep.offering.usd_per_gpu_hour / 3600.0
        dep.gpu_s_tick += gpu_s
        dep.cost_tick += cost
        self.spend += cost

    def check_invariants(self) -> None:
        held: dict[str, int] = {}
        for dep in self.deps.values():
            for s in dep.slots:
                held[dep.offering.id] = held.get(dep.offering.id, 0) + s.gpus
        for off, used in self.used.items():
            assert held.get(off, 0) == used, f"{off}: books say {used}, replicas hold {held}"
            assert used <= self.total.get(off, 0), f"{off}: {used} > {self.total.get(off, 0)}"


def replica_spec(cfg: DeploymentConfig, catalog: Catalog, world: WorldParams, *,
                 coef: StepCoef | None = None, offering: Offering | None = None,
                 slow: float = 1.0, prefix_share: float = 0.0) -> ReplicaSpec:
    """One replica's engine limits and world effects: its step coefficients (``coef``, or
    folded here for ``offering``), KV capacity, the engine's batching limits, the job's
    prefix-cache hits, the KV cliff, the noise and a straggler/throttle ``slow``down."""
    engine = catalog.engine(cfg.engine)
    cap = kv_capacity_tokens(catalog.model(cfg.model), catalog.accelerator(cfg.accelerator),
                             cfg, engine)
    hit = prefix_share if cfg.prefix_caching else 0.0
    return ReplicaSpec(coef or step_coef(cfg, catalog, world, offering), cap, cfg.max_num_seqs,
                       cfg.max_batched_tokens, cfg.chunked_prefill, hit, slow,
                       world.kv_cliff_usage, world.kv_cliff_factor, world.noise_sigma,
                       engine.reserves_full_kv, world.ttft_overhead_ms / 1e3)
