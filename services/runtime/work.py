"""Sharing one tick's work among the replicas of a service (a NATS queue group).

The replica whose durable consumer got the tick is the coordinator: it cuts the work
into items, requests each on the work subject (any replica of the queue group, itself
included, answers), and joins the answers in order. An item nobody answers in time is
done by the coordinator itself, so a replica dying mid-tick costs time, not the tick.
Items and answers go through ``Bus.request``/``Bus.respond``, so one larger than the
server's ``max_payload`` travels as a blob reference like any other Koi message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from services.runtime.bus import Bus

log = structlog.get_logger(__name__)

Work = Callable[[bytes], Awaitable[bytes]]


async def serve_work(bus: Bus, subject: str, queue: str, work: Work):
    """Answer work items on ``subject`` as one member of ``queue``. Returns once the
    server has the subscription (a flush), so a request sent after it finds a responder
    even from another connection (CI saw 'no responders' on a loaded machine)."""

    async def on_item(msg) -> None:
        try:
            reply = await work(await bus.resolve(msg))
            await bus.respond(msg, reply)
        except Exception as exc:  # the coordinator times out and does it itself
            log.warning("work_item_failed", subject=subject, error=repr(exc))

    sub = await bus.nc.subscribe(subject, queue=queue, cb=on_item)
    await bus.nc.flush()
    return sub


async def share(bus: Bus, subject: str, items: Sequence[bytes], work: Work,
                timeout_s: float) -> list[bytes]:
    """Answers to ``items`` in order, from the queue group or, failing that, locally."""

    async def one(item: bytes) -> bytes:
        try:
            return await bus.request(subject, item, timeout_s)
        except Exception as exc:  # no responders, timeout, connection trouble
            log.warning("work_item_local", subject=subject, error=repr(exc))
            return await work(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of at most ``size`` covering ``range(n)``."""
    size = max(1, size)
    return [(i, min(i + size, n)) for i in range(0, n, size)]
