"""The oracles: Koi's composer and placer planning with what the world really does.

``oracle`` (the true oracle, the reference every policy is measured against): its
predictor is the simulator itself. Each candidate is run as one replica of the hidden
world (``koi.sim.truth.WorldTruth``: the fleet's own engine model, step-time physics,
KV cliff, engine drift, region multiplier, client latency, the job's length
distribution, the step-noise distribution and a replica's expected straggler and
throttling slowdown), and the composer's table holds those measured per-replica rates
on every offering instead of predictions. What it cannot know is what no planner can:
each step's noise, which replica straggles, and future events (arrivals beyond the
observed rate, spot reclaims, stock-outs). It learns nothing and needs no DRO radius:
its p95s are measured with the noise distribution in them.

To keep a run affordable it measures a job's saturated throughput for every candidate
(one replica run each) and the SLO-bound rate (a bisection) for the ``TOP_K`` best by
saturated tokens per dollar, the ``PER_ACCELERATOR`` best on each accelerator, plus the
configurations already running; the composer chooses among measured candidates only.
Every answer is cached for the run.

``oracle-fit`` (the earlier reference, kept for comparison): Koi itself, beliefs and DRO
included, on a factor table *fitted to the run's hidden world*: every public
measurement row and every operating point of the scenario (each job's model and mean
request shape, on each accelerator of the fleet, each engine, bf16 and fp8, saturated
and at half load) re-measured by the simulator's replica model with the noise off, and
the table fitted to those numbers, starting from the world's parameters mapped onto the
table (``world_calibration``). It is the best the predictor's functional form can do
with perfect offline profiling; it scored below Koi on some fleets, so it is not an
upper bound (docs/NOTES.md).

These policies read the world file by design; they are the only planners that may.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

import structlog

from koi.catalog import Catalog, Offering, load_catalog
from koi.cluster import ClusterSnapshot, DeploymentState
from koi.jobs import JobSpec, OnlineJob
from koi.planner.evaluate import Evaluated
from koi.planner.settings import KoiSettings, Measured
from koi.policies.base import register
from koi.policies.koi import _KoiBase
from koi.predictor.calibration import Calibration
from koi.predictor.fit import fit
from koi.predictor.measurements import Case, load_cases
from koi.predictor.types import LoadMode, Workload
from koi.scenario.types import Scenario
from koi.scenario.world import WorldParams
from koi.shapes import PRECISIONS, smallest_fitting_config
from koi.sim.truth import WorldTruth
from koi.sim.world import load_world
from koi.sim.world_check import Row, load_rows, simulate_row
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


@register("oracle-fit")
class OracleFit(_KoiBase):
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


TOP_K = 12   # online candidates per job whose SLO-bound rate is measured (bisection)
PER_ACCELERATOR = 2   # ... plus the best this many on each accelerator of the fleet


@dataclass
class TruthMeasure:
    """``KoiSettings.measure`` of the true oracle: each evaluated row's per-replica rate
    on every offering of its accelerator, measured in the world (module docstring)."""

    truth: WorldTruth
    catalog: Catalog
    top_k: int = TOP_K
    per_accelerator: int = PER_ACCELERATOR

    def __call__(self, ev: Evaluated, snapshot: ClusterSnapshot) -> Measured:
        offers: dict[str, list[Offering]] = {}
        for cap in snapshot.capacity:
            if cap.total_gpus > 0:
                off = self.catalog.offering(cap.offering)
                offers.setdefault(off.accelerator, []).append(off)
        jobs = {j.id: j.spec for j in snapshot.jobs}
        running = {(d.job_id, d.config.with_(offering="", replicas=1))
                   for d in snapshot.deployments
                   if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING)}
        rows: dict[str, list[int]] = {}
        for i, p in enumerate(ev.proposals):
            if p.job_id in jobs and offers.get(p.config.accelerator):
                rows.setdefault(p.job_id, []).append(i)
        out: dict[tuple[int, str], tuple[float, float]] = {}
        for job_id, idx in rows.items():
            job = jobs[job_id]
            out_len = max(job.output_len.mean_value(), 1.0)
            chosen = self._chosen(job, idx, ev, offers, running)
            for i in chosen:
                cfg = ev.proposals[i].config
                for off in offers[cfg.accelerator]:
                    rate = (self.truth.max_rate_rps(cfg, job, off) if isinstance(job, OnlineJob)
                            else self.truth.saturated_tok_s(cfg, job, off) / out_len)
                    out[(i, off.id)] = (rate, rate * out_len)
        return out

    def _chosen(self, job: JobSpec, idx: list[int], ev: Evaluated,
                offers: dict[str, list[Offering]], running: set) -> list[int]:
        """The rows whose rate is measured: every batch row; online, the ``top_k`` by
        saturated output tok/s per dollar on the cheapest offering, the best
        ``per_accelerator`` of each accelerator by the same measure, and any running one."""
        if not isinstance(job, OnlineJob):
            return idx

        def value(i: int) -> float:
            cfg = ev.proposals[i].config
            off = min(offers[cfg.accelerator], key=lambda o: o.usd_per_gpu_hour)
            usd = off.usd_per_gpu_hour * cfg.gpus_per_replica
            return self.truth.saturated_tok_s(cfg, job, off) / max(usd, 1e-9)

        ranked = sorted(idx, key=lambda i: -value(i))
        keep = {ev.proposals[i].config for i in ranked[:self.top_k]}
        # and the best few on every accelerator, so that an offering lost to a stock-out
        # or a spot storm leaves measured alternatives elsewhere (gen-medium-1: with the
        # top 12 all on Gaudi2, a Gaudi2 stock-out left three online jobs nowhere to go)
        per_accel: dict[str, int] = {}
        for i in ranked:
            accel = ev.proposals[i].config.accelerator
            if per_accel.get(accel, 0) < self.per_accelerator:
                per_accel[accel] = per_accel.get(accel, 0) + 1
                keep.add(ev.proposals[i].config)
        keep |= {c for j, c in running if j == job.id}
        return [i for i in idx if ev.proposals[i].config in keep]


@register("oracle")
class Oracle(_KoiBase):
    """The true oracle (module docstring): measured rates, no learning, no radius."""

    settings = replace(KoiSettings(), use_beliefs=False, learn=False, use_dro=False,
                       risk_coverages=())

    def prepare(self, scenario: Scenario, seed: int) -> None:
        """The run's true world, exactly as the simulator will build it."""
        world = load_world(scenario.world, seed, scenario.randomize_world)
        self.settings = replace(self.settings,
                                measure=TruthMeasure(WorldTruth(world, self.catalog),
                                                     self.catalog))
