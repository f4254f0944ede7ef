"""The world against the public measurements: drive the simulator's own replica model at
the configurations of ``shared/data/perf_measurements.csv`` and compare.

In scope: rows with a model and accelerator id, numeric input/output length and TP, and
a throughput, TPOT or TTFT metric. The load each row offered comes from its
``concurrency_or_batch`` column: ``max``/``offline`` saturate, ``qps=N`` is Poisson,
``qps=INF`` with "N requests" in the notes (or ``num_prompts=N``/``all N at t=0``) is a
burst of N, ``concurrency=N`` is N closed-loop clients, ``batch=N`` a static batch.

Run ``python -m koi.sim.world_check`` to print every row and the median APE per metric
kind. This exercises the *world* (``koi.sim.physics`` + ``koi.sim.replica``); it must
never import ``koi.predictor``.
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.paths import shared_data_dir
from koi.scenario.world import WorldParams
from koi.sim.physics import step_coef
from koi.sim.replica import Completion, Replica, ReplicaSpec, Req
from koi.sim.world import load_world
from koi.space import DeploymentConfig, engine_default_config, kv_capacity_tokens, validate

METRICS = ("output_throughput_tok_s", "total_throughput_tok_s", "tpot_ms", "ttft_ms")
KIND = {"output_throughput_tok_s": "throughput", "total_throughput_tok_s": "throughput",
        "tpot_ms": "tpot", "ttft_ms": "ttft"}


@dataclass(frozen=True)
class Row:
    label: str
    cfg: DeploymentConfig
    replicas: int          # data-parallel copies the row's GPUs hold
    inp: int
    out: int
    mode: str              # saturate | poisson | burst | closed | static
    n: float               # rate (poisson) or count (burst/closed/static)
    metric: str
    value: float


def _num(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _load(col: str, notes: str) -> tuple[str, float] | None:
    c = col.strip().lower()
    m = re.search(r"all (\d+) at t=0|num_prompts=(\d+)", c)
    if m:
        return "burst", float(m.group(1) or m.group(2))
    if c.startswith("max") or c.startswith("offline"):
        return "saturate", 0.0
    if c == "qps=inf":
        m = re.search(r"(\d+) requests", notes)
        return ("burst", float(m.group(1))) if m else None
    for prefix, mode in (("qps=", "poisson"), ("concurrency=", "closed"), ("batch=", "static")):
        if c.startswith(prefix):
            try:
                return mode, float(c[len(prefix):])
            except ValueError:
                return None
    return None


def _config(r: dict[str, str], tp: int, pp: int, cat: Catalog) -> DeploymentConfig | None:
    prec = r["precision"].strip() or "bf16"
    knobs: dict = {"tp": tp, "pp": pp, "weight_precision": prec}
    if r["engine_id"] == "trtllm" and prec in ("fp8", "fp4"):
        knobs["kv_dtype"] = "fp8"  # the TensorRT-LLM perf notes quantise the KV cache too
    try:
        cfg = engine_default_config(r["model_id"], r["accelerator_id"], r["engine_id"] or "vllm",
                                    cat, **knobs)
    except (KeyError, ValueError):
        return None
    return None if validate(cfg, cat) else cfg


def load_rows(path: Path | None = None, catalog: Catalog | None = None) -> list[Row]:
    """The in-scope rows whose configuration is valid in the catalog."""
    cat = catalog or load_catalog()
    rows = []
    with open(path or shared_data_dir() / "perf_measurements.csv", encoding="utf-8") as fh:
        for i, r in enumerate(csv.DictReader(fh), start=1):
            inp, out, tp = _num(r["input_len"]), _num(r["output_len"]), _num(r["tp"])
            if not (r["model_id"] and r["accelerator_id"] and inp and out and tp):
                continue
            if r["metric"] not in METRICS:
                continue
            load = _load(r["concurrency_or_batch"], r["notes"])
            pp = _num(r["pp"]) or 1
            cfg = _config(r, tp, pp, cat) if load else None
            if cfg is None or load is None:
                continue
            gpus = _num(r["num_gpus"]) or tp * pp
            label = (f"row{i} {r['model_id']} {r['accelerator_id']} {r['engine_id']} tp{tp}"
                     f" {r['precision']} {inp}/{out} {r['concurrency_or_batch']} {r['metric']}")
            rows.append(Row(label, cfg, max(gpus // (tp * pp), 1), inp, out, load[0], load[1],
                            r["metric"], float(r["value"])))
    return rows


def _replica(row: Row, cat: Catalog, world: WorldParams) -> Replica:
    cfg = row.cfg
    if row.mode == "static":
        n = int(row.n)
        cfg = cfg.with_(max_num_seqs=max(n, 1),
                        max_batched_tokens=max(cfg.max_batched_tokens, n * row.inp))
    engine = cat.engine(cfg.engine)
    cap = kv_capacity_tokens(cat.model(cfg.model), cat.accelerator(cfg.accelerator), cfg,
                             engine)
    spec = ReplicaSpec(step_coef(cfg, cat, world), cap, cfg.max_num_seqs,
                       cfg.max_batched_tokens, cfg.chunked_prefill,
                       cliff_usage=world.kv_cliff_usage, cliff_factor=world.kv_cliff_factor,
                       reserve_full=engine.reserves_full_kv,
                       ttft_overhead=world.ttft_overhead_ms / 1e3)
    return Replica(spec, np.random.default_rng(0), 0.0)


def simulate_row(row: Row, cat: Catalog, world: WorldParams) -> float:
    """The simulated value of the row's metric under the world (noise off)."""
    rep = _replica(row, cat, world)
    n = _requests(row, rep)
    if row.mode == "poisson":
        times = np.cumsum(np.random.default_rng(1).exponential(1.0 / row.n, n))
        for t in times:
            rep.add_arrival(Req(0, float(t), row.inp, row.out, 1.0, 0.0))
    elif row.mode == "closed":
        _closed_loop(rep, row, n)
    else:
        w = max(1.0, n / 4096)  # a huge saturating burst travels in groups
        for _ in range(round(n / w)):
            rep.enqueue(Req(0, 0.0, row.inp, row.out, w, 0.0))
    rep.run_until(1e7)
    done = rep.take_stats().done
    return _metric(row, done)


