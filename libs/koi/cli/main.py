"""The domain's command line: predict, calibrate, bench, explain, profile, scenario, rlm.

Thin: parses flags, calls the domain library, prints with rich. Each subcommand's
logic lives in ``koi.*``; nothing here decides anything. The commands that need the
bus or a cluster (serve, submit, events, demo, plan, security, bench bus, bench
admission) are added to ``app`` by ``services.koi_command``, which the ``koi`` console
script runs: this module must not import ``services``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from koi.cli.bench_cmd import power_command, report_command
from koi.cli.help_text import reflow_app
from koi.cli.rlm_cmd import rlm_app

app = typer.Typer(help="Koi: a self-calibrating planner for LLM inference fleets.",
                  no_args_is_help=True, add_completion=False)
bench_app = typer.Typer(help="Benchmarks: policies through scenarios (options below), or the"
                        " predictor's speed and accuracy (subcommands).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
scenario_app = typer.Typer(help="Scenarios: generate new ones from the catalog.",
                           no_args_is_help=True)
app.add_typer(scenario_app, name="scenario")
app.add_typer(rlm_app, name="rlm")
console = Console()

Opt = typer.Option


@app.command()
def predict(
    model: Annotated[str | None, Opt(help="Model id, e.g. llama-3.1-70b.")] = None,
    accelerator: Annotated[str | None, Opt(help="Accelerator id, e.g. h100-sxm.")] = None,
    tp: Annotated[int, Opt(help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, Opt(help="Pipeline-parallel degree.")] = 1,
    engine: Annotated[str, Opt(help="vllm | sglang | trtllm.")] = "vllm",
    precision: Annotated[str, Opt(help="bf16|fp16|fp8|int8|int4|fp4.")] = "bf16",
    kv_dtype: Annotated[str | None, Opt(help="auto|bf16|fp16|fp8.")] = None,
    input_len: Annotated[int | None, Opt(help="Prompt tokens.")] = None,
    output_len: Annotated[int | None, Opt(help="Generated tokens.")] = None,
    concurrency: Annotated[float | None, Opt(help="Closed-loop clients.")] = None,
    rate: Annotated[float | None, Opt(help="Poisson arrivals, req/s.")] = None,
    replicas: Annotated[int, Opt(help="Data-parallel replicas.")] = 1,
    offering: Annotated[str | None, Opt(help="Offering id for the price.")] = None,
    slo_ttft_ms: Annotated[float | None, Opt(help="TTFT SLO (p95) for max rate.")] = None,
    slo_tpot_ms: Annotated[float | None, Opt(help="TPOT SLO (p95) for max rate.")] = None,
    set_knobs: Annotated[list[str] | None, Opt("--set", help="Any knob: --set max_num_seqs=64"
                                                ".")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print one JSON object.")] = False,
    batch: Annotated[Path | None, Opt(help="JSON-lines file of requests ('-' = stdin).")] = None,
) -> None:
    """Predict serving behaviour of one configuration (without --concurrency/--rate: the
    offline, as-many-as-fit throughput)."""
    from koi.cli.predict import predict_command

    predict_command(model=model, accelerator=accelerator, tp=tp, pp=pp, engine=engine,
                    precision=precision, kv_dtype=kv_dtype, input_len=input_len,
                    output_len=output_len, concurrency=concurrency, rate=rate,
                    replicas=replicas, offering=offering, slo_ttft_ms=slo_ttft_ms,
                    slo_tpot_ms=slo_tpot_ms, set_knobs=set_knobs, as_json=as_json, batch=batch)


@app.command()
def calibrate(
    write: Annotated[bool, Opt(help="Write libs/koi/predictor/data/calibration.yaml.")] = False,
    cv: Annotated[bool, Opt(help="Also leave-one-source-out cross-validation.")] = False,
) -> None:
    """Fit the efficiency-factor table on the public measurements and show the fit."""
    from koi.cli.reports import calibrate_report

    calibrate_report(console, write=write, cv=cv)


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    scenario: Annotated[list[str] | None, Opt(help="Scenario name or YAML file (repeatable).")
                        ] = None,
    scenarios: Annotated[str | None, Opt(help="Several scenarios: a,b,c.")] = None,
    policy: Annotated[list[str] | None, Opt(help="Registered policy (repeatable); default:"
                                             " every registered policy (koi-rlm, llm-only and"
                                             " llm-tools only with KOI_RLM_BASE_URL and"
                                             " KOI_RLM_MODEL set).")] = None,
    policies: Annotated[str | None, Opt(help="Several policies: a,b,c.")] = None,
    seed: Annotated[list[int] | None, Opt(help="Seed (repeatable); default 1.")] = None,
    seeds: Annotated[str | None, Opt(help="Several seeds: 1,2,3.")] = None,
    json_out: Annotated[Path | None, Opt("--json", help="Write each run's metrics as JSON"
                                         " (one object, or a list; '-' = stdout).")] = None,
    out: Annotated[Path, Opt(help="Directory for table.md, table.csv, runs.jsonl and plots.")
                   ] = Path("out/bench"),
    sample_fraction: Annotated[float | None, Opt(help="Share of online requests simulated;"
                                                 " default: the simulator's automatic one.")
                               ] = None,
    plots: Annotated[bool | None, Opt("--plots/--no-plots", help="PNG figures per run"
                                      " (default: only for a single run).")] = None,
    jobs: Annotated[bool, Opt("--jobs/--no-jobs", help="Also a per-job table (SLO met,"
                              " batch progress, GPU-hours by family, swaps / relaunches /"
                              " scales), jobs.csv, and per-job rows in the JSON.")] = False,
    telemetry: Annotated[str, Opt(help="What the policies read: sim (the simulator's own"
                                  " telemetry) or pages (the same read back from the"
                                  " simulated engines' /metrics pages, as from a real"
                                  " fleet).")] = "sim",
) -> None:
    """Run policies through simulated scenarios: the preprint's table columns, mean ±
    half-range over seeds, as a rich table, markdown and CSV."""
    if ctx.invoked_subcommand is not None:
        return
    from koi.cli.bench_cmd import bench_command, parse_seeds, split_list

    bench_command(console,
                  scenarios=[*(scenario or []), *split_list([scenarios or ""])],
                  policies=[*(policy or []), *split_list([policies or ""])],
                  seeds=[*(seed or []), *parse_seeds(split_list([seeds or ""]))],
                  json_out=json_out, out=out, sample_fraction=sample_fraction, plots=plots,
                  jobs=jobs, telemetry_path=telemetry)


@bench_app.command("predictor")
def bench_predictor(
    candidates: Annotated[int, Opt(help="Candidates per run.")] = 1_000_000,
    runs: Annotated[int, Opt(help="Timed runs of the numba kernel (median).")] = 5,
    numpy_runs: Annotated[int, Opt(help="Timed runs of the numpy reference.")] = 3,
    json_out: Annotated[Path | None, Opt("--json", help="Write results as JSON.")] = None,
    kernels: Annotated[bool | None, Opt("--kernels/--roofline", help="Time passes from the "
                                        "measured kernel tables where they cover a config, "
                                        "or the roofline everywhere (default: the "
                                        "predictor's default).")] = None,
) -> None:
    """Predictions per second: numba kernel vs numpy reference (one core)."""
    from koi.bench.predictor_speed import run

    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    with console.status("timing…") as status:
        results = run(candidates, runs, numpy_runs,
                      progress=lambda s: status.update(f"timing {s}…"), kernels=kernels)
    table = Table(title=f"Predictor speed, {candidates:,} candidates (median of runs)")
    for col in ("backend", "runs", "median wall s", "predictions/s (wall)",
                "predictions/s (CPU)", "all runs, wall s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.backend, str(r.runs), f"{r.median_s:.3f}", f"{r.per_s:,.0f}",
                      f"{r.cpu_per_s:,.0f}", " ".join(f"{t:.3f}" for t in r.all_s))
    console.print(table)
    if len(results) > 1:
        console.print(f"numba / numpy speed-up: {results[0].per_s / results[1].per_s:.1f}×")
    if json_out:
        json_out.write_text(json.dumps([r.__dict__ for r in results], indent=2))


@bench_app.command("accuracy")
def bench_accuracy(
    markdown: Annotated[bool, Opt(help="Print markdown tables (for docs).")] = False,
    rows: Annotated[bool, Opt(help="Also list every case.")] = False,
    compare: Annotated[bool, Opt(help="Held-out errors with and without the measured "
                                      "kernel tables, by source, accelerator, engine and "
                                      "metric, and the rows where they disagree most.")
                       ] = False,
    parts: Annotated[bool, Opt(help="With --compare: also split the held-out decode pass "
                                    "of every TPOT row into its parts (GEMM, all-reduce, "
                                    "LM head, attention, overhead) for both predictors.")
                     ] = False,
) -> None:
    """Median absolute % error against shared/data/perf_measurements.csv."""
    if compare:
        from koi.predictor.compare import compare_held_out
        from koi.predictor.compare import markdown as compare_markdown

        with console.status("cross-validating both predictors…"):
            print(compare_markdown(compare_held_out()))
        if parts:
            from koi.predictor.breakdown import held_out_breakdown
            from koi.predictor.breakdown import markdown as parts_markdown

            print()
            print(parts_markdown(held_out_breakdown()))
        return
    from koi.cli.reports import accuracy_tables

    accuracy_tables(console, markdown=markdown, rows=rows)


@bench_app.command("steps")
def bench_steps(
    markdown: Annotated[bool, Opt(help="Print markdown tables (for docs).")] = False,
    rows: Annotated[bool, Opt(help="Also list every point.")] = False,
    file: Annotated[Path | None, Opt(help="Step times from scripts/gpu_steps.py (default: "
                                          "the H200 runs shipped with Koi).")] = None,
    accelerator: Annotated[str, Opt(help="Accelerator id the file was measured on.")] = "h200",
) -> None:
    """Measured forward-pass step times on a GPU against the predictor's roofline."""
    from koi.cli.reports import steps_tables
    from koi.errors import KoiError
    from koi.predictor.steps import compare_steps

    try:
        comparison = compare_steps(file, accelerator)
    except KoiError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    steps_tables(console, comparison, markdown=markdown, rows=rows)


