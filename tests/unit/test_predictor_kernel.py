"""The numba kernel agrees with the numpy reference (the specification) to rtol 1e-9."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from koi.catalog import Catalog, load_catalog
from koi.predictor.api import evaluate_matrix
from koi.predictor.columns import N_OUT, OUT_NAMES
from koi.predictor.features import build_inputs
from koi.predictor.measurements import load_cases
from koi.predictor.types import LoadMode, Workload
from koi.space import DeploymentConfig, KvDtype, Precision, SpecDecode, validate

RTOL = 1e-9
N_RANDOM = 3000


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def kernel() -> None:
    """Compile (or load from cache) the numba kernel once for this module."""
    X = build_inputs([(DeploymentConfig(), Workload(100, 10))])
    evaluate_matrix(X, backend="numba")


def assert_agree(X: np.ndarray, labels: list[str]) -> None:
    fast = evaluate_matrix(X, backend="numba")
    spec = evaluate_matrix(X, backend="numpy")
    assert fast.shape == spec.shape == (N_OUT, X.shape[1])
    assert np.isfinite(spec).all()
    assert np.isfinite(fast).all()
    close = np.isclose(fast, spec, rtol=RTOL, atol=0.0)
    if not close.all():
        rows, cols = np.nonzero(~close)
        worst = [f"{OUT_NAMES[r]} of {labels[c]}: numba {fast[r, c]!r} vs numpy {spec[r, c]!r}"
                 for r, c in list(zip(rows, cols, strict=True))[:10]]
        pytest.fail(f"{len(rows)} outputs differ:\n" + "\n".join(worst))


def load_for(mode: LoadMode, wl: Workload) -> float:
    return {LoadMode.SATURATED: 0.0, LoadMode.CONCURRENCY: 32.0, LoadMode.RATE: 4.0,
            LoadMode.STATIC: 16.0, LoadMode.BURST: 1000.0}[mode] if wl.mode != mode else wl.load


@pytest.mark.parametrize("mode", list(LoadMode))
def test_measurement_cases_agree_in_every_mode(cat: Catalog, kernel: None,
                                               mode: LoadMode) -> None:
    cases = load_cases(catalog=cat)
    assert cases
    pairs = [(c.config, replace(c.workload, mode=mode, load=load_for(mode, c.workload)))
             for c in cases]
    # and once more with SLOs so the max-rate bisection runs
    pairs += [(cfg, replace(wl, slo_ttft_ms=500.0, slo_tpot_ms=50.0)) for cfg, wl in pairs]
    X = build_inputs(pairs, cat)
    assert_agree(X, [f"{c.label} as {mode}" for c in cases] * 2)


def random_config(rng: np.random.Generator, cat: Catalog) -> DeploymentConfig:
    model = cat.model(str(rng.choice(sorted(cat.models))))
    tp = int(rng.choice([1, 2, 4, 8, 16]))
    pp = int(rng.choice([1, 1, 1, 2, 4]))
    dp = int(rng.choice([1, 1, 2, 4])) if model.is_moe else 1
    ep = int(rng.choice([1, tp * dp])) if model.is_moe else 1
    spec = SpecDecode(str(rng.choice([s.value for s in SpecDecode])))
    seqs = int(rng.choice([1, 8, 64, 256, 1024]))
    accel = str(rng.choice(sorted(cat.accelerators)))
    offerings = cat.offerings_for(accelerator_id=accel)
    offering = offerings[int(rng.integers(len(offerings)))].id \
        if offerings and rng.random() < 0.3 else ""
    return DeploymentConfig(
        model=model.id, accelerator=accel, offering=offering,
        engine=str(rng.choice(sorted(cat.engines))),
        tp=tp, pp=pp, dp_attention=dp, ep=ep, replicas=int(rng.integers(1, 5)),
        weight_precision=Precision(str(rng.choice([p.value for p in Precision]))),
        kv_dtype=KvDtype(str(rng.choice([k.value for k in KvDtype]))),
        gpu_mem_fraction=float(rng.uniform(0.5, 0.95)), max_num_seqs=seqs,
        max_batched_tokens=int(max(seqs, rng.choice([512, 2048, 8192, 16384]))),
        chunked_prefill=bool(rng.random() < 0.8), cuda_graphs=bool(rng.random() < 0.8),
        spec_decode=spec, spec_tokens=0 if spec == SpecDecode.NONE else int(rng.integers(1, 6)),
        multi_node=tp * pp * dp > 8, max_model_len=0 if rng.random() < 0.5 else 4096,
    )


def random_workload(rng: np.random.Generator) -> Workload:
    mode = LoadMode(str(rng.choice([m.value for m in LoadMode])))
    load = {LoadMode.SATURATED: 0.0, LoadMode.CONCURRENCY: float(rng.integers(1, 2000)),
            LoadMode.RATE: float(10 ** rng.uniform(-2, 3)),
            LoadMode.STATIC: float(rng.integers(1, 1000)),
            LoadMode.BURST: float(rng.integers(1, 5000))}[mode]
    return Workload(
        input_len=float(rng.integers(1, 8000)), output_len=float(rng.integers(1, 2000)),
        mode=mode, load=load, prefix_hit=float(rng.choice([0.0, 0.0, 0.5, 0.9])),
        window_s=float(rng.choice([60.0, 600.0])),
        slo_ttft_ms=float(rng.choice([0.0, 0.0, 200.0, 2000.0])),
        slo_tpot_ms=float(rng.choice([0.0, 0.0, 20.0, 100.0])),
    )


def test_random_valid_candidates_agree(cat: Catalog, kernel: None) -> None:
    rng = np.random.default_rng(20240611)
    pairs: list[tuple[DeploymentConfig, Workload]] = []
    while len(pairs) < N_RANDOM:
        cfg = random_config(rng, cat)
        if not validate(cfg, cat):
            pairs.append((cfg, random_workload(rng)))
    # the draw covers the space it claims to
    assert {c.model for c, _ in pairs} == set(cat.models)
    assert {w.mode for _, w in pairs} == set(LoadMode)
    assert {c.engine for c, _ in pairs} == set(cat.engines)
    X = build_inputs(pairs, cat)
    assert_agree(X, [f"#{j} {c.model}/{c.accelerator}/{c.engine}/tp{c.tp} {w}"
                     for j, (c, w) in enumerate(pairs)])


def test_backend_name_is_checked() -> None:
    X = build_inputs([(DeploymentConfig(), Workload(100, 10))])
    with pytest.raises(ValueError, match="backend"):
        evaluate_matrix(X, backend="torch")


def test_the_threaded_kernel_gives_the_serial_numbers_bit_for_bit(cat: Catalog) -> None:
    from koi.predictor.kernel import PARALLEL_MIN_COLUMNS, predict_kernel

    rng = np.random.default_rng(7)
    pairs: list[tuple[DeploymentConfig, Workload]] = []
    while len(pairs) < 400:
        cfg = random_config(rng, cat)
        if not validate(cfg, cat):
            pairs.append((cfg, random_workload(rng)))
    X = build_inputs(pairs, cat)
    X = np.tile(X, (1, PARALLEL_MIN_COLUMNS // X.shape[1] + 1))  # past the threshold
    serial, threaded = predict_kernel(X, parallel=False), predict_kernel(X, parallel=True)
    assert np.array_equal(serial, threaded, equal_nan=True)
    assert np.array_equal(predict_kernel(X), threaded, equal_nan=True)
