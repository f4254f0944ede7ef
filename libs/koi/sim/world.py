"""The simulator's hidden world: the parameters the planner never sees and must learn.

``WorldParams`` holds how the simulated hardware *really* behaves — efficiency per
accelerator and engine, noise, the KV-thrash cliff, PCIe all-reduce penalty, network
latency, spot preemption multipliers, stragglers, thermal throttling, slow regions,
engine drift, start-up times. Defaults come from ``data/world.yaml`` (hand-fitted to the
public measurements, see docs/SIMULATOR.md); a scenario may override or randomize them.

The parameters and their bounds are the scenario's schema (``koi.scenario.world``); this
module loads the defaults, jitters them and applies a scenario's overrides. Data only:
no step-time physics (``physics.py``), no simulation loop, and it must never import
``koi.predictor`` (the world is what the predictor has to learn, not a copy of it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from koi.scenario.world import DICT_FIELDS, FIELDS, WorldParams, validate_world_overrides

WORLD_FILE = Path(__file__).resolve().parent / "data" / "world.yaml"


def apply_overrides(world: WorldParams, overrides: dict[str, Any]) -> WorldParams:
    """A copy of ``world`` with ``overrides`` applied (dicts are merged key by key)."""
    errors = validate_world_overrides(overrides)
    if errors:
        raise ValueError("; ".join(f"world.{p}: {r}" for p, r in errors))
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in DICT_FIELDS:
            merged = dict(getattr(world, key))
            merged.update({k: float(v) for k, v in value.items()})
            changes[key] = merged
        else:
            changes[key] = float(value)
    return replace(world, **changes)


def default_world(path: Path | None = None) -> WorldParams:
    """The world of ``data/world.yaml`` (dataclass defaults where the file is silent)."""
    with open(path or WORLD_FILE, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    return apply_overrides(WorldParams(), data)


# Multiplicative jitter per field kind when a scenario asks for a randomized world.
JITTER_SIGMA = 0.1


def randomize(world: WorldParams, rng: np.random.Generator) -> WorldParams:
    """Lognormal jitter (sigma 0.1) around every numeric parameter, kept in its bounds.

    Listed dict entries are jittered; the ``default_*`` fallbacks are too, so an
    accelerator missing from a dict also moves. Keys are visited in sorted order so
    the draw is a function of the seed only.
    """
    changes: dict[str, Any] = {}
    for name in sorted(FIELDS):
        meta = FIELDS[name].metadata
        value = getattr(world, name)
        if name in DICT_FIELDS:
            changes[name] = {k: _jitter(value[k], rng, meta) for k in sorted(value)}
        else:
            changes[name] = _jitter(value, rng, meta)
    return replace(world, **changes)


def _jitter(v: float, rng: np.random.Generator, meta: Any) -> float:
    out = float(v) * math.exp(JITTER_SIGMA * rng.standard_normal())
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None:
        out = max(out, lo)
    if hi is not None:
        out = min(out, hi)
    return out


_randomize = randomize  # load_world's flag shadows the name
WORLD_STREAM = 101  # rng stream id for world randomization


def load_world(overrides: dict[str, Any] | None = None, seed: int | None = None,
               randomize: bool = False) -> WorldParams:
    """The default world, randomized around its defaults from ``seed`` when asked, then
    with ``overrides`` applied (an explicit override always wins over the jitter)."""
    world = default_world()
    if randomize:
        rng = np.random.default_rng([int(seed or 0), WORLD_STREAM])
        world = _randomize(world, rng)
    if overrides:
        world = apply_overrides(world, overrides)
    return world
