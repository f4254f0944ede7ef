"""``oracle``: Koi's composer and placer planning with the simulator's true parameters.

The reference every policy is measured against. Instead of a factor table fitted to
public measurements, its predictor's table is fitted to the run's *hidden world*
(``koi.sim.world``, including the seed's random draw): every public measurement row and
every operating point of the scenario (each job's model and mean request shape, on each
accelerator of the fleet, each engine, bf16 and fp8, saturated and at half load) is
re-measured by the simulator's own replica model with the noise off, and the table is
fitted to those numbers, starting from the world's parameters mapped onto the table
(``world_calibration``). That is the best the predictor's functional form can do
with perfect offline profiling of this world. What the world draws at random per replica
or per step (noise, stragglers, throttling, the KV-thrash cliff) stays unknown, as it
would to any planner; a slow region's multiplier has no factor in the table to go to;
and the predictor's queueing model is still an approximation of the simulator's
request-level batching, so the oracle keeps Koi's beliefs and DRO radius on top. It is
an upper reference, not a proof of optimality: a planner that learns online can still
beat it where the predictor's form is wrong (docs/NOTES.md).

This policy reads the world file by design; it is the only planner that may.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

import structlog

from koi.catalog import Catalog, load_catalog
from koi.planner.tick import KoiSettings
from koi.policies.base import register
from koi.policies.common import PRECISIONS, smallest_fitting_config
from koi.policies.koi import _KoiBase
from koi.predictor.calibration import Calibration
from koi.predictor.fit import fit
from koi.predictor.measurements import Case, load_cases
from koi.predictor.types import LoadMode, Workload
from koi.scenario.types import Scenario
from koi.sim.calibration import Row, load_rows, simulate_row
from koi.sim.world import WorldParams, load_world
from koi.space import DeploymentConfig


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


log = structlog.get_logger(__name__)

ENGINES = ("vllm", "sglang", "trtllm")
HALF_LOAD = 0.5  # the Poisson operating point, as a share of the saturated request rate


def _shapes(scenario: Scenario) -> dict[str, list[tuple[int, int]]]:
    """Per model, its jobs' mean (prompt, answer) lengths: the most prefill-heavy and the
    most decode-heavy shape (one when they coincide)."""
    by: dict[str, set[tuple[int, int]]] = {}
    for job in scenario.jobs:
        shape = (max(1, round(job.input_len.mean_value())),
                 max(1, round(job.output_len.mean_value())))
        by.setdefault(job.model, set()).add(shape)
    return {m: sorted({max(v, key=lambda s: s[0] / s[1]), min(v, key=lambda s: s[0] / s[1])})
            for m, v in sorted(by.items())}


def world_cases(world: WorldParams, scenario: Scenario, catalog: Catalog | None = None
                ) -> list[Case]:
    """Predictor cases whose values are the world's own (noise off): the public
    measurement rows and the scenario's operating points (see the module docstring)."""
    cat = catalog or load_catalog()
    quiet = replace(world, noise_sigma=0.0)
    rows = {int(m.group(1)): r for r in load_rows(catalog=cat)
            if (m := re.match(r"row(\d+) ", r.label))}
    cases = [replace(c, value=simulate_row(rows[c.row], cat, quiet), source="world")
             for c in load_cases(catalog=cat) if c.row in rows]
    accels = sorted({cat.offering(f.offering).accelerator for f in scenario.fleet})
    for model, shapes in _shapes(scenario).items():
        for accel in accels:
            for engine in ENGINES:
                for precision in PRECISIONS:
                    cfg = smallest_fitting_config(model, accel, cat, precision=precision,
                                                  engine=engine)
                    if cfg is not None:
                        cases += _operating_points(cfg, shapes, cat, quiet)
    return cases


def _operating_points(cfg: DeploymentConfig, shapes: list[tuple[int, int]], cat: Catalog,
                      world: WorldParams) -> list[Case]:
    """Saturated throughput, and TTFT and TPOT at half that load, of each shape."""
    out: list[Case] = []
    for inp, outp in shapes:
        tag = f"world {cfg.model} {cfg.accelerator} {cfg.engine} tp{cfg.tp} " \
              f"{cfg.weight_precision.value} {inp}/{outp}"
        sat = simulate_row(Row(tag, cfg, 1, inp, outp, "saturate", 0.0,
                               "output_throughput_tok_s", 0.0), cat, world)
        out.append(Case(0, cfg, Workload(inp, outp), "output_throughput_tok_s", sat,
                        "world", f"{tag} saturated"))
        rate = HALF_LOAD * sat / outp
        if rate <= 0:
            continue
        for metric in ("ttft_ms", "tpot_ms"):
            value = simulate_row(Row(tag, cfg, 1, inp, outp, "poisson", rate, metric, 0.0),
                                 cat, world)
            out.append(Case(0, cfg, Workload(inp, outp, LoadMode.RATE, rate), metric, value,
                            "world", f"{tag} qps={rate:.3g} {metric}"))
    return out


def fitted_world_calibration(world: WorldParams, scenario: Scenario,
                             catalog: Catalog | None = None,
                             cases: list[Case] | None = None) -> Calibration:
    """The factor table fitted to ``world_cases`` (given, or measured here), starting from
    the world's mapped table."""
    base = world_calibration(world)
    cases = cases if cases is not None else world_cases(world, scenario, catalog)
    fitted = fit(cases, catalog, priors=base)
    factors = {g: {**base.factors.get(g, {}), **fitted.factors.get(g, {})}
               for g in set(base.factors) | set(fitted.factors)}
    return Calibration(factors=factors, version="oracle-world-fit",
                       meta={**fitted.meta, "world_cases": len(cases)})


@register("oracle")
class Oracle(_KoiBase):
    settings = KoiSettings()

    def prepare(self, scenario: Scenario, seed: int) -> None:
        """Read the run's true world, exactly as the simulator will build it."""
        started = time.perf_counter()
        world = load_world(scenario.world, seed, scenario.randomize_world)
        calibration = fitted_world_calibration(world, scenario, self.catalog)
        self.settings = replace(self.settings, calibration=calibration)
        log.info("oracle_world_fitted", scenario=scenario.name, seed=seed,
                 cases=calibration.meta["world_cases"],
                 seconds=round(time.perf_counter() - started, 1))
