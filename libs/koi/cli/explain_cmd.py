"""`koi explain` and `koi bench learning`: replay a Koi run and show what it knew.

Formatting and argument handling only; the replay and the numbers come from
``koi.bench.learning`` and the planner's reports.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from koi.bench.learning import (
    LearningRun,
    peak_rss_mib,
    plot,
    replay,
    stage_times,
    summary,
    write_csv,
)
from koi.scenario import Scenario, load_scenario


def _replay(console: Console, scenario: str, policy: str, seed: int,
            until_tick: int | None = None) -> tuple[Scenario, LearningRun]:
    """``scenario`` loaded, and ``policy``'s replay of it."""
    try:
        with console.status(f"replaying {scenario} with {policy}…") as status:
            scn = load_scenario(scenario)
            return scn, replay(scn, policy, seed, until_tick=until_tick,
                               on_tick=lambda d, n: status.update(f"tick {d}/{n}"))
    except (ValueError, KeyError, FileNotFoundError) as e:
        typer.echo(f"koi: {e.args[0] if e.args else e}", err=True)
        raise typer.Exit(2) from None


def explain_command(console: Console, scenario: str, job: str, tick: int, seed: int,
                    policy: str) -> None:
    _, run = _replay(console, scenario, policy, seed, until_tick=tick)
    report = next((r for r in run.reports if r.tick == tick), None)
    if report is None:
        typer.echo(f"koi explain: the run has no tick {tick} (last: {run.reports[-1].tick})",
                   err=True)
        raise typer.Exit(2)
    found = [e for e in report.explanations if e.job_id == job] if job else \
        list(report.explanations)
    if not found:
        known = ", ".join(e.job_id for e in report.explanations)
        typer.echo(f"koi explain: no job {job!r} planned at tick {tick}; planned: {known}",
                   err=True)
        raise typer.Exit(2)
    console.rule(f"{run.scenario} · tick {tick} · {policy} · seed {seed}")
    for e in found:
        console.print(e.text())
    if run.rounds:  # koi-rlm: the language-model hypotheses about each job
        from koi.rlm.loop import job_hypothesis_lines

        for e in found:
            lines = job_hypothesis_lines(run.rounds, e.job_id, tick)
            if lines:
                console.print(f"[bold]hypotheses about {escape(e.job_id)}:[/bold]")
                for line in lines:
                    console.print(f"  {escape(line)}")
    events = [ev for ev in run.events if (not job or ev.job_id == job) and ev.tick <= tick]
    if events:
        console.print("[bold]events so far:[/bold]")
        for ev in events[-8:]:
            console.print(f"  tick {ev.tick:>4}  {ev.kind:<10} {ev.job_id}: {ev.detail}")


def learning_command(console: Console, scenario: str, policy: str, seed: int,
                     out: Path) -> None:
    _, run = _replay(console, scenario, policy, seed)
    base = out / f"{run.scenario}-{policy}-s{seed}-learning"
    write_csv(run, base.with_suffix(".csv"))
    plot(run, base.with_suffix(".png"))
    s = summary(run)
    t = Table(title=f"Learning on {run.scenario} ({policy}, seed {seed}): first vs last third")
    for col in ("quantity", "first third", "last third"):
        t.add_column(col, justify="right")
    for key in sorted({k.rsplit("_", 1)[0] for k in s if k.endswith(("_first", "_last"))}):
        t.add_row(key, _f(s.get(f"{key}_first")), _f(s.get(f"{key}_last")))
    console.print(t)
    console.print(f"realised coverage at the end (target {run.coverage_target:.2f}): TTFT p95 "
                  f"{_f(s['coverage_ttft_p95_final'])}, TPOT p95 "
                  f"{_f(s['coverage_tpot_p95_final'])}")
    console.print(f"mechanisms discovered: {s['mechanisms_discovered']:.0f}; median tick "
                  f"{s['tick_s_median']:.3f} s")
    console.print(f"wrote {base.with_suffix('.png')} and {base.with_suffix('.csv')}")


def tick_command(console: Console, scenario: str, policy: str, seed: int, ticks: int,
                 out: Path | None = None) -> None:
    scn, run = _replay(console, scenario, policy, seed, until_tick=ticks - 1)
    t = Table(title=f"Planning tick on {run.scenario} ({policy}, seed {seed}, "
                    f"first {len(run.reports)} ticks)")
    for col in ("stage", "median s", "p90 s"):
        t.add_column(col, justify="right")
    for stage, (median, p90) in stage_times(run).items():
        t.add_row(stage, f"{median:.3f}", f"{p90:.3f}")
    console.print(t)
    console.print(f"peak resident memory {peak_rss_mib():.0f} MiB")
    if out is not None:
        from koi.bench import scale
        from koi.bench.suite import git_commit, machine

        record = scale.tick_record(run, gpus=scn.total_gpus, jobs=len(scn.jobs),
                                   peak_rss_mib=peak_rss_mib(), commit=git_commit(),
                                   machine=machine())
        if record["offerings_over_capacity"]:
            console.print(f"[red]{record['offerings_over_capacity']} (tick, offering) "
                          "pairs where a plan occupies more GPUs than it was given[/red]")
        scale.append(out / scale.TICKS, record)
        console.print(f"appended to {out / scale.TICKS}")


def _f(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"
