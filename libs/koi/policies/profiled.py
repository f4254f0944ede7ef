"""The practitioner baselines as their users run them: from a profile measured first.

A team that plans with Mélange, a bandit, an evolutionary search or a latency autoscaler
benchmarks each GPU type before it plans (Mélange's own method: each GPU at a grid of
loads). ``Profiled`` does that to the run's hidden world before the first tick
(``prepare``): it loads the world exactly as the simulator will (``load_world`` with the
scenario's overrides, seed and randomization) and measures each job's candidate replica
shapes with ``koi.sim.profile.Profiler`` — saturated throughput, then p95 TTFT and TPOT
over a sweep of Poisson loads. The policy then plans from those numbers instead of the
predictor's, with Koi's own limits: up to ``MAX_REPLICAS`` replicas a deployment, a
``MIGRATION_BUDGET`` of swaps a tick, and the default configs of every engine Koi's
proposer considers (bf16 and fp8 where they validate).

A profile sees one nominal replica: not stragglers, throttled nodes, slow regions, spot
preemptions or capacity changes, and only each job's mean request shape.

The registered names ``melange-ilp``, ``bandit``, ``evolve`` and ``regress-autoscale``
are the profiled policies (each module registers its own); the predictor-profiled ones
are ``<name>-unprofiled``. Reads the world by design, through the profiler only; logs the
profiling time at ``prepare`` as the oracle does. Nothing here decides what to run.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import structlog

from koi.catalog import Catalog
from koi.cluster import JobStatus
from koi.planner.candidates import MAX_REPLICAS as KOI_MAX_REPLICAS
from koi.planner.settings import KoiSettings
from koi.policies.base import Policy
from koi.policies.profiles import PerShape, ProfileBook, accelerator_summary, slo_of
from koi.predictor.types import Workload
from koi.scenario.types import Scenario
from koi.scenario.world import WorldParams
from koi.sim.profile import Profiler, RequestShape
from koi.sim.world import load_world
from koi.space import DeploymentConfig

log = structlog.get_logger(__name__)

ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm")
"""The engines whose default configs the profiled policies may run (Koi's proposer's)."""

MAX_REPLICAS = KOI_MAX_REPLICAS
"""Replicas one deployment may have: Koi's cap."""

MIGRATION_BUDGET = KoiSettings().migration_budget
"""Swaps a tick: Koi's placer's migration budget."""


def scenario_accelerators(scenario: Scenario, catalog: Catalog) -> dict[str, tuple[float, int]]:
    """accelerator → (cheapest $/GPU-hour, largest offering's GPUs) of the scenario's fleet
    at t=0: ``fleet_accelerators``' answer before the first snapshot."""
    return accelerator_summary(((e.offering, e.gpus) for e in scenario.fleet), catalog)


SHARED_PROFILERS = 4
"""Profilers ``shared_profiler`` keeps in a process (least recently used dropped)."""

_shared: OrderedDict[tuple[str, int, int], tuple[Catalog, Profiler]] = OrderedDict()


def shared_profiler(world: WorldParams, catalog: Catalog, seed: int) -> Profiler:
    """The process's profiler for (world, catalog, seed). The profiled policies of one
    scenario and seed measure the same replicas, and a ``Profiler``'s random streams are
    fixed per seed and measurement, so what it returns does not depend on who asked
    before: sharing it only saves the measuring (four policies did it four times)."""
    key = (repr(world), id(catalog), seed)
    hit = _shared.get(key)
    if hit is not None and hit[0] is catalog:
        _shared.move_to_end(key)
        return hit[1]
    profiler = Profiler(world, catalog, seed=seed)
    _shared[key] = (catalog, profiler)  # the catalog kept alive: its id stays its own
    while len(_shared) > SHARED_PROFILERS:
        _shared.popitem(last=False)
    return profiler


