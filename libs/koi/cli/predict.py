"""`koi predict`: one prediction from flags, or JSON lines in and out with ``--batch``.

Parses user input into a ``DeploymentConfig`` + ``Workload``, calls the predictor and
formats the answer. Invalid input exits non-zero with the reason on stderr. No model
logic here.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from koi.catalog import load_catalog
from koi.errors import KoiError
from koi.predictor.api import predict_many
from koi.predictor.types import MEDIATORS, LoadMode, Prediction, Workload
from koi.space import DeploymentConfig, config_hash, config_to_dict, engine_default_config

# keys a --batch line may carry besides any DeploymentConfig knob
WORKLOAD_KEYS = {"input_len", "output_len", "concurrency", "rate", "batch", "burst",
                 "prefix_hit", "slo_ttft_ms", "slo_tpot_ms", "precision"}
CONFIG_KEYS = {f.name for f in fields(DeploymentConfig)}


def request_from_dict(data: dict[str, Any]) -> tuple[DeploymentConfig, Workload]:
    """(config, workload) from a flat dict of CLI/JSON fields; raises ValueError/KoiError."""
    unknown = sorted(set(data) - WORKLOAD_KEYS - CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    for key in ("model", "accelerator", "input_len", "output_len"):
        if data.get(key) in (None, ""):
            raise ValueError(f"missing field {key!r}")
    loads = [k for k in ("concurrency", "rate", "batch", "burst") if data.get(k) is not None]
    if len(loads) > 1:
        raise ValueError(f"give at most one of concurrency/rate/batch/burst (got {loads})")
    mode, load = LoadMode.SATURATED, 0.0
    if loads:
        mode = {"concurrency": LoadMode.CONCURRENCY, "rate": LoadMode.RATE,
                "batch": LoadMode.STATIC, "burst": LoadMode.BURST}[loads[0]]
        load = float(data[loads[0]])
        if not load > 0:
            raise ValueError(f"{loads[0]} must be > 0 (got {data[loads[0]]})")
    knobs = {k: v for k, v in data.items() if k in CONFIG_KEYS and v is not None}
    if data.get("precision") is not None:
        knobs["weight_precision"] = data["precision"]
    model, accel = knobs.pop("model"), knobs.pop("accelerator")
    engine = knobs.pop("engine", "vllm")
    if mode == LoadMode.STATIC and "max_num_seqs" not in knobs:
        knobs["max_num_seqs"] = int(load)  # a static batch runs as one batch
        knobs.setdefault("max_batched_tokens", max(int(load), 8192))
    config = engine_default_config(str(model), str(accel), str(engine), **knobs)
    workload = Workload(
        input_len=float(data["input_len"]), output_len=float(data["output_len"]), mode=mode,
        load=load, prefix_hit=float(data.get("prefix_hit") or 0.0),
        slo_ttft_ms=float(data.get("slo_ttft_ms") or 0.0),
        slo_tpot_ms=float(data.get("slo_tpot_ms") or 0.0))
    return config, workload


def prediction_json(config: DeploymentConfig, workload: Workload,
                    pred: Prediction) -> dict[str, Any]:
    out: dict[str, Any] = {k: _round(v) for k, v in pred.to_dict().items()}
    out["mediators"] = {k: _round(v) for k, v in pred.mediators().items()}
    out["config"] = config_to_dict(config)
    out["config_hash"] = config_hash(config)
    out["workload"] = {"input_len": workload.input_len, "output_len": workload.output_len,
                       "mode": workload.mode.value, "load": workload.load}
    return out


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def run_batch(path: Path) -> int:
    """JSON lines in, one JSON line out per input (an ``error`` key where it fails)."""
    lines = sys.stdin if str(path) == "-" else path.open()
    parsed: list[tuple[int, Any]] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("each line must be a JSON object")
            parsed.append((n, request_from_dict(data)))
        except (ValueError, KoiError, KeyError) as e:
            parsed.append((n, _message(e)))
    good = [p for _, p in parsed if not isinstance(p, str)]
    results = iter(_predict_each(good))
    for n, item in parsed:
        if isinstance(item, str):
            print(json.dumps({"line": n, "error": item}))
            continue
        pred = next(results)
        if isinstance(pred, str):
            print(json.dumps({"line": n, "error": pred}))
        else:
            print(json.dumps(prediction_json(item[0], item[1], pred)))
    return 0


def _predict_each(pairs: list[tuple[DeploymentConfig, Workload]]) -> list[Prediction | str]:
    """Predict valid pairs in one kernel call; invalid configs become their error text."""
    from koi.space import validate

    cat = load_catalog()
    out: list[Prediction | str] = []
    ok: list[tuple[DeploymentConfig, Workload]] = []
    for cfg, wl in pairs:
        errors = validate(cfg, cat)
        out.append(str(errors[0]) if errors else "")
        if not errors:
            ok.append((cfg, wl))
    preds = iter(predict_many(ok, catalog=cat, validate=False)) if ok else iter([])
    return [item if item else next(preds) for item in out]


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    return str(e)


def print_table(config: DeploymentConfig, workload: Workload, pred: Prediction) -> None:
    console = Console()
    table = Table(title=f"{config.model} on {config.replicas}×{config.gpus_per_replica} "
                        f"{config.accelerator} (tp{config.tp} pp{config.pp}, {config.engine}, "
                        f"{config.weight_precision}) — {workload.mode.value}"
                        f"{'' if workload.mode == LoadMode.SATURATED else f' {workload.load:g}'}")
    table.add_column("outcome")
    table.add_column("value", justify="right")
    rows = [("TTFT mean / p50 / p95 (ms)",
             f"{pred.ttft_ms:.1f} / {pred.ttft_p50_ms:.1f} / {pred.ttft_p95_ms:.1f}"),
            ("TPOT mean / p95 (ms)", f"{pred.tpot_ms:.2f} / {pred.tpot_p95_ms:.2f}"),
            ("output throughput (tok/s)", f"{pred.output_throughput_tok_s:,.0f}"),
            ("total throughput (tok/s)", f"{pred.total_throughput_tok_s:,.0f}"),
            ("max rate under SLO (req/s)", f"{pred.max_rate_under_slo_rps:.2f}"),
            ("$ / M output tokens", f"{pred.cost_per_mtok_usd:.3f}"),
            ("running batch", f"{pred.batch_size:.0f}"),
            ("KV capacity (tokens)", f"{pred.kv_capacity_tokens:,.0f}"),
            ("weights per GPU (GB)", f"{pred.weights_gb_per_gpu:.1f}")]
    rows += [(f"mediator: {m}", f"{getattr(pred, m):.3f}") for m in MEDIATORS]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def predict_command(**options: Any) -> None:
    """Entry point used by the typer command in ``main.py``."""
    as_json = options.pop("as_json")
    batch = options.pop("batch")
    extra = options.pop("set_knobs") or []
    if batch is not None:
        raise typer.Exit(run_batch(batch))
    data = {k: v for k, v in options.items() if v is not None}
    try:
        for item in extra:
            key, _, value = item.partition("=")
            data[key.strip()] = _coerce(key.strip(), value.strip())
        config, workload = request_from_dict(data)
        pred = predict_many([(config, workload)])[0]
    except (ValueError, KoiError, KeyError) as e:
        typer.echo(f"koi predict: {_message(e)}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(prediction_json(config, workload, pred)))
    else:
        print_table(config, workload, pred)


def _coerce(key: str, value: str) -> Any:
    """Type a ``--set knob=value`` string by the knob's declared type."""
    for f in fields(DeploymentConfig):
        if f.name == key:
            kind = str(f.type)
            if kind == "bool":
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(f"{key}: {value!r} is not a boolean")
                return value.lower() in ("true", "1", "yes")
            if kind == "int":
                return int(value)
            if kind == "float":
                return float(value)
            return value
    raise ValueError(f"unknown knob {key!r}")
