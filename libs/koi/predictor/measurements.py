"""Public serving measurements as predictor test cases.

Reads ``shared/data/perf_measurements.csv`` and turns each in-scope row into a
(configuration, workload, metric, measured value) case. In scope, as the accuracy
brief defines it: a model and accelerator id, numeric input/output lengths and TP,
and a throughput, TPOT or TTFT metric. How a row offered load:

* ``max`` / ``offline`` → saturated; ``max (all N at t=0)`` / ``num_prompts=N`` /
  ``qps=INF`` with "N requests" in the notes → a burst of N;
* ``qps=R`` → Poisson at R req/s; ``concurrency=N`` → N closed-loop clients;
  ``batch=N`` → a static batch of N.

Engine settings follow each benchmark's published method: TensorRT-LLM rows quantised
to fp8/fp4 use an fp8 KV cache (the perf-overview notes say so); everything else keeps
the engine's defaults. Extra GPUs beyond TP×PP on an MoE model are attention-DP ranks
with expert parallelism (DeepSeek's "DEP8"). No fitting and no prediction here.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from koi.catalog import Catalog, load_catalog
from koi.paths import shared_data_dir
from koi.predictor.types import LoadMode, Workload
from koi.space import DeploymentConfig, KvDtype, Precision, engine_default_config

METRICS = {"output_throughput_tok_s": "output_throughput_tok_s",
           "total_throughput_tok_s": "total_throughput_tok_s",
           "tpot_ms": "tpot_ms", "ttft_ms": "ttft_ms"}
METRIC_KIND = {"output_throughput_tok_s": "throughput", "total_throughput_tok_s": "throughput",
               "tpot_ms": "tpot", "ttft_ms": "ttft"}


@dataclass(frozen=True)
class Case:
    row: int  # 1-based data row number in the CSV (header excluded)
    config: DeploymentConfig
    workload: Workload
    metric: str  # a Prediction field name
    value: float
    source: str  # host/owner/repo of the source, for grouping
    label: str

    @property
    def kind(self) -> str:
        return METRIC_KIND[self.metric]


def measurements_path() -> Path:
    return shared_data_dir() / "perf_measurements.csv"


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_load(spec: str, notes: str) -> tuple[LoadMode, float] | None:
    """Map the ``concurrency_or_batch`` column (and notes) to a load mode."""
    s = spec.strip().lower()
    if m := re.search(r"all (\d+) at t=0", s):
        return LoadMode.BURST, float(m.group(1))
    if m := re.search(r"num_prompts=(\d+)", s):
        return LoadMode.BURST, float(m.group(1))
    if s.startswith("qps=inf"):
        m = re.search(r"(\d+) requests", notes)
        return (LoadMode.BURST, float(m.group(1))) if m else (LoadMode.SATURATED, 0.0)
    if m := re.fullmatch(r"qps=([\d.]+)", s):
        return LoadMode.RATE, float(m.group(1))
    if m := re.fullmatch(r"concurrency=(\d+)", s):
        return LoadMode.CONCURRENCY, float(m.group(1))
    if m := re.fullmatch(r"batch=(\d+)", s):
        return LoadMode.STATIC, float(m.group(1))
    if s.startswith("max") or s.startswith("offline"):
        return LoadMode.SATURATED, 0.0
    return None


def _precision(text: str) -> Precision:
    return Precision(text.strip().lower())


def row_to_case(i: int, r: dict[str, str], cat: Catalog) -> Case | None:
    """The case for one CSV row, or None when the row is out of scope."""
    model_id, accel_id, engine_id = r["model_id"].strip(), r["accelerator_id"].strip(), \
        r["engine_id"].strip()
    metric = METRICS.get(r["metric"].strip())
    i_len, o_len, tp = _int(r["input_len"]), _int(r["output_len"]), _int(r["tp"])
    if not (model_id and accel_id and metric and i_len and o_len and tp):
        return None
    load = parse_load(r["concurrency_or_batch"], r["notes"])
    if load is None:
        return None
    model = cat.model(model_id)
    pp = _int(r["pp"]) or 1
    gpus = _int(r["num_gpus"]) or tp * pp
    extra = gpus // (tp * pp)
    dp_attn = extra if model.is_moe and extra > 1 else 1
    precision = _precision(r["precision"])
    kv = KvDtype.FP8 if engine_id == "trtllm" and precision in (Precision.FP8, Precision.FP4) \
        else KvDtype.AUTO
    mode, amount = load
    static = {"max_num_seqs": int(amount),
              "max_batched_tokens": max(int(amount), cat.engine(engine_id)
                                        .default_max_batched_tokens)} \
        if mode == LoadMode.STATIC else {}
    cfg = engine_default_config(
        model_id, accel_id, engine_id, cat, tp=tp, pp=pp,
        dp_attention=dp_attn, ep=tp * dp_attn if dp_attn > 1 else 1,
        replicas=max(1, extra) if not model.is_moe else 1,
        weight_precision=precision, kv_dtype=kv, multi_node=gpus > 8, **static)
    wl = Workload(input_len=i_len, output_len=o_len, mode=mode, load=amount)
    src = "/".join(r["source_url"].split("/")[2:5])
    label = (f"{model_id} {accel_id}×{gpus} tp{tp} {engine_id} {precision} {i_len}/{o_len} "
             f"{r['concurrency_or_batch'].strip()} {metric}")
    return Case(row=i, config=cfg, workload=wl, metric=metric, value=float(r["value"]),
                source=src, label=label)


def load_cases(path: Path | None = None, catalog: Catalog | None = None) -> list[Case]:
    """Every in-scope case of the measurements file, in file order."""
    cat = catalog or load_catalog()
    with (path or measurements_path()).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cases = []
    for i, r in enumerate(rows, start=1):
        case = row_to_case(i, r, cat)
        if case is not None:
            cases.append(case)
    return cases
