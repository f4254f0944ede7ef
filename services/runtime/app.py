"""How a service process starts and stops: settings, logging, the bus, signals.

``run_service(name, body)`` reads ``ServiceSettings`` from the environment, configures
structlog, connects to NATS, makes sure the streams and KV buckets exist, then awaits
``body(ctx)`` until it returns or SIGTERM/SIGINT sets ``ctx.stopping``; the bus is
drained on the way out. ``ctx.event(...)`` emits an operator event with a stable id.

Each replica's process records itself in ``koi_sim`` (``process_key``): ``running`` at
start, ``stopped`` on a clean exit. A body that raises emits an ERROR ``service`` event
(service, replica, exception type: no traceback, no message, which may hold anything)
and the process exits non-zero for its supervisor to restart it; a process that finds
its replica still marked ``running`` emits a WARNING: the previous one stopped uncleanly
(crashed, or was killed). A connection to NATS lost and regained is a WARNING
``bus_error`` event saying for how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from koi import subjects
from koi.catalog import Catalog, load_catalog
from koi.wire.planning import make_event
from services.runtime.bus import Bus
from services.runtime.connection import connect
from services.runtime.logs import configure_logging
from services.runtime.settings import ServiceSettings, redact_url
from services.runtime.ticks import clock_tick


@dataclass
class ServiceContext:
    name: str
    settings: ServiceSettings
    bus: Bus
    catalog: Catalog
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    log: structlog.typing.FilteringBoundLogger = field(
        default_factory=lambda: structlog.get_logger())

    async def event(self, *, kind: str, severity: str, message: str, tick: int,
                    key: str, job_id: str = "", deployment_id: str = "",
                    mechanism_ids: tuple[str, ...] = (),
                    attributes: dict[str, str] | None = None,
                    scenario_time_s: float = 0.0) -> None:
        """Emit one operator event; ``key`` makes its id stable across redeliveries."""
        ev = make_event(kind=kind, severity=severity, service=self.name, message=message,
                        tick=tick, job_id=job_id, deployment_id=deployment_id,
                        mechanism_ids=mechanism_ids, attributes=attributes,
                        scenario_time_s=scenario_time_s,
                        event_id=f"{self.name}:{kind}:{tick}:{key}")
        try:
            await self.bus.emit(ev)
        except Exception as exc:  # an event lost is logged; the work goes on
            self.log.warning("event_emit_failed", kind=kind, error=repr(exc))


# a coroutine function: run_service makes a task of the body
Body = Callable[[ServiceContext], Coroutine[Any, Any, None]]


def ready_key(service: str) -> str:
    """The ``koi_sim`` key a service writes once it is connected and running."""
    return f"ready.{service}"


def process_key(service: str, replica: int) -> str:
    """The ``koi_sim`` key holding ``running`` or ``stopped`` for one replica's process."""
    return f"process.{service}.{replica}"


RUNNING, STOPPED = b"running", b"stopped"


async def _clock(ctx: ServiceContext) -> int:
    """The tick a service event belongs to: the latest snapshot's (0 before the first,
    or when the bus cannot say), so the event sorts with the ticks it interrupted."""
    try:
        tick = await asyncio.wait_for(clock_tick(ctx.bus), 5.0)
        return max(tick or 0, 0)
    except Exception:
        return 0


async def _mark_running(ctx: ServiceContext) -> int:
    """Record this process as running (returns the write's revision, unique to this
    process); a replica left ``running`` by its previous process is reported."""
    replica, key = ctx.settings.replica, process_key(ctx.name, ctx.settings.replica)
    previous = await ctx.bus.kv_get(subjects.KV_SIM, key)
    revision = await ctx.bus.kv_put(subjects.KV_SIM, key, RUNNING)
    if previous is not None and previous[0] == RUNNING:
        ctx.log.warning("service_restarted_after_unclean_stop")
        await ctx.event(kind="service", severity="warning", tick=await _clock(ctx),
                        key=f"{replica}:restarted:{revision}",
                        message=f"{ctx.name} replica {replica} restarted after an unclean "
                                "stop (the previous process crashed or was killed)",
                        attributes={"replica": str(replica), "phase": "restarted"})
    return revision


