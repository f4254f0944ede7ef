"""The bus side of the ``koi`` command line: serve, submit, events follow.

``services.koi_command`` declares the commands and imports this module only when one
runs, so ``koi --help`` does not load the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from rich.console import Console
from rich.markup import escape

from koi import subjects
from koi.catalog import load_catalog
from koi.errors import KoiError
from koi.jobs import load_jobs_yaml
from koi.jobs.intake import deadline_header
from koi.safe_text import printable
from koi.v1 import events_pb2, jobs_pb2
from koi.wire.codec import encode_job
from koi.wire.planning import EVENT_KINDS, event_line
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
    from services.runtime.security import connect_nats, submit_subject

    jobs = load_jobs_yaml(path, catalog=load_catalog())
    # credentials and TLS from KOI_NATS_USER / _PASSWORD(_FILE) / _CA (a submitter: `client`
    # or one `koi security init --submitter` made); it submits on its own subject
    nc = await connect_nats(nats_url, connect_timeout=min(timeout_s, 5), max_reconnect_attempts=3)
    subject, failed = submit_subject(), 0
    try:
        for job in jobs:
            data = encode_job(job)
            ack = await _request_ack(nc, subject, data, timeout_s)
            stored = "not looked up"
            if ack is None or ack.retry_after_ms:
                # no definite answer: the job may still have been stored (the answer lost
                # or late); what the stream holds is the truth
                found, stored = await _look_up(nc, job.id, data)
                ack = found or ack
            failed += not _print_ack(console, job.id, ack, timeout_s, stored)
    finally:
        await nc.close()
    return 1 if failed else 0


def _print_ack(console: Console, job_id: str, ack: jobs_pb2.JobAck | None,
               timeout_s: float, stored: str) -> bool:
    """One line per job; True when it was accepted."""
    jid = escape(printable(job_id, 200))
    if ack is None:
        console.print(f"[red]{jid}: no answer from the placer within {timeout_s:g} s, and "
                      f"the job is {escape(stored)}[/red] (is `koi serve placer` running?)")
        return False
    if ack.accepted:
        note = (escape(printable(ack.reason)) if ack.reason  # found stored, unanswered
                else f"tick {ack.tick}; already admitted, this was a retry" if ack.duplicate
                else f"tick {ack.tick}")
        console.print(f"[green]accepted[/green] {escape(printable(ack.job_id or job_id, 200))}"
                      f" ({note})")
        return True
    if ack.retry_after_ms:
        console.print(f"[red]{jid}: the placer stayed busy for {timeout_s:g} s; the job is "
                      f"{escape(stored)}[/red] ({escape(printable(ack.reason))})")
        return False
    where = f" ({ack.field})" if ack.field else ""
    console.print(f"[red]rejected[/red] {escape(printable(ack.job_id or job_id, 200))}"
                  f"{escape(where)}: {escape(printable(ack.reason))}")
    return False


async def _request_ack(nc, subject: str, data: bytes, timeout_s: float
                       ) -> jobs_pb2.JobAck | None:
    """Ask on ``subject`` until answered or out of time: a restarting placer answers a
    retry, a busy one (overloaded, or this user over its rate limit) says when to retry
    (the same spec: a retry of an admitted job is answered ``duplicate``). The last busy
    answer, or None if nothing answered."""
    deadline = time.monotonic() + timeout_s
    busy = None
    while (left := deadline - time.monotonic()) > 0:
        try:
            wait = min(left, 2.0)  # this attempt's deadline travels with it
            reply = await nc.request(subject, data, timeout=wait,
                                     headers=deadline_header(wait))
            ack = jobs_pb2.JobAck.FromString(reply.data)
        except Exception:  # no responders / timeout: retry until the deadline
            await asyncio.sleep(min(0.25, max(left, 0)))
            continue
        if not ack.retry_after_ms:
            return ack
        busy = ack
        await asyncio.sleep(min(ack.retry_after_ms / 1000, max(deadline - time.monotonic(), 0)))
    return busy


async def _look_up(nc, job_id: str, data: bytes) -> tuple[jobs_pb2.JobAck | None, str]:
    """What ``koi.jobs.accepted.<id>`` holds for this job: accepted if it holds this very
    spec, refused if another; else None and what we know ("not stored", or why we
    could not tell)."""
    from nats.js.errors import NotFoundError

    try:
        subject = subjects.job_accepted_subject(job_id)
        stored = await nc.jetstream().get_last_msg(subjects.STREAM_JOBS, subject)
    except NotFoundError:
        return None, "not stored"
    except Exception as exc:  # unreadable or unreachable: we cannot tell
        return None, f"of unknown state (the lookup failed: {type(exc).__name__})"
    try:
        same = jobs_pb2.JobSpec.FromString(stored.data or b"") == \
            jobs_pb2.JobSpec.FromString(data)
    except Exception:
        same = False
    if same:
        return jobs_pb2.JobAck(accepted=True, job_id=job_id, duplicate=True,
                               reason=f"no answer came, but it is stored on {subject}"), ""
    return jobs_pb2.JobAck(accepted=False, job_id=job_id, field="id",
                           reason=f"no answer came, and {subject} holds a different job "
                                  "spec: the id is taken; choose another"), ""


def submit(path: Path, nats_url: str | None, timeout_s: float, debug: bool = False) -> int:
    """``koi submit``: 0 if every job was accepted, 1 if any was not, 2 if the file or the
    bus failed us (one line; ``debug`` re-raises for the traceback)."""
    console = Console()
    if not path.exists():
        console.print(f"[red]{escape(printable(str(path)))}: no such file[/red]")
        return 2
    try:
        return asyncio.run(_submit(path, nats_url or env("KOI_NATS_URL"), timeout_s, console))
    except Exception as exc:
        if debug:
            raise
        console.print(f"[red]error:[/red] {escape(one_line_error(exc, path))} "
                      "(--debug shows the traceback)", soft_wrap=True)
        return 2


def one_line_error(exc: BaseException, path: Path | None = None) -> str:
    """An exception as one line an operator can act on (no traceback)."""
    if isinstance(exc, UnicodeDecodeError):
        where = f"{path}: " if path else ""
        text = f"{where}not a text file ({exc.reason} at byte {exc.start})"
    elif isinstance(exc, KoiError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return printable(" ".join(text.split()), 500)


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


def parse_kinds(kinds: list[str] | None) -> frozenset[int]:
    """``--kind`` values (repeated and/or comma-separated) as event kind numbers; empty
    means every kind. An unknown name raises ValueError listing the known ones."""
    names = [k.strip().lower() for arg in kinds or () for k in arg.split(",") if k.strip()]
    unknown = [n for n in names if n not in EVENT_KINDS or n == "unspecified"]
    if unknown:
        known = ", ".join(k for k in EVENT_KINDS if k != "unspecified")
        raise ValueError(f"--kind {', '.join(map(repr, unknown))}: unknown; known: {known}")
    return frozenset(EVENT_KINDS[n] for n in names)


def wants(ev: events_pb2.OperatorEvent, job: str | None, min_severity: int,
          kinds: frozenset[int] = frozenset()) -> bool:
    return ((job is None or ev.job_id == job) and ev.severity >= min_severity
            and (not kinds or ev.kind in kinds))


def _enum_name(enum, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:  # a number from a newer schema
        return str(value)


def event_json(ev: events_pb2.OperatorEvent) -> str:
    """One JSON object (one line: json escapes every control character) with every
    field of the event, severity and kind by name, and the scenario clock."""
    fields = json_format.MessageToDict(ev, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True)
    fields["severity"] = _enum_name(events_pb2.Severity, ev.severity, "SEVERITY_")
    fields["kind"] = _enum_name(events_pb2.EventKind, ev.kind, "EVENT_KIND_")
    fields["tick"] = ev.tick  # proto3 JSON writes an int64 as a string
    fields["time"] = fields.get("time")  # unset: null, not the 1970 epoch
    fields["clock"] = event_line(ev).split(" ", 1)[0]  # exactly as the line shows it
    return json.dumps(fields)


def _skipped(msg, exc: Exception) -> str:
    seq = msg.metadata.sequence.stream if msg.metadata else "?"
    return (f"warning: skipped undecodable event at {subjects.STREAM_EVENTS} stream sequence "
            f"{seq} on {printable(msg.subject, 200)} ({type(exc).__name__}: "
            f"{printable(str(exc), 200)})")


async def _follow(nats_url: str, job: str | None, severity: str, since: str, follow: bool,
                  out, *, kinds: frozenset[int] = frozenset(), as_json: bool = False,
                  err=None) -> int:
    """Print the matching events (``event_line`` or ``event_json``) on ``out``; an
    event that does not decode is skipped with a warning on ``err`` (stderr)."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    from services.runtime.security import connect_nats

    err = err or sys.stderr
    start = parse_since(since)
    min_sev = events_pb2.Severity.Value(f"SEVERITY_{severity.upper()}")
    nc = await connect_nats(nats_url, connect_timeout=5, max_reconnect_attempts=3)
    js = nc.jetstream()
    cfg = (ConsumerConfig(deliver_policy=DeliverPolicy.ALL) if start is None else
           ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                          opt_start_time=start))
    render = event_json if as_json else event_line
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
            try:
                ev = events_pb2.OperatorEvent.FromString(msg.data)
            except DecodeError as exc:  # one bad message must not end the command
                print(_skipped(msg, exc), file=err, flush=True)
            else:
                if wants(ev, job, min_sev, kinds):
                    print(render(ev), file=out, flush=True)
                    shown += 1
            if not follow and msg.metadata.num_pending == 0 and pending:
                break
    finally:
        await nc.close()
    return shown


def events_follow(nats_url: str | None, job: str | None, severity: str, since: str,
                  follow: bool, kinds: list[str] | None = None, as_json: bool = False) -> None:
    if severity not in SEVERITIES:
        raise SystemExit(f"--severity must be one of {', '.join(SEVERITIES)}")
    try:
        parse_since(since)
        wanted = parse_kinds(kinds)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_follow(nats_url or env("KOI_NATS_URL"), job, severity, since, follow,
                            sys.stdout, kinds=wanted, as_json=as_json))
