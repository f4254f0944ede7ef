"""Scenarios: a fleet, its capacity over time, the jobs and the simulated world's quirks.

``load_scenario("hetero-3h")`` reads a shipped scenario (``scenario/data/*.yaml``) or any
YAML file in the format of ``docs/SCENARIOS.md`` into a frozen ``Scenario``;
``parse_scenario``/``scenario_to_dict`` convert the dict form both ways. Errors are
``InvalidSpecError`` naming file, line and field. ``generate_scenario(seed, size)`` draws
a new scenario from the catalog (``scenario/generate.py``). Data and validation only: no
simulation, no transport imports.
"""

from __future__ import annotations

from koi.scenario.durations import format_duration, parse_duration
from koi.scenario.fleet import gpus_by
from koi.scenario.generate import generate_scenario, write_generated
from koi.scenario.loader import (
    SCENARIO_DIR,
    list_scenarios,
    load_scenario,
    parse_scenario,
    scenario_path,
    scenario_to_dict,
)
from koi.scenario.types import CapacityEvent, FleetEntry, Scenario

__all__ = [
    "SCENARIO_DIR",
    "CapacityEvent",
    "FleetEntry",
    "Scenario",
    "format_duration",
    "generate_scenario",
    "gpus_by",
    "list_scenarios",
    "load_scenario",
    "parse_duration",
    "parse_scenario",
    "scenario_path",
    "scenario_to_dict",
    "write_generated",
]
