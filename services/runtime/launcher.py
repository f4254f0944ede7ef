"""Run the services as child processes, supervised: the one-machine stand-in for what
docker compose or Kubernetes does (``restart: unless-stopped``).

``Supervisor`` starts each service (``python -m services.<name>.main``) with the given
environment and replica count, writes each process's output to a log file, restarts a
process that dies unless it is stopping (``poll()`` does it; ``watch()`` polls in a
thread), and stops everything on ``stop()``: SIGTERM, then SIGKILL after a grace period.
Used by ``koi demo`` and the integration tests.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from services.runtime.settings import SERVICES

log = structlog.get_logger(__name__)


def _die_with_parent_fn():
    """A ``preexec_fn`` asking Linux to SIGTERM a child when the thread that started it
    ends: the main thread, or the supervisor's watch thread, which lives exactly as long
    as the supervisor. A killed supervisor thus takes its services with it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded before fork, on purpose
    except OSError:
        return None

    def arm() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return arm


_DIE_WITH_PARENT = _die_with_parent_fn()

# the tick pipeline's order; planner-api is a read model beside it
ALL = ("placer", "causal-store", "telemetry-ingest", "proposer", "evaluator", "planner-api",
       "sim")
ENGINE_METRICS = "engine-metrics"


def services_for(env: dict[str, str]) -> tuple[str, ...]:
    """The services a run with these variables needs: ``ALL``, and engine-metrics when
    the telemetry is read from engines' pages (the sim serves them, a targets list or a
    Prometheus is given) rather than published by the sim."""
    engines = (env.get("KOI_SIM_METRICS_PORT") or env.get("KOI_METRICS_TARGETS_URL")
               or env.get("KOI_METRICS_SOURCE") == "prometheus")
    return (*ALL[:-1], ENGINE_METRICS, ALL[-1]) if engines else ALL


def peak_rss_mib(pid: int) -> float | None:
    """A process's peak resident set (VmHWM) in MiB, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Child:
    service: str
    replica: int
    proc: subprocess.Popen
    log_path: Path
    restarts: int = 0


@dataclass
class Supervisor:
    env: dict[str, str]
    log_dir: Path
    replicas: dict[str, int] = field(default_factory=dict)
    # per service: variables over ``env`` (e.g. the fault suite routes one service's NATS
    # link through a proxy)
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    stopping: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def _spawn(self, service: str, replica: int) -> subprocess.Popen:
        env = {**os.environ, **self.env, **self.service_env.get(service, {}),
               "KOI_REPLICA": str(replica)}
        path = self.log_dir / f"{service}-{replica}.log"
        out = open(path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        try:
            return subprocess.Popen([sys.executable, "-m", SERVICES[service]], env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_DIE_WITH_PARENT)
        finally:
            out.close()

    def peak_rss_mib(self) -> dict[str, float]:
        """Each running child's peak resident memory so far ("service-replica" → MiB,
        the kernel's VmHWM); empty where /proc has no such line (not Linux)."""
        out = {}
        for c in self.children:
            peak = peak_rss_mib(c.proc.pid) if c.proc.poll() is None else None
            if peak is not None:
                out[f"{c.service}-{c.replica}"] = peak
        return out

    def start(self, services: tuple[str, ...] = ALL) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in services:
            if name not in SERVICES:
                raise ValueError(f"unknown service {name!r}; known: {', '.join(SERVICES)}")
            for r in range(self.replicas.get(name, 1)):
                self.children.append(Child(name, r, self._spawn(name, r),
                                           self.log_dir / f"{name}-{r}.log"))

    def poll(self) -> list[str]:
        """Restart every child that exited; returns the ones restarted."""
        restarted: list[str] = []
        with self._lock:
            if self.stopping:
                return restarted
            for c in self.children:
                code = c.proc.poll()
                if code is not None:
                    log.warning("service_exited", service=c.service, replica=c.replica,
                                code=code, log=str(c.log_path))
                    c.proc = self._spawn(c.service, c.replica)
                    c.restarts += 1
                    restarted.append(f"{c.service}-{c.replica}")
        return restarted

    def watch(self, every_s: float = 0.5) -> None:
        def loop() -> None:
            while not self.stopping:
                self.poll()
                time.sleep(every_s)

        self._thread = threading.Thread(target=loop, name="koi-supervisor", daemon=True)
        self._thread.start()

    def child(self, service: str, replica: int = 0) -> Child:
        return next(c for c in self.children if c.service == service and c.replica == replica)

    def kill(self, service: str, replica: int = 0, sig: int = signal.SIGKILL) -> int:
        """Signal one child (``kill -9`` by default); returns its pid."""
        c = self.child(service, replica)
        c.proc.send_signal(sig)
        return c.proc.pid

    def stop(self, grace_s: float = 5.0) -> None:
        with self._lock:
            self.stopping = True
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.terminate()
        deadline = time.monotonic() + grace_s
        for c in self.children:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
