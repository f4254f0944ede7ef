"""``melange-ilp``: the cost-minimal GPU mix by ILP from offline profiles (Mélange, AIBrix).

Offline profile: for each job and each accelerator in the fleet, the best-value replica
shape (accelerator, TP, precision, engine) and its per-replica capacity in the job's
demand unit — max req/s under the job's SLO (online) or saturated output tok/s (batch).
``melange-ilp`` measures it in the run's world before planning, over every engine's
defaults, with at most Koi's replica cap per column and its migration budget
(``koi.policies.profiled``); ``melange-ilp-unprofiled`` takes it from the predictor, vLLM
defaults only, uncapped, ``MAX_SWAPS_PER_TICK``. The ILP (``scipy.optimize.milp``,
HiGHS) chooses integer replicas x[j, o] per (job, offering of a profiled accelerator)
minimising $/hour subject to

    Σ_o rate[j, o]·x[j, o] + short[j] ≥ demand[j]      (each job's rate; batch: tok/s to
                                                         finish the rest by its deadline)
    Σ_j gpus[j, o]·x[j, o] ≤ total GPUs of offering o   (capacity)

where ``short[j]`` ≥ 0 is unserved demand, priced far above any GPU so that a job is
served partially (or deferred) only when the fleet cannot hold it. Current placements
get a small price discount so the plan does not churn for pennies. Re-solved when a job
arrives or finishes, when a deployment is lost, and every ``RESOLVE_EVERY`` ticks for
rate and batch-progress changes; in between the last solution is re-applied (scale,
launch what failed, drain what left the plan).

Pure decision code: no clocks, no randomness (the ILP is deterministic), no I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from koi.catalog import Catalog, Offering
from koi.cluster import Action, ClusterSnapshot, DeploymentTelemetry, JobStatus, PlanDecision
from koi.lifecycle import is_lost
from koi.policies.base import Policy, register
from koi.policies.bookkeeping import CapacityLedger, housekeeping_stops
from koi.policies.profiled import ProfiledBook
from koi.policies.profiles import Profile, ProfileBook, demand, shape_key
from koi.policies.reconcile import (
    Budget,
    DeploymentTarget,
    reconcile,
    serving_deployments,
    unfinished_jobs,
)
from koi.shapes import shape_label
from koi.space import DeploymentConfig

RESOLVE_EVERY = 10             # ticks between re-solves when nothing else changed
STAY_DISCOUNT = 0.9            # current (job, offering, shape) placements price × this
SHORTFALL_USD_PER_UNIT_FRAC = 1e4   # $/h for serving none of a job (per unit of demand share)
ILP_NODE_LIMIT = 2000          # a work limit, not a time limit: same answer on any machine
ILP_GAP = 0.005                # relative optimality gap accepted
ILP_TIME_LIMIT_S = 30.0        # safety net only
MAX_SWAPS_PER_TICK = 3


@dataclass(frozen=True, slots=True)
class Column:
    """One ILP variable: replicas of a job's profiled shape on one offering."""

    job: int
    shape: DeploymentConfig
    offering: Offering
    rate: float       # per replica, in the job's demand unit
    usd_h: float      # per replica


def profile_columns(jobs: Sequence[JobStatus], profiles: dict[str, Profile],
                    offerings: Sequence[Offering]) -> list[Column]:
    """Per job, per accelerator: the cheapest shape per unit of rate, on every offering of it."""
    cols = []
    for j, job in enumerate(jobs):
        prof = profiles[job.id]
        best: dict[str, int] = {}
        for i, shape in enumerate(prof.shapes):
            if prof.rate[i] <= 0:
                continue
            a = shape.accelerator
            per = prof.usd_h[i] / prof.rate[i]
            if a not in best or per < prof.usd_h[best[a]] / prof.rate[best[a]] - 1e-12:
                best[a] = i
        for off in offerings:
            i = best.get(off.accelerator, -1)
            if i >= 0:
                cols.append(Column(j, prof.shapes[i], off, float(prof.rate[i]),
                                   off.usd_per_gpu_hour * prof.shapes[i].gpus_per_replica))
    return cols


