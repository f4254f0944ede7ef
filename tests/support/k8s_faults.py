"""API servers that fail the way real ones do, for the K8s backend's error paths: NOT
Kubernetes. Each is a context manager on 127.0.0.1 giving the URL to dial:

- ``refusing()``: a port nothing listens on (the connection is refused);
- ``silent()``: accepts connections and never answers (a hung server or a black hole);
- ``answering(status, message)``: every request answered with a ``Status`` object as
  the API server sends it (401 Unauthorized, 403 Forbidden naming user, verb and
  resource, …);
- ``tls(cert, key)``: HTTPS with the given certificate (a client trusting another CA
  must fail with a TLS error), answering 403 to whoever gets through.

``kubeconfig(path, server, ca)`` writes a minimal kubeconfig for ``server``, trusting the
CA file ``ca``, with a bearer token.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml


@contextlib.contextmanager
def refusing() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}"  # closed: nothing listens there now


@contextlib.contextmanager
def silent() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                held.append(conn)  # kept open, never read from or written to

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        t.join(timeout=2)
        for conn in held:
            conn.close()
        server.close()


def _status(code: int, message: str) -> bytes:
    reason = {401: "Unauthorized", 403: "Forbidden"}.get(code, "Failure")
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code}).encode()


def _handler(code: int, message: str) -> type[BaseHTTPRequestHandler]:
    class Answer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = _status(code, message)
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = do_DELETE = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Answer


@contextlib.contextmanager
def answering(code: int, message: str, *, cert: Path | None = None,
              key: Path | None = None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(code, message))
    scheme = "http"
    if cert is not None and key is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def forbidden_message(user: str = "alice", verb: str = "list",
                      resource: str = "deployments", group: str = "apps",
                      namespace: str = "koi") -> str:
    """The message a real API server's RBAC denial carries."""
    return (f'{resource}.{group} is forbidden: User "{user}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" in the namespace "{namespace}"')


def kubeconfig(path: Path, server: str, ca: Path) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "koi",
           "clusters": [{"name": "c", "cluster": {"server": server,
                                                  "certificate-authority": str(ca)}}],
           "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
           "contexts": [{"name": "koi", "context": {"cluster": "c", "user": "u"}}]}
    path.write_text(yaml.safe_dump(doc))
    return path
