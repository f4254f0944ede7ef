"""The simulated cluster: the world a planning policy is tested against.

``Simulator`` owns the clock. Each tick a policy reads ``snapshot()``, returns a
``PlanDecision`` that ``apply`` validates and carries out, and ``advance`` runs one tick:
online arrivals (systematically thinned to the sample fraction, each kept request
weighted 1/f) are routed least-loaded to the job's serving replicas or wait (up to a
timeout) in the job's queue; a kept request's members are spread over the time that
replica would see them arrive. Batch backlogs are fed to their replicas as fast as they
absorb them; every replica runs its continuous-batching engine; the fleet handles
start-ups, drains, swaps, preemptions and stock-outs. ``record`` returns the ``RunRecord``.

Randomness comes only from numpy Generators seeded by (seed, stream); there is no wall
clock. A job whose own handling raises (its arrivals, its replicas' run) is quarantined:
rejected with the reason ``quarantined: <exception type>``, its deployments stopped; the
run goes on without it. The simulator is the world: it must never import ``koi.predictor``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from koi.catalog import Catalog, Offering, load_catalog
from koi.cluster import (
    ActionOutcome,
    ClusterSnapshot,
    DeploymentTelemetry,
    JobStatus,
    OfferingCapacity,
    PlanDecision,
)
from koi.jobs import JobSpec, OnlineJob
from koi.records import RunRecord, TickRecord
from koi.scenario.types import Scenario
from koi.scenario.world import WorldParams
from koi.sim.actions import apply_action
from koi.sim.fleet import Dep, Fleet, Slot
from koi.sim.jobstate import QUEUE_TIMEOUT_S, JobState
from koi.sim.replica import Req
from koi.sim.telemetry import build_telemetry
from koi.sim.thinning import auto_sample_fraction, member_offsets
from koi.sim.world import load_world
from koi.space import DeploymentConfig

STREAM_JOB = 21
# eviction reasons that are a policy's move (the rest are the world's — preemption,
# stock-out — or an end: a STOP of a finished or rejected job is not a move)
MOVE_EVICTIONS = frozenset({"relaunch", "scaled_down"})
QUARANTINED = "quarantined"   # the reason prefix of a job taken out because it raised


class Simulator:
    """A simulated fleet driven tick by tick; see the module docstring."""

    def __init__(self, scenario: Scenario, *, seed: int, world: WorldParams | None = None,
                 sample_fraction: float | None = None, catalog: Catalog | None = None) -> None:
        self.scenario = scenario
        self.seed = seed
        self.catalog = catalog or load_catalog()
        self.world = world or load_world(scenario.world, seed, scenario.randomize_world)
        if sample_fraction is None:
            sample_fraction = (scenario.sample_fraction if scenario.sample_fraction is not None
                               else auto_sample_fraction(scenario))
        if not 0.0 < sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1] (got {sample_fraction})")
        self.fraction = float(sample_fraction)
        for entry in scenario.fleet:
            self.catalog.offering(entry.offering)  # unknown ids fail here, loudly
        self.fleet = Fleet(self.catalog, self.world, seed,
                           {f.offering: f.gpus for f in scenario.fleet},
                           scenario.capacity_events)
        self.jobs: dict[str, JobState] = {
            j.id: JobState(i, j, np.random.default_rng([seed, STREAM_JOB, i]))
            for i, j in enumerate(scenario.jobs)}
        self._by_idx = list(self.jobs.values())
        self.tick = 0
        self.now = 0.0
        self.timeline: list[TickRecord] = []
        self._dep_serial = 0
        self._tick_slo = [0.0, 0.0, 0.0]
        self._good_total = 0.0
        self.quarantined: list[str] = []   # job ids, in the order they were taken out

    # --- the policy's view ---------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.now >= self.scenario.horizon_s - 1e-9

    def snapshot(self) -> ClusterSnapshot:
        fl = self.fleet
        cap = tuple(OfferingCapacity(o, fl.total[o], fl.used.get(o, 0))
                    for o in sorted(fl.total))
        deps = tuple(d.view(self.now) for d in fl.deps.values())
        jobs = tuple(self._status(js) for js in self.jobs.values()
                     if js.spec.submit_s <= self.now)
        return ClusterSnapshot(self.tick, self.now, self.scenario.tick_s,
                               self.scenario.horizon_s, cap, deps, jobs)

    def _status(self, js: JobState) -> JobStatus:
        rate = js.arrived_tick / self.scenario.tick_s if self.tick else 0.0
        return JobStatus(js.spec, js.admitted, js.rejected, js.reason,
                         js.tokens_processed, rate, js.batch_requests_done)

    def apply(self, decision: PlanDecision) -> list[ActionOutcome]:
        """Apply each action in order; refused ones come back with their reason."""
        out = [apply_action(self, a) for a in decision.actions]
        self._settle_evicted(self.now)
        return out

    def submit(self, job: JobSpec) -> JobSpec:
        """Add a job submitted while the run goes on (e.g. over the bus). It is seen from
        the next snapshot; a ``submit_s`` in the past becomes now. Returns the job as
        kept. Raises ``ValueError`` for a duplicate id."""
        if job.id in self.jobs:
            raise ValueError(f"job {job.id!r} already exists")
        if job.submit_s < self.now:
            job = dataclasses.replace(job, submit_s=self.now)
        i = len(self._by_idx)
        js = JobState(i, job, np.random.default_rng([self.seed, STREAM_JOB, i]))
        self.jobs[job.id] = js
        self._by_idx.append(js)
        return job

    def quarantine(self, job_id: str, error: str) -> bool:
        """Take a job out of the run because handling it raised ``error`` (an exception
        type name): it is rejected with the reason ``quarantined: <error>`` (the next
        snapshot shows it), its deployments stop and its queue is dropped. Returns False
        if it already was (so replaying a stored snapshot's quarantine is idempotent)."""
        js = self.jobs[job_id]
        if job_id in self.quarantined:
            return False
        js.rejected, js.reason = True, f"{QUARANTINED}: {error}"
        self.quarantined.append(job_id)
        for dep in [d for d in self.fleet.deps.values() if d.job.id == job_id]:
            self.fleet.stop(dep, self.now, QUARANTINED)
        for r in js.queue:
            js.drop(r, QUARANTINED)
        js.queue.clear()
        self.emit("quarantine", job_id, f"job {job_id}: handling it raised {error}; rejected,"
                                        " its deployments stopped")
        return True

    # --- helpers for actions -------------------------------------------------------------

    def emit(self, kind: str, job_id: str, detail: str = "", dep: str = "",
             before: str = "", after: str = "") -> None:
        self.fleet.emit(self.now, kind, job_id, detail, dep, before, after)

    def relaunched(self, dep: Dep) -> None:
        """After ``dep`` restarted its ranks: if nothing else of its job serves, the
        job's new arrivals until a replica is back wait out the move (``JobState.move_gap``)."""
        js = self.jobs[dep.job.id]
        if not self._serving(js, self.now, self.now + 1e-6):
            back = min((s.ready_at for s in dep.slots), default=self.now)
            js.move_gap = (self.now, max(back, js.move_gap[1]))

    def new_deployment(self, js: JobState, cfg: DeploymentConfig, off: Offering,
                       replicas: int) -> Dep:
        self._dep_serial += 1
        region = js.spec.client_region if isinstance(js.spec, OnlineJob) else ""
        dep = self.fleet.create(f"{js.spec.id}-d{self._dep_serial}", js.spec, cfg, off,
                                replicas, self.now, region)
        if not js.admitted:
            js.admitted = True
            self.emit("admit", js.spec.id, f"first deployment {dep.id}", dep.id)
        return dep

    # --- one tick ------------------------------------------------------------------------

    def advance(self) -> list[DeploymentTelemetry]:
        """Simulate [now, now + tick) and return each serving deployment's telemetry."""
        t0 = self.now
        t1 = min(t0 + self.scenario.tick_s, self.scenario.horizon_s)
        spend0 = self.fleet.spend
        self._tick_slo = [0.0, 0.0, 0.0]   # online served, TTFT met, TPOT met (weighted)
        self.fleet.begin_tick(self.tick, t0, t1)
        self._settle_evicted(t0)
        for js in self.jobs.values():
            if isinstance(js.spec, OnlineJob) and not js.rejected:
                js.arrived_tick = 0.0
                try:
                    self._route(js, js.arrivals(t0, t1, self.fraction), t0, t1)
                except Exception as exc:  # one job's failure must not stop the fleet
                    self.quarantine(js.spec.id, type(exc).__name__)
        ran = self._run_replicas(t1)
        ran = [r for r in ran if r[1].spec.id not in self.quarantined]
        self._settle_evicted(t1)
        for js in self.jobs.values():
            js.expire(t1)
        self.fleet.end_tick(t1)  # accrues spend, so telemetry is built after it
        telemetry = [self._account(dep, js, stats, t0, t1) for dep, js, stats in ran]
        self.fleet.check_invariants()
        self._tick_record(t0, t1, spend0, telemetry)
        self.now = t1
        self.tick += 1
        return telemetry

    def _serving(self, js: JobState, t0: float, t1: float) -> list[tuple[Dep, Slot]]:
        return [(d, s) for d in self.fleet.deps.values() if d.job.id == js.spec.id
                for s in d.slots if not s.draining and s.ready_at < t1 and s.accept_until > t0]

    def _route(self, js: JobState, reqs: list[Req], t0: float, t1: float) -> None:
        """Least-loaded routing of the job's queue, then this tick's arrivals."""
        slots = self._serving(js, t0, t1)
        todo = list(js.queue) + reqs
        js.queue.clear()
        gap0, gap1 = js.move_gap
        for r in reqs:   # arrivals while a move left the job no replica
            if gap0 <= r.arrival < gap1:
                js.disrupt(r)
        if not slots:
            js.queue.extend(todo)
            return
        loads = [s.engine.outstanding for _, s in slots]
        first_ready = min(s.ready_at for _, s in slots)
        groups: list[list[Req]] = [[] for _ in slots]   # thinned groups to spread, per slot
        for r in todo:
            t = max(r.arrival, t0)
            best, best_load = -1, 0.0
            for i, (_, s) in enumerate(slots):
                ok = s.ready_at <= max(t, first_ready) and s.accept_until > t
                if ok and (best < 0 or loads[i] < best_load):
                    best, best_load = i, loads[i]
            if best < 0 or slots[best][1].ready_at - r.arrival > QUEUE_TIMEOUT_S:
                js.queue.append(r)
                continue
            dep, slot = slots[best]
            loads[best] += r.w
            r.net = dep.net_s
            slot.engine.add_arrival(r)
            if r.n > 1 and r.offs is None:
                groups[best].append(r)
        self._spread(js, groups, t0, t1)

    @staticmethod
    def _spread(js: JobState, groups: list[list[Req]], t0: float, t1: float) -> None:
        """Spread each thinned group's members from its arrival to the next group's on the
        same replica (the last one's over the mean interval), as the real requests the
        groups stand for would have reached that replica; see ``member_offsets``."""
        spec = js.spec
        assert isinstance(spec, OnlineJob)
        rate = spec.arrival.rate_at(0.5 * (t0 + t1), spec.submit_s)
        gap = len(groups) / rate if rate > 0.0 else 0.0   # between a replica's requests
        for mine in groups:
            for i, r in enumerate(mine):
                span = mine[i + 1].arrival - r.arrival if i + 1 < len(mine) else r.w * gap
                r.spread(member_offsets(js.rng, r.n, span))

    def _run_replicas(self, t1: float) -> list[tuple[Dep, JobState, list]]:
        out = []
        for dep in list(self.fleet.deps.values()):
            js = self.jobs[dep.job.id]
            if js.spec.id in self.quarantined and dep.id not in self.fleet.deps:
                continue  # stopped when its job was quarantined earlier in this loop
            try:
                stats = self._run_dep(dep, js, t1)
            except Exception as exc:  # one job's failure must not stop the fleet
                self.quarantine(js.spec.id, type(exc).__name__)
                continue
            if stats:
                out.append((dep, js, stats))
        return out

    def _run_dep(self, dep: Dep, js: JobState, t1: float) -> list:
        stats = []
        for slot in list(dep.slots):
            feed = js.is_batch and js.admitted and not slot.draining
            slot.engine.feeder = js.feed if feed else None
            slot.engine.run_until(min(t1, slot.kill_at))
            stats.append(slot.engine.take_stats())
            if slot.kill_at <= t1:
                self.fleet.remove_slot(dep, slot, slot.kill_at, "preempted")
        return stats

    def _account(self, dep: Dep, js: JobState, stats: list, t0: float,
                 t1: float) -> DeploymentTelemetry:
        done = [c for st in stats for c in st.done]
        before = (js.served, js.ttft_met, js.tpot_met)
        for c in done:
            js.complete(c)
        if not js.is_batch:
            acc = self._tick_slo
            for i, v in enumerate((js.served, js.ttft_met, js.tpot_met)):
                acc[i] += v - before[i]
        dropped = 0.0
        for st in stats:
            for r, reason in st.dropped:
                js.drop(r, reason)
                dropped += r.w
            js.tokens_processed += st.gen_tokens if js.is_batch else 0.0
            js.tokens_by_deadline += st.gen_by if js.is_batch else 0.0
        w = np.array([c.w for c in done])
        span = t1 - t0
        counts = {k: sum(getattr(st, k) for st in stats)
                  for k in ("arrived", "prompt_tokens", "gen_tokens", "preemptions")}
        counts.update(dropped=dropped, replica_preemptions=dep.preempted_tick,
                      gpu_seconds=dep.gpu_s_tick, cost_usd=dep.cost_tick)
        means = {"kv": sum(st.busy_kv for st in stats) / max(span * len(stats), 1e-9),
                 "running": sum(st.busy_run for st in stats) / span,
                 "waiting": sum(st.busy_wait for st in stats) / span}
        engines = [slot.engine for slot in dep.slots]   # those still up at the end
        end = {"running": sum(e.w_pre + e.w_dec for e in engines),
               "waiting": sum(e.w_wait for e in engines)}
        return build_telemetry(self.tick, dep.id, js.spec.id, span, counts=counts,
                               ttft=np.array([c.ttft for c in done]),
                               tpot=np.array([c.tpot for c in done]), weights=w,
                               means=means, end=end)

    def _settle_evicted(self, now: float) -> None:
        """Displaced requests: batch work returns to its backlog; online requests go back
        to the job's queue if another replica serves it, else drop with the reason."""
        for job_id, r, reason in self.fleet.evicted:
            js = self.jobs[job_id]
            if reason in MOVE_EVICTIONS:
                js.disrupt(r)
            if js.is_batch:
                js.queue.append(r)  # already issued; the feeder re-feeds it first
            elif reason in ("stopped",):
                js.drop(r, reason)
            elif reason in ("relaunch", "scaled_down") or self._serving(js, now, now + 1e-6):
                js.queue.append(r)
            else:
                js.drop(r, reason)
        self.fleet.evicted.clear()

    # --- records -------------------------------------------------------------------------

    def _tick_record(self, t0: float, t1: float, spend0: float,
                     telemetry: Sequence[DeploymentTelemetry]) -> None:
        by_family: dict[str, int] = {}
        by_job: dict[str, dict[str, int]] = {}
        for dep in self.fleet.deps.values():
            fam = self.catalog.accelerator(dep.config.accelerator).family
            g = sum(s.gpus for s in dep.slots)
            by_family[fam] = by_family.get(fam, 0) + g
            job = by_job.setdefault(dep.job.id, {})
            job[fam] = job.get(fam, 0) + g
        dt = max(t1 - t0, 1e-9)
        served, ttft_ok, tpot_ok = self._tick_slo
        out_tok = sum(t.generation_tokens for t in telemetry)
        good = sum(js.good_tokens for js in self.jobs.values()) + sum(
            js.tokens_by_deadline for js in self.jobs.values())
        prev_good, self._good_total = self._good_total, good
        self.timeline.append(TickRecord(
            self.tick, t0, (self.fleet.spend - spend0) / dt * 3600.0, by_family, by_job,
            ttft_ok / served if served else 1.0, tpot_ok / served if served else 1.0,
            out_tok / dt, (good - prev_good) / dt))

    def record(self, policy: str) -> RunRecord:
        queued: dict[str, float] = {j: sum(r.w for r in js.queue) for j, js in self.jobs.items()}
        for dep in self.fleet.deps.values():
            for s in dep.slots:
                queued[dep.job.id] += s.engine.outstanding
        fl = self.fleet
        outcomes = tuple(dataclasses.replace(
            js.outcome(self.scenario.horizon_s, queued[j]),
            startup_gpu_s=fl.startup_gpu_s.get(j, 0.0), drain_gpu_s=fl.drain_gpu_s.get(j, 0.0))
            for j, js in self.jobs.items())
        return RunRecord(self.scenario.name, policy, self.seed, self.scenario.horizon_s,
                         self.scenario.tick_s, self.fleet.spend, outcomes,
                         tuple(self.timeline), tuple(self.fleet.events), self.fraction)


def run(scenario: Scenario, policy, *, seed: int, sample_fraction: float | None = None,
        world: WorldParams | None = None, catalog: Catalog | None = None) -> RunRecord:
    """Drive ``policy`` (anything with ``decide(snapshot, telemetry)`` and ``name``)
    through the whole scenario and return the run's record."""
    sim = Simulator(scenario, seed=seed, world=world, sample_fraction=sample_fraction,
                    catalog=catalog)
    telemetry: list[DeploymentTelemetry] = []
    while not sim.done:
        sim.apply(policy.decide(sim.snapshot(), telemetry))
        telemetry = sim.advance()
    return sim.record(getattr(policy, "name", "") or type(policy).__name__)


__all__ = ["Simulator", "run"]
