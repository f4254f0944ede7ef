"""``koi bench --scenario … --policy …``: run policies through scenarios and report;
``koi bench report``: one results document from the runs already made.

Thin: resolves names (unknown ones exit 2 with the known names), drives
``koi.bench.runner.run_matrix`` under a rich progress bar, and writes what
``koi.bench.report``, ``koi.bench.plots`` and ``koi.bench.results`` render. No metric or
simulation logic here.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from koi.errors import KoiError

if TYPE_CHECKING:
    from koi.bench.runner import RunResult

DEFAULT_OUT = Path("out/bench")
DEFAULT_RUNS = Path("out")
DEFAULT_RESULTS = Path("docs/RESULTS.md")


def split_list(values: Sequence[str] | None) -> list[str]:
    """``["a,b", "c"]`` → ``["a", "b", "c"]`` (repeatable and comma-separated flags)."""
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def parse_seeds(values: Sequence[str]) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise typer.BadParameter(f"seeds must be integers (got {', '.join(values)})",
                                 param_hint="--seed/--seeds") from None


def bench_command(console: Console, *, scenarios: list[str], policies: list[str],
                  seeds: list[int], json_out: Path | None, out: Path,
                  sample_fraction: float | None, plots: bool | None,
                  jobs: bool = False, telemetry_path: str = "sim") -> None:
    from koi.bench.report import results_json, run_json
    from koi.bench.runner import RunProgress, run_matrix
    from koi.bench.suite import git_commit, machine
    from koi.policies import default_policy_names, model_endpoint_problem, policy_names
    from koi.scenario import list_scenarios, load_scenario

    if not scenarios:
        _fail(console, "give --scenario NAME|FILE (or --scenarios a,b)",
              f"shipped scenarios: {', '.join(list_scenarios())}")
    known_policies = policy_names()
    policies = policies or default_policy_names()
    unknown = [p for p in policies if p not in known_policies]
    if unknown:
        _fail(console, f"unknown policy {', '.join(map(repr, unknown))}",
              f"known policies: {', '.join(known_policies)}")
    no_model = model_endpoint_problem(policies)
    if no_model:
        _fail(console, no_model, "")
    if "koi-rlm" in policies:  # its round transcripts go beside the run's other outputs
        os.environ.setdefault("KOI_RLM_TRANSCRIPTS", str(out / "rlm"))
    loaded = []
    for name in scenarios:
        try:
            loaded.append(load_scenario(name))
        except (KoiError, OSError) as exc:
            hint = "" if "shipped" in str(exc) else f"shipped: {', '.join(list_scenarios())}"
            _fail(console, str(exc), hint)
    from koi.fleet.simulated import TELEMETRY_PATHS
    if telemetry_path not in TELEMETRY_PATHS:
        _fail(console, f"--telemetry must be one of {', '.join(TELEMETRY_PATHS)} "
                       f"(got {telemetry_path!r})", "")
    if sample_fraction is not None and not 0.0 < sample_fraction <= 1.0:
        _fail(console, f"--sample-fraction must be in (0, 1] (got {sample_fraction})", "")
    seeds = seeds or [1]
    runs = len(loaded) * len(policies) * len(seeds)
    plot_each = plots if plots is not None else runs == 1

    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "runs.jsonl"
    jsonl.write_text("")
    # where the runs ran (and, when not the simulator's own, what they read), for the report
    stamp = {"commit": git_commit(), **machine(),
             **({"telemetry": telemetry_path} if telemetry_path != "sim" else {})}

    def on_result(res: RunResult) -> None:  # partial results survive an interrupted matrix
        with jsonl.open("a") as fh:
            fh.write(json.dumps({**run_json(res, jobs=jobs), "bench": stamp}) + "\n")
        if plot_each:
            from koi.bench.plots import write_plots

            write_plots(res, out)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        all_runs = bar.add_task("runs", total=runs)
        ticks = bar.add_task("ticks", total=1)

        def progress(p: RunProgress) -> None:
            if p.tick == 0:
                bar.update(all_runs, completed=p.run_index,
                           description=f"run {p.run_index + 1}/{p.runs}")
                bar.reset(ticks, total=p.ticks,
                          description=f"{p.scenario} · {p.policy} · s{p.seed}")
            bar.update(ticks, completed=p.tick)
            if p.tick >= p.ticks:
                bar.update(all_runs, completed=p.run_index + 1)

        results = run_matrix(loaded, policies, seeds, sample_fraction=sample_fraction,
                             progress=progress, on_result=on_result,
                             telemetry_path=telemetry_path)

    _print_and_write(console, results, out)
    if jobs:
        _print_and_write_jobs(console, results, out)
    if plot_each:
        console.print(f"plots: {out}/<scenario>-<policy>-s<seed>-{{gpus,slo,cost}}.png")
    if json_out is not None:
        text = json.dumps(results_json(results, jobs=jobs), indent=2)
        if str(json_out) == "-":
            print(text)
        else:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(text + "\n")
            console.print(f"json: {json_out}")


def report_command(
    runs: Annotated[list[Path] | None, typer.Argument(
        help="runs.jsonl files, or directories searched for them (those of koi bench --out "
             "and koi bench suite --out); default: out/.", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Markdown file to write ('-': "
                                                          "stdout).")] = DEFAULT_RESULTS,
) -> None:
    """One results document from the runs already made: per generated suite, each
    policy's mean score, Koi against each (paired bootstrap) and the bar; per shipped
    scenario, the koi bench table. Runs nothing."""
    from koi.bench import scale
    from koi.bench.results import load_run_files, render
    from koi.policies import policy_class, policy_names
    from koi.scenario import list_scenarios

    console = Console(stderr=True)
    paths = runs or [DEFAULT_RUNS]
    try:
        files = load_run_files(paths)
    except FileNotFoundError as exc:
        _fail(console, str(exc), "give runs.jsonl files or the --out directories of "
                                 "koi bench / koi bench suite")
    command = shlex.join(["koi", "bench", "report", *map(str, paths), "-o", str(out)])
    text = render(files, command=command, shipped=list_scenarios(),
                  needs_model=[n for n in policy_names() if policy_class(n).needs_model],
                  ticks=scale.load(paths),
                  date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    if str(out) == "-":
        print(text, end="")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    runs_read = sum(len(f.records) for f in files)
    console.print(f"wrote {out}: {runs_read} runs from {len(files)} runs.jsonl file(s)",
                  soft_wrap=True, markup=False)


def power_command(
    runs: Annotated[list[Path] | None, typer.Argument(
        help="runs.jsonl files, or directories searched for them; default: out/.",
        show_default=False)] = None,
    target: Annotated[float, typer.Option(help="The difference to be able to see, in the "
                                               "metric's units.", min=1e-9)] = 1.0,
    reference: Annotated[str, typer.Option(help="The policy compared with.")] = "koi",
    metric: Annotated[str, typer.Option(help="The metric (score: the overall score).")
                      ] = "score",
) -> None:
    """Statistical power of runs already made: per policy paired with the reference, the
    spread of the paired differences, the minimum detectable difference (80 % power,
    two-sided 5 %) with the pairs there are, and how many pairs that spread would need to
    see TARGET. Runs nothing."""
    from koi.bench.results import load_run_files
    from koi.bench.stats import format_power, power_table

    console = Console(stderr=True)
    try:
        files = load_run_files(runs or [DEFAULT_RUNS])
    except FileNotFoundError as exc:
        _fail(console, str(exc), "give runs.jsonl files or the --out directories of "
                                 "koi bench / koi bench suite")
    records = [r for f in files for r in f.records]
    try:
        rows = power_table(records, target, metric, reference)
    except KeyError as exc:
        _fail(console, f"metric {metric!r} not in the runs ({exc})", "see docs/BENCHMARKS.md")
    if not rows:
        _fail(console, f"no policy is paired with {reference!r} in these runs",
              "run the reference on the same (scenario, seed)s")
    print(format_power(rows), end="")


def _print_and_write(console: Console, results: Sequence[RunResult], out: Path) -> None:
    from koi.bench.report import csv_text, markdown_table, rich_table, summarise

    rows = summarise(results)
    _wide(console).print(rich_table(rows))
    for r in results:
        if r.model_spend is not None:  # the planner's own language-model calls
            s = r.model_spend
            console.print(f"{r.scenario} · {r.policy} · s{r.seed}: the model cost "
                          f"{s['tokens']:,} tokens, ${s['usd']:.4f}, {s['calls']} calls "
                          f"({s['seconds']:.1f} s); runs.jsonl has the rest (model_spend)")
        if r.policy_failures:
            f = r.policy_failures[0]
            console.print(f"[red]{r.scenario} · {r.policy} · s{r.seed}: the policy raised in "
                          f"{len(r.policy_failures)} ticks[/] (first at tick {f.tick}: "
                          f"{f.error} at {f.where}); those ticks ran with no actions")
    (out / "table.md").write_text(markdown_table(rows))
    (out / "table.csv").write_text(csv_text(rows))
    console.print(f"table: {out / 'table.md'}, {out / 'table.csv'}; runs: {out / 'runs.jsonl'}")


def _print_and_write_jobs(console: Console, results: Sequence[RunResult], out: Path) -> None:
    from koi.bench.jobs import job_rows, jobs_csv, jobs_rich_table
    from koi.bench.report import churn_markdown, run_json

    rows = job_rows(results)
    _wide(console).print(jobs_rich_table(rows))
    (out / "jobs.csv").write_text(jobs_csv(rows))
    churn = churn_markdown([run_json(r) for r in results])
    (out / "churn.md").write_text(churn)
    _wide(console).print(churn, markup=False, soft_wrap=True)
    console.print(f"per job: {out / 'jobs.csv'}; churn: {out / 'churn.md'}")


def _wide(console: Console) -> Console:
    """A pipe or a log file gets the full table, not one squeezed into 80 columns."""
    return console if console.is_terminal else Console(file=console.file, width=220)


def _fail(console: Console, message: str, hint: str) -> NoReturn:
    console.print(f"[red]error:[/] {message}")
    if hint:
        console.print(hint)
    raise typer.Exit(2)


__all__ = ["DEFAULT_OUT", "bench_command", "parse_seeds", "power_command", "report_command",
           "split_list"]
