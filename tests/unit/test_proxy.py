"""The fault-suite proxy forwards bytes, cuts every link on ``cut()`` and refuses new
ones until ``heal()``, and slows a link on ``slow()``."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from services.runtime.proxy import TcpProxy

pytestmark = pytest.mark.timeout(30)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_port():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _roundtrip(port: int, payload: bytes = b"ping") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(payload)
        return s.recv(4096)


def test_forwards_cuts_refuses_and_heals(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        assert _roundtrip(proxy.port) == b"ping"
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=3)
        held.sendall(b"a")
        assert held.recv(16) == b"a"
        proxy.cut()
        # the open link is reset: the next read sees the end (or a reset), never an echo
        with pytest.raises(OSError):
            held.sendall(b"b")
            if held.recv(16) in (b"",):
                raise ConnectionResetError
        held.close()
        # new links are refused while cut
        with pytest.raises(OSError):
            if _roundtrip(proxy.port) == b"":
                raise ConnectionResetError
        proxy.heal()
        assert _roundtrip(proxy.port) == b"ping"
        assert proxy.stats.reset >= 1 and proxy.stats.refused >= 1


def test_slow_delays_each_chunk(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        proxy.slow(0.2)
        t = time.perf_counter()
        assert _roundtrip(proxy.port) == b"ping"
        assert time.perf_counter() - t >= 0.4  # up and down, 0.2 s each
        proxy.heal()
