"""End to end: ``koi demo`` as an operator runs it — embedded NATS and valkey, every
service as a process, a short stretch of hetero-3h — finishes, prints the metrics table
and leaves no process of its own behind; without a model endpoint it runs as it always
did, and pointed at ``koi rlm serve-replay`` (recorded answers served as an
OpenAI-compatible endpoint) it shows the hypothesis rounds, accepted and dropped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

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


def _command_lines(pids: set[str]) -> set[str]:
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.add(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out


def _secrets_of(root: Path) -> dict[str, str]:
    """Every secret a run's secrets directory holds, by file: passwords, the gRPC token
    and the body of each private key."""
    found = {}
    for path in root.rglob("*"):
        if path.name in ("password", "token"):
            found[str(path)] = path.read_text().strip()
        elif path.name.endswith("-key.pem"):
            body = "".join(line for line in path.read_text().splitlines()
                           if not line.startswith("-----"))
            found[str(path)] = body[:40]
    return found


def test_demo_runs_everything_and_stops_it(tmp_path):
    """…and nothing secret reaches its output, a service's log or a command line."""
    before = _koi_processes()
    env = {k: v for k, v in os.environ.items()
           if k not in ("KOI_NATS_URL", "KOI_REDIS_URL") and not k.startswith("KOI_RLM_")}
    keep = tmp_path / "run"
    # --fast, as `make demo DEMO_ARGS=--fast` runs it: the first hour of hetero-3h
    proc = subprocess.Popen([sys.executable, "-m", "services.koi_command", "demo", "--fast",
                             "--timeout-s", "300", "--keep", str(keep), "--no-rlm"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    stop = threading.Event()

    def sample() -> None:  # the command lines of what the demo starts, while it runs
        while not stop.wait(0.5):
            seen.update(_command_lines(_koi_processes() - before))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=380)
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert proc.returncode == 0, out[-3000:]
    assert "embedded NATS with JetStream" in out and "embedded valkey" in out
    assert "overall score" in out and "60 ticks" in out
    assert "hypothesis layer off (--no-rlm)" in out and "hypothesis rounds" not in out
    # an operator can follow it (issue 44): no line shape (digits aside) more than three
    # times, and no library warning or traceback on the console
    shapes = Counter(re.sub(r"\d+", "#", line).strip() for line in out.splitlines())
    shapes.pop("", None)
    assert max(shapes.values()) <= 3, shapes.most_common(3)
    stray = [line for line in out.splitlines()
             if re.search(r"Traceback|Warning:|warnings\.warn|Exception", line)]
    assert not stray, stray
    assert not _koi_processes() - before, "the demo left processes running"

    secrets = _secrets_of(keep / "secrets")
    assert len([f for f in secrets if f.endswith("/password")]) >= 8 and secrets
    logs = sorted((keep / "logs").glob("*")) + sorted((keep / "jetstream").glob("*.log"))
    assert logs and any(p.stat().st_size for p in logs)
    assert any("services." in c for c in seen), "no service's command line was sampled"
    texts = {"the demo's output": out, "command lines": "\n".join(seen)}
    texts |= {str(p): p.read_text(errors="replace") for p in logs if p.is_file()}
    conf = (keep / "jetstream" / "nats.conf")
    if conf.is_file():  # the server's configuration: bcrypt hashes, never a password
        texts[str(conf)] = conf.read_text()
    leaks = [f"{name} holds {file}" for file, secret in secrets.items()
             for name, text in texts.items() if secret and secret in text]
    assert not leaks, leaks


def test_demo_against_a_replayed_model_shows_its_hypotheses(tmp_path):
    answers = Path(__file__).parents[2] / "examples" / "rlm" / "demo-answers.jsonl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("KOI_NATS_URL", "KOI_REDIS_URL") and not k.startswith("KOI_RLM_")}
    model = subprocess.Popen([sys.executable, "-m", "koi.cli.main", "rlm", "serve-replay",
                              str(answers)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        url = model.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), url
        env.update(KOI_RLM_BASE_URL=url, KOI_RLM_MODEL="replay-model", COLUMNS="240",
                   KOI_RLM_TRANSCRIPTS=str(tmp_path / "rlm"))
        proc = subprocess.run([sys.executable, "-m", "services.koi_command", "demo",
                               "--horizon-s",
                               "300", "--timeout-s", "300"], env=env, capture_output=True,
                              text=True, timeout=380)
    finally:
        model.send_signal(signal.SIGTERM)
        _, err = model.communicate(timeout=10)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "hypothesis rounds (language model)" in out and "5 ticks" in out
    assert "hypothesis round r0-" in out and "1 accepted, 1 dropped" in out
    assert "chat-us-8b: accepted hypothesis" in out
    assert "chat-us-8b: dropped hypothesis #1" in out and "hallucinated accelerator" in out
    assert "stopped after" in err and len(list((tmp_path / "rlm").glob("r0-*.jsonl"))) == 1
