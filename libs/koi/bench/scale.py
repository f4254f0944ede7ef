"""`koi bench tick` records and the "Scale" section of docs/RESULTS.md.

One record per `koi bench tick --out DIR` run, a line of ``DIR/ticks.jsonl``: the
scenario and its size (GPUs at t=0, jobs), per planning stage the median and p90 over
the run's ticks, every tick's total, the plans' capacity check (GPUs each plan occupies
per offering against what the composer was given: ``ComposePlan.gpus_by_offering`` ≤
``free_by_offering``), peak resident memory, and where it ran (commit, host, CPUs).
``scale_markdown`` turns the records into a table; a number there is what a run recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from koi.bench.learning import LearningRun, stage_times
from koi.bench.stats import Record

TICKS = "ticks.jsonl"
STAGES = ("propose", "evaluate", "compose", "place", "learn", "total")
REFERENCE = "hetero-12h"  # the tick every other size is compared with


def tick_record(run: LearningRun, *, gpus: int, jobs: int, peak_rss_mib: float,
                commit: str, machine: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ticks.jsonl`` record of one timed replay."""
    over = 0
    for r in run.reports:
        if r.plan is None:
            continue
        free = r.plan.free_by_offering
        over += sum(used > free.get(off, 0) for off, used in r.plan.gpus_by_offering.items())
    return {
        "scenario": run.scenario, "policy": run.policy, "seed": run.seed, "gpus": gpus,
        "jobs": jobs, "ticks": len(run.reports),
        "stages": {k: list(v) for k, v in stage_times(run).items()},
        "tick_total_s": [r.stage_s.get("total", float("nan")) for r in run.reports],
        "candidates": [r.candidates for r in run.reports],
        "offerings_over_capacity": over, "peak_rss_mib": peak_rss_mib,
        "commit": commit, "machine": machine}


def append(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def load(paths: Iterable[Path]) -> list[Record]:
    """Every record of the ``ticks.jsonl`` files in ``paths`` (files, or directories
    searched recursively); lines that are not records are skipped."""
    out: list[Record] = []
    for p in paths:
        for f in sorted(p.rglob(TICKS)) if p.is_dir() else [p] if p.name == TICKS else []:
            for line in f.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and {"scenario", "stages", "gpus"} <= set(rec):
                    out.append(rec)
    return out


def scale_markdown(records: Sequence[Record]) -> str:
    """Per (scenario, commit): runs, size, the median over runs of each stage's median
    tick and of the p90 of the whole tick, its ratio to hetero-12h's at that commit, peak
    memory and the plans' capacity check."""
    if not records:
        return ("No `koi bench tick --out` runs in these files (`make bench-scale` makes "
                "them).\n")
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((str(r["scenario"]), str(r.get("commit", ""))[:12]), []).append(r)
    reference = {commit: _median(rs, "total", 0) for (name, commit), rs in groups.items()
                 if name == REFERENCE}
    head = ("| scenario | GPUs | jobs | commit | runs × ticks | propose | evaluate | compose "
            "| total median | total p90 | × hetero-12h | peak RSS MiB | over capacity |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = sorted(groups, key=lambda k: (groups[k][0]["gpus"], k[0], k[1]))
    for name, commit in order:
        rs = groups[(name, commit)]
        total = _median(rs, "total", 0)
        ratio = total / reference[commit] if reference.get(commit) else float("nan")
        cells = [name, str(rs[0]["gpus"]), str(rs[0]["jobs"]), f"`{commit}`",
                 f"{len(rs)} × {rs[0]['ticks']}",
                 *(f"{_median(rs, s, 0):.2f}" for s in ("propose", "evaluate", "compose")),
                 f"{total:.2f}", f"{_median(rs, 'total', 1):.2f}",
                 "–" if not np.isfinite(ratio) else f"{ratio:.1f}",
                 f"{max(float(r['peak_rss_mib']) for r in rs):.0f}",
                 str(sum(int(r.get("offerings_over_capacity", 0)) for r in rs))]
        lines.append("| " + " | ".join(cells) + " |")
    machines = sorted({f"{r['machine'].get('host')}, {r['machine'].get('cpus')} CPUs"
                       for r in records if isinstance(r.get("machine"), dict)})
    return "\n".join([
        "Seconds per planning tick in process (`koi bench tick`): per stage the median over "
        "runs of each run's median tick; p90 the median over runs of each run's p90 (the "
        "first tick of a run is a cold one: empty caches, every job new). Over capacity: "
        "(tick, offering) pairs where a plan occupies more GPUs than the composer was "
        "given. Machines: " + ("; ".join(machines) or "unknown") + ".", "", *lines, ""])


def _median(records: Sequence[Record], stage: str, which: int) -> float:
    values = [float(r["stages"][stage][which]) for r in records if stage in r["stages"]]
    return float(np.median(values)) if values else float("nan")
