"""Scenario record types: the fleet, its capacity over time, the jobs, the world.

Parsed and validated by ``koi.scenario.loader`` from the YAML format documented in
``docs/SCENARIOS.md``. Frozen dataclasses only; no I/O, no simulation logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from koi.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class FleetEntry:
    offering: str   # offering id from the catalog
    gpus: int       # GPUs of that offering available to the fleet at t=0


@dataclass(frozen=True, slots=True)
class CapacityEvent:
    """A change in what an offering can give: a stock-out (negative) or a return."""

    t_s: float
    offering: str
    delta_gpus: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    horizon_s: float
    tick_s: float
    seed: int
    fleet: tuple[FleetEntry, ...]
    jobs: tuple[JobSpec, ...]
    capacity_events: tuple[CapacityEvent, ...] = ()
    # overrides of the simulator's hidden world parameters (validated by koi.scenario.world)
    world: dict[str, Any] = field(default_factory=dict)
    randomize_world: bool = False   # draw world parameters around the defaults from the seed
    # share of online requests simulated (weighted), 0 < f ≤ 1; None = the simulator's
    # automatic choice for the scenario's size
    sample_fraction: float | None = None
    source: str = ""                # file it came from

    @property
    def total_gpus(self) -> int:
        return sum(f.gpus for f in self.fleet)

    @property
    def ticks(self) -> int:
        return round(self.horizon_s / self.tick_s)