# --- profile sources ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Measured:
    """A ``ProfileBook`` source: each job's shapes profiled in the world. Online: the
    highest swept rate meeting the job's SLO and the p95s there (0 and inf when the
    lightest load misses it); batch: saturated output tok/s and the p95s of that run."""

    profiler: Profiler

    def __call__(self, todo: Sequence[tuple[JobStatus, list[DeploymentConfig]]]
                 ) -> list[PerShape]:
        out = []
        for job, configs in todo:
            shape = RequestShape.of(job.spec)
            rows = [self._online(c, shape, *slo_of(job)) if job.is_online
                    else self._batch(c, shape) for c in configs]
            out.append(PerShape([r[0] for r in rows], [r[1] for r in rows],
                                [r[2] for r in rows]))
        return out

    def _online(self, cfg: DeploymentConfig, shape: RequestShape, ttft_s: float,
                tpot_s: float) -> tuple[float, float, float]:
        rate, point = self.profiler.max_rate_under_slo(cfg, shape, ttft_s, tpot_s)
        if point is None:
            return 0.0, math.inf, math.inf
        return rate, point.ttft_p95_s, point.tpot_p95_s

    def _batch(self, cfg: DeploymentConfig, shape: RequestShape) -> tuple[float, float, float]:
        sat = self.profiler.saturation(cfg, shape)
        return sat.tok_s, sat.ttft_p95_s, sat.tpot_p95_s


@dataclass(frozen=True, slots=True)
class MeasuredRates:
    """best-fixed's ``FixedRates`` (``baselines.choose_fixed_config``) from the profiler,
    for the representative workload's mean shape and tightest SLO."""

    profiler: Profiler

    def __call__(self, candidates: list[DeploymentConfig], workload: Workload,
                 has_slo: bool) -> list[tuple[float, float, float]]:
        shape = RequestShape(max(1, round(workload.input_len)),
                             max(1, round(workload.output_len)))
        out = []
        for cfg in candidates:
            sat = self.profiler.saturation(cfg, shape)
            rate = (self.profiler.max_rate_under_slo(cfg, shape, workload.slo_ttft_ms / 1e3,
                                                     workload.slo_tpot_ms / 1e3)[0]
                    if has_slo else 0.0)
            out.append((sat.tok_s, sat.rps, rate))
        return out


@dataclass(frozen=True, slots=True)
class Unprepared:
    """The source of a profiled policy before ``prepare``: planning without a profile
    would silently fall back on the predictor, so it refuses."""

    policy: str

    def __call__(self, *args: object) -> list:
        raise RuntimeError(f"{self.policy} plans from replicas profiled in the run's world:"
                           " call prepare(scenario, seed) before decide")


# --- the mixins -----------------------------------------------------------------------------

class Profiled(Policy):
    """Put first among a practitioner policy's bases: Koi's limits, every engine, and a
    profiler on the run's world at ``prepare`` (``shared_profiler``; ``use_profiler`` hands
    it on)."""

    engines: ClassVar[tuple[str, ...]] = ENGINES
    max_replicas: ClassVar[int] = MAX_REPLICAS
    max_swaps: ClassVar[int] = MIGRATION_BUDGET

    profiler: Profiler | None = None

    def prepare(self, scenario: Scenario, seed: int) -> None:
        """Profile the scenario's jobs on its fleet in the world the simulator will build."""
        started = time.perf_counter()
        world = load_world(scenario.world, seed, scenario.randomize_world)
        self.profiler = shared_profiler(world, self.catalog, seed)
        before = self.profiler.runs
        self.use_profiler(self.profiler, scenario)
        log.info("replicas_profiled", policy=self.name, scenario=scenario.name, seed=seed,
                 replica_runs=self.profiler.runs - before,
                 seconds=round(time.perf_counter() - started, 2))

    def use_profiler(self, profiler: Profiler, scenario: Scenario) -> None:
        """Plan from ``profiler`` from now on, measuring up front what is known now."""
        raise NotImplementedError


class ProfiledBook(Profiled):
    """``Profiled`` for a policy that plans from ``self.book`` (a ``ProfileBook``): every
    job of the scenario is profiled on its fleet at ``prepare``."""

    book: ProfileBook

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.book.source = Unprepared(self.name)

    def use_profiler(self, profiler: Profiler, scenario: Scenario) -> None:
        self.book.source = Measured(profiler)
        jobs = [JobStatus(spec, False, False) for spec in scenario.jobs]
        self.book.profiles(jobs, scenario_accelerators(scenario, self.catalog))