async def _report_crash(ctx: ServiceContext, exc: BaseException, revision: int) -> None:
    """The ERROR event of a body that raised: the exception's type only (its message and
    traceback may carry payloads or credentials; ``main`` logs the traceback)."""
    replica, kind = ctx.settings.replica, type(exc).__name__
    await ctx.event(kind="service", severity="error", tick=await _clock(ctx),
                    key=f"{replica}:crashed:{revision}",
                    message=f"{ctx.name} replica {replica} crashed ({kind}); it exits for "
                            "its supervisor to restart it",
                    attributes={"replica": str(replica), "phase": "crashed",
                                "exception": kind})


async def _report_reconnect(ctx: ServiceContext, seconds: float) -> None:
    """A WARNING ``bus_error`` event once the NATS connection is back (it cannot be sent
    while it is down): how long this replica was cut off, so a NATS outage or a
    partition shows in the event log next to the degraded ticks it caused."""
    await asyncio.sleep(_RECONNECT_SETTLE_S)  # JetStream may still be recovering its streams
    replica = ctx.settings.replica
    await ctx.event(kind="bus_error", severity="warning", tick=await _clock(ctx),
                    key=f"{replica}:reconnected:{time.time_ns()}",
                    message=f"{ctx.name} replica {replica} lost its NATS connection for "
                            f"{seconds:.1f} s; reconnected",
                    attributes={"replica": str(replica), "phase": "reconnected",
                                "down_s": f"{seconds:.1f}"})


_RECONNECT_SETTLE_S = 1.0


async def run_service(name: str, body: Body, settings: ServiceSettings | None = None) -> None:
    settings = settings or ServiceSettings.from_env()
    configure_logging(name, settings.log_level, settings.log_format)
    log = structlog.get_logger().bind(service=name, replica=settings.replica)
    bus = await connect(settings.nats_url, f"koi-{name}-{settings.replica}",
                        auth=settings.nats_auth)
    await bus.ensure_streams()
    await bus.ensure_kv()
    ctx = ServiceContext(name, settings, bus, load_catalog(), log=log)
    bus.on_reconnected = lambda seconds: _report_reconnect(ctx, seconds)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, ctx.stopping.set)
    log.info("service_started", nats=redact_url(settings.nats_url),
             nats_user=settings.nats_auth.user, nats_tls=bool(settings.nats_auth.ca_file))
    revision = await _mark_running(ctx)
    task = asyncio.create_task(body(ctx))
    await asyncio.sleep(0)  # let the body subscribe before saying we are ready
    await bus.kv_put(subjects.KV_SIM, ready_key(name), str(settings.replica).encode())
    stop = asyncio.create_task(ctx.stopping.wait())
    clean = False
    try:
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        crash = task.exception() if task in done else None
        if crash is not None:
            await _report_crash(ctx, crash, revision)
            task.result()  # re-raise a crash: the supervisor restarts the process
        clean = True
    finally:
        task.cancel()
        stop.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if clean:
            with contextlib.suppress(Exception):  # a lost marker: a warning at next start
                await bus.kv_put(subjects.KV_SIM, process_key(name, settings.replica), STOPPED)
        await bus.close()
        log.info("service_stopped", clean=clean)


def main(name: str, body: Body) -> None:
    """Process entry point of one service; a crash is logged (the traceback through the
    escaping, locals-free log renderer, not printed raw) and exits with status 1."""
    try:
        asyncio.run(run_service(name, body))
    except Exception as exc:
        structlog.get_logger().error("service_failed", service=name,
                                     error_type=type(exc).__name__, exc_info=exc)
        raise SystemExit(1) from None
