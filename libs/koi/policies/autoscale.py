"""``regress-autoscale``: best-fixed placement plus a latency-regression autoscaler.

What Dynamo's and llm-d's planners do: place each job once with the best-value config
(exactly ``best-fixed``'s rule), then every tick fit, per deployment,
p95 TTFT and p95 TPOT against per-replica load (req/s per ready replica) by recursive
least squares with forgetting (features 1, ρ, ρ²), and pick the smallest replica count
whose predicted p95 at the job's current rate meets the SLO with a ``MARGIN`` margin.
Up fast (straight to that count, as far as free GPUs allow); down slowly: only after
``DOWN_AFTER`` consecutive ticks wanting fewer, one replica at a time, and only if the
fit predicts ≤ ``DOWN_MARGIN`` × SLO at the lower count. Until a fit has
``MIN_SAMPLES`` points (or when it is not increasing in load), the rule is proportional:
replicas × observed p95 ÷ (margin × SLO). Never changes accelerator, parallelism or
offering; batch deployments keep best-fixed's sizing.

``regress-autoscale`` chooses the config from a profile measured in the run's world,
among every engine's defaults, and scales to at most Koi's replica cap
(``koi.policies.profiled``); ``regress-autoscale-unprofiled`` chooses it with the
predictor among vLLM defaults and caps at ``MAX_REPLICAS``.

Pure decision code: state on the policy, no clocks, no randomness, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from koi.catalog import Catalog
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    DeploymentTelemetry,
    JobStatus,
    PlanDecision,
)
from koi.policies.base import register
from koi.policies.baselines import BestFixed
from koi.policies.bookkeeping import CapacityLedger, housekeeping_stops, needs_placement
from koi.policies.profiled import MeasuredRates, Profiled, Unprepared
from koi.policies.profiles import online_demand_rps, slo_of
from koi.scenario.types import Scenario
from koi.sim.profile import Profiler

MARGIN = 0.9            # target p95 ≤ MARGIN × SLO
DOWN_MARGIN = 0.7       # scale down only if the fit says ≤ this × SLO at one fewer
DOWN_AFTER = 3          # consecutive ticks wanting fewer before a scale-down
MIN_SAMPLES = 3
FORGET = 0.95           # RLS forgetting factor
MAX_REPLICAS = 32


@dataclass(slots=True)
class Rls:
    """Recursive least squares with forgetting on features (1, ρ, ρ²)."""

    theta: np.ndarray = field(default_factory=lambda: np.zeros(3))
    P: np.ndarray = field(default_factory=lambda: np.eye(3) * 1e3)
    n: int = 0

    @staticmethod
    def features(load: float) -> np.ndarray:
        return np.array([1.0, load, load * load])

    def update(self, load: float, y: float, forget: float = FORGET) -> None:
        x = self.features(load)
        Px = self.P @ x
        gain = Px / (forget + x @ Px)
        self.theta = self.theta + gain * (y - x @ self.theta)
        self.P = (self.P - np.outer(gain, Px)) / forget
        self.n += 1

    def predict(self, load: float) -> float:
        return float(self.features(load) @ self.theta)

    def usable(self) -> bool:
        """Enough points, and latency grows with load over the fitted range."""
        rising = self.predict(2.0) > self.predict(1.0) > self.predict(0.0) - 1e-9
        return self.n >= MIN_SAMPLES and rising


@dataclass(slots=True)
class DeploymentFit:
    ttft: Rls = field(default_factory=Rls)
    tpot: Rls = field(default_factory=Rls)
    last_p95: tuple[float, float] = (0.0, 0.0)
    want_down: int = 0


def replicas_for_slo(fit: DeploymentFit, rate: float, slo: tuple[float, float],
                     current: int, cap: int = MAX_REPLICAS) -> tuple[int, str]:
    """The smallest replica count whose predicted p95 meets MARGIN × SLO, and how it was found."""
    if fit.ttft.usable() and fit.tpot.usable():
        for r in range(1, cap + 1):
            load = rate / r
            if (fit.ttft.predict(load) <= MARGIN * slo[0]
                    and fit.tpot.predict(load) <= MARGIN * slo[1]):
                return r, "regression"
        return cap, "regression (capped)"
    ratio = max(fit.last_p95[0] / slo[0], fit.last_p95[1] / slo[1]) / MARGIN
    if ratio <= 0:
        return current, "no data"
    return max(1, min(cap, math.ceil(current * ratio - 1e-9))), "proportional"


@register("regress-autoscale-unprofiled")
class RegressAutoscale(BestFixed):
    """best-fixed placement (the predictor's choice) + per-deployment latency regression
    scaling (see module doc)."""

    max_replicas: ClassVar[int] = MAX_REPLICAS

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.fits: dict[str, DeploymentFit] = {}

    def observe(self, snapshot: ClusterSnapshot,
                telemetry: Sequence[DeploymentTelemetry]) -> None:
        ready = {d.id: d.replicas_ready for d in snapshot.deployments}
        for t in telemetry:
            n = ready.get(t.deployment_id, 0)
            if n <= 0 or t.requests_finished <= 0 or t.window_s <= 0:
                continue
            load = t.requests_arrived / t.window_s / n
            fit = self.fits.setdefault(t.deployment_id, DeploymentFit())
            fit.ttft.update(load, t.ttft_p95_s)
            fit.tpot.update(load, t.tpot_p95_s)
            fit.last_p95 = (t.ttft_p95_s, t.tpot_p95_s)

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        self.observe(snapshot, telemetry)
        actions: list[Action] = []
        for each in snapshot.jobs:
            actions.extend(housekeeping_stops(each, snapshot))
        ledger = CapacityLedger(snapshot, self.catalog)
        jobs = {j.id: j for j in snapshot.jobs}
        for dep in snapshot.deployments:
            job = jobs.get(dep.job_id)
            if job is not None and job.is_online and not needs_placement(job, snapshot):
                action = self.scale(job, dep, ledger)
                if action is not None:
                    actions.append(action)
        return self.place_pending(snapshot, ledger, actions)

    def scale(self, job: JobStatus, dep: Deployment, ledger: CapacityLedger) -> Action | None:
        fit = self.fits.get(dep.id)
        if fit is None or dep.state != DeploymentState.RUNNING:
            return None
        slo = slo_of(job)
        current = dep.config.replicas
        want, how = replicas_for_slo(fit, online_demand_rps(job), slo, current,
                                     cap=self.max_replicas)
        if want > current:
            fit.want_down = 0
            want = current + ledger.max_replicas(dep.offering, dep.config.gpus_per_replica,
                                                 want - current)
            if want == current:
                return None
            ledger.take(dep.offering, (want - current) * dep.config.gpus_per_replica)
        elif want < current:
            fit.want_down += 1
            lower = current - 1
            safe = (not (fit.ttft.usable() and fit.tpot.usable())
                    or (fit.ttft.predict(online_demand_rps(job) / lower) <= DOWN_MARGIN * slo[0]
                        and fit.tpot.predict(online_demand_rps(job) / lower)
                        <= DOWN_MARGIN * slo[1]))
            if fit.want_down < DOWN_AFTER or not safe:
                return None
            fit.want_down, want = 0, lower
        else:
            fit.want_down = 0
            return None
        return Action(ActionKind.SCALE, job.id,
                      f"regress-autoscale: p95 TTFT {fit.last_p95[0] * 1e3:.0f} ms / TPOT"
                      f" {fit.last_p95[1] * 1e3:.0f} ms vs SLO {slo[0] * 1e3:.0f}/"
                      f"{slo[1] * 1e3:.0f} ms ({how}); {current} → {want} replicas",
                      deployment_id=dep.id, replicas=want)


@register("regress-autoscale")
class ProfiledRegressAutoscale(Profiled, RegressAutoscale):
    """``regress-autoscale`` choosing its config from a profile measured in the run's world
    (each model's, when it first appears), with Koi's replica cap and every engine."""

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.rates = Unprepared(self.name)

    def use_profiler(self, profiler: Profiler, scenario: Scenario) -> None:
        self.rates = MeasuredRates(profiler)
