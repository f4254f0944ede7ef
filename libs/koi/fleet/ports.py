"""The two ports between Koi and a fleet: where telemetry comes from, where actions go.

Decisions are pure; I/O lives at the edge (the split NVIDIA Dynamo's planner makes between
its planning logic and its connectors). A planner, a service or a bench run talks to a
fleet only through these two protocols, and does not know which fleet it is:

- a ``TelemetrySource`` gives, once per tick, one ``DeploymentTelemetry`` per deployment
  for the window that just ended (latency histograms, running and waiting requests, KV
  usage, preemptions, token counters);
- a ``FleetBackend`` gives the fleet's state (``ClusterSnapshot``: capacity, deployments
  and their readiness, jobs) and takes a tick's ``PlanDecision``, returning what became of
  each action (``ActionOutcome``); the world's own events (a node lost, a pod evicted, a
  spot reclaim) come back as ``FleetEvent``.

Implementations: the simulator (``koi.fleet.simulated.SimulatedFleet``: both ports in
one object, because in a simulation time only moves when the world is told to advance),
engine metrics read from ``/metrics`` pages or a Prometheus server
(``koi.fleet.engine_metrics`` / ``koi.fleet.scrape``), and Kubernetes
(``koi.fleet.k8s``). Protocols only: no I/O here, no transport imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from koi.cluster import ActionOutcome, ClusterSnapshot, DeploymentTelemetry, PlanDecision


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """Something the fleet did on its own, as the backend saw it.

    ``kind`` is one of ``preemption`` (a spot reclaim or pod preemption), ``eviction``,
    ``unschedulable``, ``node_lost``, ``stockout``, ``ready`` (a replica became ready) or
    ``failed`` (a replica crashed); ``deployment_id`` is empty for node-level events.
    """

    kind: str
    time_s: float
    job_id: str = ""
    deployment_id: str = ""
    detail: str = ""


@runtime_checkable
class TelemetrySource(Protocol):
    """Per-deployment telemetry for the window that ended at ``snapshot``'s tick."""

    def collect(self, snapshot: ClusterSnapshot) -> list[DeploymentTelemetry]:
        """One window per deployment the source could read; a deployment it could not
        read (not ready, scrape failed) is left out, never reported as zeros."""
        ...


@runtime_checkable
class FleetBackend(Protocol):
    """The fleet's state in, a tick's actions out, their outcome back."""

    def snapshot(self) -> ClusterSnapshot:
        """What runs now, read from the fleet itself (level-triggered: no memory of what
        was asked is trusted over what is observed)."""
        ...

    def apply(self, decision: PlanDecision) -> list[ActionOutcome]:
        """Carry out a tick's actions; one outcome per action, in order. A refused action
        says why; nothing raises for an action the fleet could not carry out."""
        ...

    def events(self) -> Sequence[FleetEvent]:
        """Fleet events since the last call (each reported once)."""
        ...
