"""``bandit``: a contextual bandit (LinUCB) over per-job configuration arms.

What a practitioner builds when they let the fleet learn which config to run: each job's
arms are a few (accelerator, TP, precision, engine) shapes that fit the fleet (the best
``ARMS_PER_JOB`` by profiled goodput per dollar); an arm's expected reward is linear in
the job's context (log rate, log mean input/output length, SLO tightness, log model size,
and the profile's normalised value of that arm for that job), one ridge model per arm
key shared across jobs (disjoint LinUCB, prior mean "trust the profile"). The reward,
every tick a deployment runs, is its SLO-meeting output tok/s per dollar-hour (p95 TTFT
and TPOT against the SLO; misses scaled down) divided by the job's best profiled value.
Every ``SWITCH_EVERY`` ticks a job may SWAP to the arm with the highest UCB if it beats
the current arm's by ``SWITCH_MARGIN``. Replicas follow the demand with a per-replica
rate learned online: it starts at the profile's max rate under the SLO and shrinks when
observed p95 misses the SLO, grows slowly when it is comfortably met.

``bandit`` profiles the arms in the run's world before planning, over every engine's
defaults, with Koi's replica cap and migration budget (``koi.policies.profiled``);
``bandit-unprofiled`` takes the predictor's numbers, vLLM defaults only,
``MAX_REPLICAS`` and ``MAX_SWAPS_PER_TICK``.

Pure decision code: state on the policy, randomness only from ``numpy.random.Generator``
seeded by ``self.seed`` (tie-breaking), no clocks, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from koi.catalog import Catalog
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    DeploymentTelemetry,
    JobStatus,
    PlanDecision,
)
from koi.policies.base import Policy, register
from koi.policies.bookkeeping import CapacityLedger, housekeeping_stops, replicas_for_rate
from koi.policies.profiled import ProfiledBook
from koi.policies.profiles import Profile, ProfileBook, demand, shape_key, slo_of
from koi.policies.reconcile import (
    Budget,
    DeploymentTarget,
    reconcile,
    serving_deployments,
    unfinished_jobs,
)
from koi.shapes import shape_label

ARMS_PER_JOB = 6
SWITCH_EVERY = 5          # ticks between a job's arm changes
SWITCH_MARGIN = 0.1       # UCB must beat the current arm's by this much (normalised reward)
ALPHA = 0.5               # exploration width
RIDGE = 1.0               # prior precision (λ) on the "trust the profile" mean
MAX_SWAPS_PER_TICK = 3
MAX_REPLICAS = 16
RATE_SHRINK, RATE_GROW = 0.85, 1.05   # per-replica rate updates on a miss / a comfortable meet
REWARD_CLIP = 3.0


def job_context(job: JobStatus) -> np.ndarray:
    """Job features shared by all its arms (scaled to O(1))."""
    spec = job.spec
    ttft, tpot = slo_of(job)
    tight = 0.0 if math.isinf(ttft) else -0.5 * (math.log10(ttft) + math.log10(tpot * 20))
    return np.array([
        1.0,
        math.log1p(demand(job, 0.0) if job.is_online else 0.0) / 3.0,
        math.log10(max(1.0, spec.input_len.mean_value())) / 4.0,
        math.log10(max(1.0, spec.output_len.mean_value())) / 4.0,
        tight,
        1.0 if job.is_batch else 0.0,
    ])


def model_size_feature(params_b: float) -> float:
    return math.log10(max(params_b, 0.1)) / 3.0


class LinUCB:
    """Disjoint LinUCB: one ridge-regression model per arm key, prior mean ``theta0``."""

    def __init__(self, dim: int, alpha: float = ALPHA, ridge: float = RIDGE,
                 theta0: np.ndarray | None = None) -> None:
        self.dim, self.alpha, self.ridge = dim, alpha, ridge
        self.theta0 = np.zeros(dim) if theta0 is None else np.asarray(theta0, dtype=float)
        self.A: dict[object, np.ndarray] = {}
        self.b: dict[object, np.ndarray] = {}

    def _arm(self, key: object) -> tuple[np.ndarray, np.ndarray]:
        if key not in self.A:
            self.A[key] = self.ridge * np.eye(self.dim)
            self.b[key] = self.ridge * self.theta0.copy()
        return self.A[key], self.b[key]

    def ucb(self, key: object, x: np.ndarray) -> tuple[float, float]:
        """(mean estimate, upper confidence bound) of the arm's reward in context x."""
        A, b = self._arm(key)
        A_inv = np.linalg.inv(A)
        mean = float(x @ (A_inv @ b))
        return mean, mean + self.alpha * math.sqrt(max(float(x @ A_inv @ x), 0.0))

    def update(self, key: object, x: np.ndarray, reward: float) -> None:
        A, b = self._arm(key)
        A += np.outer(x, x)
        b += reward * x

    def choose(self, arms: Sequence[tuple[object, np.ndarray]], rng: np.random.Generator) -> int:
        """Index of the arm with the highest UCB; exact ties broken by ``rng``."""
        ucbs = np.array([self.ucb(k, x)[1] for k, x in arms])
        best = np.flatnonzero(ucbs >= ucbs.max() - 1e-12)
        return int(best[0] if len(best) == 1 else rng.choice(best))


