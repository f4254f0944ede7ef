"""Passes timed from the measured kernel tables: shipped data, coverage and fallback,
numba = numpy, physics (monotone, positive), and what the tables leave alone."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from koi.catalog import Catalog, load_catalog
from koi.predictor import tables
from koi.predictor.api import evaluate_matrix
from koi.predictor.calibration import load_calibration
from koi.predictor.columns import IN, OUT, OUT_NAMES
from koi.predictor.features import build_inputs
from koi.predictor.measurements import load_cases
from koi.predictor.passes import scale_passes
from koi.predictor.reference import pass_time
from koi.predictor.types import LoadMode, Workload
from koi.space import DeploymentConfig, KvDtype, Precision, engine_default_config

RTOL = 1e-9


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def cfg_for(cat: Catalog, model: str, accel: str, engine: str = "trtllm", tp: int = 1,
            **kw: object) -> DeploymentConfig:
    return engine_default_config(model, accel, engine, cat, tp=tp, **kw)  # type: ignore[arg-type]


def test_shipped_files_name_their_source_and_stay_small() -> None:
    files = sorted(tables.DATA_DIR.glob("*.npz"))
    assert {f.stem for f in files} == set(tables.SYSTEM_OF.values())
    assert sum(f.stat().st_size for f in files) < 2_000_000
    for f in files:
        with np.load(f) as z:
            header = json.loads(str(z["header"]))
        assert header["source_repository"] == "https://github.com/ai-dynamo/aiconfigurator"
        assert re.fullmatch(r"[0-9a-f]{40}", header["commit"])
        assert "Apache-2.0" in header["licence"]
        assert header["engine"] == "trtllm" and header["engine_version"]
        assert all(p.endswith(".parquet") for p in header["paths"].values())


def test_covered_and_fallback_shards_say_why(cat: Catalog) -> None:
    ok, label = tables.shard_row(cat.model("llama-3.1-8b"),
                                 cfg_for(cat, "llama-3.1-8b", "h200", weight_precision="fp8"),
                                 cat.accelerator("h200"))
    assert ok is not None and ok.shape == (tables.ROW,) and np.isfinite(ok).all()
    assert label.startswith("h200_sxm/trtllm-")
    for cfg, why in [
        (cfg_for(cat, "llama-3.1-8b", "mi300x", "vllm"), "no kernel tables for mi300x"),
        (cfg_for(cat, "llama-3.1-8b", "h200", "vllm"), "not vllm"),
        (cfg_for(cat, "llama-3.1-70b", "h200", tp=2, pp=2), "pipeline"),
    ]:
        row, reason = tables.shard_row(cat.model(cfg.model), cfg,
                                       cat.accelerator(cfg.accelerator))
        assert row is None and why in reason


def _matrix(cat: Catalog, kernels: bool) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(7)
    pairs, labels = [], []
    for case in load_cases(catalog=cat):
        for mode in LoadMode:
            wl = Workload(int(rng.integers(16, 40_000)), int(rng.integers(1, 3000)), mode,
                          float(rng.uniform(0.5, 60.0)), slo_ttft_ms=2000.0, slo_tpot_ms=80.0)
            pairs.append((case.config, wl))
            labels.append(f"{case.label} {mode}")
    return build_inputs(pairs, cat, kernels=kernels), labels


def test_numba_agrees_with_numpy_on_table_passes(cat: Catalog) -> None:
    X, labels = _matrix(cat, kernels=True)
    assert (X[IN["ktab"]] >= 0).mean() > 0.5
    fast, spec = evaluate_matrix(X, backend="numba"), evaluate_matrix(X, backend="numpy")
    assert np.isfinite(spec).all() and np.isfinite(fast).all()
    bad = ~np.isclose(fast, spec, rtol=RTOL, atol=0.0)
    rows, cols = np.nonzero(bad)
    assert not bad.any(), [f"{OUT_NAMES[r]} of {labels[c]}" for r, c in zip(rows, cols, strict=False)][:5]


@pytest.mark.parametrize(("model", "accel", "tp", "precision"), [
    ("llama-3.1-8b", "h100-sxm", 1, "fp8"), ("llama-3.1-70b", "h200", 4, "bf16"),
    ("mixtral-8x7b", "a100-80gb", 2, "fp16"), ("llama-3.1-70b", "l40s", 4, "fp8")])
def test_table_pass_is_positive_and_monotone(cat: Catalog, model: str, accel: str, tp: int,
                                             precision: str) -> None:
    cfg = cfg_for(cat, model, accel, tp=tp, weight_precision=precision)
    X = build_inputs([(cfg, Workload(2000, 500))], cat, kernels=True)
    assert X[IN["ktab"], 0] >= 0
    grid = np.concatenate([np.arange(0, 40), np.geomspace(40, 200_000, 300)])
    n = len(grid)
    Xn = np.repeat(X, n, axis=1)
    one = np.ones(n)
    for b, p in [(grid, 0 * one), (one, grid), (64 * one, grid)]:
        total = pass_time(Xn, b, p, 2250.0 * one, 1000.0 * one)[0]
        assert (total > 0).all() and np.isfinite(total).all()
        assert (np.diff(total) >= -1e-12 * total[1:]).all()
    longer = pass_time(Xn, 64 * one, 0 * one, grid + 1.0, 1000.0 * one)[0]
    assert (np.diff(longer) >= -1e-12 * longer[1:]).all()


def test_pass_multiplier_scales_a_table_pass_exactly(cat: Catalog) -> None:
    cfg = cfg_for(cat, "llama-3.1-70b", "h100-sxm", tp=4, weight_precision="fp8",
                  kv_dtype=KvDtype.FP8)
    X = build_inputs([(cfg, Workload(1000, 200))], cat, kernels=True)
    args = (np.array([48.0]), np.array([512.0]), np.array([1100.0]), np.array([500.0]))
    base = pass_time(X, *args)[0]
    assert pass_time(scale_passes(X, 1.7), *args)[0] == pytest.approx(1.7 * base, rel=1e-12)


def test_parts_without_tables_predict_as_the_roofline(cat: Catalog) -> None:
    pairs = [(cfg_for(cat, "llama-3.1-70b", "mi300x", "vllm", tp=8, weight_precision="fp8"),
              Workload(1000, 250, LoadMode.RATE, 3.0)),
             (cfg_for(cat, "llama-3.1-8b", "gaudi3", "vllm"), Workload(128, 2048))]
    cal = load_calibration(kernels=True)
    with_tables = evaluate_matrix(build_inputs(pairs, cat, cal, kernels=True))
    roofline = evaluate_matrix(build_inputs(pairs, cat, cal, kernels=False))
    np.testing.assert_array_equal(with_tables, roofline)
    # and the kernel-table calibration keeps the roofline table's factors for them
    roof_cal = load_calibration(kernels=False)
    for group in ("mem", "comp", "precision_comp", "engine_mem", "engine_comp", "global"):
        assert cal.factors.get(group) == roof_cal.factors.get(group)


def test_fp8_weights_are_faster_than_bf16_in_the_tables(cat: Catalog) -> None:
    wl = Workload(1000, 1000)
    pairs = [(cfg_for(cat, "llama-3.1-70b", "h200", tp=2, weight_precision=p), wl)
             for p in (Precision.BF16, Precision.FP8)]
    Y = evaluate_matrix(build_inputs(pairs, cat, kernels=True))
    assert Y[OUT["out_tput"], 1] > Y[OUT["out_tput"], 0]


def test_pass_models_name_the_tables_or_the_roofline(cat: Catalog) -> None:
    from koi.predictor.api import pass_models

    configs = [cfg_for(cat, "llama-3.1-8b", "h200", weight_precision="fp8"),
               cfg_for(cat, "llama-3.1-8b", "mi300x", "vllm")]
    assert pass_models(configs, catalog=cat, kernels=True)[0].startswith(
        "kernel tables h200_sxm/trtllm-")
    assert pass_models(configs, catalog=cat, kernels=True)[1] == "roofline"
    assert pass_models(configs, catalog=cat, kernels=False) == ["roofline", "roofline"]


def test_shipped_decode_attention_never_beats_the_hbm() -> None:
    """Every decode-attention cell streams its KV cache no faster than the part's peak
    HBM bandwidth (the extraction floors cells at their speed of light, as AIConfigurator
    does; some collected cells read 1.07 GB in 0.25 ms on a 3.35 TB/s H100)."""
    for system in tables.SYSTEM_OF.values():
        t = tables.load_system(system)
        assert t is not None
        a, bw = t.arrays, float(t.header["sol_floor"]["mem_bw"])
        kv_bytes = np.array([2.0, 1.0])[:, None, None, None, None, None]
        h = a["gen_head_dim"][None, :, None, None, None, None]
        n_kv = a["gen_kv_heads"][None, None, None, :, None, None]
        b = a["gen_batch"][None, None, None, None, :, None]
        cached = a["gen_len"][None, None, None, None, None, :] - 1.0
        stream_ms = np.broadcast_to(b * 2.0 * n_kv * cached * h * kv_bytes / bw * 1e3,
                                    a["gen_attn"].shape)
        ok = np.isfinite(a["gen_attn"])
        # float16 storage rounds to 1 part in 2,048
        assert (a["gen_attn"][ok] >= stream_ms[ok] * (1 - 1e-3)).all(), system


def test_a_calibration_brings_the_pass_model_it_was_fitted_for(cat: Catalog) -> None:
    """The planner passes its settings' calibration and nothing else: the table fitted
    for the kernel tables must switch them on (the ``koi-kernels`` variant), the roofline's
    must not, and an explicit ``kernels`` still wins."""
    from koi.planner.settings import settings_for

    cfg = engine_default_config("llama-3.1-8b", "h200", "trtllm", catalog=cat, tp=1)
    pair = [(cfg, Workload(512, 128))]
    with_tables, roofline = load_calibration(kernels=True), load_calibration(kernels=False)
    assert (with_tables.kernels, roofline.kernels) == (True, False)
    assert load_calibration(kernels=True) is with_tables   # cached: one object a file
    assert build_inputs(pair, cat, with_tables)[IN["ktab"], 0] >= 0
    assert build_inputs(pair, cat, roofline)[IN["ktab"], 0] == -1
    assert build_inputs(pair, cat, with_tables, kernels=False)[IN["ktab"], 0] == -1
    assert (build_inputs(pair, cat, None)[IN["ktab"], 0] >= 0) == tables.DEFAULT
    assert settings_for("koi-kernels").calibration.kernels is True
    assert settings_for("koi").calibration is None
