"""The simulator behind the two ports (``koi.fleet.ports``).

A ``SimulatedFleet`` is both the ``FleetBackend`` and the ``TelemetrySource`` of a
simulated run. In a simulation time only moves when the world is told to, so it has one
more verb than a real fleet: ``advance()`` simulates the next tick and keeps its
telemetry, which ``collect`` then hands out. A real fleet advances by itself; its
backend and telemetry source are two objects (Kubernetes and engine metrics).

``PageReader`` is the other way to read a simulated run: the telemetry the engine-metrics
service would get by scraping the simulator's ``/metrics`` pages, with the same pure
steps (``SimulatedEngines`` → ``parse_targets``/``parse_page`` → ``ScrapeBook``) and no
sockets, so a bench run can read its telemetry as a real fleet's would be read
(``koi bench --telemetry pages``) and be compared with the simulator's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from koi.catalog import Catalog
from koi.cluster import ActionOutcome, ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.fleet.engine_metrics import parse_page
from koi.fleet.ports import FleetEvent
from koi.fleet.scrape import ScrapeBook, parse_targets
from koi.fleet.sim_pages import SimulatedEngines
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


TELEMETRY_PATHS = ("sim", "pages")
"""How a bench run reads its telemetry: ``sim`` (the simulator's own records, what the
sim service publishes on the bus) or ``pages`` (``PageReader``)."""


class PageReader:
    """The simulated fleet's telemetry read back from its engines' ``/metrics`` pages,
    as the engine-metrics service reads a fleet (``services/engine_metrics``), in
    process: each tick's records go onto the replicas' pages, every listed page is
    parsed and windowed against its previous read. What comes back differs from the
    records only by what the pages cannot carry (histogram buckets, arrivals estimated
    from the queue gauges, a deployment's first window, which is a baseline)."""

    HOST = "sim.invalid:9"   # the pages are read from memory; the address is a label

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.engines = SimulatedEngines()
        self.book = ScrapeBook()

    def read(self, snapshot: ClusterSnapshot, records: Sequence[DeploymentTelemetry]
             ) -> list[DeploymentTelemetry]:
        """The window ending at ``snapshot`` (whose simulated records are ``records``)
        as the pages show it."""
        self.engines.update(snapshot, records)
        pages = self.engines.pages()
        targets, _ = parse_targets(self.engines.targets(self.HOST))
        results = [(t, parse_page(pages[urlsplit(t.url).path])) for t in targets]
        collected, self.book = self.book.step(snapshot, results, self.catalog)
        return collected.telemetry
