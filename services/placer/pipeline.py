"""Many JetStream publishes in flight on one connection, their acks awaited together.

``js.publish`` is a request per message (a future, a timer and a socket write each);
awaiting a batch of them one after the other costs a round trip per message. Here every
publish carries a reply subject under one inbox, the messages of a batch leave in one
socket write, and one subscription settles each publish's future from its ack.

Why not nats-py 2.16's ``js.publish_async``: when the server answers with an error (e.g.
``Nats-Expected-Last-Subject-Sequence`` not met, the answer admission relies on) its
reply handler raises inside the subscription callback instead of failing the future,
which then never completes; and its ``wait_stall`` makes every call yield to the loop
(one socket write per message).

Transport only: no Koi decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

NO_RESPONDERS = "503"


@dataclass(frozen=True)
class Stored:
    """The server's answer to one publish: stored (``seq``), a de-duplicated repeat
    (``duplicate``), or refused (``err_code`` and ``error``, e.g. 10071 for a subject
    whose last sequence was not the expected one)."""
    seq: int = 0
    duplicate: bool = False
    err_code: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class Pipeline:
    """Publishes to JetStream whose acks arrive on one subscription (start it first)."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Any = None
        self._waiting: dict[str, asyncio.Future[Stored]] = {}
        self._tokens = itertools.count()

    async def start(self) -> None:
        self._prefix = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_ack)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()

    async def publish(self, subject: str, data: bytes,
                      headers: dict[str, str]) -> asyncio.Future[Stored]:
        """Send one message; the future settles when its ack comes (never on its own:
        pass it to ``settle`` with a timeout)."""
        token = str(next(self._tokens))
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        try:
            # no await between a batch's publishes yields: they leave in one write
            await self._nc.publish(subject, data, reply=f"{self._prefix}.{token}",
                                   headers=headers)
        except Exception as err:
            self._waiting.pop(token, None)
            future.set_exception(err)
        return future

    async def settle(self, futures: list[asyncio.Future[Stored]], timeout_s: float
                     ) -> list[Stored | BaseException | None]:
        """Each publish's outcome after at most ``timeout_s``: ``Stored``, the exception
        that prevented the send, or None when no ack came in time (then unknown whether
        it was stored)."""
        pending = [f for f in futures if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        out: list[Stored | BaseException | None] = []
        for future in futures:
            if not future.done():
                future.cancel()
                out.append(None)
            elif future.cancelled():
                out.append(None)
            else:
                out.append(future.exception() or future.result())
        self._forget_settled()
        return out

    def _forget_settled(self) -> None:
        for token in [t for t, f in self._waiting.items() if f.done()]:
            del self._waiting[token]

    async def _on_ack(self, msg: Any) -> None:
        future = self._waiting.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is None or future.done():
            return
        if (msg.headers or {}).get("Status") == NO_RESPONDERS:
            future.set_result(Stored(err_code=503, error="no stream stores this subject"))
            return
        try:
            resp = json.loads(msg.data)
        except ValueError:
            future.set_result(Stored(error=f"unreadable ack: {msg.data[:100]!r}"))
            return
        err = resp.get("error")
        if err:
            future.set_result(Stored(err_code=int(err.get("err_code", 0)),
                                     error=str(err.get("description", err))))
        else:
            future.set_result(Stored(seq=int(resp.get("seq", 0)),
                                     duplicate=bool(resp.get("duplicate", False))))
