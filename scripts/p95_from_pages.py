"""How well a p95 read from engine pages matches the simulator's own (docs/FLEETS.md).

Runs Koi on a scenario for its first hour (``--horizon-s``), reads every tick back from
the simulated engines' ``/metrics`` pages (``koi.fleet.simulated.PageReader``) and
compares each deployment's TTFT and TPOT p95 read from the buckets, by Prometheus's
linear interpolation and by ``quantile_estimate``, with the p95 of the simulated
requests themselves. Prints the median error and median |error| of each.

    .venv/bin/python scripts/p95_from_pages.py hetero-3h
    .venv/bin/python scripts/p95_from_pages.py gen-medium-1
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from koi.catalog import load_catalog
from koi.fleet.engine_metrics import Histogram, histogram_quantile, quantile_estimate
from koi.fleet.simulated import PageReader
from koi.policies import make_policy
from koi.scenario import load_scenario, parse_scenario
from koi.scenario.generate import generate_scenario
from koi.sim.simulator import Simulator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="a shipped scenario or gen-<size>-<seed>")
    ap.add_argument("--horizon-s", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cat = load_catalog()
    if a.scenario.startswith("gen-"):
        _, size, seed = a.scenario.split("-")
        scn = parse_scenario(generate_scenario(int(seed), size, cat), source=a.scenario,
                             catalog=cat)
    else:
        scn = load_scenario(a.scenario)
    scn = dataclasses.replace(scn, horizon_s=min(a.horizon_s, scn.horizon_s))
    sim = Simulator(scn, seed=a.seed, catalog=cat)
    policy = make_policy("koi", catalog=cat, seed=a.seed)
    reader = PageReader(cat)
    errors: dict[tuple[str, str], list[float]] = {}
    telemetry: list = []
    while not sim.done:
        sim.apply(policy.decide(sim.snapshot(), telemetry))
        telemetry = sim.advance()
        read = {t.deployment_id: t for t in reader.read(sim.snapshot(), telemetry)}
        for rec in telemetry:
            page = read.get(rec.deployment_id)
            if page is None or rec.requests_finished <= 0:
                continue
            for metric in ("ttft", "tpot"):
                truth = getattr(rec, f"{metric}_p95_s")
                bounds = getattr(page, f"{metric}_bucket_bounds_s")
                cum = tuple(float(x) for x in np.cumsum(getattr(page, f"{metric}_bucket_counts")))
                if truth <= 0 or not cum or cum[-1] <= 0:
                    continue
                h = Histogram(bounds, cum, getattr(page, f"{metric}_mean_s") * cum[-1])
                for name, fn in (("linear", histogram_quantile),
                                 ("quantile_estimate", quantile_estimate)):
                    errors.setdefault((metric, name), []).append(fn(0.95, h) / truth - 1)
    for (metric, name), e in errors.items():
        arr = np.array(e)
        print(f"{metric} p95 {name:17s} n={arr.size}  median {np.median(arr) * 100:+6.1f} %"
              f"  median |error| {np.median(np.abs(arr)) * 100:5.1f} %")


if __name__ == "__main__":
    main()
