"""Koi's edge to a fleet: the two ports and their implementations (simulated, engine
metrics, Kubernetes). See ``koi.fleet.ports``.

Engine metrics: ``parse_page``/``window``/``merge`` read engines' ``/metrics`` pages
(``koi.fleet.engine_metrics``, names per release in ``koi.fleet.engine_tables``);
``ReplicaCounters``/``render`` write them for the simulator (``koi.fleet.exposition``,
``koi.fleet.sim_pages.SimulatedEngines``); ``parse_targets``/``ScrapeBook`` turn a tick's
scrapes into telemetry (``koi.fleet.scrape``); ``promql`` does the same through a
Prometheus server. ``SimulatedFleet`` (both ports over the simulator) is imported on
first use, so reading pages does not import the simulator.
"""

from typing import Any

from koi.fleet.engine_metrics import (
    EngineScrape,
    Histogram,
    MetricsPageError,
    ReplicaWindow,
    histogram_quantile,
    merge,
    parse_page,
    rebucket,
    window,
)
from koi.fleet.exposition import ReplicaCounters, render, split_tick
from koi.fleet.ports import FleetBackend, FleetEvent, TelemetrySource
from koi.fleet.scrape import ScrapeBook, ScrapeTarget, TargetsError, parse_targets, targets_document
from koi.fleet.sim_pages import ENGINE_LAYOUTS, SimulatedEngines

__all__ = [
    "ENGINE_LAYOUTS",
    "EngineScrape",
    "FleetBackend",
    "FleetEvent",
    "Histogram",
    "MetricsPageError",
    "ReplicaCounters",
    "ReplicaWindow",
    "ScrapeBook",
    "ScrapeTarget",
    "SimulatedEngines",
    "SimulatedFleet",
    "TargetsError",
    "TelemetrySource",
    "histogram_quantile",
    "merge",
    "parse_page",
    "parse_targets",
    "rebucket",
    "render",
    "split_tick",
    "targets_document",
    "window",
]


def __getattr__(name: str) -> Any:
    if name == "SimulatedFleet":
        from koi.fleet.simulated import SimulatedFleet

        return SimulatedFleet
    raise AttributeError(f"module 'koi.fleet' has no attribute {name!r}")
