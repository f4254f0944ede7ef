"""The simulator behind the two ports (``koi.fleet.ports``).

A ``SimulatedFleet`` is both the ``FleetBackend`` and the ``TelemetrySource`` of a
simulated run. In a simulation time only moves when the world is told to, so it has one
more verb than a real fleet: ``advance()`` simulates the next tick and keeps its
telemetry, which ``collect`` then hands out. A real fleet advances by itself; its
backend and telemetry source are two objects (Kubernetes and engine metrics).
"""

from __future__ import annotations

from koi.cluster import ActionOutcome, ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.fleet.ports import FleetEvent
from koi.sim.simulator import Simulator

# the simulator's own event records that are the world's doing (the rest echo actions)
WORLD_KINDS = {"preemption": "preemption", "stockout": "stockout"}


class SimulatedFleet:
    """``FleetBackend`` and ``TelemetrySource`` over one ``Simulator``."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self._telemetry: list[DeploymentTelemetry] = []
        self._seen_events = len(sim.fleet.events)

    # --- FleetBackend ---------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        return self.sim.snapshot()

    def apply(self, decision: PlanDecision) -> list[ActionOutcome]:
        return self.sim.apply(decision)

    def events(self) -> list[FleetEvent]:
        new = self.sim.fleet.events[self._seen_events:]
        self._seen_events = len(self.sim.fleet.events)
        return [FleetEvent(WORLD_KINDS[e.kind], e.time_s, e.job_id, e.deployment_id, e.detail)
                for e in new if e.kind in WORLD_KINDS]

    # --- TelemetrySource ------------------------------------------------------------------
    def collect(self, snapshot: ClusterSnapshot) -> list[DeploymentTelemetry]:
        """The telemetry of the tick last advanced (the window ending at ``snapshot``)."""
        if snapshot.tick != self.sim.tick:
            raise ValueError(f"snapshot of tick {snapshot.tick}, but the simulator is at "
                             f"tick {self.sim.tick}")
        return list(self._telemetry)

    # --- simulation only ------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.sim.done

    def advance(self) -> list[DeploymentTelemetry]:
        """Simulate one tick; its telemetry is what ``collect`` returns next."""
        self._telemetry = self.sim.advance()
        return list(self._telemetry)
