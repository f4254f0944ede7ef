"""The simulated engines' metrics over HTTP: a small threaded server on loopback.

``PageServer`` serves the pages it was last given: ``GET /replicas/<deployment>/<i>/
metrics`` (a replica's engine page, Prometheus text format 0.0.4) and ``GET /targets``
(Prometheus HTTP service discovery JSON listing them). The sim service hands it the
tick's pages (``koi.fleet.sim_pages.SimulatedEngines``) before it publishes the tick's
snapshot; the whole set is swapped at once, so a scrape never sees half a tick. No
decisions here, and nothing but GET.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TARGETS_PATH = "/targets"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        pages, targets = self.server.content
        path = self.path.split("?", 1)[0]
        if path == TARGETS_PATH:
            self._send(200, "application/json", targets)
        elif path in pages:
            self._send(200, PAGE_TYPE, pages[path])
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # one line per scrape would drown the service's own log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    content: tuple[Mapping[str, bytes], bytes] = ({}, b"[]")


class PageServer:
    """Serves the last ``publish``-ed pages and targets at ``host:port`` (0: any free)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="koi-sim-metrics", daemon=True)

    @property
    def address(self) -> str:
        """``host:port`` it listens on."""
        host, port = self._server.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> str:
        self._thread.start()
        return self.address

    def publish(self, pages: Mapping[str, bytes], targets: str | bytes) -> None:
        """Serve these pages and this targets document from now on (one swap)."""
        body = targets.encode() if isinstance(targets, str) else targets
        self._server.content = (dict(pages), body)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)

    def __enter__(self) -> PageServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
