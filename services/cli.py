"""The bus side of the ``koi`` command line: serve, submit, events follow.

``koi.cli.main`` declares the commands and imports this module only when one runs, so
the domain library never imports the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from koi import subjects
from koi.catalog import load_catalog
from koi.jobs import load_jobs_yaml
from koi.v1 import events_pb2, jobs_pb2
from koi.wire.codec import encode_job
from koi.wire.planning import event_line
from services.runtime.settings import SERVICES, env

SEVERITIES = ("debug", "info", "warning", "error", "critical")


def serve(name: str) -> None:
    """Run one service in this process until SIGTERM/SIGINT."""
    if name not in SERVICES:
        raise SystemExit(f"unknown service {name!r}; known: {', '.join(SERVICES)}")
    module = importlib.import_module(SERVICES[name])
    from services.runtime.app import main

    main(module.NAME, module.run)


async def _submit(path: Path, nats_url: str, timeout_s: float, console: Console) -> int:
    import nats

    jobs = load_jobs_yaml(path, catalog=load_catalog())
    nc = await nats.connect(nats_url, connect_timeout=min(timeout_s, 5), max_reconnect_attempts=3)
    failed = 0
    try:
        for job in jobs:
            ack = await _request_ack(nc, encode_job(job), timeout_s)
            if ack is None:
                console.print(f"[red]{job.id}: no answer from the placer within "
                              f"{timeout_s:g} s[/red] (is `koi serve placer` running?)")
                failed += 1
            elif ack.accepted:
                console.print(f"[green]accepted[/green] {ack.job_id} (tick {ack.tick})")
            else:
                where = f" ({ack.field})" if ack.field else ""
                console.print(f"[red]rejected[/red] {escape(ack.job_id or job.id)}"
                              f"{escape(where)}: {escape(ack.reason)}")
                failed += 1
    finally:
        await nc.close()
    return 1 if failed else 0


async def _request_ack(nc, data: bytes, timeout_s: float) -> jobs_pb2.JobAck | None:
    """Ask until answered or out of time (a restarting placer answers a retry)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = await nc.request(subjects.JOBS_SUBMIT, data, timeout=min(left, 2.0))
            return jobs_pb2.JobAck.FromString(reply.data)
        except Exception:  # no responders / timeout: retry until the deadline
            await asyncio.sleep(min(0.25, max(left, 0)))
    return None


def submit(path: Path, nats_url: str | None, timeout_s: float) -> int:
    console = Console()
    if not path.exists():
        console.print(f"[red]{path}: no such file[/red]")
        return 2
    return asyncio.run(_submit(path, nats_url or env("KOI_NATS_URL"), timeout_s, console))


def parse_since(since: str, now: datetime | None = None) -> datetime | None:
    """``10m``/``2h``/``30s``/``1d`` ago, an ISO time, or ``all`` (None = from the start)."""
    now = now or datetime.now(UTC)
    if since == "all":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", since)
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return now - timedelta(**{unit: float(m.group(1))})
    try:
        t = datetime.fromisoformat(since)
    except ValueError:
        raise ValueError(f"--since {since!r}: give 30s, 10m, 2h, 1d, an ISO time or 'all'") \
            from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def wants(ev: events_pb2.OperatorEvent, job: str | None, min_severity: int) -> bool:
    return (job is None or ev.job_id == job) and ev.severity >= min_severity


async def _follow(nats_url: str, job: str | None, severity: str, since: str, follow: bool,
                  out) -> int:
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    start = parse_since(since)
    min_sev = events_pb2.Severity.Value(f"SEVERITY_{severity.upper()}")
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=3)
    js = nc.jetstream()
    cfg = (ConsumerConfig(deliver_policy=DeliverPolicy.ALL) if start is None else
           ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                          opt_start_time=start.isoformat().replace("+00:00", "Z")))
    shown = 0
    try:
        info = await js.stream_info(subjects.STREAM_EVENTS)
        pending = info.state.messages
        sub = await js.subscribe(f"{subjects.EVENTS_PREFIX}.>", ordered_consumer=True,
                                 config=cfg)
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:  # nats' TimeoutError: nothing new for a second
                if not follow:
                    break
                continue
            ev = events_pb2.OperatorEvent.FromString(msg.data)
            if wants(ev, job, min_sev):
                print(event_line(ev), file=out, flush=True)
                shown += 1
            if not follow and msg.metadata.num_pending == 0 and pending:
                break
    finally:
        await nc.close()
    return shown


def events_follow(nats_url: str | None, job: str | None, severity: str, since: str,
                  follow: bool) -> None:
    if severity not in SEVERITIES:
        raise SystemExit(f"--severity must be one of {', '.join(SEVERITIES)}")
    try:
        parse_since(since)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_follow(nats_url or env("KOI_NATS_URL"), job, severity, since, follow,
                            sys.stdout))
