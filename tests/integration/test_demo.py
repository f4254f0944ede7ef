"""End to end: ``koi demo`` as an operator runs it — embedded NATS and valkey, every
service as a process, a short stretch of hetero-3h — finishes, prints the metrics table
and leaves no process of its own behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _koi_processes() -> set[str]:
    """Pids of service processes and embedded servers (what the demo starts)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # the system's own nats-server (/usr/sbin) is not the demo's
        if "-m services." in cmd or "valkey-server" in cmd or (
                "nats-server" in cmd and not cmd.startswith("/usr/")):
            out.add(entry)
    return out


def test_demo_runs_everything_and_stops_it(tmp_path):
    before = _koi_processes()
    env = {k: v for k, v in os.environ.items() if k not in ("KOI_NATS_URL", "KOI_REDIS_URL")}
    proc = subprocess.Popen([sys.executable, "-m", "services.koi_command", "demo", "--horizon-s",
                             "300", "--timeout-s", "300"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=380)
    assert proc.returncode == 0, out[-3000:]
    assert "embedded NATS with JetStream" in out and "embedded valkey" in out
    assert "overall score" in out and "5 ticks" in out
    assert not _koi_processes() - before, "the demo left processes running"
