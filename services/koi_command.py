"""The ``koi`` command: the domain's command line (``koi.cli.main.app``) plus the commands
that run on the bus or against a cluster: serve, submit, events follow, demo, plan,
security, settings, bench bus and bench admission.

The ``koi`` console script points here, so one ``koi`` has every command while the
domain library never imports ``services``. Thin, as ``koi.cli.main`` is: flags in,
``services.*`` called, lines out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from koi.cli.help_text import reflow_app
from koi.cli.main import Opt, app, bench_app, console

events_app = typer.Typer(help="The operator event log.", no_args_is_help=True)
app.add_typer(events_app, name="events")


@bench_app.command("bus")
def bench_bus(
    scenario: Annotated[str, Opt(help="Scenario.")] = "hetero-3h",
    seed: Annotated[int, Opt(help="Seed.")] = 1,
    horizon_s: Annotated[float | None, Opt(help="Cut the scenario to this many seconds.")
                         ] = None,
    runs: Annotated[int, Opt(help="Runs of each (medians are reported).")] = 3,
    evaluators: Annotated[str, Opt(help="Evaluator replica counts to compare for the "
                                        "evaluate stage; '' skips it.")] = "",
    proposers: Annotated[str, Opt(help="Proposer replica counts to compare for the "
                                       "propose stage, with the model of 1-8 machines; "
                                       "'' skips it.")] = "",
    eval_scenario: Annotated[str, Opt(help="Scenario of the scale-out comparisons "
                                           "(--evaluators, --proposers).")
                             ] = "hetero-12h",
    eval_horizon_s: Annotated[float | None, Opt(help="Its horizon cut.")] = 7200.0,
    replicas: Annotated[str, Opt(help="Replicas in the overhead runs, e.g. "
                                      "proposer=2,evaluator=2 (default one of each).")] = "",
    telemetry: Annotated[bool, Opt(help="Also run the scenario once with the sim "
                                        "publishing telemetry and once with engine "
                                        "/metrics pages scraped, and compare.")] = False,
) -> None:
    """The bus's overhead against the in-process run (medians of --runs), the evaluate
    and propose stages with 1 vs more evaluator or proposer replicas, and (--telemetry)
    telemetry over the bus against telemetry read from engine pages over HTTP."""
    import statistics

    from services.bench import (
        overhead,
        parse_replicas,
        scale_out,
        scale_out_lines,
        telemetry_paths,
    )

    if telemetry:
        t = telemetry_paths(scenario, seed, horizon_s, progress=console.print)
        first = "none" if t.first_difference is None else str(t.first_difference)
        console.print(f"{t.scenario} seed {t.seed}, {t.ticks} ticks: score with telemetry "
                      f"over the bus {t.score['bus']:.2f}, over HTTP {t.score['http']:.2f} "
                      f"(difference {t.difference:+.2f}); identical decisions on "
                      f"{t.same_ticks}/{t.ticks} ticks, first difference at tick {first}; "
                      f"wall {t.wall_s['bus']:.0f} s vs {t.wall_s['http']:.0f} s")
    if runs > 0:
        r = overhead(scenario, seed, horizon_s, runs, progress=console.print,
                     replicas=parse_replicas(replicas))
        console.print(f"{r.scenario} seed {r.seed}, {r.horizon_s:.0f} s: in-process median "
                      f"{statistics.median(r.in_process_s):.1f} s {list(map(_s, r.in_process_s))}"
                      f", bus median {statistics.median(r.bus_s):.1f} s "
                      f"{list(map(_s, r.bus_s))}; ratio {r.ratio:.2f}×; metrics "
                      f"{'identical' if r.same_metrics else 'DIFFER'}; replicas "
                      f"{dict(r.replicas) or 'one of each'}")
        if r.peak_rss_mib:
            console.print("peak resident memory per service (MiB): " + ", ".join(
                f"{name} {mib:.0f}" for name, mib in sorted(r.peak_rss_mib.items())),
                soft_wrap=True)
    for service, text in (("evaluator", evaluators), ("proposer", proposers)):
        counts = tuple(int(x) for x in text.split(",") if x.strip())
        if counts:
            s = scale_out(eval_scenario, seed, eval_horizon_s, counts,
                          progress=console.print, service=service)
            for line in scale_out_lines(s):
                console.print(line, soft_wrap=True)


def _s(x: float) -> str:
    return f"{x:.1f}"


@bench_app.command("admission")
def bench_admission(
    rates: Annotated[str, Opt(help="Offered submissions/s, comma-separated.")
                     ] = "500,1000,2000,4000,8000",
    duration_s: Annotated[float, Opt(help="Seconds of sending at each rate.")] = 4.0,
    runs: Annotated[int, Opt(help="Runs at each rate (each on a fresh NATS; the median "
                                  "row is printed after them).")] = 1,
    replicas: Annotated[int, Opt(help="Placer replicas answering (queue group).")] = 2,
    timeout_s: Annotated[float, Opt(help="Seconds a sender waits for each ack.")] = 2.0,
    out: Annotated[Path, Opt(help="Directory for the placers' logs.")
                   ] = Path("out/bench-admission"),
    secure: Annotated[bool, Opt("--secure/--plain", help="NATS as deployed (TLS, one user "
                                "per role) or plain TCP without accounts.")] = True,
    deadline: Annotated[bool, Opt("--deadline/--no-deadline", help="Send each request's "
                                  "wait as its deadline (Koi-Deadline-Ms), as koi submit "
                                  "does, or send none.")] = True,
) -> None:
    """Job admission under load: acked/s, ack latency, busy answers, and whether every
    accepted job is stored exactly once (a fresh NATS and placers per run)."""
    from services.bench_admission import HEADER, format_row, knee, median_row, sweep
    from services.runtime.logs import configure_logging

    configure_logging("bench-admission", "warning", "console")  # the table alone on stdout

    try:
        wanted = tuple(float(x) for x in rates.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--rates takes numbers, comma-separated (got {rates!r})"
                                 ) from None
    if not wanted or not all(0 < r <= 100_000 for r in wanted):
        raise typer.BadParameter(f"--rates must be in (0, 100000] (got {rates!r})")
    if duration_s <= 0 or timeout_s <= 0 or runs < 1 or replicas < 1:
        raise typer.BadParameter("--duration-s and --timeout-s must be > 0, --runs and "
                                 "--replicas >= 1")

    def say(line: str) -> None:
        console.print(line, soft_wrap=True)

    say(HEADER)
    per = sweep(wanted, duration_s, timeout_s, replicas, runs, out, progress=say,
                secure=secure, deadline=deadline)
    medians = {rate: median_row(rows) for rate, rows in per.items()}
    if runs > 1:
        say(f"median of {runs} runs:")
        for row in medians.values():
            say(format_row(row))
    held, broke = knee(medians)
    console.print(f"holds (p99 <= 250 ms, no timeout, lost, duplicate or lying ack, <= 1 % "
                  f"busy) up to {held:g}/s" if held else "holds at none of these rates",
                  end="")
    console.print(f"; not at {broke:g}/s" if broke else "")



@app.command()
def demo(
    scenario: Annotated[str, Opt(help="Scenario the simulated cluster runs.")] = "hetero-3h",
    seed: Annotated[int, Opt(help="Seed of the world and the jobs.")] = 1,
    horizon_s: Annotated[float | None, Opt(help="Stop the scenario after this many "
                                                "simulated seconds.")] = None,
    fast: Annotated[bool, Opt(help="A short run: the first hour of the scenario.")] = False,
    timeout_s: Annotated[float, Opt(help="Give up after this many wall seconds.")] = 600.0,
    predictor: Annotated[bool, Opt(help="Only show the predictor on public measurements "
                                        "(no services).")] = False,
    telemetry: Annotated[str, Opt(help="bus: the sim publishes telemetry; http: it serves "
                                       "engine /metrics pages that engine-metrics reads.")
                         ] = "bus",
    rlm: Annotated[bool, Opt(help="Hypothesis rounds by a language model: the one at "
                                  "KOI_RLM_BASE_URL, else the embedded llama-server "
                                  "(make lm).")] = True,
    keep: Annotated[Path | None, Opt(help="Keep the run's directory here (each service's "
                                          "log, the secrets, the JetStream store; made "
                                          "0700); default: a temporary one, removed.")
                    ] = None,
) -> None:
    """Run every service on an embedded NATS against a simulated fleet and show what the
    planner does (live progress, events, hypothesis rounds, then the run's metrics)."""
    if predictor:
        from koi.cli.reports import demo_report

        demo_report(console)
        return
    from services.demo import run_demo

    if telemetry not in ("bus", "http"):
        raise typer.BadParameter("bus or http", param_hint="--telemetry")
    horizon = 3600.0 if fast and horizon_s is None else horizon_s
    raise typer.Exit(run_demo(scenario=scenario, seed=seed, horizon_s=horizon,
                              timeout_s=timeout_s, console=console, telemetry=telemetry,
                              rlm=rlm, keep=keep))


@app.command()
def serve(name: Annotated[str, typer.Argument(help="Service: sim, telemetry-ingest, "
                                                   "causal-store, proposer, evaluator, "
                                                   "placer, planner-api, engine-metrics.")],
          metrics_port: Annotated[int | None, Opt(
              help="sim only: serve each replica's engine /metrics page and a Prometheus "
                   "/targets on 127.0.0.1 at this port (0 = any free port), as "
                   "KOI_SIM_METRICS_PORT does.", min=0, max=65535)] = None) -> None:
    """Run one service until SIGTERM/SIGINT (settings from the KOI_* environment)."""
    from services.cli import serve as serve_service

    if metrics_port is not None:
        if name != "sim":
            raise typer.BadParameter("only the sim serves metrics pages",
                                     param_hint="--metrics-port")
        os.environ["KOI_SIM_METRICS_PORT"] = str(metrics_port)
    serve_service(name)


@app.command()
def plan(
    backend: Annotated[str, Opt(help="Where the actions go: k8s.")] = "k8s",
    apply: Annotated[bool, Opt("--apply/--dry-run", help="Apply the actions, or only show"
                               " them (the default).")] = False,
    server_dry_run: Annotated[bool, Opt(help="With --dry-run: also send every write with"
                                        " dryRun=All, for the API server to validate.")
                              ] = False,
    scenario: Annotated[str, Opt(help="Scenario name or YAML file.")] = "hetero-3h",
    tick: Annotated[int, Opt(help="The planning tick whose actions to show.")] = 0,
    seed: Annotated[int, Opt(help="Seed.")] = 1,
    policy: Annotated[str, Opt(help="Planning policy.")] = "koi",
    kube_url: Annotated[str | None, Opt(help="API server URL without credentials (kubectl"
                                        " proxy); default: the kubeconfig.")] = None,
    kubeconfig: Annotated[str | None, Opt(help="Kubeconfig file (default: $KUBECONFIG or"
                                          " ~/.kube/config).")] = None,
    namespace: Annotated[str, Opt(help="Namespace Koi's objects live in.")] = "koi",
    manifest_options: Annotated[Path | None, Opt(help="YAML: checkpoints, draft_models,"
                                                 " images, hf_token_secret, ...")] = None,
) -> None:
    """Replay a scenario to a tick and show its actions on a Kubernetes cluster: the
    manifests, the diff against what runs, and why (docs/FLEETS.md)."""
    from services.plan_cmd import plan_command

    raise typer.Exit(plan_command(
        backend=backend, apply=apply, server_dry_run=server_dry_run, scenario=scenario,
        tick=tick, seed=seed, policy=policy, kube_url=kube_url, kubeconfig=kubeconfig,
        namespace=namespace, options_file=manifest_options))


@app.command()
def security(
    action: Annotated[str, typer.Argument(help="init")],
    directory: Annotated[Path, typer.Argument(help="Secrets directory to make or complete.")],
    san: Annotated[list[str] | None, Opt(help="Extra server name or IP (repeatable).")] = None,
    mount: Annotated[Path | None, Opt(help="Where DIRECTORY appears to nats-server.")] = None,
    submitter: Annotated[list[str] | None, Opt(help="Add a submitter user NAME, who may "
                                               "submit on koi.jobs.submit.NAME only, with "
                                               "its own rate limit (repeatable; kept by "
                                               "later runs).")] = None,
) -> None:
    """`koi security init DIR`: a CA, the server certificate (NATS and planner-api's
    gRPC), one user per service and per submitter, the nats-server config and
    planner-api's gRPC bearer token (services/runtime/security.py). No secret is printed."""
    from services.runtime.security import init_command

    if action != "init":
        raise typer.BadParameter(f"unknown action {action!r}; known: init")
    try:
        console.print(init_command(directory, san or (), mount, submitters=submitter or ()))
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


@app.command()
def submit(
    path: Annotated[Path, typer.Argument(help="Job YAML (one job or a list).")],
    nats_url: Annotated[str | None, Opt(help="NATS URL (default $KOI_NATS_URL).")] = None,
    timeout_s: Annotated[float, Opt(help="Seconds to keep asking for each ack (busy "
                                         "answers and silence are retried; then the "
                                         "stream is looked up).")] = 15.0,
    debug: Annotated[bool, Opt(help="Show the traceback of an error, not one line.")
                     ] = False,
) -> None:
    """Submit jobs on koi.jobs.submit.<your NATS user> and print each ack (accepted with
    its id, or rejected with the reason). Exit code 1 if any was rejected or unanswered, 2
    if the file or the bus could not be used."""
    from services.cli import submit as submit_jobs

    raise typer.Exit(submit_jobs(path, nats_url, timeout_s, debug))


@events_app.command("follow")
def events_follow(
    job: Annotated[str | None, Opt(help="Only this job's events.")] = None,
    severity: Annotated[str, Opt(help="Minimum severity: debug|info|warning|error|"
                                      "critical.")] = "info",
    since: Annotated[str, Opt(help="Start from 30s/10m/2h/1d ago, an ISO time, or "
                                   "'all'.")] = "10m",
    follow: Annotated[bool, Opt(help="Keep following new events (--no-follow: print what "
                                     "is there and exit).")] = True,
    nats_url: Annotated[str | None, Opt(help="NATS URL (default $KOI_NATS_URL).")] = None,
    kind: Annotated[list[str] | None, Opt(help="Only these kinds (repeatable or a,b), e.g. "
                                               "slo_breach,service.")] = None,
    as_json: Annotated[bool, Opt("--json", help="One JSON object per line: every field of "
                                                "the event and the scenario clock.")] = False,
) -> None:
    """Print operator events as readable lines, with the mechanisms behind each (an
    event that does not decode is skipped with a warning on stderr)."""
    from services.cli import events_follow as follow_events

    follow_events(nats_url, job, severity, since, follow, kind, as_json)




@app.command()
def settings(
    markdown: Annotated[bool, Opt("--markdown", help="Print docs/SETTINGS.md: every KOI_* "
                                  "variable and the planner's settings, from the models.")
                        ] = False,
) -> None:
    """The settings: every KOI_* variable with its default, bounds and meaning (and the
    planner's KoiSettings). Without --markdown, the variables and their values in this
    environment (secrets shown as set or not)."""
    from services.runtime.settings import ENV, redact_url
    from services.runtime.settings_doc import markdown as settings_markdown

    if markdown:
        typer.echo(settings_markdown(), nl=False)
        return
    for name, (default, _meaning) in ENV.items():
        value = os.environ.get(name, "")
        secret = any(w in name for w in ("PASSWORD", "TOKEN", "API_KEY")) and "FILE" not in name
        shown = (("(set)" if value else "") if secret
                 else redact_url(value) if value else f"{default} (default)")
        typer.echo(f"{name}={shown}")




@app.command("serve-model")
def serve_model(
    model: Annotated[str, Opt(help="A model `make lm` set up (default: KOI_LM_MODEL or "
                                   "SmolLM2-135M-Instruct.Q4_1).")] = "",
    port: Annotated[int, Opt(help="Port (0: any free one).", min=0, max=65535)] = 0,
    threads: Annotated[int, Opt(help="CPU threads.", min=1, max=256)] = 2,
) -> None:
    """Run the embedded llama-server until interrupted and print the KOI_RLM_* lines that
    point Koi at it (koi bench --policies koi-rlm, the services)."""
    import signal
    import threading

    from services.runtime.embedded import EmbeddedServerError
    from services.runtime.lm import model_env, start_model

    try:
        served = start_model(model, threads=threads, port=port or None)
    except EmbeddedServerError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with served:
        for name, value in sorted(model_env(served, {}).items()):
            print(f"export {name}={value}", flush=True)
        stop.wait()


reflow_app(app)  # every command is registered by now: let the terminal wrap their help

if __name__ == "__main__":
    app()
