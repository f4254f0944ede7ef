"""Deterministic scenario generator: scenarios drawn from the catalog that nobody tuned to.

``generate_scenario(seed, size)`` returns the YAML dict form of docs/SCENARIOS.md
("Generated scenarios"): a fleet of catalog offerings (clouds, regions, on-demand and
spot), capacity incidents (spot storms, stock-outs, returns, new capacity), online jobs
(chat, code, RAG, agents, long context; Poisson, diurnal or replayed shared traces) and
batch jobs with deadlines, SLOs from loose to impossible, and world departures drawn
inside ``WorldParams``' own bounds. Everything comes from one numpy ``Generator`` seeded
from (seed, size), so the same seed and size give a byte-identical file.

**Seeds >= 1000 are held out for evaluation**: no default or constant here may be chosen
by looking at a scenario generated from them; tune on seeds below 1000 only.

Offered load: every job is given a share of a target load drawn in [0.4, 1.2] of the
fleet's rough capacity, ``sum(gpus * bf16 peak FLOP/s) * SERVING_EFF``; a request costs
``2 * active parameters * (mean input + mean output tokens)`` FLOPs. Rates and trace
speeds are rounded and clipped to the job bounds, and the load that results is stated
in the description.

Pure: no clocks, no global randomness; the only I/O is reading the catalog and the
shared traces' statistics, and ``write_generated`` writing its file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from koi.catalog import Catalog, Market, Model, Offering, load_catalog
from koi.jobs import Trace, load_trace, resolve_trace_path, solve_lognormal
from koi.jobs.bounds import MAX_RATE_RPS, MAX_TIME_SCALE, MIN_TIME_SCALE, MIN_TPOT_MS
from koi.scenario.durations import format_duration, parse_duration
from koi.scenario.world import FIELDS, WorldParams

TICK_S = 60
# Share of bf16 peak that serving under SLOs turns into useful FLOPs. Chosen so that the
# shipped trace-azure scenario, whose fleet is "about twice the mean demand", comes out
# near 0.5 by this estimate.
SERVING_EFF = 0.25
LOAD_RANGE = (0.4, 1.2)
MIN_RATE_RPS = 0.05
RATE_CAP_RPS = MAX_RATE_RPS / 10  # keeps one job's simulation cheap; far below the bound
FIT_SHARE = 0.8  # fp8 weights (1 byte/parameter) must fit this share of a node's memory
SIZE_STREAM = {"small": 1, "medium": 2, "large": 3, "xlarge": 4}


@dataclass(frozen=True, slots=True)
class SizeSpec:
    """Ranges (inclusive) one size draws from."""

    gpus: tuple[int, int]
    jobs: tuple[int, int]
    hours: tuple[int, int]
    accelerators: tuple[int, int]   # distinct accelerator types in the fleet
    incidents: tuple[int, int]      # offerings hit by a capacity incident


SIZES = {
    "small": SizeSpec((32, 96), (3, 8), (1, 2), (1, 3), (0, 2)),
    "medium": SizeSpec((150, 400), (10, 25), (2, 4), (3, 6), (1, 4)),
    "large": SizeSpec((400, 1200), (25, 60), (4, 8), (5, 9), (2, 7)),
    # Scale tests (issue 43): about 10,000 GPUs and 500 jobs.
    "xlarge": SizeSpec((8000, 12000), (400, 600), (8, 12), (7, 12), (6, 16)),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """A kind of job: its lengths, base SLO (online), and the context a model needs."""

    name: str
    input_len: dict[str, float]
    output_len: dict[str, float]
    context: int
    slo: tuple[float, float] = (0.0, 0.0)   # base ttft_ms, tpot_ms (online only)
    prefix_share: float = 0.0
    trace: str | None = None


ONLINE = (
    Workload("chat", {"p50": 800, "p99": 3000}, {"mean": 200, "p99": 900}, 4096,
             (1000, 60), 0.0, "shared:traces/azure_llm_2023_conv.csv"),
    Workload("code", {"mean": 2048, "p99": 8000}, {"mean": 60, "p99": 400}, 16384,
             (500, 50), 0.4, "shared:traces/azure_llm_2023_code.csv"),
    Workload("rag", {"p50": 4000, "p99": 12000}, {"mean": 150, "p99": 600}, 16384,
             (1500, 70), 0.3),
    Workload("agent", {"p50": 3000, "p99": 16000}, {"mean": 300, "p99": 1500}, 32768,
             (2000, 70), 0.6),
    Workload("longctx", {"p50": 20000, "p99": 90000}, {"mean": 350, "p99": 1200}, 131072,
             (8000, 100), 0.0, "shared:traces/mooncake_fast25_conversation.csv"),
)
BATCH = (
    Workload("summarize", {"mean": 3000, "sigma": 0.8}, {"mean": 250, "p99": 900}, 16384),
    Workload("eval", {"mean": 1500, "sigma": 0.7}, {"mean": 400, "p99": 1500}, 8192),
    Workload("synth", {"mean": 500, "sigma": 0.6}, {"mean": 800, "p99": 2500}, 8192),
)
BATCH_SHARE = 0.3
ARRIVALS = ("rate", "diurnal", "trace")
ARRIVAL_P = (0.45, 0.35, 0.2)
NO_TRACE_RATE_P = 0.55                  # without a usable trace: rate, else diurnal
SLO_TIERS = {"loose": 3.0, "normal": 1.0, "tight": 0.5, "impossible": 0.0}
SLO_TIER_P = (0.25, 0.45, 0.2, 0.1)
IMPOSSIBLE_SLO = (10.0, 1.0)            # ms: below the world's own fixed TTFT cost
ARRIVAL_NAMES = {"rate_rps": "Poisson", "mean_rps": "diurnal", "trace": "trace"}
WORLD_SCALARS = ("noise_sigma", "kv_cliff_usage", "kv_cliff_factor", "pcie_tp_penalty",
                 "straggler_prob", "straggler_slowdown", "throttle_slowdown",
                 "cross_region_latency_ms")


# --- public API ------------------------------------------------------------------------

def generate_scenario(seed: int, size: str = "medium",
                      catalog: Catalog | None = None) -> dict[str, Any]:
    """The YAML dict form of scenario ``gen-<size>-<seed>``; same arguments, same dict."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (got {seed!r})")
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)} (got {size!r})")
    cat = catalog or load_catalog()
    spec = SIZES[size]
    rng = np.random.default_rng([seed, SIZE_STREAM[size]])
    horizon_s = 1800 * int(rng.integers(2 * spec.hours[0], 2 * spec.hours[1] + 1))
    fleet = _draw_fleet(rng, cat, spec)
    events = _draw_events(rng, fleet, spec, horizon_s)
    capacity = _capacity_flops(fleet, cat)
    jobs, load = _draw_jobs(rng, cat, fleet, spec, horizon_s, capacity)
    world = _draw_world(rng, cat, fleet)
    return {
        "name": f"gen-{size}-{seed}",
        "description": _describe(seed, size, fleet, events, jobs, load, world),
        "horizon": format_duration(horizon_s), "tick": f"{TICK_S}s", "seed": seed,
        "randomize_world": False, "world": world,
        "fleet": [{"offering": o.id, "gpus": g} for o, g in fleet],
        "capacity_events": events,
        "jobs": jobs,
    }


