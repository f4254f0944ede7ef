"""The simulator's own small fit of ``data/world.yaml`` efficiencies to the measurements.

Coordinate search, per accelerator, of ``mem_eff`` and ``comp_eff`` over a grid,
minimising the mean |log(simulated / measured)| (clipped at 1 so a few odd rows cannot
dominate) of that accelerator's rows in ``world_check.load_rows``. Prints the values to
paste into ``data/world.yaml``: ``python -m koi.sim.world_fit``. Offline tooling only; it
must never import ``koi.predictor``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Literal

from koi.catalog import load_catalog
from koi.scenario.world import WorldParams
from koi.sim.world import load_world
from koi.sim.world_check import Row, load_rows, simulate_row

GRID = (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.97)
Knob = Literal["mem_eff", "comp_eff"]
KNOBS: tuple[Knob, ...] = ("mem_eff", "comp_eff")


def _loss(rows: list[Row], world: WorldParams) -> float:
    cat = load_catalog()
    errs = [min(abs(math.log(simulate_row(r, cat, world) / r.value)), 1.0) for r in rows]
    return sum(errs) / len(errs)


def _with(world: WorldParams, knob: Knob, accel: str, value: float) -> WorldParams:
    """``world`` with ``knob[accel]`` set to ``value``."""
    if knob == "mem_eff":
        return replace(world, mem_eff={**world.mem_eff, accel: value})
    return replace(world, comp_eff={**world.comp_eff, accel: value})


def _loss_with(rows: list[Row], world: WorldParams, knob: Knob, accel: str,
               value: float) -> float:
    return _loss(rows, _with(world, knob, accel, value))


def fit(sweeps: int = 1) -> WorldParams:
    world = replace(load_world(), noise_sigma=0.0)
    rows = load_rows()
    by_accel: dict[str, list[Row]] = {}
    for r in rows:
        by_accel.setdefault(r.cfg.accelerator, []).append(r)
    for _ in range(sweeps):
        for accel, sub in sorted(by_accel.items()):
            for knob in KNOBS:
                best = min(GRID, key=partial(_loss_with, sub, world, knob, accel))
                world = _with(world, knob, accel, best)
    return world


def main() -> None:
    w = fit()
    print("mem_eff:", {k: w.mem_eff[k] for k in sorted(w.mem_eff)})
    print("comp_eff:", {k: w.comp_eff[k] for k in sorted(w.comp_eff)})


if __name__ == "__main__":
    main()