def solve_mix(cols: Sequence[Column], demands: Sequence[float],
              capacity: dict[str, int], current: AbstractSet[tuple[int, str, tuple]] = frozenset(),
              time_limit_s: float = ILP_TIME_LIMIT_S,
              max_replicas: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(replicas per column, shortfall per job) of the cost-minimal mix (see module doc),
    at most ``max_replicas`` per column when given."""
    n, m = len(cols), len(demands)
    price = np.array([c.usd_h * (STAY_DISCOUNT if (c.job, c.offering.id, shape_key(c.shape))
                                 in current else 1.0) for c in cols])
    dem = np.asarray(demands, dtype=float)
    short_price = SHORTFALL_USD_PER_UNIT_FRAC / np.maximum(dem, 1e-9)
    cost = np.concatenate([price, short_price])
    rows, lo, hi = [], [], []
    for j in range(m):                      # rate: Σ rate·x + short ≥ demand
        r = np.zeros(n + m)
        for k, c in enumerate(cols):
            if c.job == j:
                r[k] = c.rate
        r[n + j] = 1.0
        rows.append(r)
        lo.append(dem[j])
        hi.append(np.inf)
    offs = sorted({c.offering.id for c in cols})
    for o in offs:                          # capacity per offering
        r = np.zeros(n + m)
        for k, c in enumerate(cols):
            if c.offering.id == o:
                r[k] = c.shape.gpus_per_replica
        rows.append(r)
        lo.append(0.0)
        hi.append(float(capacity.get(o, 0)))
    fit = [capacity.get(c.offering.id, 0) // c.shape.gpus_per_replica for c in cols]
    if max_replicas is not None:
        fit = [min(f, max_replicas) for f in fit]
    ub = np.array(fit + list(dem), dtype=float)
    integrality = np.concatenate([np.ones(n), np.zeros(m)])
    res = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi),
               integrality=integrality, bounds=Bounds(np.zeros(n + m), ub),
               options={"time_limit": time_limit_s, "node_limit": ILP_NODE_LIMIT,
                        "mip_rel_gap": ILP_GAP})
    if res.x is None:
        return np.zeros(n, dtype=int), dem.copy()
    x = np.round(res.x[:n]).astype(int)
    return x, np.maximum(res.x[n:], 0.0)


@register("melange-ilp-unprofiled")
class MelangeIlp(Policy):
    """Cost-minimal GPU mix per job by ILP over the predictor's profiles (see module doc)."""

    engines: ClassVar[tuple[str, ...]] = ("vllm",)
    max_replicas: ClassVar[int] = sys.maxsize     # no cap: as many as the offering holds
    max_swaps: ClassVar[int] = MAX_SWAPS_PER_TICK

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.book = ProfileBook(self.catalog, engines=self.engines)
        self.plan: dict[str, list[DeploymentTarget]] = {}
        self._solved_tick = -RESOLVE_EVERY
        self._solved_jobs: frozenset[str] = frozenset()

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        actions: list[Action] = []
        for job in snapshot.jobs:
            actions.extend(housekeeping_stops(job, snapshot))
        jobs = unfinished_jobs(snapshot)
        ids = frozenset(j.id for j in jobs)
        lost = any(is_lost(d) for d in snapshot.deployments)
        if (ids != self._solved_jobs or lost
                or snapshot.tick - self._solved_tick >= RESOLVE_EVERY):
            self.plan = self.solve(jobs, snapshot)
            self._solved_tick, self._solved_jobs = snapshot.tick, ids
        ledger = CapacityLedger(snapshot, self.catalog)
        budget = Budget(self.max_swaps)
        for job in jobs:
            actions.extend(reconcile(job, self.plan.get(job.id, []), snapshot, ledger, budget,
                                     "melange-ilp"))
        return PlanDecision(tick=snapshot.tick, actions=tuple(actions),
                            notes={"policy": self.name, "solved_tick": str(self._solved_tick)})

    def solve(self, jobs: list[JobStatus],
              snapshot: ClusterSnapshot) -> dict[str, list[DeploymentTarget]]:
        if not jobs:
            return {}
        profiles = self.book.get(jobs, snapshot)
        ledger = CapacityLedger(snapshot, self.catalog)
        offerings = ledger.known_offerings()
        cols = profile_columns(jobs, profiles, offerings)
        capacity = {c.offering: c.total_gpus for c in snapshot.capacity}
        current = {(j, d.offering, shape_key(d.config)) for j, job in enumerate(jobs)
                   for d in serving_deployments(snapshot, job.id)}
        demands = [demand(j, snapshot.time_s) for j in jobs]
        x, short = solve_mix(cols, demands, capacity, current,
                             max_replicas=self.max_replicas)
        plan: dict[str, list[DeploymentTarget]] = {j.id: [] for j in jobs}
        for k, c in enumerate(cols):
            if x[k] <= 0:
                continue
            job = jobs[c.job]
            unit = "req/s" if job.is_online else "tok/s"
            served = 1.0 - short[c.job] / max(demands[c.job], 1e-9)
            plan[job.id].append(DeploymentTarget(
                c.shape, c.offering.id, int(x[k]),
                f"melange-ilp: cost-minimal mix, {shape_label(c.shape)}"
                f" at {c.rate:.3g} {unit}/replica, "
                f"${c.usd_h:.2f}/h each, serves {served:.0%} of {demands[c.job]:.4g} {unit}"))
        return plan


@register("melange-ilp")
class ProfiledMelangeIlp(ProfiledBook, MelangeIlp):
    """``melange-ilp`` from a profile measured in the run's world, with Koi's limits and
    every engine (``koi.policies.profiled``)."""
