"""Scenario benchmark runner: drive a registered policy through the simulator.

``run_once`` is the controller loop — snapshot → ``policy.decide`` → ``sim.apply`` →
``sim.advance`` until the horizon — timed with ``time.perf_counter`` around the whole
run (simulator and policy set-up included). Like SkyPilot's serve controller, the loop
survives a policy that raises in one tick: the error is logged, that tick's decision is
treated as empty, and the failure is counted in the result. ``run_matrix`` runs every
(scenario, policy, seed) combination in a fixed order. Metrics come from
``koi.metrics.metrics_for`` only; formatting lives in ``report``, figures in ``plots``.
No printing, no files.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from koi.catalog import Catalog, load_catalog
from koi.cluster import DeploymentTelemetry, PlanDecision
from koi.metrics import RunMetrics, metrics_for
from koi.policies import make_policy
from koi.records import RunRecord
from koi.scenario import Scenario, load_scenario

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PolicyFailure:
    """A tick in which ``policy.decide`` raised; the tick ran with no actions."""

    tick: int
    time_s: float
    error: str          # ``repr`` of the exception
    where: str = ""     # the innermost frame, ``file:line in function``


@dataclass(frozen=True, slots=True)
class RunResult:
    """One (scenario, policy, seed) run: its metrics, its record and how it went."""

    scenario: str
    policy: str
    seed: int
    wall_s: float
    metrics: RunMetrics
    record: RunRecord
    policy_failures: tuple[PolicyFailure, ...] = ()
    refused_actions: int = 0   # actions the simulator refused (capacity, invalid, …)
    # what a policy's own language-model calls cost (tokens, dollars, calls, …); None
    # for policies without a model (``model_spend()`` on the policy)
    model_spend: dict[str, Any] | None = None

    @property
    def sample_fraction(self) -> float:
        return self.record.sample_fraction


@dataclass(frozen=True, slots=True)
class RunProgress:
    """Where ``run_matrix`` is: run ``run_index`` (0-based) of ``runs``, at ``tick``."""

    run_index: int
    runs: int
    scenario: str
    policy: str
    seed: int
    tick: int
    ticks: int


TickCallback = Callable[[int, int], None]          # (ticks done, ticks in the run)
ProgressCallback = Callable[[RunProgress], None]


def scenario_ticks(scenario: Scenario) -> int:
    """Ticks the simulator runs for a scenario (the last one may be short)."""
    return max(1, math.ceil(scenario.horizon_s / scenario.tick_s - 1e-9))


def run_once(scenario: Scenario | str, policy_name: str, seed: int, *,
             sample_fraction: float | None = None, catalog: Catalog | None = None,
             on_tick: TickCallback | None = None, telemetry_path: str = "sim") -> RunResult:
    """Run ``policy_name`` through ``scenario`` with ``seed`` (policy and simulator).

    ``sample_fraction=None`` lets the simulator choose (the scenario's own, else
    ``koi.sim.auto_sample_fraction``). ``on_tick(done, total)`` is called after every tick.
    ``telemetry_path``: the policy sees the simulator's own telemetry (``sim``) or the
    same read back from the simulated engines' ``/metrics`` pages (``pages``,
    ``koi.fleet.simulated.PageReader``). Raises ``ValueError`` for an unknown policy or
    telemetry path before anything runs.
    """
    from koi.fleet.simulated import TELEMETRY_PATHS, PageReader
    from koi.sim.simulator import Simulator  # the simulator is heavy; import on use

    if telemetry_path not in TELEMETRY_PATHS:
        raise ValueError(f"telemetry path {telemetry_path!r}: one of "
                         f"{', '.join(TELEMETRY_PATHS)}")

    scn = load_scenario(scenario) if isinstance(scenario, str) else scenario
    cat = catalog or load_catalog()
    ticks = scenario_ticks(scn)
    t0 = time.perf_counter()
    policy = make_policy(policy_name, catalog=cat, seed=seed)
    prepare = getattr(policy, "prepare", None)  # optional: policies that read the scenario
    if prepare is not None:
        prepare(scn, seed)
    sim = Simulator(scn, seed=seed, sample_fraction=sample_fraction, catalog=cat)
    failures: list[PolicyFailure] = []
    refused = 0
    pages = PageReader(cat) if telemetry_path == "pages" else None
    telemetry: list[DeploymentTelemetry] = []
    snapshot = sim.snapshot()
    while not sim.done:
        decision = _decide(policy, snapshot, telemetry, failures)
        refused += sum(not o.applied for o in sim.apply(decision))
        telemetry = sim.advance()
        snapshot = sim.snapshot()
        if pages is not None:
            telemetry = pages.read(snapshot, telemetry)
        if on_tick is not None:
            on_tick(sim.tick, ticks)
    record = sim.record(policy_name)
    wall = time.perf_counter() - t0
    record = dataclasses.replace(record, wall_s=wall)
    metrics = metrics_for(record, scn, cat)
    if failures:
        log.warning("policy_failures", scenario=scn.name, policy=policy_name, seed=seed,
                    ticks=len(failures), first=failures[0].error)
    spend = getattr(policy, "model_spend", None)
    return RunResult(scn.name, policy_name, seed, wall, metrics, record, tuple(failures),
                     refused, spend() if callable(spend) else None)


def _decide(policy: Any, snapshot: Any, telemetry: Sequence[DeploymentTelemetry],
            failures: list[PolicyFailure]) -> PlanDecision:
    """``policy.decide``, with an exception turned into an empty decision and recorded."""
    try:
        return policy.decide(snapshot, telemetry)
    except Exception as exc:  # the controller must outlive any one tick's bug
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""
        if not failures:  # the rest are counted, and summarised at the end of the run
            log.warning("policy_decide_failed", tick=snapshot.tick, policy=policy.name,
                        error=repr(exc), where=where)
        failures.append(PolicyFailure(snapshot.tick, snapshot.time_s, repr(exc), where))
        return PlanDecision(tick=snapshot.tick, actions=(),
                            notes={"error": f"policy raised {exc!r}; no actions"})


def run_matrix(scenarios: Sequence[Scenario | str], policies: Sequence[str],
               seeds: Sequence[int], *, sample_fraction: float | None = None,
               catalog: Catalog | None = None,
               progress: ProgressCallback | None = None,
               on_result: Callable[[RunResult], None] | None = None,
               telemetry_path: str = "sim") -> list[RunResult]:
    """Every (scenario, policy, seed), scenario-major, in the order given.

    ``progress`` gets a ``RunProgress`` before each run (tick 0) and after every tick;
    ``on_result`` gets each finished run (e.g. to write partial results).
    """
    cat = catalog or load_catalog()
    scns = [load_scenario(s) if isinstance(s, str) else s for s in scenarios]
    combos = [(s, p, seed) for s in scns for p in policies for seed in seeds]
    results: list[RunResult] = []
    for i, (scn, pol, seed) in enumerate(combos):
        ticks = scenario_ticks(scn)

        def tick_cb(done: int, total: int, i: int = i, scn: Scenario = scn, pol: str = pol,
                    seed: int = seed) -> None:
            if progress is not None:
                progress(RunProgress(i, len(combos), scn.name, pol, seed, done, total))

        tick_cb(0, ticks)
        res = run_once(scn, pol, seed, sample_fraction=sample_fraction, catalog=cat,
                       on_tick=tick_cb, telemetry_path=telemetry_path)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


__all__ = [
    "PolicyFailure",
    "RunProgress",
    "RunResult",
    "run_matrix",
    "run_once",
    "scenario_ticks",
]
