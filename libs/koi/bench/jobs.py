"""Per-job breakdown of a benchmark run: what each job got, and what the policy did to it.

``koi bench --jobs`` prints and writes these rows beside the run table. Each row is one
job of one run: its DESIGN §4 terms (``koi.metrics.JobMetrics``), the GPU-hours it held
by accelerator family (from the run's per-tick timeline) and how often the policy acted
on it (the cluster's events by kind: launch, scale, swap, relaunch, drain, stop, and the
world's preemptions and stock-outs). A run's score says *that* a policy lost; this says
*where*: which job missed its SLO, which one moved every few ticks, which one held the
expensive parts. Formatting and counting only: nothing here runs or scores anything.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from koi.bench.runner import RunResult
from koi.churn import JobChurn, by_job, run_churn
from koi.metrics import JobMetrics
from koi.records import RunRecord

# event kinds that are the policy's moves (the rest: admission records, the world's doing)
MOVES: tuple[str, ...] = ("swap", "relaunch", "scale")


@dataclass(frozen=True, slots=True)
class JobActivity:
    """What one job held and how often it was acted on over a run."""

    gpu_hours: dict[str, float]     # accelerator family → GPU-hours held (starting too)
    events: dict[str, int]          # event kind → count

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())

    def moves(self) -> str:
        """``swap 12 · relaunch 1 · scale 32`` (kinds with a count only)."""
        return " · ".join(f"{k} {self.events[k]}" for k in MOVES if self.events.get(k))


def job_activity(record: RunRecord) -> dict[str, JobActivity]:
    """Per job id (every job of the record, and any other an event or tick names):
    GPU-hours by family (each tick's GPUs held at its end, for the tick's length; the
    last tick ends at the horizon) and event counts by kind."""
    hours: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    timeline = record.timeline
    for i, t in enumerate(timeline):
        end = timeline[i + 1].time_s if i + 1 < len(timeline) else record.horizon_s
        dt_h = max(end - t.time_s, 0.0) / 3600.0
        for job, by_family in t.gpus_by_job.items():
            for family, gpus in by_family.items():
                hours[job][family] += gpus * dt_h
    events: dict[str, Counter[str]] = defaultdict(Counter)
    for e in record.events:
        events[e.job_id][e.kind] += 1
    jobs = [j.job_id for j in record.jobs] + sorted((set(hours) | set(events))
                                                   - {j.job_id for j in record.jobs})
    return {j: JobActivity({f: h for f, h in sorted(hours[j].items()) if h > 0},
                           dict(sorted(events[j].items()))) for j in jobs}


@dataclass(frozen=True, slots=True)
class JobRow:
    scenario: str
    policy: str
    seed: int
    metrics: JobMetrics
    activity: JobActivity
    churn: JobChurn | None = None


def job_rows(results: Sequence[RunResult]) -> list[JobRow]:
    """One row per submitted job of every run, in run order, then the run's job order."""
    rows = []
    for r in results:
        activity = job_activity(r.record)
        churn = by_job(run_churn(r.record))
        rows += [JobRow(r.scenario, r.policy, r.seed, m, activity[m.job_id],
                        churn.get(m.job_id)) for m in r.metrics.jobs if m.submitted]
    return rows


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100.0 * x:.1f}"


def _hours(a: JobActivity) -> str:
    return " ".join(f"{f} {h:.1f}" for f, h in sorted(a.gpu_hours.items(),
                                                       key=lambda kv: -kv[1]))


def jobs_rich_table(rows: Sequence[JobRow]) -> Table:
    t = Table(title="Per job: SLO met %, batch progress %, GPU-hours by family, moves")
    for name, right in (("run", False), ("job", False), ("kind", False),
                        ("admitted", False), ("TTFT met %", True), ("TPOT met %", True),
                        ("batch prog %", True), ("good Mtok", True), ("GPU-h", True),
                        ("by family", False), ("moves", False), ("moves/h", True),
                        ("flaps", True), ("disrupted", True)):
        t.add_column(name, justify="right" if right else "left")
    for r in rows:
        m, a, c = r.metrics, r.activity, r.churn
        t.add_row(f"{r.scenario} · {r.policy} · s{r.seed}", m.job_id, m.kind,
                  "yes" if m.admitted else "[red]no[/]", _pct(m.ttft_met_frac),
                  _pct(m.tpot_met_frac), _pct(m.batch_progress_frac),
                  f"{m.good_output_tokens / 1e6:.2f}", f"{a.total_gpu_hours:.1f}",
                  _hours(a), a.moves(), "" if c is None else f"{c.moves_per_hour:.1f}",
                  "" if c is None else str(c.flaps) if not c.flaps else f"[red]{c.flaps}[/]",
                  "" if c is None else f"{c.disrupted_requests:.0f}")
    return t


def jobs_csv(rows: Sequence[JobRow]) -> str:
    """Machine-readable: one line per (run, job); GPU-hours and events as ``k=v`` lists."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["scenario", "policy", "seed", "job", "kind", "model", "admitted",
                "ttft_met_pct", "tpot_met_pct", "batch_progress_pct", "served_output_tokens",
                "good_output_tokens", "gpu_hours", "gpu_hours_by_family", "events",
                "moves_per_hour", "flaps", "disrupted_requests", "dropped_by_move",
                "startup_gpu_min", "drain_gpu_min"])
    for r in rows:
        m, a, c = r.metrics, r.activity, r.churn
        w.writerow([r.scenario, r.policy, r.seed, m.job_id, m.kind, m.model, int(m.admitted),
                    _pct(m.ttft_met_frac), _pct(m.tpot_met_frac),
                    _pct(m.batch_progress_frac), f"{m.served_output_tokens:.6g}",
                    f"{m.good_output_tokens:.6g}", f"{a.total_gpu_hours:.4g}",
                    " ".join(f"{f}={h:.4g}" for f, h in a.gpu_hours.items()),
                    " ".join(f"{k}={n}" for k, n in a.events.items()),
                    *(["", "", "", "", "", ""] if c is None else
                      [f"{c.moves_per_hour:.4g}", c.flaps, f"{c.disrupted_requests:.6g}",
                       f"{c.dropped_by_move:.6g}", f"{c.startup_gpu_min:.4g}",
                       f"{c.drain_gpu_min:.4g}"])])
    return buf.getvalue()


__all__ = ["MOVES", "JobActivity", "JobRow", "job_activity", "job_rows", "jobs_csv",
           "jobs_rich_table"]
