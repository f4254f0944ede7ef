"""``koi bench bus``: what the bus costs, and what a second evaluator or proposer buys.

* overhead — the same scenario and seed run in-process (``koi.bench.runner.run_once``,
  policy ``koi``) and through the bus (every service a process, on embedded NATS and
  valkey started fresh for each run), ``runs`` times each; medians of the wall times
  and their ratio. The bus run's metrics are checked equal to the in-process ones.
* scale-out — the bus run with 1 and with N evaluator (or proposer) replicas; the
  stage's seconds per tick are read from the services' JSON logs (the evaluators'
  ``evaluated`` lines, ``evaluate_s``; the proposers' ``proposed`` lines,
  ``propose_s``, with each work item's ``propose_item`` line), and each run's decisions
  are compared with the first's. For the proposer, ``koi.bench.fanout`` turns the first
  run's items and fan-in into the stage N machines would give.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from koi.bench.fanout import MACHINES, FanOutTick, predicted_stage_s
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
    # "service-replica" → the largest peak resident MiB over the bus runs
    peak_rss_mib: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return statistics.median(self.bus_s) / statistics.median(self.in_process_s)


@dataclass(frozen=True)
class ScaleOutResult:
    service: str                             # "evaluator" | "proposer"
    scenario: str
    horizon_s: float
    stage_s: dict[int, tuple[float, ...]]    # replicas → per-tick stage seconds
    wall_s: dict[int, float]
    same_ticks: dict[int, tuple[int, int]]   # replicas → (ticks decided as the first run, ticks)
    # the proposer's ticks in detail (items, fan-in), for koi.bench.fanout
    ticks: dict[int, tuple[FanOutTick, ...]] = field(default_factory=dict)

    def speed_up(self, replicas: int) -> float:
        """The first run's median stage (the first count asked for) over this one's."""
        first = next(iter(self.stage_s))
        return statistics.median(self.stage_s[first]) / statistics.median(self.stage_s[replicas])


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
    peak: dict[str, float] = {}
    for i in range(runs):
        t = time.perf_counter()
        res = run_once(scn, "koi", seed)
        local.append(time.perf_counter() - t)
        progress(f"in-process run {i + 1}/{runs}: {local[-1]:.1f} s")
        b = bus_once(scenario, seed, scn.horizon_s, replicas)
        bus.append(b.wall_s)
        for name, mib in b.peak_rss_mib.items():
            peak[name] = max(mib, peak.get(name, 0.0))
        progress(f"bus run {i + 1}/{runs}: {bus[-1]:.1f} s")
        same &= all(abs(v - getattr(res.metrics, k)) <= 1e-9 * max(1.0, abs(v))
                    for k, v in b.summary.metrics.items())
    return OverheadResult(scenario, seed, scn.horizon_s, tuple(local), tuple(bus), same,
                          tuple(sorted((replicas or {}).items())), peak)


def parse_replicas(text: str) -> dict[str, int]:
    """``"proposer=2,evaluator=2"`` → {"proposer": 2, "evaluator": 2}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--replicas: {part!r} is not NAME=N with N >= 1")
        out[name.strip()] = int(n)
    return out


