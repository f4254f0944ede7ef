"""``evolve``: MAP-Elites evolutionary search over whole-cluster plans (OpenEvolve-style).

A genome is one plan: per job an option — (accelerator, TP, precision, engine) shape
among the job's ``SHAPES_PER_JOB`` best by profiled value, on one offering of that
accelerator — and a replica count (0 = not served). Fitness, from per-replica profiles
(``ProfileBook``, computed once per job, then pure numpy):

    Σ_j w_j·served_j ÷ Σ_j w_j  −  λ·cost ÷ reference cost  −  churn·jobs moved
                                  −  penalty·GPUs over capacity

with served_j = min(1, replicas × rate ÷ demand) (online: max req/s under the SLO; batch:
tok/s to finish by the deadline), discounted on spot by the preemption rate; w_j grows
with priority; the reference cost is each job served alone by its cheapest option.
Children are repaired to per-offering capacity (replicas cut on over-full offerings, in a
seeded random job order). The archive is a MAP-Elites grid over two behaviour descriptors
— share of GPUs on spot, mean GPUs per served job — and survives between ticks (re-
encoded against the current jobs). Each tick: seed with the current plan, a greedy plan
and the archive, run ``GENERATIONS`` × ``POPULATION`` children (mutation: new option,
replicas ±1, replicas sized to demand, drop; plus uniform crossover between elites), then
apply the best elite's diff with at most ``max_swaps`` swaps.

``evolve`` profiles the options in the run's world before planning, over every engine's
defaults, with Koi's replica cap and migration budget (``koi.policies.profiled``);
``evolve-unprofiled`` takes the predictor's numbers, vLLM defaults only,
``MAX_REPLICAS`` and ``MAX_SWAPS_PER_TICK``.

Pure decision code: randomness only from ``numpy.random.Generator(self.seed)``, no clocks,
no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from koi.catalog import Catalog, Market
from koi.cluster import Action, ClusterSnapshot, DeploymentTelemetry, JobStatus, PlanDecision
from koi.policies.base import Policy, register
from koi.policies.bookkeeping import CapacityLedger, housekeeping_stops
from koi.policies.profiled import ProfiledBook
from koi.policies.profiles import ProfileBook, demand, shape_key
from koi.policies.reconcile import (
    Budget,
    DeploymentTarget,
    reconcile,
    serving_deployments,
    unfinished_jobs,
)
from koi.shapes import shape_label
from koi.space import DeploymentConfig

SHAPES_PER_JOB = 6
GENERATIONS = 20
POPULATION = 24
COST_WEIGHT = 0.15        # λ: plan cost in units of the reference cost
CHURN_WEIGHT = 0.01       # per job whose shape/offering differs from what runs
OVER_CAPACITY_PENALTY = 1.0   # per GPU (repair makes this 0; kept as a guard)
CROSSOVER_P = 0.3
MAX_SWAPS_PER_TICK = 3
MAX_REPLICAS = 16
SPOT_BINS = 4
SIZE_BINS = 4


@dataclass(slots=True)
class Options:
    """Every job's options flattened: option g belongs to job ``job[g]``."""

    start: np.ndarray        # (J,) first option of each job
    count: np.ndarray        # (J,) options per job
    shape: list[DeploymentConfig]
    offering: list[str]
    off_idx: np.ndarray      # (G,) index into ``offerings``
    rate: np.ndarray
    gpus: np.ndarray
    usd_h: np.ndarray
    keep: np.ndarray         # (G,) availability factor (1 − spot preemption exposure)
    spot: np.ndarray         # (G,) bool
    offerings: list[str]
    capacity: np.ndarray     # (O,) total GPUs
    max_replicas: int        # per job

    def need(self, g: np.ndarray, dem: np.ndarray) -> np.ndarray:
        """Replicas that serve each job's demand with option g (at least 1)."""
        r = np.ceil(dem / np.maximum(self.rate[g], 1e-9) - 1e-9)
        return np.clip(r, 1, self.max_replicas).astype(int)


