"""A loopback TCP proxy that can cut, slow or restore one service's link to NATS.

The fault suite (``services/chaos.py``) puts one of these between a service and the NATS
server to make a network partition (``cut()``: every open connection is reset and new
ones are refused until ``heal()``) or a slow link (``slow(delay_s, bytes_per_s)``: every
chunk forwarded is delayed and the bandwidth capped, so the service becomes a slow
consumer). It listens and connects on 127.0.0.1 only and runs its own event loop in a
daemon thread, so the synchronous test harness can drive it between ticks.

Nothing here knows about Koi: bytes in, bytes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

_CHUNK = 64 * 1024


@dataclass
class LinkStats:
    connections: int = 0        # accepted since start
    refused: int = 0            # refused while cut
    reset: int = 0              # open connections reset by cut()
    bytes_up: int = 0           # client → server
    bytes_down: int = 0         # server → client


class TcpProxy:
    """``127.0.0.1:<port>`` → ``127.0.0.1:<target_port>``, with faults on demand."""

    def __init__(self, target_port: int, *, port: int = 0, scheme: str = "nats") -> None:
        self.target_port = target_port
        self.port = port
        self.scheme = scheme        # the URL scheme clients use through it (tls: TLS passes)
        self.stats = LinkStats()
        self._cut = False
        self._delay_s = 0.0
        self._bytes_per_s = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="koi-proxy",
                                        daemon=True)

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("proxy_started", port=self.port, target_port=self.target_port)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close_all(stop_listening=True))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    # -- faults -------------------------------------------------------------------------
    def cut(self) -> None:
        """A partition: reset every open connection and refuse new ones."""
        self._cut = True
        self._call(self._close_all(stop_listening=False))
        log.info("proxy_cut", port=self.port)

    def heal(self) -> None:
        """End a partition and any slowness."""
        self._cut = False
        self._delay_s = 0.0
        self._bytes_per_s = 0.0
        log.info("proxy_healed", port=self.port)

    def slow(self, delay_s: float, bytes_per_s: float = 0.0) -> None:
        """Delay every forwarded chunk by ``delay_s`` and cap the bandwidth (0: no cap)."""
        if delay_s < 0 or bytes_per_s < 0:
            raise ValueError("delay_s and bytes_per_s must be >= 0")
        self._delay_s = delay_s
        self._bytes_per_s = bytes_per_s
        log.info("proxy_slowed", port=self.port, delay_s=delay_s, bytes_per_s=bytes_per_s)

    # -- internals ----------------------------------------------------------------------
    def _call(self, coro):  # run a coroutine on the proxy's loop from another thread
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _close_all(self, *, stop_listening: bool) -> None:
        if stop_listening and self._server is not None:
            self._server.close()
        for w in list(self._writers):
            self.stats.reset += 1
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self.stats.refused += 1
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.stats.connections += 1
        self._writers.update((writer, up_w))
        await asyncio.gather(self._pipe(reader, up_w, up=True),
                             self._pipe(up_r, writer, up=False), return_exceptions=True)
        for w in (writer, up_w):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    up: bool) -> None:
        while not reader.at_eof():
            data = await reader.read(_CHUNK)
            if not data or self._cut:
                break
            if self._delay_s:
                await asyncio.sleep(self._delay_s)
            if self._bytes_per_s:
                await asyncio.sleep(len(data) / self._bytes_per_s)
            if up:
                self.stats.bytes_up += len(data)
            else:
                self.stats.bytes_down += len(data)
            writer.write(data)
            await writer.drain()
        writer.transport.abort()
