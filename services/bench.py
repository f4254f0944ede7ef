"""``koi bench bus``: what the bus costs, and what a second evaluator buys.

* overhead — the same scenario and seed run in-process (``koi.bench.runner.run_once``,
  policy ``koi``) and through the bus (every service a process, on embedded NATS and
  valkey started fresh for each run), ``runs`` times each; medians of the wall times
  and their ratio. The bus run's metrics are checked equal to the in-process ones.
* scale-out — the bus run with 1 and with N evaluator replicas; the evaluate stage's
  seconds per tick are read from the evaluators' JSON logs (``evaluated`` lines).
* telemetry — the same bus run with the sim publishing its telemetry (protobuf on the
  bus) and with the sim serving engine ``/metrics`` pages that engine-metrics scrapes
  (``telemetry_paths``): the scores, and the ticks whose decisions agree.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from koi.bench.runner import run_once
from koi.scenario import load_scenario
from services.runtime.busrun import BusRun, BusRunResult
from services.runtime.embedded import start_nats, start_valkey


@dataclass(frozen=True)
class OverheadResult:
    scenario: str
    seed: int
    horizon_s: float
    in_process_s: tuple[float, ...]
    bus_s: tuple[float, ...]
    same_metrics: bool
    replicas: tuple[tuple[str, int], ...] = ()

    @property
    def ratio(self) -> float:
        return statistics.median(self.bus_s) / statistics.median(self.in_process_s)


@dataclass(frozen=True)
class ScaleOutResult:
    scenario: str
    horizon_s: float
    evaluate_s: dict[int, tuple[float, ...]]   # replicas → per-tick evaluate-stage seconds
    wall_s: dict[int, float]


def bus_once(scenario: str, seed: int, horizon_s: float | None,
             replicas: dict[str, int] | None = None, *, secure: bool = False,
             telemetry: str = "bus") -> BusRunResult:
    """One bus run on fresh servers; ``secure``: NATS with TLS and a user per service
    (as ``koi demo`` runs), else plain (the figures in docs/BENCHMARKS.md);
    ``telemetry``: ``bus`` (the sim publishes it) or ``http`` (engine pages scraped)."""
    logs = Path(tempfile.mkdtemp(prefix="koi-bench-bus-"))
    with start_nats(store_dir=logs / "js", secure=secure) as nats, start_valkey() as cache:
        return BusRun(nats.url, logs / "logs", scenario, seed, horizon_s, cache.url,
                      replicas=dict(replicas or {}), timeout_s=3600,
                      security=nats.security, telemetry=telemetry).run()


@dataclass(frozen=True)
class TelemetryPaths:
    scenario: str
    seed: int
    ticks: int
    score: dict[str, float]        # "bus" | "http" → overall score
    wall_s: dict[str, float]
    same_ticks: int                # ticks whose actions are identical in both runs
    first_difference: int | None   # the first tick whose actions differ

    @property
    def difference(self) -> float:
        return self.score["http"] - self.score["bus"]


def same_decisions(a: BusRunResult, b: BusRunResult) -> tuple[int, int | None]:
    """(ticks with identical actions, the first tick that differs or None)."""
    ticks = sorted(set(a.decisions) | set(b.decisions))
    same = [t for t in ticks if t in a.decisions and t in b.decisions
            and a.decisions[t].actions == b.decisions[t].actions]
    differ = [t for t in ticks if t not in same]
    return len(same), (differ[0] if differ else None)


def telemetry_paths(scenario: str, seed: int, horizon_s: float | None,
                    progress: Callable[[str], None] = lambda _: None) -> TelemetryPaths:
    """One bus run with each telemetry path (``bus_once``), compared."""
    runs = {}
    for path in ("bus", "http"):
        runs[path] = bus_once(scenario, seed, horizon_s, telemetry=path)
        progress(f"telemetry over {path}: score "
                 f"{runs[path].summary.metrics['overall_score']:.2f}, "
                 f"{runs[path].wall_s:.0f} s")
    same, first = same_decisions(runs["bus"], runs["http"])
    return TelemetryPaths(scenario, seed, runs["bus"].summary.ticks,
                          {k: r.summary.metrics["overall_score"] for k, r in runs.items()},
                          {k: r.wall_s for k, r in runs.items()}, same, first)


def overhead(scenario: str, seed: int, horizon_s: float | None, runs: int,
             progress: Callable[[str], None] = lambda _: None,
             replicas: dict[str, int] | None = None) -> OverheadResult:
    scn = load_scenario(scenario)
    if horizon_s is not None:
        scn = dataclasses.replace(scn, horizon_s=min(scn.horizon_s, horizon_s))
    local, bus, same = [], [], True
    for i in range(runs):
        t = time.perf_counter()
        res = run_once(scn, "koi", seed)
        local.append(time.perf_counter() - t)
        progress(f"in-process run {i + 1}/{runs}: {local[-1]:.1f} s")
        b = bus_once(scenario, seed, scn.horizon_s, replicas)
        bus.append(b.wall_s)
        progress(f"bus run {i + 1}/{runs}: {bus[-1]:.1f} s")
        same &= all(abs(v - getattr(res.metrics, k)) <= 1e-9 * max(1.0, abs(v))
                    for k, v in b.summary.metrics.items())
    return OverheadResult(scenario, seed, scn.horizon_s, tuple(local), tuple(bus), same,
                          tuple(sorted((replicas or {}).items())))


def parse_replicas(text: str) -> dict[str, int]:
    """``"proposer=2,evaluator=2"`` → {"proposer": 2, "evaluator": 2}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--replicas: {part!r} is not NAME=N with N >= 1")
        out[name.strip()] = int(n)
    return out


def evaluate_seconds(log_dir: Path) -> list[float]:
    out = []
    for path in sorted(log_dir.glob("evaluator-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if '"evaluated"' in line:
                try:
                    out.append(float(json.loads(line)["evaluate_s"]))
                except (ValueError, KeyError):
                    continue
    return out


def scale_out(scenario: str, seed: int, horizon_s: float | None, replicas: tuple[int, ...],
              progress: Callable[[str], None] = lambda _: None) -> ScaleOutResult:
    per, wall = {}, {}
    for n in replicas:
        b = bus_once(scenario, seed, horizon_s, {"evaluator": n})
        per[n] = tuple(evaluate_seconds(b.log_dir))
        wall[n] = b.wall_s
        progress(f"{n} evaluator(s): median evaluate stage "
                 f"{statistics.median(per[n]) * 1e3:.0f} ms over {len(per[n])} ticks")
    return ScaleOutResult(scenario, horizon_s or load_scenario(scenario).horizon_s, per, wall)