@register("evolve-unprofiled")
class Evolve(Policy):
    """MAP-Elites over cluster plans scored by the predictor's profiles (see module doc)."""

    engines: ClassVar[tuple[str, ...]] = ("vllm",)
    max_replicas: ClassVar[int] = MAX_REPLICAS
    max_swaps: ClassVar[int] = MAX_SWAPS_PER_TICK

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.rng = np.random.default_rng(seed)
        self.book = ProfileBook(self.catalog, engines=self.engines)
        # cell → (fitness, {job: (shape key, offering, replicas)})
        self.archive: dict[int, tuple[float, dict[str, tuple[tuple, str, int]]]] = {}
        self.last_best = -math.inf

    # --- building the search space ---------------------------------------------------

    def options(self, jobs: list[JobStatus], snapshot: ClusterSnapshot) -> Options:
        profiles = self.book.get(jobs, snapshot)
        ledger = CapacityLedger(snapshot, self.catalog)
        offers = ledger.known_offerings()
        names = [o.id for o in offers]
        cap = {c.offering: c.total_gpus for c in snapshot.capacity}
        start: list[int] = []
        count: list[int] = []
        shape: list[DeploymentConfig] = []
        offering: list[str] = []
        rows: list[tuple[int, float, int, float, float, bool]] = []
        for job in jobs:
            prof = profiles[job.id]
            start.append(len(shape))
            for i in prof.best(SHAPES_PER_JOB):
                s = prof.shapes[i]
                for k, o in enumerate(offers):
                    if o.accelerator != s.accelerator or cap.get(o.id, 0) < s.gpus_per_replica:
                        continue
                    shape.append(s)
                    offering.append(o.id)
                    hours = snapshot.tick_s / 3600.0
                    rows.append((k, prof.rate[i], s.gpus_per_replica,
                                 o.usd_per_gpu_hour * s.gpus_per_replica,
                                 max(0.5, 1.0 - o.preemption_rate_per_hour * hours * 5),
                                 o.market == Market.SPOT))
            count.append(len(shape) - start[-1])
        arr = np.array(rows, dtype=float).reshape(-1, 6)
        return Options(np.array(start, dtype=int), np.array(count, dtype=int), shape, offering,
                       arr[:, 0].astype(int), arr[:, 1], arr[:, 2].astype(int), arr[:, 3],
                       arr[:, 4], arr[:, 5].astype(bool), names,
                       np.array([cap.get(n, 0) for n in names], dtype=int), self.max_replicas)

    # --- scoring, repair, descriptors (population-wide numpy) ------------------------

    def fitness(self, opts: Options, g: np.ndarray, reps: np.ndarray, dem: np.ndarray,
                w: np.ndarray, ref_cost: float, current: np.ndarray) -> np.ndarray:
        served = np.minimum(1.0, reps * opts.rate[g] / np.maximum(dem, 1e-9)) * opts.keep[g]
        cost = (reps * opts.usd_h[g]).sum(axis=1)
        moved = ((g != current) & (current >= 0) & (reps > 0)).sum(axis=1)
        over = np.maximum(self.usage(opts, g, reps) - opts.capacity, 0).sum(axis=1)
        return ((served * w).sum(axis=1) / w.sum() - COST_WEIGHT * cost / ref_cost
                - CHURN_WEIGHT * moved - OVER_CAPACITY_PENALTY * over)

    @staticmethod
    def usage(opts: Options, g: np.ndarray, reps: np.ndarray) -> np.ndarray:
        P = g.shape[0]
        use = np.zeros((P, len(opts.offerings)), dtype=int)
        np.add.at(use, (np.repeat(np.arange(P), g.shape[1]), opts.off_idx[g].ravel()),
                  (reps * opts.gpus[g]).ravel())
        return use

    def repair(self, opts: Options, g: np.ndarray, reps: np.ndarray) -> None:
        """Cut replicas on over-full offerings (random job order) until every plan fits."""
        use = self.usage(opts, g, reps)
        for p, o in zip(*np.nonzero(use > opts.capacity), strict=True):
            jobs = np.flatnonzero((opts.off_idx[g[p]] == o) & (reps[p] > 0))
            excess = use[p, o] - opts.capacity[o]
            for j in self.rng.permutation(jobs):
                if excess <= 0:
                    break
                per = opts.gpus[g[p, j]]
                cut = min(reps[p, j], math.ceil(excess / per))
                reps[p, j] -= cut
                excess -= cut * per

    @staticmethod
    def cells(opts: Options, g: np.ndarray, reps: np.ndarray) -> np.ndarray:
        gpus = reps * opts.gpus[g]
        total = np.maximum(gpus.sum(axis=1), 1)
        spot = (gpus * opts.spot[g]).sum(axis=1) / total
        per_job = total / np.maximum((reps > 0).sum(axis=1), 1)
        b1 = np.minimum((spot * SPOT_BINS).astype(int), SPOT_BINS - 1)
        b2 = np.minimum(np.log2(np.maximum(per_job, 1)).astype(int), SIZE_BINS - 1)
        return b1 * SIZE_BINS + b2

    # --- genomes <-> plans -------------------------------------------------------------

    def encode(self, opts: Options, jobs: list[JobStatus],
               plan: dict[str, tuple[tuple, str, int]]) -> tuple[np.ndarray, np.ndarray]:
        g = np.full(len(jobs), -1, dtype=int)
        reps = np.zeros(len(jobs), dtype=int)
        for j, job in enumerate(jobs):
            if job.id not in plan:
                continue
            key, off, r = plan[job.id]
            for k in range(opts.start[j], opts.start[j] + opts.count[j]):
                if shape_key(opts.shape[k]) == key and opts.offering[k] == off:
                    g[j], reps[j] = k, r
                    break
        return g, reps

    def decode(self, opts: Options, jobs: list[JobStatus], g: np.ndarray,
               reps: np.ndarray) -> dict[str, tuple[tuple, str, int]]:
        return {job.id: (shape_key(opts.shape[g[j]]), opts.offering[g[j]], int(reps[j]))
                for j, job in enumerate(jobs) if reps[j] > 0}

    # --- the search ----------------------------------------------------------------------

    def search(self, jobs: list[JobStatus], snapshot: ClusterSnapshot
               ) -> tuple[Options, np.ndarray, np.ndarray, float]:
        opts = self.options(jobs, snapshot)
        J = len(jobs)
        dem = np.array([demand(j, snapshot.time_s) for j in jobs])
        w = np.array([1.0 + j.spec.priority / 9.0 for j in jobs])
        has = opts.count > 0
        best_g = np.where(has, opts.start, 0)
        for j in np.flatnonzero(has):   # greedy: each job's cheapest way to meet demand
            ks = np.arange(opts.start[j], opts.start[j] + opts.count[j])
            cost = opts.need(ks, np.full(len(ks), dem[j])) * opts.usd_h[ks]
            best_g[j] = ks[int(np.argmin(cost))]
        ref_cost = max(float((opts.need(best_g, dem) * opts.usd_h[best_g])[has].sum()), 1e-6)
        cur_plan = {job.id: (shape_key(d.config), d.offering, d.config.replicas)
                    for job in jobs for d in serving_deployments(snapshot, job.id)[-1:]}
        cur_g, cur_r = self.encode(opts, jobs, cur_plan)
        seeds = [(cur_g, cur_r), (best_g, np.where(has, opts.need(best_g, dem), 0))]
        seeds += [self.encode(opts, jobs, plan) for _, plan in self.archive.values()]
        G = np.array([np.where(s[0] >= 0, s[0], best_g) for s in seeds])
        R = np.array([np.where((s[0] >= 0) & has, s[1], 0) for s in seeds])
        self.repair(opts, G, R)
        score = lambda g, r: self.fitness(opts, g, r, dem, w, ref_cost, cur_g)  # noqa: E731
        archive: dict[int, tuple[float, np.ndarray, np.ndarray]] = {}
        self._insert(archive, opts, G, R, score(G, R))
        for _ in range(GENERATIONS):
            G, R = self._children(archive, opts, dem, has, J)
            self.repair(opts, G, R)
            self._insert(archive, opts, G, R, score(G, R))
        self.archive = {c: (f, self.decode(opts, jobs, g, r)) for c, (f, g, r) in archive.items()}
        f, g, r = max(archive.values(), key=lambda e: e[0])
        return opts, g, r, f

    def _insert(self, archive: dict, opts: Options, G: np.ndarray, R: np.ndarray,
                fit: np.ndarray) -> None:
        for p, c in enumerate(self.cells(opts, G, R)):
            if c not in archive or fit[p] > archive[c][0]:
                archive[int(c)] = (float(fit[p]), G[p].copy(), R[p].copy())

    def _children(self, archive: dict, opts: Options, dem: np.ndarray, has: np.ndarray,
                  J: int) -> tuple[np.ndarray, np.ndarray]:
        elites = [archive[c] for c in sorted(archive)]
        G = np.empty((POPULATION, J), dtype=int)
        R = np.empty((POPULATION, J), dtype=int)
        rate = 2.0 / max(J, 1)
        for p in range(POPULATION):
            _, g, r = elites[self.rng.integers(len(elites))]
            g, r = g.copy(), r.copy()
            if len(elites) > 1 and self.rng.random() < CROSSOVER_P:
                _, g2, r2 = elites[self.rng.integers(len(elites))]
                take = self.rng.random(J) < 0.5
                g[take], r[take] = g2[take], r2[take]
            for j in np.flatnonzero((self.rng.random(J) < rate) & has):
                op = self.rng.integers(4)
                if op == 0:   # another option, sized to demand
                    g[j] = opts.start[j] + self.rng.integers(opts.count[j])
                    r[j] = opts.need(g[j:j + 1], dem[j:j + 1])[0]
                elif op == 1:
                    r[j] = max(0, min(opts.max_replicas,
                                      r[j] + (1 if self.rng.random() < 0.5 else -1)))
                elif op == 2:
                    r[j] = opts.need(g[j:j + 1], dem[j:j + 1])[0]
                else:
                    r[j] = 0
            G[p], R[p] = g, r
        return G, R

    # --- the tick ------------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        actions: list[Action] = []
        for job in snapshot.jobs:
            actions.extend(housekeeping_stops(job, snapshot))
        jobs = unfinished_jobs(snapshot)
        if not jobs:
            return PlanDecision(tick=snapshot.tick, actions=tuple(actions),
                                notes={"policy": self.name})
        opts, g, r, f = self.search(jobs, snapshot)
        ledger = CapacityLedger(snapshot, self.catalog)
        budget = Budget(self.max_swaps)
        for j, job in enumerate(jobs):
            targets = [] if r[j] <= 0 else [DeploymentTarget(
                opts.shape[g[j]], opts.offering[g[j]], int(r[j]),
                f"evolve: best plan (fitness {f:.3f}, {len(self.archive)} elites) runs"
                f" {shape_label(opts.shape[g[j]])} × {int(r[j])} for"
                f" {demand(job, snapshot.time_s):.4g} {'req/s' if job.is_online else 'tok/s'}")]
            actions.extend(reconcile(job, targets, snapshot, ledger, budget, "evolve"))
        self.last_best = f
        return PlanDecision(tick=snapshot.tick, actions=tuple(actions),
                            notes={"policy": self.name, "fitness": f"{f:.4f}",
                                   "elites": str(len(self.archive))})


@register("evolve")
class ProfiledEvolve(ProfiledBook, Evolve):
    """``evolve`` from a profile measured in the run's world, with Koi's limits and every
    engine (``koi.policies.profiled``)."""
