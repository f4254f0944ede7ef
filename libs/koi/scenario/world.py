"""What a scenario may say about its hidden world: the parameters, their bounds, and the
check of a scenario's ``world:`` overrides.

``WorldParams`` holds how the simulated hardware *really* behaves — efficiency per
accelerator and engine, noise, the KV-thrash cliff, PCIe all-reduce penalty, network
latency, spot preemption multipliers, stragglers, thermal throttling, slow regions,
engine drift, start-up times. The values the simulator starts from, their jitter and
``load_world`` are the simulator's (``koi.sim.world``); this module is the schema a
scenario file is validated against and the generator draws departures within, so the
scenario package needs nothing of the simulator. Data and validation only: it must
never import ``koi.predictor`` (the world is what the predictor has to learn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


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
