"""engine-metrics' Prometheus source against a real Prometheus server.

A small in-test page server (``services.sim.metrics_http.PageServer``) serves three
engine replicas' ``/metrics`` pages — two of a vLLM deployment (current vLLM layout),
one of an SGLang deployment (current SGLang layout) — and lists them in ``/targets``; a
thread advances their counters at known rates against the wall clock. Prometheus
scrapes them every second through ``http_sd_configs``; after a window's worth of
scrapes the test reads the telemetry through the prometheus mode
(``services.engine_metrics.main.prometheus_telemetry``: ``koi.fleet.promql``'s queries,
Prometheus's HTTP API) and checks it against the known rates.

Tolerances. ``increase(x[W])`` takes the samples inside the window and extrapolates
their slope to its edges (by at most half a scrape interval past the outer samples), so
for a counter growing linearly it gives ``rate × W`` up to the jitter of the sample
times and the step of the thread that advances the counters (0.05 s against a 10 s
window): 10 % is ample. Every histogram bucket is extrapolated by the same factor
(the same sample times), so means and p95s are read to within a few per cent of the
histogram's own; gauges are exact. Needs the ``prometheus`` binary (skipped without).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from koi.catalog import load_catalog
from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, DeploymentTelemetry
from koi.fleet.engine_metrics import Histogram, parse_page, quantile_estimate
from koi.fleet.exposition import ReplicaCounters, render
from koi.fleet.scrape import targets_document
from koi.space import engine_default_config
from services.engine_metrics.main import prometheus_telemetry
from services.sim.metrics_http import PageServer

pytestmark = [pytest.mark.timeout(120)]

CAT = load_catalog()
WINDOW_S = 10.0
TTFT_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0)
# per second, per deployment: finished, aborted, prompt and generated tokens, KV
# preemptions; TTFT observations by bucket (the rest above 1 s)
RATES = {"vd": {"finished": 12.0, "aborted": 0.5, "prompt": 6000.0, "gen": 1800.0,
                "preempt": 0.2, "ttft": (2.0, 5.0, 3.0, 1.0, 0.6, 0.4)},
         "sd": {"finished": 4.0, "aborted": 0.25, "prompt": 2500.0, "gen": 700.0,
                "preempt": 0.1, "ttft": (0.5, 1.5, 1.0, 0.6, 0.3, 0.1)}}
LAYOUT = {"vd": "vllm-0.34.0", "sd": "sglang-0.5.23"}
REPLICAS = {"vd": 2, "sd": 1}
RUNNING, WAITING, KV = 6.0, 2.0, 0.4   # each replica's gauges


def _prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("needs prometheus: apt-get install -y --no-install-recommends prometheus "
                    "(Debian), or a release binary from prometheus.io on PATH")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deployment(dep_id: str, engine: str, replicas: int) -> Deployment:
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", engine, CAT).with_(replicas=replicas)
    offering = next(o.id for o in CAT.offerings.values() if o.accelerator == "h100-sxm")
    return Deployment(dep_id, f"job-{dep_id}", cfg, offering, DeploymentState.RUNNING,
                      replicas, 0, 0.0)


class Fleet:
    """Three engine replicas whose counters grow at ``RATES`` with the wall clock."""

    def __init__(self, server: PageServer) -> None:
        self.server = server
        self.replicas = {d: [ReplicaCounters("llama-3.1-8b") for _ in range(n)]
                         for d, n in REPLICAS.items()}
        for reps in self.replicas.values():
            for r in reps:
                r.running, r.waiting, r.kv_usage = RUNNING, WAITING, KV
        self._stop = threading.Event()
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._publish()

    def _advance(self, dt: float) -> None:
        for dep, reps in self.replicas.items():
            rate, share = RATES[dep], dt / len(reps)
            for r in reps:
                r.requests_finished += share * rate["finished"]
                r.requests_aborted += share * rate["aborted"]
                r.prompt_tokens += share * rate["prompt"]
                r.generation_tokens += share * rate["gen"]
                r.preemptions += share * rate["preempt"]
                per = [share * c for c in rate["ttft"]]
                cum = [sum(per[:i + 1]) for i in range(len(per))]
                mean = sum(c * b for c, b in zip(rate["ttft"], (*TTFT_BOUNDS, 2.0),
                                                   strict=True)) / sum(rate["ttft"])
                tick = Histogram(TTFT_BOUNDS, tuple(cum), mean * cum[-1])
                r.ttft = tick if r.ttft.count == 0 else r.ttft.plus(tick)

    def _publish(self) -> None:
        pages = {f"/replicas/{d}/{i}/metrics": render(LAYOUT[d], r).encode()
                 for d, reps in self.replicas.items() for i, r in enumerate(reps)}
        doc = targets_document(self.server.address,
                               [(d, f"job-{d}", i, LAYOUT[d].split("-")[0])
                                for d, reps in self.replicas.items() for i in range(len(reps))])
        self.server.publish(pages, doc)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = time.monotonic()
            self._advance(now - self._last)
            self._last = now
            self._publish()

    def __enter__(self) -> Fleet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _get(url: str) -> bytes:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as r:
        return r.read()


@contextlib.contextmanager
def _running_prometheus(binary: str, targets_url: str, tmp: Path):
    port = _free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: koi-engines\n    http_sd_configs:\n"
        f"      - url: {targets_url}\n        refresh_interval: 1s\n")
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if _get(url + "/-/ready"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start: "
                                   + (tmp / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _shape(fleet: Fleet) -> dict[str, tuple[float, float]]:
    """Each deployment's TTFT (p95, mean) as its engine's page shows it (on the engine's
    bounds; the same for any window, the rates being constant)."""
    out = {}
    for dep, reps in fleet.replicas.items():
        h = parse_page(render(LAYOUT[dep], reps[0])).histograms["ttft"]
        out[dep] = (quantile_estimate(0.95, h), h.sum / h.count)
    return out


def _read(url: str) -> list[DeploymentTelemetry]:
    snap = ClusterSnapshot(3, 180.0, WINDOW_S, 3600.0, (),
                           (_deployment("vd", "vllm", 2), _deployment("sd", "sglang", 1)), ())

    async def go() -> list[DeploymentTelemetry]:
        with ThreadPoolExecutor(8) as pool:
            return await prometheus_telemetry(url, snap, window_s=WINDOW_S, at=time.time(),
                                              catalog=CAT, timeout_s=5, pool=pool)
    return asyncio.run(go())


def test_prometheus_mode_reads_the_known_increments(tmp_path: Path) -> None:
    binary = _prometheus()
    with PageServer() as server, Fleet(server) as fleet, \
            _running_prometheus(binary, f"http://{server.address}/targets", tmp_path) as prom:
        # every target scraped for more than a window, with a scrape or two to spare
        deadline = time.monotonic() + 40
        while b'"value"' not in _get(prom + "/api/v1/query?query=count(up%3D%3D1)%3D%3D3"):
            assert time.monotonic() < deadline, "prometheus never scraped all three targets"
            time.sleep(0.5)
        time.sleep(WINDOW_S + 2.5)
        got = {t.deployment_id: t for t in _read(prom)}
        shape = _shape(fleet)
    assert sorted(got) == ["sd", "vd"]
    for dep, rate in RATES.items():
        t = got[dep]
        assert (t.tick, t.job_id, t.window_s) == (2, f"job-{dep}", WINDOW_S)
        for field, per_s in (("requests_finished", rate["finished"]),
                             ("requests_dropped", rate["aborted"]),
                             ("prompt_tokens", rate["prompt"]),
                             ("generation_tokens", rate["gen"]),
                             ("num_preemptions", rate["preempt"])):
            assert getattr(t, field) == pytest.approx(per_s * WINDOW_S, rel=0.10), (dep, field)
        assert t.output_tok_s == pytest.approx(rate["gen"], rel=0.10)
        # constant queues: arrivals are what finished or was aborted
        assert t.requests_arrived == pytest.approx((rate["finished"] + rate["aborted"])
                                                   * WINDOW_S, rel=0.10)
        assert t.num_running == pytest.approx(RUNNING * REPLICAS[dep])
        assert t.num_waiting == pytest.approx(WAITING * REPLICAS[dep])
        assert t.kv_cache_usage == pytest.approx(KV)
        # the p95 and the mean as the engine's own histogram gives them
        assert t.ttft_p95_s == pytest.approx(shape[dep][0], rel=0.05), dep
        assert t.ttft_mean_s == pytest.approx(shape[dep][1], rel=0.05), dep
