"""How a service process starts and stops: settings, logging, the bus, signals.

``run_service(name, body)`` reads ``ServiceSettings`` from the environment, configures
structlog, connects to NATS, makes sure the streams and KV buckets exist, then awaits
``body(ctx)`` until it returns or SIGTERM/SIGINT sets ``ctx.stopping``; the bus is
drained on the way out. ``ctx.event(...)`` emits an operator event with a stable id.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from koi import subjects
from koi.catalog import Catalog, load_catalog
from koi.wire.planning import make_event
from services.runtime.bus import Bus, connect
from services.runtime.logs import configure_logging
from services.runtime.settings import ServiceSettings


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


Body = Callable[[ServiceContext], Awaitable[None]]


def ready_key(service: str) -> str:
    """The ``koi_sim`` key a service writes once it is connected and running."""
    return f"ready.{service}"


async def run_service(name: str, body: Body, settings: ServiceSettings | None = None) -> None:
    settings = settings or ServiceSettings.from_env()
    configure_logging(name, settings.log_level, settings.log_format)
    log = structlog.get_logger().bind(service=name, replica=settings.replica)
    bus = await connect(settings.nats_url, f"koi-{name}-{settings.replica}")
    await bus.ensure_streams()
    await bus.ensure_kv()
    ctx = ServiceContext(name, settings, bus, load_catalog(), log=log)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, ctx.stopping.set)
    log.info("service_started", nats=settings.nats_url)
    task = asyncio.create_task(body(ctx))
    await asyncio.sleep(0)  # let the body subscribe before saying we are ready
    await bus.kv_put(subjects.KV_SIM, ready_key(name), str(settings.replica).encode())
    stop = asyncio.create_task(ctx.stopping.wait())
    try:
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # re-raise a crash: the supervisor restarts the process
    finally:
        task.cancel()
        stop.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close()
        log.info("service_stopped")


def main(name: str, body: Body) -> None:
    """Process entry point of one service."""
    asyncio.run(run_service(name, body))
