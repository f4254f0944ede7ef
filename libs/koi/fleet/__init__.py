"""Koi's edge to a fleet: the two ports and their implementations (simulated, engine
metrics, Kubernetes). See ``koi.fleet.ports``."""

from koi.fleet.ports import FleetBackend, FleetEvent, TelemetrySource

__all__ = ["FleetBackend", "FleetEvent", "TelemetrySource"]
