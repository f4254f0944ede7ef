"""The simulator's hidden world: the parameters the planner never sees and must learn.

``WorldParams`` holds how the simulated hardware *really* behaves — efficiency per
accelerator and engine, noise, the KV-thrash cliff, PCIe all-reduce penalty, network
latency, spot preemption multipliers, stragglers, thermal throttling, slow regions,
engine drift, start-up times. Defaults come from ``data/world.yaml`` (hand-fitted to the
public measurements, see docs/SIMULATOR.md); a scenario may override or randomize them.

This module is data and validation only: no step-time physics (``physics.py``), no
simulation loop, and it must never import ``koi.predictor`` (the world is what the
predictor has to learn, not a copy of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

WORLD_FILE = Path(__file__).resolve().parent / "data" / "world.yaml"


def _m(help: str, lo: float | None = None, hi: float | None = None,
       per_id: bool = False) -> dict[str, Any]:
    """Field metadata: description, bounds, and whether it maps ids to values."""
    return {"help": help, "lo": lo, "hi": hi, "per_id": per_id}


def _p(default: float, help: str, lo: float | None = None, hi: float | None = None) -> Any:
    return field(default=default, metadata=_m(help, lo, hi))


@dataclass(frozen=True)
class WorldParams:
    """Hidden world parameters. Dict fields map an id (accelerator, engine, cloud,
    ``cloud/region``) to a value; ids missing from a dict take the ``default_*`` value."""

    mem_eff: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Achieved share of HBM bandwidth, per accelerator.",
        0.05, 1.0, per_id=True))
    comp_eff: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Achieved share of peak FLOP/s, per accelerator.",
        0.05, 1.0, per_id=True))
    default_mem_eff: float = _p(0.75, "mem_eff of an accelerator not listed.", 0.05, 1.0)
    default_comp_eff: float = _p(0.5, "comp_eff of an accelerator not listed.", 0.05, 1.0)
    engine_mult: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Step-time multiplier per engine (1 = roofline).",
        0.2, 5.0, per_id=True))
    engine_overhead_ms: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Fixed per-step overhead per engine, ms.",
        0.0, 100.0, per_id=True))
    default_overhead_ms: float = _p(3.0, "Per-step overhead of an engine not listed, ms.",
                                    0.0, 100.0)
    no_cuda_graph_mult: float = _p(2.5, "Overhead multiplier when cuda_graphs is off.", 1.0, 10.0)
    ttft_overhead_ms: float = _p(10.0, "Per-request fixed cost added to TTFT (scheduling,"
                                 " tokenisation, first-token return), ms.", 0.0, 1000.0)
    noise_sigma: float = _p(0.04, "Lognormal sigma of one step's time.", 0.0, 1.0)
    kv_cliff_usage: float = _p(0.9, "KV usage above which decode thrashes.", 0.1, 1.0)
    kv_cliff_factor: float = _p(1.6, "Decode-time multiplier past the KV cliff.", 1.0, 10.0)
    pcie_tp_penalty: float = _p(1.8, "Collective-time multiplier on PCIe parts when tp > 1.",
                                1.0, 10.0)
    collective_eff: float = _p(0.7, "Achieved share of interconnect bandwidth.", 0.05, 1.0)
    pp_bubble: float = _p(0.15, "Pipeline bubble share per extra stage.", 0.0, 1.0)
    cross_region_latency_ms: float = _p(70.0, "Added to TTFT when clients are in another"
                                        " region.", 0.0, 2000.0)
    same_region_latency_ms: float = _p(2.0, "Added to TTFT in the same region.", 0.0, 1000.0)
    preemption_mult: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Spot preemption-rate multiplier per cloud.",
        0.0, 1e6, per_id=True))
    straggler_prob: float = _p(0.03, "Chance a replica is a straggler.", 0.0, 1.0)
    straggler_slowdown: float = _p(1.25, "Step-time multiplier of a straggler.", 1.0, 10.0)
    throttle_share: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Share of an accelerator's nodes that throttle.",
        0.0, 1.0, per_id=True))
    throttle_slowdown: float = _p(1.15, "Step-time multiplier of a throttled node.", 1.0, 10.0)
    slow_regions: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Step-time multiplier per 'cloud/region'.",
        1.0, 10.0, per_id=True))
    engine_drift: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Engine-version drift multiplier per engine.",
        0.2, 5.0, per_id=True))
    provisioning_s: dict[str, float] = field(default_factory=dict, metadata=_m(
        "Node provisioning time per cloud, s.",
        0.0, 7200.0, per_id=True))
    default_provisioning_s: float = _p(150.0, "Provisioning of a cloud not listed, s.",
                                       0.0, 7200.0)
    storage_gb_s: float = _p(2.0, "Weight-loading bandwidth per replica, GB/s.", 0.01, 1000.0)
    relaunch_cost_s: float = _p(45.0, "Rank restart time of a RELAUNCH before weights load, s.",
                                0.0, 3600.0)

    # --- lookups (ids missing from a dict take the default) ------------------------------

    def mem_eff_of(self, accel: str) -> float:
        return self.mem_eff.get(accel, self.default_mem_eff)

    def comp_eff_of(self, accel: str) -> float:
        return self.comp_eff.get(accel, self.default_comp_eff)

    def overhead_s(self, engine: str, cuda_graphs: bool) -> float:
        ms = self.engine_overhead_ms.get(engine, self.default_overhead_ms)
        return ms / 1e3 * (1.0 if cuda_graphs else self.no_cuda_graph_mult)

    def provisioning_of(self, cloud: str) -> float:
        return self.provisioning_s.get(cloud, self.default_provisioning_s)


FIELDS = {f.name: f for f in fields(WorldParams)}
DICT_FIELDS = frozenset(n for n, f in FIELDS.items() if f.metadata["per_id"])


def validate_world_overrides(d: Any) -> list[tuple[str, str]]:
    """Every problem in a world-override mapping, as (dotted field path, reason)."""
    if not isinstance(d, dict):
        return [("world", f"must be a mapping (got {type(d).__name__})")]
    errors: list[tuple[str, str]] = []
    for key, value in d.items():
        if key not in FIELDS:
            known = ", ".join(sorted(FIELDS))
            errors.append((str(key), f"unknown world parameter; known: {known}"))
            continue
        meta = FIELDS[key].metadata
        if key in DICT_FIELDS:
            if not isinstance(value, dict):
                errors.append((key, f"must be a mapping of id → number (got {value!r})"))
                continue
            for sub, v in value.items():
                reason = _check_number(v, meta["lo"], meta["hi"])
                if not isinstance(sub, str) or not sub:
                    errors.append((f"{key}.{sub}", "key must be a non-empty id string"))
                elif reason:
                    errors.append((f"{key}.{sub}", reason))
        else:
            reason = _check_number(value, meta["lo"], meta["hi"])
            if reason:
                errors.append((key, reason))
    return errors


def _check_number(v: Any, lo: float | None, hi: float | None) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return f"must be a finite number (got {v!r})"
    if lo is not None and v < lo:
        return f"must be >= {lo:g} (got {v:g})"
    if hi is not None and v > hi:
        return f"must be <= {hi:g} (got {v:g})"
    return ""


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
