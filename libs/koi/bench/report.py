"""Scenario benchmark reports: the preprint's table columns, per (scenario, policy).

``summarise`` groups ``RunResult``s by (scenario, policy) and gives each column's mean and
spread over seeds (``summarise_records`` the same from ``runs.jsonl`` records, where a
null stays missing); ``rich_table``, ``markdown_table`` and ``csv_text`` render the same
rows; ``run_json`` is the per-run JSON object of ``koi bench --json``. The spread is
**half the range** over seeds, (max − min) ÷ 2, so ``mean ± spread`` brackets every seed
when runs are symmetric, and with three seeds it is not the understated std of n − 1 = 2.
$/token is shown in units of 1e-4 USD, as in the preprint. Formatting only: the numbers
come from ``koi.metrics`` through ``RunResult.metrics``; nothing here runs anything.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from rich.table import Table

from koi.bench.runner import RunResult
from koi.bench.stats import Record, metric_value
from koi.churn import by_job, run_churn

COST_UNIT = 1e-4
SPREAD = "half-range"


@dataclass(frozen=True, slots=True)
class Column:
    key: str                            # short id (CSV header)
    header: str                         # human header (rich, markdown)
    metric: str                         # ``RunMetrics`` field = key under a record's metrics
    fmt: str                            # format of mean and spread
    scale: float = 1.0                  # the column shows metric ÷ scale

    def get(self, result: RunResult) -> float:
        return float(getattr(result.metrics, self.metric)) / self.scale

    def of_record(self, record: Record) -> float | None:
        """The value in a ``runs.jsonl`` record; None when null or not recorded."""
        try:
            value = metric_value(record, self.metric)
        except KeyError:
            return None
        return None if value is None else value / self.scale


COLUMNS: tuple[Column, ...] = (
    Column("batch_prog_pct", "batch prog %", "batch_progress_pct", ".1f"),
    Column("admit_online_pct", "admit online %", "admit_online_pct", ".1f"),
    Column("admit_batch_pct", "admit batch %", "admit_batch_pct", ".1f"),
    Column("cost_per_token_1e-4_usd", "$/token (×1e-4 $)", "cost_per_token_usd", ".3f",
           COST_UNIT),
    Column("ttft_met_pct", "TTFT met %", "ttft_met_pct", ".1f"),
    Column("tpot_met_pct", "TPOT met %", "tpot_met_pct", ".1f"),
    Column("goodput_tok_s", "goodput tok/s", "goodput_tok_s", ".0f"),
    Column("score", "score", "overall_score", ".1f"),
)


@dataclass(frozen=True, slots=True)
class Stat:
    mean: float
    spread: float      # (max − min) / 2 over seeds
    n: int

    def text(self, fmt: str) -> str:
        if not math.isfinite(self.mean):
            return "inf" if self.mean > 0 else "nan"
        if self.n < 2:
            return format(self.mean, fmt)
        return f"{format(self.mean, fmt)} ± {format(self.spread, fmt)}"


@dataclass(frozen=True, slots=True)
class SummaryRow:
    scenario: str
    policy: str
    seeds: tuple[int, ...]
    stats: dict[str, Stat]          # keyed by Column.key
    wall_s: Stat
    sample_fraction: float
    policy_failures: int            # ticks in which the policy raised, all seeds


def stat(values: Sequence[float]) -> Stat:
    """Mean and half-range; inf if any value is inf (e.g. $/token with nothing served)."""
    vals = list(values)
    if not vals:
        return Stat(math.nan, math.nan, 0)
    if any(not math.isfinite(v) for v in vals):
        return Stat(math.inf, math.nan, len(vals))
    return Stat(statistics.fmean(vals), (max(vals) - min(vals)) / 2.0, len(vals))


def recorded_stat(values: Sequence[float | None]) -> Stat:
    """``stat`` of values read back from ``runs.jsonl``, where null stands for a value that
    was not recorded or not finite (the file cannot tell which): any null makes the cell
    nan, never a mean over the other seeds."""
    if any(v is None for v in values):
        return Stat(math.nan, math.nan, len(values))
    return stat(cast(Sequence[float], values))


def summarise(results: Sequence[RunResult]) -> list[SummaryRow]:
    """One row per (scenario, policy), in first-seen order."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.scenario, r.policy), []).append(r)
    rows = []
    for (scn, pol), runs in groups.items():
        rows.append(SummaryRow(
            scn, pol, tuple(r.seed for r in runs),
            {c.key: stat([c.get(r) for r in runs]) for c in COLUMNS},
            stat([r.wall_s for r in runs]),
            runs[0].sample_fraction,
            sum(len(r.policy_failures) for r in runs)))
    return rows