def _requests(row: Row, rep: Replica) -> int:
    if row.mode in ("burst", "static"):
        return int(row.n)
    if row.mode == "saturate":
        return max(4 * rep.s.max_seqs, 1000)
    if row.mode == "closed":
        return int(max(10 * row.n, 200))
    return 500


def _closed_loop(rep: Replica, row: Row, total: int) -> None:
    issued = [0]

    def feed(r: Replica) -> None:
        busy = r.w_wait + r.w_pre + r.w_dec
        while busy < row.n and issued[0] < total:
            r.enqueue(Req(0, r.now, row.inp, row.out, 1.0, 0.0))
            issued[0] += 1
            busy += 1

    rep.feeder = feed


def span_s(done: list[Completion]) -> float:
    """From the first request's arrival to the last completion, s: the time a
    throughput is measured over."""
    end = max(c.t for c in done)
    start = min(c.t - c.ttft - (c.out - 1) * c.tpot for c in done)
    return max(end - start, 1e-9)


def _metric(row: Row, done: list[Completion]) -> float:
    w = np.array([c.w for c in done])
    span = span_s(done)
    if row.metric == "output_throughput_tok_s":
        return float((w * row.out).sum() / span) * row.replicas
    if row.metric == "total_throughput_tok_s":
        return float((w * (row.inp + row.out)).sum() / span) * row.replicas
    key = "tpot" if row.metric == "tpot_ms" else "ttft"
    vals = np.array([getattr(c, key) for c in done])
    return float((vals * w).sum() / w.sum() * 1e3)


def check_world(world: WorldParams | None = None, catalog: Catalog | None = None
                      ) -> list[tuple[str, float, float]]:
    """(label, measured, simulated) for every in-scope, valid measurement row."""
    cat = catalog or load_catalog()
    world = replace(world or load_world(), noise_sigma=0.0)
    return [(r.label, r.value, simulate_row(r, cat, world)) for r in load_rows(catalog=cat)]


def ape_summary(results: list[tuple[str, float, float]]) -> dict[str, float]:
    """Median absolute percentage error overall and per metric kind."""
    by: dict[str, list[float]] = {"overall": []}
    for label, meas, sim in results:
        ape = abs(sim - meas) / meas
        by["overall"].append(ape)
        kind = next(KIND[m] for m in METRICS if label.endswith(m))
        by.setdefault(kind, []).append(ape)
    return {k: statistics.median(v) for k, v in by.items()}


def main() -> None:
    res = check_world()
    for label, meas, sim in res:
        print(f"{label:90s} measured {meas:10.2f} simulated {sim:10.2f}"
              f" ({(sim - meas) / meas:+.0%})")
    for kind, v in ape_summary(res).items():
        n = len(res) if kind == "overall" else sum(1 for r in res if KIND[r[0].split()[-1]] == kind)
        print(f"median APE {kind:10s} {v:.1%} (n={n})")


if __name__ == "__main__":
    main()