def logged(log_dir: Path, service: str, event: str, keys: Sequence[str]
           ) -> list[tuple[float, ...]]:
    """``keys`` of every ``event`` line in ``service``'s JSON logs (``<service>-<replica>.log``),
    as numbers, file by file; a line that is not JSON or lacks one of them is skipped."""
    out = []
    for path in sorted(log_dir.glob(f"{service}-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                record = json.loads(line)
                if record.get("event") == event:
                    out.append(tuple(float(record[k]) for k in keys))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return out


def evaluate_seconds(log_dir: Path) -> list[float]:
    return [s for s, in logged(log_dir, "evaluator", "evaluated", ("evaluate_s",))]


def propose_ticks(log_dir: Path) -> list[FanOutTick]:
    """Each tick the proposers logged, with its items' seconds by the replica that ran them."""
    items: dict[int, dict[int, list[float]]] = {}   # tick → replica → item seconds
    for tick, replica, s in logged(log_dir, "proposer", "propose_item",
                                   ("tick", "replica", "item_s")):
        items.setdefault(int(tick), {}).setdefault(int(replica), []).append(s)
    out = {}
    for tick, stage, before in logged(log_dir, "proposer", "proposed",
                                      ("tick", "propose_s", "before_s")):
        by_replica = items.get(int(tick), {})
        out[int(tick)] = FanOutTick(int(tick), stage, before,
                                    tuple(s for v in by_replica.values() for s in v),
                                    tuple(sum(v) for v in by_replica.values()))
    return [out[t] for t in sorted(out)]


STAGE = {"evaluator": "evaluate", "proposer": "propose"}  # service → its stage


def scale_out(scenario: str, seed: int, horizon_s: float | None, replicas: tuple[int, ...],
              progress: Callable[[str], None] = lambda _: None,
              service: str = "evaluator") -> ScaleOutResult:
    """The bus run with each of ``replicas`` replicas of ``service`` (evaluator or
    proposer), one of every other service."""
    if service not in STAGE:
        raise ValueError(f"scale-out of {service!r}: evaluator or proposer")
    per, wall, same, ticks = {}, {}, {}, {}
    first: BusRunResult | None = None
    for n in replicas:
        b = bus_once(scenario, seed, horizon_s, {service: n})
        if service == "proposer":
            ticks[n] = tuple(propose_ticks(b.log_dir))
            per[n] = tuple(t.stage_s for t in ticks[n])
        else:
            per[n] = tuple(evaluate_seconds(b.log_dir))
        wall[n] = b.wall_s
        first = b if first is None else first
        same[n] = (same_decisions(first, b)[0], len(set(first.decisions) | set(b.decisions)))
        progress(f"{n} {service}(s): median {STAGE[service]} stage "
                 f"{statistics.median(per[n]) * 1e3:.0f} ms over {len(per[n])} ticks")
    return ScaleOutResult(service, scenario,
                          horizon_s or load_scenario(scenario).horizon_s, per, wall, same,
                          ticks)


def scale_out_lines(s: ScaleOutResult) -> list[str]:
    """What ``koi bench bus`` prints of a scale-out comparison: per replica count the
    stage's median and p90 per tick, the speed-up on the first count and whether the
    decisions were the same; for the proposer, its items and fan-in, and the model."""
    stage = STAGE[s.service]
    lines = []
    for n, per in s.stage_s.items():
        if not per:
            lines.append(f"{s.scenario}: {n} {s.service}(s): no {stage} lines logged")
            continue
        same, of = s.same_ticks[n]
        line = (f"{s.scenario} ({s.horizon_s:.0f} s): {n} {s.service}(s): {stage} stage "
                f"median {_ms(statistics.median(per))}, p90 {_ms(np.percentile(per, 90))}"
                f", mean {_ms(statistics.fmean(per))} over {len(per)} ticks; speed-up "
                f"{s.speed_up(n):.2f}×; decisions as the first run's on {same}/{of} ticks;"
                f" run {s.wall_s[n]:.0f} s")
        ticks = s.ticks.get(n)
        if ticks:
            items = [x for t in ticks for x in t.item_s]
            busiest = [max(t.busy_s, default=0.0) / max(sum(t.busy_s), 1e-12) for t in ticks]
            line += (f"; {statistics.median(len(t.item_s) for t in ticks):.0f} items a tick,"
                     f" item median {_ms(statistics.median(items))} (p90 "
                     f"{_ms(np.percentile(items, 90))}), before "
                     f"{_ms(statistics.median(t.before_s for t in ticks))}, fan-in "
                     f"{_ms(statistics.median(t.fan_in_s for t in ticks))}, busiest replica "
                     f"{statistics.median(busiest):.0%} of the items' time")
        lines.append(line)
    first = next(iter(s.ticks), None)
    if first is not None and s.ticks[first]:
        model = predicted_stage_s(s.ticks[first], MACHINES)
        lines.append(f"model from the {first}-{s.service} run (before + items over N, longest"
                     " first to the least loaded + fan-in; koi.bench.fanout): "
                     + ", ".join(f"N={n} {_ms(v)}" for n, v in model.items()))
    return lines


def _ms(seconds: float) -> str:
    return f"{float(seconds) * 1e3:.0f} ms"
