"""`koi profile`: measure a scenario's candidate replica shapes in its world.

What the profiled baselines (``melange-ilp``, ``bandit``, ``evolve``, ``regress-autoscale``)
measure before they plan, written out: every job's candidate shapes on the fleet's
accelerators (each engine's defaults, bf16 and fp8) profiled by ``koi.sim.profile`` —
saturated throughput and, for online jobs, the load sweep and the highest rate under the
job's SLO. Argument handling, progress and formatting only.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from koi.catalog import load_catalog
from koi.cluster import JobStatus
from koi.errors import KoiError
from koi.jobs import OnlineJob
from koi.policies.profiled import ENGINES, Measured, scenario_accelerators
from koi.policies.profiles import Profile, ProfileBook, candidate_shapes
from koi.scenario import Scenario, load_scenario
from koi.shapes import TP_LADDER, shape_label
from koi.sim.profile import (
    LOAD_GRID,
    POINT_REQUESTS,
    SOAK_FROM,
    SOAK_REQUESTS,
    Profiler,
    ReplicaProfile,
    RequestShape,
)
from koi.sim.world import load_world


def _fail(message: str) -> typer.Exit:
    typer.echo(f"koi profile: {message}", err=True)
    return typer.Exit(2)


def profile_command(console: Console, scenario: str, seed: int, out: Path | None) -> None:
    if seed < 0:
        raise _fail(f"--seed must be >= 0 (got {seed})")
    cat = load_catalog()
    try:
        scn = load_scenario(scenario, catalog=cat)
    except (KoiError, OSError) as e:
        raise _fail(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    profiler = Profiler(load_world(scn.world, seed, scn.randomize_world), cat, seed=seed)
    accels = scenario_accelerators(scn, cat)
    tasks = [(spec, cfg) for spec in scn.jobs
             for cfg in candidate_shapes(spec.model, accels, cat, TP_LADDER, ENGINES)]
    started = time.perf_counter()
    sweeps: dict[str, list[ReplicaProfile]] = {spec.id: [] for spec in scn.jobs}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        bar = progress.add_task(f"profiling {scn.name}", total=len(tasks))
        for spec, cfg in tasks:
            progress.update(bar, description=f"{spec.id}: {shape_label(cfg)}")
            shape = RequestShape.of(spec)
            if isinstance(spec, OnlineJob):
                sweeps[spec.id].append(profiler.profile(cfg, shape))
            else:  # a batch job needs its saturated throughput only
                sweeps[spec.id].append(ReplicaProfile(cfg, shape,
                                                      profiler.saturation(cfg, shape), ()))
            progress.advance(bar)
    book = ProfileBook(cat, tps=TP_LADDER, engines=ENGINES, source=Measured(profiler))
    profiles = book.profiles([JobStatus(s, False, False) for s in scn.jobs], accels)
    seconds = time.perf_counter() - started
    report = _report(scn, seed, profiler, profiles, sweeps, seconds)
    path = out or Path("out/profile") / f"{scn.name}-s{seed}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise _fail(f"cannot write {path}: {e.strerror}") from None
    console.print(_table(scn, profiles, sweeps))
    console.print(f"{len(tasks)} (job, shape) pairs, {profiler.runs} replica runs in "
                  f"{seconds:.1f} s; wrote {path}")


def _best(prof: Profile) -> int | None:
    best = prof.best(1)
    return best[0] if best else None


def _table(scn: Scenario, profiles: dict[str, Profile],
           sweeps: dict[str, list[ReplicaProfile]]) -> Table:
    table = Table(title=f"{scn.name}: each job's best-value shape, as measured")
    for col in ("job", "request", "shape", "sat tok/s", "max req/s @SLO", "TTFT p95",
                "TPOT p95", "shapes"):
        table.add_column(col, justify="left" if col in ("job", "request", "shape") else "right")
    for spec in scn.jobs:
        prof = profiles[spec.id]
        i = _best(prof)
        request = RequestShape.of(spec).label()
        if i is None:
            table.add_row(spec.id, request, "[red]none serves it[/]", "", "", "", "",
                          str(len(prof.shapes)))
            continue
        online = isinstance(spec, OnlineJob)
        table.add_row(spec.id, request, shape_label(prof.shapes[i]),
                      f"{sweeps[spec.id][i].saturation.tok_s:.0f}",
                      f"{prof.rate[i]:.3g}" if online else "batch",
                      _ms(prof.ttft_p95_s[i]) if online else "",
                      _ms(prof.tpot_p95_s[i]) if online else "", str(len(prof.shapes)))
    return table


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if math.isfinite(seconds) else "-"


def _num(x: float) -> float | None:
    """JSON has no infinity: an unmeasurable latency is null."""
    return float(x) if math.isfinite(x) else None


def _report(scn: Scenario, seed: int, profiler: Profiler, profiles: dict[str, Profile],
            sweeps: dict[str, list[ReplicaProfile]], seconds: float) -> dict[str, Any]:
    jobs = []
    for spec in scn.jobs:
        slo = ((spec.slo.ttft_ms / 1e3, spec.slo.tpot_ms / 1e3)
               if isinstance(spec, OnlineJob) else None)
        prof, shape, best = profiles[spec.id], RequestShape.of(spec), _best(profiles[spec.id])
        jobs.append({
            "job": spec.id, "model": spec.model, "kind": spec.kind,
            "shape": {"input_len": shape.input_len, "output_len": shape.output_len,
                      "prefix_share": shape.prefix_share},
            "slo": {"ttft_s": slo[0], "tpot_s": slo[1]} if slo else None,
            "best": None if best is None else shape_label(prof.shapes[best]),
            "candidates": [_candidate(rp, float(prof.usd_h[k]), slo, profiler)
                           for k, rp in enumerate(sweeps[spec.id])]})
    return {"scenario": scn.name, "seed": seed, "world_randomized": scn.randomize_world,
            "grid": list(LOAD_GRID), "requests_per_point": POINT_REQUESTS,
            "soak_requests": SOAK_REQUESTS, "soak_from": SOAK_FROM,
            "replica_runs": profiler.runs, "seconds": round(seconds, 2), "jobs": jobs}


def _candidate(rp: ReplicaProfile, usd_h: float, slo: tuple[float, float] | None,
               profiler: Profiler) -> dict[str, Any]:
    cfg, sat = rp.config, rp.saturation
    row: dict[str, Any] = {
        "accelerator": cfg.accelerator, "engine": cfg.engine, "tp": cfg.tp,
        "precision": str(cfg.weight_precision), "gpus": cfg.gpus_per_replica,
        "usd_per_hour": round(usd_h, 4), "saturated_tok_s": round(sat.tok_s, 2),
        "saturated_rps": round(sat.rps, 4)}
    if slo is not None:
        rate, _ = profiler.max_rate_under_slo(cfg, rp.shape, *slo)
        row["max_rps_under_slo"] = round(rate, 4)
        row["points"] = [{"rate_rps": round(p.rate_rps, 4), "ttft_p95_s": _num(p.ttft_p95_s),
                          "tpot_p95_s": _num(p.tpot_p95_s), "kept_up": p.kept_up,
                          "latency_mean_s": _num(p.latency_mean_s)} for p in rp.points]
    return row