def scenario_yaml(data: dict[str, Any]) -> str:
    """The file text for a generated dict (stable key order and formatting)."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def write_generated(seed: int, size: str, path: str | Path,
                    catalog: Catalog | None = None) -> Path:
    """Generate ``gen-<size>-<seed>`` and write it to ``path``; returns the path."""
    p = Path(path)
    p.write_text(scenario_yaml(generate_scenario(seed, size, catalog)), encoding="utf-8")
    return p


def first_ticks(data: dict[str, Any], ticks: int) -> dict[str, Any]:
    """A generated dict cut to its first ``ticks`` ticks (later jobs, ends and capacity
    events dropped): a cheap smoke run of a scenario the planner has never seen."""
    horizon = ticks * TICK_S
    jobs = [dict(j) for j in data["jobs"] if parse_duration(j.get("submit", 0)) < horizon]
    for j in jobs:
        if "end" in j and parse_duration(j["end"]) >= horizon:
            del j["end"]
    events = [e for e in data["capacity_events"] if e["at"] < horizon]
    return {**data, "horizon": horizon, "jobs": jobs, "capacity_events": events}


# --- fleet and capacity ----------------------------------------------------------------

def _draw_fleet(rng: np.random.Generator, cat: Catalog,
                spec: SizeSpec) -> list[tuple[Offering, int]]:
    """Offerings of a few accelerator types, GPUs in whole instances, total in range."""
    by_accel: dict[str, list[Offering]] = {}
    for o in sorted(cat.offerings.values(), key=lambda o: o.id):
        if o.market in (Market.ON_DEMAND, Market.SPOT):
            by_accel.setdefault(o.accelerator, []).append(o)
    accels = sorted(by_accel)
    k = min(len(accels), int(rng.integers(spec.accelerators[0], spec.accelerators[1] + 1)))
    chosen: list[Offering] = []
    for a in rng.choice(accels, size=k, replace=False):
        options = by_accel[str(a)]
        n = min(len(options), int(rng.integers(1, 3)))
        chosen.extend(options[int(i)] for i in sorted(rng.choice(len(options), n, False)))
    target = int(rng.integers(spec.gpus[0], spec.gpus[1] + 1))
    shares = rng.dirichlet(np.ones(len(chosen)))
    units = [max(1, round(s * target / o.gpus_per_instance))
             for s, o in zip(shares, chosen, strict=True)]
    _fit_total(rng, chosen, units, spec.gpus)
    return [(o, u * o.gpus_per_instance) for o, u in zip(chosen, units, strict=True)]


def _fit_total(rng: np.random.Generator, offers: list[Offering], units: list[int],
               bounds: tuple[int, int]) -> None:
    """Add or remove whole instances until the fleet's GPUs lie within ``bounds``."""
    def total() -> int:
        return sum(u * o.gpus_per_instance for o, u in zip(offers, units, strict=True))

    while total() > bounds[1]:
        i = max((j for j in range(len(units)) if units[j] > 1),
                key=lambda j: units[j] * offers[j].gpus_per_instance)
        units[i] -= 1
    while total() < bounds[0]:
        i = int(rng.integers(len(units)))
        if total() + offers[i].gpus_per_instance <= bounds[1]:
            units[i] += 1


