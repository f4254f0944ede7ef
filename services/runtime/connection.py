"""Connecting to NATS: who to be, which CA to trust, reconnecting forever once up.

``connect`` returns the process's ``Bus`` (``bus.py``); a refused login or certificate
fails at once, a server that is not there yet is waited for up to ``wait_s``.
``delete_koi_state`` wipes Koi's streams, buckets and object stores for a fresh start.
Connection events are log lines with the server's host and port only (never a URL's
credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any

import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from koi import subjects
from services.runtime.bus import Bus
from services.runtime.security import connect_options, servers
from services.runtime.settings import NatsAuth, redact_url

log = structlog.get_logger(__name__)


def _server(nc: Client) -> str:
    # host and port only: a URL's user:password@ must never reach a log line
    url = nc.connected_url
    if url is None:
        return ""
    host = f"[{url.hostname}]" if url.hostname and ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{url.port}"


async def delete_koi_state(js: JetStreamContext) -> None:
    """Delete every Koi stream and KV bucket (what is absent is skipped): a fresh start on
    a NATS that held an earlier run. ``Bus.ensure_streams``/``ensure_kv`` recreate them."""
    for name in subjects.STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    for bucket in subjects.KV_BUCKETS:
        with contextlib.suppress(NotFoundError):  # BucketNotFoundError is one
            await js.delete_key_value(bucket)
    for bucket in (subjects.OBJ_BLOBS, subjects.OBJ_KV_BLOBS):
        with contextlib.suppress(NotFoundError):
            await js.delete_object_store(bucket)


async def connect(url: str, name: str, *, wait_s: float | None = 30.0,
                  auth: NatsAuth | None = None) -> Bus:
    """Connect to NATS (``url`` may list several servers, comma-separated) and keep
    reconnecting forever after that; raise ``ConnectionError`` if the first connection
    does not succeed within ``wait_s`` (None: wait as long as it takes). ``auth`` is who
    to be and which CA to trust (default: ``KOI_NATS_USER``/``…PASSWORD(_FILE)``/``…CA``);
    a refused login or certificate fails at once, it is not retried."""
    nc = Client()
    options = connect_options(auth, url)
    made: list[Bus] = []                 # the Bus, once there is one
    down_since: list[float] = []         # when the connection was lost (empty: it is up)

    async def on_error(err: Exception) -> None:
        log.warning("nats_error", connection=name, error=str(err) or type(err).__name__)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # not worth a warning when we close it
            log.warning("nats_disconnected", connection=name)
            down_since[:] = down_since or [time.monotonic()]

    async def on_reconnected() -> None:
        seconds = time.monotonic() - down_since.pop() if down_since else 0.0
        log.info("nats_reconnected", connection=name, server=_server(nc),
                 down_s=round(seconds, 1))
        hook = made[0].on_reconnected if made else None
        if hook is not None:  # not awaited here: nats-py waits for its callbacks
            _background(hook(seconds))

    async def on_closed() -> None:
        log.info("nats_closed", connection=name)

    try:
        await asyncio.wait_for(nc.connect(
            servers=servers(url), name=name, allow_reconnect=True, max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]  # typed int, used as seconds
            connect_timeout=2, error_cb=on_error, disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected, closed_cb=on_closed, **options), wait_s)
    except TimeoutError:
        with contextlib.suppress(Exception):
            await nc.close()
        raise ConnectionError(f"could not connect to NATS at {redact_url(url)} within "
                              f"{wait_s} s") from None
    log.info("nats_connected", connection=name, server=_server(nc))
    made.append(Bus(nc, name))
    return made[0]


_BACKGROUND: set[asyncio.Task[Any]] = set()  # strong references until each is done


def _background(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
