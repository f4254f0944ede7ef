"""Durable at-least-once consumers: one message at a time, acked only after the handler.

``Bus.consume`` starts a ``Consumer``: a background loop that fetches from a JetStream
pull consumer, resolves blob references, runs the handler, and acks when it returns.
``Undecodable`` (raised by a handler or its ``decode``) sends the message to the
service's dead letters and terms it; any other exception naks it for redelivery after a
delay (doubling, capped, while the handler's output is refused). A long handler keeps
its message with ``in_progress`` so the server does not redeliver it meanwhile.
``Subscription`` is a core subscription with the same ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from koi import subjects
from services.runtime.blobs import PayloadRefused

log = structlog.get_logger(__name__)

_REFUSED_RETRY_MAX_S = 30.0          # back-off cap for a handler whose output is refused
_FETCH_WAIT_S = 1.0                  # a pull request's lifetime; also stop()'s latency

# (subject, payload or decoded payload, headers) → None
Handler = Callable[[str, Any, Mapping[str, str] | None], Awaitable[None]]


class Undecodable(Exception):
    """Raised by a handler (or its ``decode``) when a payload cannot be decoded: the
    message goes to the service's dead-letter subject instead of being retried."""


class _Bus(Protocol):
    """What a consumer needs of the ``Bus`` that started it (named here, so this module
    does not import ``bus.py`` back)."""

    nc: Client

    async def resolve_or_undecodable(self, msg: Msg) -> bytes: ...

    async def dead_letter(self, service: str, subject: str, data: bytes, error: str, *,
                          msg_id: str | None = None, tick: int = 0,
                          headers: Mapping[str, str] | None = None) -> None: ...


class Subscription:
    """A core NATS subscription with the same ``stop()`` as a ``Consumer``."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()


class Consumer:
    """The background loop of one durable pull consumer (see ``Bus.consume``)."""

    def __init__(self, bus: _Bus, sub: JetStreamContext.PullSubscription, *, durable: str,
                 service: str, handler: Handler, decode: Callable[[bytes], Any] | None,
                 ack_wait_s: float, nak_delay_s: float) -> None:
        self._bus = bus
        self._sub = sub
        self.durable = durable
        self.service = service
        self._handler = handler
        self._decode = decode
        self._ack_wait_s = ack_wait_s
        self._nak_delay_s = nak_delay_s
        self._stopping = asyncio.Event()
        self.processed = 0
        self.failed = 0
        self.dead_lettered = 0
        self._task = asyncio.create_task(self._run(), name=f"consume:{durable}")

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the message in hand (within ``timeout_s``), then stop fetching."""
        self._stopping.set()
        try:
            # not cancelled while idle: a pull request cut short could still be answered,
            # leaving a message unacked (and, with max_ack_pending=1, the consumer stuck)
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s + _FETCH_WAIT_S)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(nats.errors.Error, ValueError):
            await self._sub.unsubscribe()

    async def _run(self) -> None:
        while not self._stopping.is_set() and not self._bus.nc.is_closed:
            try:
                msgs = await self._sub.fetch(1, timeout=_FETCH_WAIT_S)
            except TimeoutError:  # nats' TimeoutError and FetchTimeoutError too
                continue
            except asyncio.CancelledError:
                raise
            except Exception as err:  # disconnected, stream gone, ...: keep trying
                log.warning("fetch_failed", durable=self.durable, error=str(err) or repr(err))
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                if self._stopping.is_set():
                    await _settle(msg.nak())  # fetched while stopping: hand it back now
                else:
                    await self._process(msg)

    async def _process(self, msg: Msg) -> None:
        meta = msg.metadata
        msg_id = (msg.headers or {}).get(api.Header.MSG_ID)
        tick = tick_or_zero(msg.subject)
        bound = log.bind(service=self.service, durable=self.durable, subject=msg.subject,
                         seq=meta.sequence.stream, delivered=meta.num_delivered, msg_id=msg_id)
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            data = payload = await self._bus.resolve_or_undecodable(msg)
            if self._decode is not None:
                try:
                    payload = self._decode(data)
                except Exception as err:
                    raise Undecodable(f"{type(err).__name__}: {err}") from err
            # the handler's own log lines carry the tick and message id too
            with structlog.contextvars.bound_contextvars(tick=tick, msg_id=msg_id):
                await self._handler(msg.subject, payload, msg.headers)
        except Undecodable as err:
            keepalive.cancel()
            await self._dead_letter(msg, msg_id, str(err), bound)
        except asyncio.CancelledError:
            keepalive.cancel()
            await _settle(msg.nak())
            raise
        except Exception as err:
            keepalive.cancel()
            self.failed += 1
            bound.exception("handler_failed")
            delay = self._nak_delay_s
            if isinstance(err, PayloadRefused):  # announced; retry as the cause may pass
                delay = min(_REFUSED_RETRY_MAX_S, delay * 2 ** min(meta.num_delivered, 8))
            await _settle(msg.nak(delay=delay))
        else:
            keepalive.cancel()
            self.processed += 1
            await _settle(msg.ack())

    async def _dead_letter(self, msg: Msg, msg_id: str | None, error: str, bound: Any) -> None:
        letter_id = f"dlq.{self.service}.{msg_id or _stream_seq(msg)}"
        try:
            await self._bus.dead_letter(self.service, msg.subject, msg.data, error,
                                        msg_id=letter_id, tick=tick_or_zero(msg.subject),
                                        headers=msg.headers)
        except Exception:
            # could not park it: leave it to redelivery rather than lose it
            bound.exception("dead_letter_failed")
            await _settle(msg.nak(delay=self._nak_delay_s))
            return
        self.dead_lettered += 1
        await _settle(msg.term())

    async def _keep_alive(self, msg: Msg) -> None:
        """Tell the server a long handler is still working, so it does not redeliver."""
        with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
            while True:
                await asyncio.sleep(max(0.5, self._ack_wait_s / 3))
                await msg.in_progress()


def _stream_seq(msg: Msg) -> str:
    return f"{msg.metadata.stream}.{msg.metadata.sequence.stream}"


def tick_or_zero(subject: str) -> int:
    """The tick a subject names, 0 for a subject without one (events sort first)."""
    try:
        return subjects.tick_of(subject)
    except ValueError:
        return 0


async def _settle(ack: Awaitable[None]) -> None:
    """Send an ack/nak/term; if the connection is gone the server redelivers anyway."""
    try:
        await ack
    except (nats.errors.Error, APIError) as err:
        log.warning("ack_failed", error=str(err))
