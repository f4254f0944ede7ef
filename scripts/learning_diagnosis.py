"""What learning changes in Koi's plans, measured against the hidden world (issue 41).

Runs Koi-family policies (default ``koi`` and ``koi-no-learning``) through one scenario
and, every tick, for every online job the plan places, compares the per-replica rate
the composer planned with (the evaluator's robust ``max_rate_rps`` of the chosen row,
and its nominal one: beliefs applied, no radius) against the rate one replica of that
configuration really serves within the job's SLO in the run's world
(``koi.sim.truth.WorldTruth``, the oracle's measurement: the fleet's engine model,
throttling, stragglers, the region and the job's lengths). log(planned / true) > 0 is an
optimistic plan (too few replicas: SLO misses), < 0 a pessimistic one (too many: cost).

Writes ``ticks.csv`` (one row per policy, tick and placed online job) and prints, per
policy, the run's score terms, and per job: its SLO attainment, the accelerators it held,
mean replicas, and the median log error of the robust and the nominal rate over the
first and the last third of the run. Training seeds only (< 1000): this is for
diagnosis, never for choosing defaults on held-out scenarios.

    .venv/bin/python scripts/learning_diagnosis.py --size medium --seed 3 -o out/diag-m3

generates ``gen-medium-3`` and runs it with run seed 3, as ``koi bench suite`` does.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import koi.planner.tick as tick_module
from koi.bench.jobs import job_activity
from koi.bench.runner import run_once
from koi.bench.suite import scenario_name
from koi.catalog import load_catalog
from koi.causal.observe import attribute
from koi.causal.scope import scope_of
from koi.jobs import OnlineJob
from koi.planner.settings import VARIANTS
from koi.scenario import parse_scenario
from koi.scenario.generate import generate_scenario
from koi.scenario.types import Scenario
from koi.sim.truth import WorldTruth
from koi.sim.world import load_world

FIELDS = ("policy", "tick", "job", "offering", "accelerator", "replicas", "demand_rps",
          "robust_rps", "nominal_rps", "true_rps", "radius_ttft", "log_robust", "log_nominal",
          "realised_coverage_ttft", "evidence")


def _log(a: float, b: float) -> float:
    return math.log(a / b) if a > 0 and b > 0 else float("nan")


def run_policy(scenario: Scenario, policy: str, seed: int, truth: WorldTruth,
               rows: list[dict[str, Any]]) -> Any:
    """One run of ``policy`` with ``compose_stage`` wrapped to record each placed
    online job's planned and true per-replica rate."""
    original = tick_module.compose_stage
    catalog = truth.catalog

    def recording(ev: Any, inputs: Any) -> Any:
        plan = original(ev, inputs)
        specs = {j.spec.id: j.spec for j in inputs.jobs}
        # the share of TTFT p95 residuals that fell inside the radius in force when they
        # arrived (out of sample), against the calibrator's target ``coverage``
        realised = inputs.calibrator.realised_coverage("ttft_p95")
        for c in plan.choices:
            spec = specs.get(c.job_id)
            if (c.candidate_id is None or c.config is None or c.replicas < 1
                    or not isinstance(spec, OnlineJob)):
                continue
            i = int(str(c.candidate_id).split("@", 1)[0])
            offering = catalog.offering(c.offering)
            true = truth.max_rate_rps(c.config, spec, offering)
            load = inputs.loads.get(c.job_id)
            robust, nominal = float(ev.max_rate_rps[i]), float(ev.nominal_max_rate_rps[i])
            # where the row's TTFT correction comes from: its own scope ("own"), a wider
            # one it backed off to ("wider"), or the prior ("prior": no scope has evidence)
            own = scope_of(c.config, catalog)
            belief = inputs.beliefs.lookup(attribute("ttft", None, inputs.beliefs.regimes),
                                           own)
            evidence = ("own" if belief.scope == own else
                        "prior" if belief.support == 0 else "wider")
            rows.append({
                "policy": policy, "tick": inputs.snapshot.tick, "job": c.job_id,
                "offering": c.offering, "accelerator": c.config.accelerator,
                "replicas": c.replicas,
                "demand_rps": round(load.rate_rps, 4) if load else "",
                "robust_rps": round(robust, 4), "nominal_rps": round(nominal, 4),
                "true_rps": round(true, 4), "radius_ttft": round(float(ev.radius_ttft[i]), 4),
                "log_robust": round(_log(robust, true), 4),
                "log_nominal": round(_log(nominal, true), 4),
                "realised_coverage_ttft": round(realised, 4), "evidence": evidence})
        return plan

    tick_module.compose_stage = recording
    try:
        return run_once(scenario, policy, seed, catalog=catalog)
    finally:
        tick_module.compose_stage = original


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def result_coverage_target(policy: str) -> float:
    return VARIANTS[policy].coverage if policy in VARIANTS else float("nan")


