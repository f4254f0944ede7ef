"""``oracle``: Koi's composer and placer planning with the simulator's true parameters.

The upper bound every policy is measured against. Instead of a fitted efficiency table
and learned beliefs, its predictor's table is derived from the scenario's hidden world
(``koi.sim.world``): per-accelerator HBM and compute efficiency, engine multipliers and
overheads, collective efficiency and the PCIe penalty, per-request TTFT overhead and
network latency. What the world draws at random per replica or per step (noise,
stragglers, thermal throttling, the KV-thrash cliff) stays unknown, as it would to any
planner; and the predictor's queueing model is still an approximation of the
simulator's request-level batching, so the oracle keeps Koi's beliefs and DRO radius on
top of the true physics. It starts where Koi would be after perfect calibration.

This policy reads the world file by design; it is the only planner that may.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from koi.planner.tick import KoiSettings
from koi.policies.base import register
from koi.policies.koi import _KoiBase
from koi.predictor.calibration import Calibration
from koi.scenario.types import Scenario

if TYPE_CHECKING:
    from koi.sim.world import WorldParams


def world_calibration(world: WorldParams) -> Calibration:
    """The predictor's factor table that reproduces the world's mean step time."""
    accels = sorted(set(world.mem_eff) | set(world.comp_eff))
    engines = sorted(set(world.engine_mult) | set(world.engine_overhead_ms) | {"vllm",
                                                                             "sglang",
                                                                             "trtllm"})
    speed = {e: 1.0 / (world.engine_mult.get(e, 1.0) * world.engine_drift.get(e, 1.0))
             for e in engines}
    factors = {
        "mem": {a: world.mem_eff_of(a) for a in accels},
        "comp": {a: world.comp_eff_of(a) for a in accels},
        "precision_comp": {p: 1.0 for p in ("bf16", "fp16", "fp8", "int8", "int4", "fp4")},
        "engine_mem": speed, "engine_comp": dict(speed),
        "engine_ovh_base_ms": {e: world.overhead_s(e, True) * 1e3 / speed[e] for e in engines},
        "engine_ovh_seq_us": {e: 1e-6 for e in engines},  # the world has no per-seq cost
        "engine_ttft_ms": {e: world.ttft_overhead_ms + world.same_region_latency_ms
                           for e in engines},
        "link": {"nvlink": world.collective_eff, "infinity_fabric": world.collective_eff,
                 "roce": world.collective_eff,
                 "pcie": world.collective_eff / world.pcie_tp_penalty},
        "global": {"attn_mem": 1.0, "moe_eff": 1.0, "serial_frac": 1e-6},
    }
    return Calibration(factors=factors, version="oracle-world")


@register("oracle")
class Oracle(_KoiBase):
    settings = KoiSettings()

    def prepare(self, scenario: Scenario, seed: int) -> None:
        """Read the run's true world, exactly as the simulator will build it."""
        from koi.sim.world import load_world

        world = load_world(scenario.world, seed, scenario.randomize_world)
        self.settings = replace(self.settings, calibration=world_calibration(world))