def summarise_records(records: Sequence[Record]) -> list[SummaryRow]:
    """``summarise`` over ``runs.jsonl`` records (``run_json`` objects): the same rows."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((str(r["scenario"]), str(r["policy"])), []).append(r)
    rows = []
    for (scn, pol), runs in groups.items():
        rows.append(SummaryRow(
            scn, pol, tuple(int(r["seed"]) for r in runs),
            {c.key: recorded_stat([c.of_record(r) for r in runs]) for c in COLUMNS},
            recorded_stat([r.get("wall_s") for r in runs]),
            float(runs[0].get("sample_fraction") or math.nan),
            sum(len(r.get("policy_failures") or ()) for r in runs)))
    return rows


def _title(rows: Sequence[SummaryRow]) -> str:
    seeds = sorted({s for r in rows for s in r.seeds})
    return (f"Scenario benchmark: mean ± half-range over seeds {','.join(map(str, seeds))}"
            f"; $/token in units of 1e-4 USD")


def rich_table(rows: Sequence[SummaryRow]) -> Table:
    t = Table(title=_title(rows))
    t.add_column("scenario")
    t.add_column("policy")
    for c in COLUMNS:
        t.add_column(c.header, justify="right")
    t.add_column("wall s", justify="right")
    for r in rows:
        pol = r.policy + (f" [red]({r.policy_failures} failed ticks)[/]"
                          if r.policy_failures else "")
        t.add_row(r.scenario, pol, *(r.stats[c.key].text(c.fmt) for c in COLUMNS),
                  r.wall_s.text(".1f"))
    return t


def markdown_table(rows: Sequence[SummaryRow]) -> str:
    head = ["scenario", "policy", *(c.header for c in COLUMNS), "wall s", "f"]
    lines = [f"<!-- {_title(rows)} -->",
             "| " + " | ".join(head) + " |",
             "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        pol = r.policy + (f" ({r.policy_failures} failed ticks)" if r.policy_failures else "")
        cells = [r.scenario, pol, *(r.stats[c.key].text(c.fmt) for c in COLUMNS),
                 r.wall_s.text(".1f"), f"{r.sample_fraction:g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[SummaryRow]) -> str:
    """Machine-readable: mean and spread (half-range) as separate columns."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = ["scenario", "policy", "seeds", "sample_fraction"]
    for c in COLUMNS:
        head += [f"{c.key}_mean", f"{c.key}_halfrange"]
    head += ["wall_s_mean", "wall_s_halfrange", "policy_failures"]
    w.writerow(head)
    for r in rows:
        row: list[Any] = [r.scenario, r.policy, " ".join(map(str, r.seeds)),
                          f"{r.sample_fraction:g}"]
        for c in COLUMNS:
            s = r.stats[c.key]
            row += [f"{s.mean:.6g}", f"{s.spread:.6g}"]
        row += [f"{r.wall_s.mean:.3f}", f"{r.wall_s.spread:.3f}", r.policy_failures]
        w.writerow(row)
    return buf.getvalue()