def _coverage_thirds(result: Any, rows: list[dict[str, Any]]) -> tuple[str, str]:
    mine = [r for r in rows if r["policy"] == result.policy]
    if not mine:
        return "–", "–"
    ticks = sorted({r["tick"] for r in mine})
    span = (ticks[-1] - ticks[0]) / 3
    early = _median([r["realised_coverage_ttft"] for r in mine
                     if r["tick"] <= ticks[0] + span])
    late = _median([r["realised_coverage_ttft"] for r in mine
                    if r["tick"] >= ticks[-1] - span])
    return f"{early:.2f}", f"{late:.2f}"


def summarise(result: Any, rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"## {result.policy}: score {result.metrics.overall_score:.2f}",
             "terms: " + ", ".join(f"{k} {v:.3f}"
                                   for k, v in result.metrics.score_terms.items()),
             f"spend ${result.metrics.spend_usd:,.0f}",
             "TTFT radius's realised coverage (target {:.2f}), first → last third: {} → {}"
             .format(result_coverage_target(result.policy), *_coverage_thirds(result, rows)),
             "",
             "| job | ttft met | tpot met | GPU-h by family | moves | mean replicas "
             "| log robust/true first→last third | log nominal/true first→last |",
             "|---|---:|---:|---|---|---:|---|---|"]
    activity = job_activity(result.record)
    mine = [r for r in rows if r["policy"] == result.policy]
    ticks = sorted({r["tick"] for r in mine}) or [0]
    third = (ticks[-1] - ticks[0]) / 3 + ticks[0]
    last = ticks[-1] - (ticks[-1] - ticks[0]) / 3
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in mine:
        by_job[r["job"]].append(r)
    for jm in result.metrics.jobs:
        if jm.kind != "online":
            continue
        js = by_job.get(jm.job_id, [])
        early = [r for r in js if r["tick"] <= third]
        late = [r for r in js if r["tick"] >= last]
        act = activity.get(jm.job_id)
        gpu_h = ", ".join(f"{k} {v:.0f}" for k, v in sorted(
            (act.gpu_hours if act else {}).items(), key=lambda kv: -kv[1]) if v >= 0.5)
        reps = statistics.mean(r["replicas"] for r in js) if js else 0.0

        def fmt(part: list[dict[str, Any]], key: str) -> str:
            return f"{_median([r[key] for r in part]):+.2f}"

        met = (f"{jm.ttft_met_frac:.3f}" if jm.ttft_met_frac is not None else "–",
               f"{jm.tpot_met_frac:.3f}" if jm.tpot_met_frac is not None else "–")
        lines.append(f"| {jm.job_id} | {met[0]} | {met[1]} | {gpu_h} | "
                     f"{act.moves() if act else ''} | {reps:.1f} | "
                     f"{fmt(early, 'log_robust')} → {fmt(late, 'log_robust')} | "
                     f"{fmt(early, 'log_nominal')} → {fmt(late, 'log_nominal')} |")
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="medium", help="small | medium | large")
    ap.add_argument("--seed", type=int, required=True, help="scenario and run seed (< 1000)")
    ap.add_argument("--policies", default="koi,koi-no-learning")
    ap.add_argument("-o", "--out", type=Path, default=Path("out/diagnosis"))
    args = ap.parse_args()
    if args.seed >= 1000:
        raise SystemExit("held-out seeds (>= 1000) are not for diagnosis")
    catalog = load_catalog()
    name = scenario_name(args.size, args.seed)
    scenario = parse_scenario(generate_scenario(args.seed, args.size, catalog), source=name,
                              catalog=catalog)
    truth = WorldTruth(load_world(scenario.world, args.seed, scenario.randomize_world),
                       catalog)
    rows: list[dict[str, Any]] = []
    report = [f"# {name} seed {args.seed}", ""]
    for policy in args.policies.split(","):
        result = run_policy(scenario, policy, args.seed, truth, rows)
        report += summarise(result, rows)
        print("\n".join(summarise(result, rows)), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "ticks.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    (args.out / "summary.md").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