@dataclass(slots=True)
class JobArms:
    """A job's arms and what the bandit learnt about serving it."""

    indices: list[int]            # into the job's Profile.shapes
    current: int                  # index into indices
    last_switch_tick: int
    rate_per_replica: dict[int, float]   # profile index → learnt per-replica rate


@register("bandit-unprofiled")
class Bandit(Policy):
    """LinUCB over (accelerator, TP, precision) arms per job, the predictor's profiles
    (see module doc)."""

    engines: ClassVar[tuple[str, ...]] = ("vllm",)
    max_replicas: ClassVar[int] = MAX_REPLICAS
    max_swaps: ClassVar[int] = MAX_SWAPS_PER_TICK

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.rng = np.random.default_rng(seed)
        self.book = ProfileBook(self.catalog, engines=self.engines)
        theta0 = np.zeros(8)
        theta0[-1] = 1.0   # prior: reward ≈ the profile's normalised value of the arm
        self.linucb = LinUCB(dim=8, theta0=theta0)
        self.arms: dict[str, JobArms] = {}
        self._contexts: dict[str, np.ndarray] = {}
        self._dep_arm: dict[str, tuple[str, int]] = {}  # deployment id → (job, profile index)

    # --- context and reward ------------------------------------------------------------

    def arm_context(self, job: JobStatus, prof: Profile, i: int) -> np.ndarray:
        value = prof.value
        top = float(value.max()) if value.size and value.max() > 0 else 1.0
        size = model_size_feature(self.catalog.model(job.spec.model).params_b)
        return np.concatenate([job_context(job), [size, float(value[i]) / top]])

    def reward(self, job: JobStatus, prof: Profile, t: DeploymentTelemetry) -> float:
        """SLO-meeting output tok/s per $/hour, over the job's best profiled value."""
        usd_h = t.cost_usd / t.window_s * 3600.0 if t.window_s > 0 else 0.0
        if usd_h <= 0:
            return 0.0
        ttft_slo, tpot_slo = slo_of(job)
        miss = max(t.ttft_p95_s / ttft_slo, t.tpot_p95_s / tpot_slo, 0.0)
        good = t.output_tok_s * (1.0 if miss <= 1.0 else 1.0 / (miss * miss))
        value = prof.value
        top = float(value.max()) if value.size and value.max() > 0 else 1.0
        if job.is_online:
            # the best value assumes a full replica; a light job's reward is capped by its load
            top = min(top, demand(job, 0.0) * prof.tok_per_req / max(float(prof.usd_h.min()), 1e-9))
        return float(np.clip(good / usd_h / max(top, 1e-9), 0.0, REWARD_CLIP))

    def learn(self, snapshot: ClusterSnapshot, telemetry: Sequence[DeploymentTelemetry],
              profiles: dict[str, Profile]) -> None:
        jobs = {j.id: j for j in snapshot.jobs}
        for t in telemetry:
            owner = self._dep_arm.get(t.deployment_id)
            job = jobs.get(t.job_id)
            if owner is None or job is None or t.job_id not in profiles or t.output_tok_s <= 0:
                continue
            prof, i = profiles[t.job_id], owner[1]
            self.linucb.update(shape_key(prof.shapes[i]), self.arm_context(job, prof, i),
                               self.reward(job, prof, t))
            arms = self.arms.get(job.id)
            if arms is not None and job.is_online and t.requests_finished > 0:
                ttft_slo, tpot_slo = slo_of(job)
                miss = max(t.ttft_p95_s / ttft_slo, t.tpot_p95_s / tpot_slo)
                rate = arms.rate_per_replica.get(i, float(prof.rate[i]))
                if miss > 1.0:
                    rate *= RATE_SHRINK
                elif miss < 0.6:
                    rate = min(rate * RATE_GROW, 2.0 * float(prof.rate[i]))
                arms.rate_per_replica[i] = max(rate, 1e-3)

    # --- the tick ------------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        actions: list[Action] = []
        for job in snapshot.jobs:
            actions.extend(housekeeping_stops(job, snapshot))
        jobs = unfinished_jobs(snapshot)
        profiles = self.book.get(jobs, snapshot)
        self._track(snapshot, profiles)
        self.learn(snapshot, telemetry, profiles)
        ledger = CapacityLedger(snapshot, self.catalog)
        budget = Budget(self.max_swaps)
        for job in sorted(jobs, key=lambda j: (-j.spec.priority, j.spec.submit_s)):
            target = self._target(job, profiles[job.id], snapshot)
            if target is None:
                actions.append(Action(ActionKind.DEFER, job.id,
                                      "bandit: no arm of this model fits the fleet"))
                continue
            actions.extend(reconcile(job, [target], snapshot, ledger, budget, "bandit"))
        return PlanDecision(tick=snapshot.tick, actions=tuple(actions),
                            notes={"policy": self.name, "jobs": str(len(jobs))})

    def _track(self, snapshot: ClusterSnapshot, profiles: dict[str, Profile]) -> None:
        """Attribute each serving deployment to the arm (profile index) it runs."""
        for dep in snapshot.deployments:
            if dep.id in self._dep_arm or dep.job_id not in profiles:
                continue
            keys = [shape_key(s) for s in profiles[dep.job_id].shapes]
            if shape_key(dep.config) in keys:
                self._dep_arm[dep.id] = (dep.job_id, keys.index(shape_key(dep.config)))

    def _target(self, job: JobStatus, prof: Profile,
                snapshot: ClusterSnapshot) -> DeploymentTarget | None:
        arms = self.arms.get(job.id)
        if arms is None:
            indices = prof.best(ARMS_PER_JOB)
            if not indices:
                return None
            pick = self.linucb.choose(
                [(shape_key(prof.shapes[i]), self.arm_context(job, prof, i)) for i in indices],
                self.rng)
            arms = self.arms[job.id] = JobArms(indices, pick, snapshot.tick, {})
            why = "first arm by UCB"
        else:
            why = "keeps its arm"
            running = serving_deployments(snapshot, job.id)
            if running and snapshot.tick - arms.last_switch_tick >= SWITCH_EVERY:
                why = self._maybe_switch(job, prof, arms, snapshot.tick)
        i = arms.indices[arms.current]
        shape = prof.shapes[i]
        cap = self.max_replicas
        if job.is_online:
            rate = arms.rate_per_replica.get(i, float(prof.rate[i]))
            replicas = min(cap, replicas_for_rate(demand(job, snapshot.time_s), rate))
            sizing = f"{demand(job, snapshot.time_s):.3g} req/s at {rate:.3g} per replica"
        else:
            need = demand(job, snapshot.time_s)
            replicas = min(cap, replicas_for_rate(need, float(prof.rate[i])))
            sizing = f"batch {need:.4g} tok/s to meet the deadline"
        offers = sorted((o for o in self.catalog.offerings.values()
                         if o.accelerator == shape.accelerator
                         and snapshot.capacity_of(o.id) is not None),
                        key=lambda o: o.usd_per_gpu_hour)
        if not offers:
            return None
        mean, ucb = self.linucb.ucb(shape_key(shape), self.arm_context(job, prof, i))
        return DeploymentTarget(shape, offers[0].id, replicas,
                      f"bandit: {why} {shape_label(shape)}"
                      f" (reward est {mean:.2f}, UCB {ucb:.2f}); {sizing}")

    def _maybe_switch(self, job: JobStatus, prof: Profile, arms: JobArms, tick: int) -> str:
        scored = [(self.linucb.ucb(shape_key(prof.shapes[i]), self.arm_context(job, prof, i))[1], k)
                  for k, i in enumerate(arms.indices)]
        cur = scored[arms.current][0]
        best_ucb, best = max(scored, key=lambda s: (s[0], -s[1]))
        if best != arms.current and best_ucb > cur + SWITCH_MARGIN:
            arms.current, arms.last_switch_tick = best, tick
            return f"switches (UCB {best_ucb:.2f} > {cur:.2f} + {SWITCH_MARGIN}) to"
        return "keeps its arm"


@register("bandit")
class ProfiledBandit(ProfiledBook, Bandit):
    """``bandit`` from a profile measured in the run's world, with Koi's limits and every
    engine (``koi.policies.profiled``)."""