def _finite(x: Any) -> Any:
    """JSON has no inf/nan: write them as null (JSON consumers choke on ``Infinity``)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def run_json(result: RunResult, *, jobs: bool = False) -> dict[str, Any]:
    """``{scenario, policy, seed, wall_s, sample_fraction, metrics{…}, churn{…},
    policy_failures}``, and ``model_spend{tokens, usd, calls, …}`` for a policy that asks
    a language model.

    ``metrics`` holds every ``RunMetrics`` field (per-job rows only with ``jobs=True``,
    each with the GPU-hours the job held by family, its event counts by kind,
    ``koi.bench.jobs.job_activity``, and its ``churn``); ``churn`` is the run's
    ``koi.churn.RunChurn``; non-finite numbers (``$/token`` with nothing served) are
    ``null``.
    """
    m = result.metrics.to_dict()
    rows = cast(list[dict[str, Any]], m.pop("jobs"))
    churn = run_churn(result.record)
    if jobs:
        from koi.bench.jobs import job_activity

        activity = job_activity(result.record)
        per_job = by_job(churn)
        m["jobs"] = rows
        for row in rows:
            a = activity[row["job_id"]]
            row["gpu_hours_by_family"], row["events"] = dict(a.gpu_hours), dict(a.events)
            if row["job_id"] in per_job:
                row["churn"] = per_job[row["job_id"]].to_dict()
    return _finite({
        "scenario": result.scenario, "policy": result.policy, "seed": result.seed,
        "wall_s": result.wall_s, "sample_fraction": result.sample_fraction,
        "ticks": len(result.record.timeline), "events": len(result.record.events),
        "refused_actions": result.refused_actions,
        "policy_failures": [{"tick": f.tick, "time_s": f.time_s, "error": f.error,
                             "where": f.where} for f in result.policy_failures],
        "metrics": m,
        "churn": churn.to_dict(),
        # the planner's own language-model spend (koi-rlm, llm-only, llm-tools)
        **({"model_spend": result.model_spend} if result.model_spend is not None else {}),
    })


# --- churn (koi.churn), per (scenario, policy) over seeds, from run records -------------

CHURN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (key in a record's ``churn``, header, format)
    ("median_moves_per_job_hour", "median moves/job-h", ".2f"),
    ("moves_per_job_hour", "moves/job-h", ".2f"),
    ("flaps", "flaps", ".1f"),
    ("jobs_with_flaps", "jobs flapping", ".1f"),
    ("disrupted_requests", "requests disrupted", ".0f"),
    ("dropped_by_move", "dropped by a move", ".0f"),
    ("startup_gpu_min", "start-up GPU-min", ".0f"),
    ("drain_gpu_min", "drain GPU-min", ".0f"),
)


def churn_markdown(records: Sequence[Record], *, by_scenario: bool = True) -> str:
    """Churn per (scenario, policy) — or per policy over every scenario — as mean ±
    half-range over runs (``koi.churn``); runs recorded before churn was (no ``churn``
    block) make their row's cells "—", never a mean over the rest."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        key = (str(r["scenario"]) if by_scenario else "all", str(r["policy"]))
        groups.setdefault(key, []).append(r)
    head = ["scenario" if by_scenario else "scenarios", "policy", "runs",
            *(h for _, h, _ in CHURN_COLUMNS), "moves (up/down/swap/relaunch)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for (scn, pol), runs in groups.items():
        churns: list[dict[str, Any] | None] = [r.get("churn") for r in runs]
        known = [c for c in churns if c is not None]
        if len(known) == len(churns):
            cells = [recorded_stat([c.get(k) for c in known]).text(f)
                     for k, _, f in CHURN_COLUMNS]
            tot = [sum(int(c["moves"].get(k, 0)) for c in known)
                   for k in ("scale_up", "scale_down", "swap", "relaunch")]
            kinds = "/".join(map(str, tot))
        else:   # a mean over the runs that have it would read as the group's
            cells = ["—"] * len(CHURN_COLUMNS)
            kinds = "not recorded"
        where = scn if by_scenario else str(len({r["scenario"] for r in runs}))
        lines.append("| " + " | ".join([where, pol, str(len(runs)), *cells, kinds]) + " |")
    return "\n".join(lines) + "\n"


def results_json(results: Sequence[RunResult], *, jobs: bool = False) -> Any:
    """A single object for one run, a list for several."""
    objs = [run_json(r, jobs=jobs) for r in results]
    return objs[0] if len(objs) == 1 else objs


__all__ = [
    "CHURN_COLUMNS",
    "COLUMNS",
    "COST_UNIT",
    "SPREAD",
    "Stat",
    "SummaryRow",
    "churn_markdown",
    "csv_text",
    "markdown_table",
    "recorded_stat",
    "results_json",
    "rich_table",
    "run_json",
    "stat",
    "summarise",
    "summarise_records",
]
