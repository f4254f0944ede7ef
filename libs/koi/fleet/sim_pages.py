"""The simulated fleet's engines as scrape targets: one ``/metrics`` page per replica.

The simulator reports one ``DeploymentTelemetry`` per deployment per tick; a real fleet
has one engine per replica, each with its own cumulative counters. ``SimulatedEngines``
keeps a ``ReplicaCounters`` (``koi.fleet.exposition``) per simulated replica and, once
per tick, adds the tick's telemetry to them, so each replica's page reads as a real
engine's would (``page``), and lists the pages as Prometheus HTTP service discovery
targets (``targets``).

Which replicas a tick goes to. A deployment lists ``ready + starting`` replicas (a
starting engine already answers its metrics port, with zeros), indexed from 0; a
draining deployment keeps its last list until it is gone, as a terminating pod serves
``/metrics`` until it exits. The window ending at snapshot ``n`` is split evenly over the
replicas listed at both ``n - 1`` and ``n``: those a scraper read at ``n - 1`` (its
baseline) and reads again at ``n``. So a scraper that reads every page at every snapshot
gets each tick's counters back exactly (up to float rounding), its running and waiting
requests as they stood at the tick's end, and its KV usage as the simulator averaged
it; a tick of a deployment with no replica listed at both (its first tick) is not on any
page, as a real engine's traffic before its first scrape is not in any window (``lost``
counts them).

Engines and layouts (``ENGINE_LAYOUTS``): vLLM replicas show the current vLLM layout,
SGLang replicas the current SGLang one. TensorRT-LLM replicas show the vLLM layout:
TensorRT-LLM's own Prometheus endpoint (``trtllm-serve``'s ``/prometheus/metrics``, five
families in 1.1) has no token counters, running/waiting or KV usage, so Koi has no table
for it, and a TensorRT-LLM fleet is read through a vLLM-compatible exporter.

Pure: no HTTP server here (``services/sim/metrics_http.py`` serves the text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from koi.cluster import ClusterSnapshot, DeploymentState, DeploymentTelemetry
from koi.fleet.exposition import ReplicaCounters, render, split_tick
from koi.fleet.scrape import replica_path, targets_document

ENGINE_LAYOUTS: dict[str, str] = {"vllm": "vllm-0.34.0", "sglang": "sglang-0.5.23",
                                  "trtllm": "vllm-0.34.0"}
"""Engine id → the release layout (``koi.fleet.engine_tables`` key) its replicas show."""


@dataclass
class _Deployment:
    job_id: str
    engine: str
    layout: str
    replicas: list[ReplicaCounters] = field(default_factory=list)


def _plausible(t: DeploymentTelemetry) -> bool:
    return min(t.num_running, t.num_waiting, t.num_running_end, t.num_waiting_end,
               t.kv_cache_usage, t.ttft_mean_s, t.tpot_mean_s) >= 0.0


def _clamped(t: DeploymentTelemetry) -> DeploymentTelemetry:
    """What an engine could show of a tick the simulator reported below zero: its tick
    means can come out a rounding error under 0 (-3e-15 waiting), and a batch job's mean
    TTFT has been seen negative (hetero-3h seed 1, ticks 36-37: requests re-fed after an
    eviction). No engine shows a negative gauge or latency, and every reader refuses a
    page that does (``parse_page``), so they are shown as 0."""
    return replace(t, num_running=max(t.num_running, 0.0),
                   num_waiting=max(t.num_waiting, 0.0),
                   num_running_end=max(t.num_running_end, 0.0),
                   num_waiting_end=max(t.num_waiting_end, 0.0),
                   kv_cache_usage=max(t.kv_cache_usage, 0.0),
                   ttft_mean_s=max(t.ttft_mean_s, 0.0), tpot_mean_s=max(t.tpot_mean_s, 0.0))


class SimulatedEngines:
    """One ``ReplicaCounters`` per simulated replica, fed tick by tick (see the module
    docstring for which replica gets what)."""

    def __init__(self, layouts: Mapping[str, str] = ENGINE_LAYOUTS) -> None:
        self._layouts = dict(layouts)
        self._deps: dict[str, _Deployment] = {}
        self.tick = -1
        self.lost = 0

    def update(self, snapshot: ClusterSnapshot, telemetry: Sequence[DeploymentTelemetry]
               ) -> bool:
        """Add the window ending at ``snapshot`` (its ``telemetry``) to the replicas and
        list the snapshot's replicas. A snapshot no later than the last one is ignored
        (False), so a replayed tick is not counted twice."""
        if snapshot.tick <= self.tick:
            return False
        listed = {d.id: d for d in snapshot.deployments}
        fed: set[int] = set()
        for t in telemetry:
            dep, now = self._deps.get(t.deployment_id), listed.get(t.deployment_id)
            keep = 0 if dep is None or now is None else min(len(dep.replicas),
                                                             self._count(now, dep))
            if keep == 0 or dep is None:
                self.lost += 1
                continue
            split_tick(t if _plausible(t) else _clamped(t), dep.replicas[:keep])
            fed.update(id(r) for r in dep.replicas[:keep])
        for dep in self._deps.values():
            for r in dep.replicas:
                if id(r) not in fed:  # an idle engine's gauges read 0, not its last tick
                    r.running = r.waiting = r.kv_usage = r.gen_throughput = 0.0
        self._deps = {d.id: self._resized(d) for d in snapshot.deployments}
        self.tick = snapshot.tick
        return True

    def _count(self, d, known: _Deployment | None) -> int:
        n = d.replicas_ready + d.replicas_starting
        if n == 0 and d.state == DeploymentState.DRAINING and known is not None:
            return len(known.replicas)
        return n

    def _resized(self, d) -> _Deployment:
        known = self._deps.get(d.id)
        if known is None:
            engine = d.config.engine
            known = _Deployment(d.job_id, engine, self._layouts.get(engine, "vllm-0.34.0"))
        n = self._count(d, known)
        model = d.config.model
        known.replicas = known.replicas[:n] + [ReplicaCounters(model)
                                               for _ in range(n - len(known.replicas))]
        return known

    # --- what a scraper sees ----------------------------------------------------------------
    def replicas(self) -> list[tuple[str, str, int, str]]:
        """(deployment, job, replica index, engine) of every listed replica."""
        return [(dep_id, d.job_id, i, d.engine) for dep_id, d in self._deps.items()
                for i in range(len(d.replicas))]

    def page(self, deployment_id: str, replica: int) -> str | None:
        """One replica's ``/metrics`` page, or None if it is not listed."""
        d = self._deps.get(deployment_id)
        if d is None or not 0 <= replica < len(d.replicas):
            return None
        return render(d.layout, d.replicas[replica])

    def pages(self) -> dict[str, bytes]:
        """Every listed replica's page by its path (``koi.fleet.scrape.replica_path``)."""
        return {replica_path(dep_id, i): render(d.layout, r).encode()
                for dep_id, d in self._deps.items() for i, r in enumerate(d.replicas)}

    def targets(self, host_port: str) -> str:
        """The ``http_sd`` document listing every page, served at ``host_port``."""
        return targets_document(host_port, self.replicas())