@bench_app.command("kernels")
def bench_kernels(
    markdown: Annotated[bool, Opt(help="Print markdown tables (for docs).")] = False,
    rows: Annotated[bool, Opt(help="Also list every layer pass.")] = False,
    file: Annotated[Path | None, Opt(help="Kernel times from scripts/gpu_kernels.py "
                                          "(default: the H200 runs shipped with Koi).")] = None,
    accelerator: Annotated[str, Opt(help="Accelerator id the file was measured on.")] = "h200",
) -> None:
    """Measured GEMM, attention and chunked-prefill passes against the kernel tables and
    the roofline."""
    from koi.cli.reports import kernels_tables
    from koi.errors import KoiError
    from koi.predictor.kernel_evidence import compare_kernels

    try:
        comparison = compare_kernels(file, accelerator)
    except KoiError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    kernels_tables(console, comparison, markdown=markdown, rows=rows)


@bench_app.command("thinning")
def bench_thinning(
    model: Annotated[str, Opt(help="Model id.")] = "qwen2.5-7b",
    accelerator: Annotated[str, Opt(help="Accelerator id.")] = "l40s",
    engine: Annotated[str, Opt(help="Engine id (its default knobs).")] = "sglang",
    precision: Annotated[str, Opt(help="Weight precision.")] = "fp8",
    rate: Annotated[float, Opt(help="Offered req/s on the replica.")] = 2.25,
    input_mean: Annotated[float, Opt(help="Mean prompt tokens (lognormal).")] = 2048,
    input_sigma: Annotated[float, Opt(help="Lognormal sigma of prompt tokens.")] = 0.5,
    output_mean: Annotated[float, Opt(help="Mean output tokens (lognormal).")] = 28,
    output_sigma: Annotated[float, Opt(help="Lognormal sigma of output tokens.")] = 1.11,
    prefix_hit: Annotated[float, Opt(help="Share of prompt tokens from the prefix cache.")]
    = 0.4,
    weights: Annotated[str, Opt(help="Group sizes to compare: 1,6,36.")] = "1,6,36",
    spread: Annotated[bool, Opt(help="Groups as the simulator makes them (every w-th "
                                     "request, members spread out); --no-spread: kept "
                                     "at random and arriving at once, as before "
                                     "2026-11-30.")] = True,
) -> None:
    """What thinning does to one simulated replica: single requests vs groups of w
    (hetero-12h simulates w ≈ 36, hetero-3h ≈ 6, real-104 ≈ 2)."""
    from rich.table import Table

    from koi.errors import KoiError
    from koi.jobs.lengths import LengthDist
    from koi.sim.thinning import burst_probe
    from koi.space import engine_default_config

    try:
        cfg = engine_default_config(model, accelerator, engine, weight_precision=precision)
        ws = [float(w) for w in weights.split(",") if w.strip()]
        rows = burst_probe(cfg, rate_rps=rate, weights=ws, prefix_hit=prefix_hit, spread=spread,
                           input_len=LengthDist.lognormal(input_mean, input_sigma),
                           output_len=LengthDist.lognormal(output_mean, output_sigma))
    except (KoiError, ValueError, KeyError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    how = "spread" if spread else "at once"
    table = Table(title=f"{model} on {accelerator} ({engine}, {precision}), {rate:g} req/s,"
                        f" groups {how}")
    for col in ("w", "TTFT mean ms", "TTFT p95 ms", "TPOT mean ms", "TPOT p95 ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r.weight:g}", f"{r.ttft_mean_ms:,.1f}", f"{r.ttft_p95_ms:,.1f}",
                      f"{r.tpot_mean_ms:,.1f}", f"{r.tpot_p95_ms:,.1f}")
    console.print(table)


@bench_app.command("learning")
def bench_learning(
    scenario: Annotated[str, Opt(help="Scenario name or YAML file.")] = "hetero-3h",
    policy: Annotated[str, Opt(help="koi or one of its ablations.")] = "koi",
    seed: Annotated[int, Opt(help="Seed.")] = 1,
    out: Annotated[Path, Opt(help="Directory for the CSV and PNG.")] = Path("out/learning"),
) -> None:
    """Prediction error, DRO radius and coverage, mechanisms over a Koi run (plot + CSV)."""
    from koi.cli.explain_cmd import learning_command

    learning_command(console, scenario, policy, seed, out)


@bench_app.command("tick")
def bench_tick(
    scenario: Annotated[str, Opt(help="Scenario name or YAML file.")] = "hetero-12h",
    policy: Annotated[str, Opt(help="koi or one of its ablations.")] = "koi",
    seed: Annotated[int, Opt(help="Seed.")] = 1,
    ticks: Annotated[int, Opt(help="Time the first N planning ticks.", min=1)] = 90,
    out: Annotated[Path | None, Opt(help="Directory whose ticks.jsonl gets this run's "
                                         "record (koi bench report's Scale section).")
                   ] = None,
) -> None:
    """Planning-tick time (propose → evaluate → compose → place, and learn): median and
    p90 per stage over the first --ticks ticks."""
    from koi.cli.explain_cmd import tick_command

    tick_command(console, scenario, policy, seed, ticks, out)


bench_app.command("report")(report_command)
bench_app.command("power")(power_command)


@bench_app.command("suite")
def bench_suite(
    generated: Annotated[str, Opt(help="Generated scenario seeds A-B (inclusive, at most "
                                       "1000); seeds >= 1000 are held out.")],
    size: Annotated[str, Opt(help="small | medium | large | xlarge.")] = "medium",
    policies: Annotated[str | None, Opt(help="Policies a,b,c; default: every registered "
                                             "policy (those that need a language model only "
                                             "with KOI_RLM_BASE_URL and KOI_RLM_MODEL set)."
                                        )] = None,
    workers: Annotated[int, Opt(help="Parallel processes (1: in-process).", min=1, max=16)
                       ] = 2,
    out: Annotated[Path, Opt(help="Directory for runs.jsonl, failures.jsonl and suite.md; "
                                  "runs already there are skipped.")] = Path("out/suite"),
    sample_fraction: Annotated[float | None, Opt(help="Share of online requests simulated;"
                                                 " default: the simulator's own.")] = None,
    ticks: Annotated[int | None, Opt(help="Only each scenario's first N ticks (smoke runs).",
                                     min=1)] = None,
) -> None:
    """Every policy on every generated scenario gen-<size>-<seed>: resumable, in parallel,
    with each policy's mean score and the paired comparison to koi."""
    import sys

    from koi.bench.suite import SuiteConfig, parse_range, run_suite
    from koi.cli.bench_cmd import split_list
    from koi.policies import default_policy_names, model_endpoint_problem, policy_names
    from koi.scenario.generate import SIZES

    try:
        first, last = parse_range(generated)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--generated") from None
    if size not in SIZES:
        raise typer.BadParameter(f"one of {', '.join(SIZES)} (got {size!r})",
                                 param_hint="--size")
    known = policy_names()
    chosen = split_list([policies or ""]) or default_policy_names()
    unknown = [p for p in chosen if p not in known]
    if unknown:
        raise typer.BadParameter(f"unknown {', '.join(map(repr, unknown))}; known: "
                                 f"{', '.join(known)}", param_hint="--policies")
    no_model = model_endpoint_problem(chosen)
    if no_model:
        raise typer.BadParameter(no_model, param_hint="--policies")
    if "koi-rlm" in chosen:  # its round transcripts go beside the suite's records
        os.environ.setdefault("KOI_RLM_TRANSCRIPTS", str(out / "rlm"))
    if sample_fraction is not None and not 0.0 < sample_fraction <= 1.0:
        raise typer.BadParameter(f"must be in (0, 1] (got {sample_fraction})",
                                 param_hint="--sample-fraction")
    run_suite(SuiteConfig(first, last, size, tuple(dict.fromkeys(chosen)), workers, out,
                          sample_fraction, ticks, command=" ".join(["koi", *sys.argv[1:]])),
              say=lambda line: console.print(line, soft_wrap=True, markup=False))


@app.command()
def explain(
    scenario: Annotated[str, Opt(help="Scenario name or YAML file.")] = "hetero-3h",
    job: Annotated[str, Opt(help="Job id.")] = "",
    tick: Annotated[int, Opt(help="Planning tick to explain.")] = 5,
    seed: Annotated[int, Opt(help="Seed.")] = 1,
    policy: Annotated[str, Opt(help="koi or one of its ablations.")] = "koi",
) -> None:
    """Why a job is where it is at a tick: replays the scenario and explains the plan."""
    from koi.cli.explain_cmd import explain_command

    explain_command(console, scenario, job, tick, seed, policy)


@app.command()
def profile(
    scenario: Annotated[str, Opt(help="Scenario name or YAML file.")],
    seed: Annotated[int, Opt(help="Run seed: the world profiled (a randomized world is drawn"
                                  " from it, as the simulator draws it) and the noise.")] = 1,
    out: Annotated[Path | None, Opt("--out", "-o", help="JSON file to write (default: "
                                                        "out/profile/<scenario>-s<seed>.json).")
                   ] = None,
) -> None:
    """Profile every job's candidate replica shapes in the scenario's world, as the
    profiled baselines do before planning: saturated tok/s, p95 TTFT/TPOT over a load
    sweep, and the highest rate under each job's SLO."""
    from koi.cli.profile_cmd import profile_command

    profile_command(console, scenario, seed, out)


@scenario_app.command("generate")
def scenario_generate(
    seed: Annotated[int, Opt(help="Seed, >= 0; the same seed and size give the same file."
                                  " Seeds >= 1000 are held out for evaluation.")],
    size: Annotated[str, Opt(help="small (32-96 GPUs, 3-8 jobs, 1-2 h) | medium (150-400,"
                                  " 10-25, 2-4 h) | large (400-1200, 25-60, 4-8 h) |"
                                  " xlarge (8000-12000, 400-600, 8-12 h).")
                    ] = "medium",
    out: Annotated[Path | None, Opt("--out", "-o", help="File to write (default: stdout).")
                   ] = None,
) -> None:
    """Write a scenario drawn from the catalog (docs/SCENARIOS.md, "Generated scenarios")."""
    from koi.scenario.generate import SIZES, generate_scenario, scenario_yaml

    if seed < 0:
        raise typer.BadParameter(f"--seed must be >= 0 (got {seed})")
    if size not in SIZES:
        raise typer.BadParameter(f"--size must be one of {', '.join(SIZES)} (got {size!r})")
    text = scenario_yaml(generate_scenario(seed, size))
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise typer.BadParameter(f"cannot write {out}: {e.strerror}") from None
    typer.echo(f"wrote {out} (gen-{size}-{seed})", err=True)


reflow_app(app)  # every command is registered by now: let the terminal wrap their help

if __name__ == "__main__":
    app()