def _draw_events(rng: np.random.Generator, fleet: list[tuple[Offering, int]],
                 spec: SizeSpec, horizon_s: int) -> list[dict[str, Any]]:
    """One incident on each of a few offerings, so no offering can go below zero."""
    n = min(len(fleet), int(rng.integers(spec.incidents[0], spec.incidents[1] + 1)))
    events: list[dict[str, Any]] = []
    for i in sorted(rng.choice(len(fleet), size=n, replace=False)):
        offer, gpus = fleet[int(i)]
        events.extend(_incident(rng, offer, gpus // offer.gpus_per_instance, horizon_s))
    return sorted(events, key=lambda e: e["at"])


def _incident(rng: np.random.Generator, offer: Offering, units: int,
              horizon_s: int) -> list[dict[str, Any]]:
    ticks = horizon_s // TICK_S
    start = TICK_S * int(rng.integers(max(1, ticks // 10), max(2, 7 * ticks // 10)))
    step = offer.gpus_per_instance
    if offer.market == Market.SPOT:
        kind, lost_share, p_return = "spot storm", rng.uniform(0.25, 0.75), 0.8
    elif rng.random() < 0.7:
        kind, lost_share, p_return = "stock-out", rng.uniform(0.25, 1.0), 0.5
    else:
        added = int(rng.integers(1, max(1, units // 2) + 1)) * step
        return [{"at": start, "offering": offer.id, "delta_gpus": added,
                 "note": "new capacity"}]
    lost = max(1, round(lost_share * units)) * step
    out = [{"at": start, "offering": offer.id, "delta_gpus": -lost, "note": kind}]
    back = start + TICK_S * int(rng.integers(max(1, ticks // 10), max(2, 4 * ticks // 10)))
    if rng.random() < p_return and back < horizon_s:
        out.append({"at": back, "offering": offer.id, "delta_gpus": lost, "note": "returns"})
    return out


def _capacity_flops(fleet: list[tuple[Offering, int]], cat: Catalog) -> float:
    """The fleet's rough serving capacity, FLOP/s (see the module docstring)."""
    peak = sum(g * cat.accelerators[o.accelerator].bf16_tflops * 1e12 for o, g in fleet)
    return peak * SERVING_EFF


def _node_memory_gb(fleet: list[tuple[Offering, int]], cat: Catalog) -> float:
    """The most memory one node of the fleet has (GPUs per node, capped by the fleet's)."""
    best = 0.0
    for o, g in fleet:
        acc = cat.accelerators[o.accelerator]
        best = max(best, acc.memory_gb * min(acc.gpus_per_node, g))
    return best


# --- jobs ------------------------------------------------------------------------------

def _draw_jobs(rng: np.random.Generator, cat: Catalog, fleet: list[tuple[Offering, int]],
               spec: SizeSpec, horizon_s: int,
               capacity: float) -> tuple[list[dict[str, Any]], float]:
    """Jobs sharing a target load; returns them and the offered load they add up to."""
    n = int(rng.integers(spec.jobs[0], spec.jobs[1] + 1))
    target = rng.uniform(*LOAD_RANGE)
    shares = rng.dirichlet(np.ones(n))
    memory = _node_memory_gb(fleet, cat)
    regions = sorted({f"{o.cloud}/{o.region}" for o, _ in fleet})
    budget = capacity * horizon_s  # FLOPs the fleet can serve over the horizon
    jobs: list[dict[str, Any]] = []
    work = 0.0
    for i in range(n):
        batch = rng.random() < BATCH_SHARE
        kinds = BATCH if batch else ONLINE
        wl = kinds[int(rng.integers(len(kinds)))]
        model = _pick_model(rng, cat, memory, wl.context)
        draw = _batch_job if batch else _online_job
        job, flops = draw(rng, wl, model, horizon_s, target * shares[i] * budget, regions)
        job["id"] = f"{wl.name}-{i:02d}-{model.id.replace('.', '-')}"
        jobs.append(job)
        work += flops
    return jobs, work / budget


def _pick_model(rng: np.random.Generator, cat: Catalog, memory_gb: float,
                context: int) -> Model:
    """A catalog model that fits one node of the fleet (fp8) and holds the context."""
    fits = [m for m in sorted(cat.models.values(), key=lambda m: m.id)
            if m.params_b <= FIT_SHARE * memory_gb and m.max_context >= context]
    if not fits:  # nothing fits: the smallest model that holds the context
        fits = [min((m for m in cat.models.values() if m.max_context >= context),
                    key=lambda m: (m.params_b, m.id))]
    return fits[int(rng.integers(len(fits)))]


def _lengths(wl: Workload, context: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Length dicts clipped so that one request fits the model's context."""
    return ({**wl.input_len, "max": 3 * context // 4},
            {**wl.output_len, "max": context // 4})


def _mean_len(dist: dict[str, float]) -> float:
    keys = {k: float(v) for k, v in dist.items() if k in ("mean", "sigma", "p50", "p99")}
    return solve_lognormal(**keys)[0]


def _flops_per_request(model: Model, mean_in: float, mean_out: float) -> float:
    return 2.0 * model.active_params_b * 1e9 * (mean_in + mean_out)


def _times(rng: np.random.Generator, horizon_s: int) -> tuple[int, int | None]:
    """Submit (0 for most jobs) and end (None = the horizon), on tick boundaries."""
    ticks = horizon_s // TICK_S
    submit = 0 if rng.random() < 0.6 else TICK_S * int(rng.integers(1, max(2, 6 * ticks // 10)))
    if rng.random() < 0.75:
        return submit, None
    earliest = submit // TICK_S + max(1, ticks // 5)
    if earliest >= ticks:
        return submit, None
    return submit, TICK_S * int(rng.integers(earliest, ticks))


def _online_job(rng: np.random.Generator, wl: Workload, model: Model, horizon_s: int,
                work: float, regions: list[str]) -> tuple[dict[str, Any], float]:
    """A service whose rate fills ``work`` FLOPs over the time it is active."""
    submit, end = _times(rng, horizon_s)
    active_s = (end or horizon_s) - submit
    input_len, output_len = _lengths(wl, model.max_context)
    usable = _usable_trace(wl, model)
    kind = ARRIVALS[int(rng.choice(3, p=ARRIVAL_P))] if usable else (
        "rate" if rng.random() < NO_TRACE_RATE_P else "diurnal")
    trace = usable if kind == "trace" else None
    if trace is not None:
        mean_in, mean_out = float(trace.input_tokens.mean()), float(trace.output_tokens.mean())
    else:
        mean_in, mean_out = _mean_len(input_len), _mean_len(output_len)
    per_request = _flops_per_request(model, mean_in, mean_out)
    rate = _sig(min(RATE_CAP_RPS, max(MIN_RATE_RPS, work / per_request / active_s)))
    job: dict[str, Any] = {"kind": "online", "id": "", "model": model.id,
                           "priority": int(rng.integers(2, 10))}
    if trace is not None:
        scale = _sig(min(MAX_TIME_SCALE, max(MIN_TIME_SCALE, trace.mean_rate / rate)))
        rate = trace.mean_rate / scale
        job["arrival"] = {"trace": wl.trace, "time_scale": scale, "loop": True}
        job["input_len"], job["output_len"] = "trace", "trace"
    else:
        job["arrival"] = _arrival(rng, kind, rate, horizon_s)
        job["input_len"], job["output_len"] = input_len, output_len
    job["slo"] = _slo(rng, wl, model)
    if wl.prefix_share:
        job["prefix_share"] = wl.prefix_share
    if regions and rng.random() < 0.3:
        job["client_region"] = regions[int(rng.integers(len(regions)))]
    _set_times(job, submit, end, "end")
    return job, rate * per_request * active_s


def _usable_trace(wl: Workload, model: Model) -> Trace | None:
    """The workload's shared trace if it is there and every row fits the model."""
    if wl.trace is None:
        return None
    trace = load_trace(resolve_trace_path(wl.trace))
    most = int(trace.input_tokens.max()) + int(trace.output_tokens.max())
    return trace if most <= model.max_context else None


def _arrival(rng: np.random.Generator, kind: str, rate: float,
             horizon_s: int) -> dict[str, Any]:
    """A constant-rate Poisson or a diurnal arrival whose period is the horizon or half."""
    if kind == "rate":
        return {"rate_rps": rate}
    period = horizon_s if rng.random() < 0.5 else horizon_s // 2
    return {"mean_rps": rate, "peak_to_trough": _sig(rng.uniform(1.5, 4.0)),
            "period_s": period, "phase_s": TICK_S * int(rng.integers(0, period // TICK_S))}


def _slo(rng: np.random.Generator, wl: Workload, model: Model) -> dict[str, Any]:
    """Base SLO of the workload, scaled for the model's size and a loose..impossible tier."""
    tier = list(SLO_TIERS)[int(rng.choice(len(SLO_TIERS), p=SLO_TIER_P))]
    mult = SLO_TIERS[tier] * (1.0 + model.active_params_b / 200.0)
    if tier == "impossible":
        ttft, tpot = IMPOSSIBLE_SLO
    else:
        ttft, tpot = wl.slo[0] * mult, wl.slo[1] * mult
    return {"ttft_ms": float(round(ttft)), "tpot_ms": max(MIN_TPOT_MS, float(round(tpot)))}


def _batch_job(rng: np.random.Generator, wl: Workload, model: Model, horizon_s: int,
               work: float, regions: list[str]) -> tuple[dict[str, Any], float]:
    """A token volume due by a deadline; ``work`` is what it should add within the horizon."""
    ticks = horizon_s // TICK_S
    submit = 0 if rng.random() < 0.5 else TICK_S * int(rng.integers(1, max(2, ticks // 2)))
    left = horizon_s - submit
    deadline = max(600, TICK_S * round(rng.uniform(0.3, 1.3) * left / TICK_S))
    input_len, output_len = _lengths(wl, model.max_context)
    mean_in, mean_out = _mean_len(input_len), _mean_len(output_len)
    per_request = _flops_per_request(model, mean_in, mean_out)
    total = work * deadline / min(deadline, left)  # the part due past the horizon too
    tokens = max(1, int(_sig(total / per_request * mean_out)))
    job: dict[str, Any] = {"kind": "batch", "id": "", "model": model.id,
                           "priority": int(rng.integers(1, 8)),
                           "total_output_tokens": tokens,
                           "input_len": input_len, "output_len": output_len}
    _set_times(job, submit, deadline, "deadline")
    within = tokens / mean_out * per_request * min(deadline, left) / deadline
    return job, within


def _set_times(job: dict[str, Any], submit: int, later: int | None, key: str) -> None:
    if submit:
        job["submit"] = format_duration(submit)
    if later is not None:
        job[key] = format_duration(later)


def _sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (stable, short YAML numbers)."""
    return float(f"{x:.{digits}g}")


# --- world -----------------------------------------------------------------------------

def _draw_world(rng: np.random.Generator, cat: Catalog,
                fleet: list[tuple[Offering, int]]) -> dict[str, Any]:
    """A few departures from the simulator's defaults, inside each field's own bounds."""
    base = WorldParams()
    world: dict[str, Any] = {}
    k = int(rng.integers(2, 6))
    for name in sorted(str(n) for n in rng.choice(WORLD_SCALARS, size=k, replace=False)):
        value = getattr(base, name) * math.exp(0.3 * rng.standard_normal())
        world[name] = _within(FIELDS[name].metadata, value)
    per_id = {
        "engine_drift": (sorted(cat.engines), lambda: math.exp(0.1 * rng.standard_normal())),
        "throttle_share": (sorted({o.accelerator for o, _ in fleet}),
                           lambda: rng.uniform(0.02, 0.2)),
        "slow_regions": (sorted({f"{o.cloud}/{o.region}" for o, _ in fleet}),
                         lambda: 1.0 + rng.uniform(0.05, 0.4)),
        "preemption_mult": (sorted({o.cloud for o, _ in fleet if o.market == Market.SPOT}),
                            lambda: math.exp(0.5 * rng.standard_normal())),
    }
    for name, (ids, draw) in per_id.items():
        if ids and rng.random() < 0.5:
            key = ids[int(rng.integers(len(ids)))]
            world[name] = {key: _within(FIELDS[name].metadata, draw())}
    return world


def _within(meta: Any, value: float) -> float:
    lo, hi = meta["lo"], meta["hi"]
    value = _sig(value)
    if lo is not None:
        value = max(value, lo)
    if hi is not None:
        value = min(value, hi)
    return float(value)


# --- description -----------------------------------------------------------------------

def _describe(seed: int, size: str, fleet: list[tuple[Offering, int]],
              events: list[dict[str, Any]], jobs: list[dict[str, Any]], load: float,
              world: dict[str, Any]) -> str:
    gpus = sum(g for _, g in fleet)
    accels = _tally((o.accelerator, g) for o, g in fleet)
    markets = _tally((str(o.market), g) for o, g in fleet)
    clouds = _tally((o.cloud, g) for o, g in fleet)
    online = [j for j in jobs if j["kind"] == "online"]
    arrivals = _tally((ARRIVAL_NAMES[next(iter(j["arrival"]))], 1) for j in online)
    models = sorted({j["model"] for j in jobs})
    notes = _tally((e["note"], 1) for e in events) or "none"
    return (f"Generated by koi scenario generate (seed {seed}, size {size}); not tuned by"
            f" hand. Fleet: {gpus} GPUs of {accels} on {clouds}; {markets}. Jobs:"
            f" {len(online)} online ({arrivals}) and {len(jobs) - len(online)} batch, on"
            f" {len(models)} models ({', '.join(models)}). Offered load about {load:.2f}"
            f" of the fleet's rough capacity (bf16 peak x {SERVING_EFF}). Capacity events:"
            f" {notes}. World departures: {', '.join(world) or 'none'}.")


def _tally(pairs: Any) -> str:
    counts: dict[str, int] = {}
    for key, n in pairs:
        counts[key] = counts.get(key, 0) + n
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
