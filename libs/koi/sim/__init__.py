"""The simulated world Koi plans against: fleet, engines and hidden world parameters.

``Simulator`` (tick-by-tick cluster), ``run`` (drive a policy through a scenario),
``WorldParams``/``load_world``/``validate_world_overrides``/``randomize`` (the hidden
world), ``auto_sample_fraction`` and ``thinning_error`` (thinned simulation),
``check_world`` (the world against the public measurements); the replicas' engine
``/metrics`` pages are ``koi.fleet.sim_pages``. The simulator never imports
``koi.predictor``: the planner must learn this world from telemetry.
"""

from __future__ import annotations

from typing import Any

from koi.sim.simulator import Simulator, run
from koi.sim.telemetry import TPOT_BOUNDS_S, TTFT_BOUNDS_S
from koi.sim.thinning import auto_sample_fraction
from koi.sim.thinning_check import thinning_error
from koi.sim.world import (
    WorldParams,
    default_world,
    load_world,
    randomize,
    validate_world_overrides,
)


def check_world(*args: Any, **kwargs: Any) -> list[tuple[str, float, float]]:
    """(label, measured, simulated) per in-scope measurement; see koi.sim.world_check."""
    from koi.sim.world_check import check_world as check

    return check(*args, **kwargs)


__all__ = [
    "TPOT_BOUNDS_S",
    "TTFT_BOUNDS_S",
    "Simulator",
    "WorldParams",
    "auto_sample_fraction",
    "check_world",
    "default_world",
    "load_world",
    "randomize",
    "run",
    "thinning_error",
    "validate_world_overrides",
]
