"""The predictor's public entry points: validate, build inputs, run the kernel, wrap.

``predict(config, workload)`` for one candidate; ``predict_many`` for a list;
``evaluate_matrix`` for callers that already hold an input matrix (the evaluator).
Invalid configurations raise ``InvalidConfigError`` naming the knob. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.predictor import tables
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import IN, OUT
from koi.predictor.features import build_inputs
from koi.predictor.types import Prediction, Workload
from koi.space import DeploymentConfig, check, kv_capacity_tokens, weight_bytes_per_gpu


def evaluate_matrix(X: np.ndarray, *, backend: str = "numba") -> np.ndarray:
    """Outputs (N_OUT, n) for an input matrix, with the numba kernel or the numpy reference."""
    if backend == "numpy":
        from koi.predictor.reference import predict_reference

        return predict_reference(X)
    if backend == "numba":
        from koi.predictor.kernel import predict_kernel

        return predict_kernel(X)
    raise ValueError(f"backend must be 'numba' or 'numpy', not {backend!r}")


def wrap_outputs(Y: np.ndarray, j: int, cfg: DeploymentConfig, cat: Catalog) -> Prediction:
    """Column ``j`` of the kernel's outputs ``Y`` as the ``Prediction`` of ``cfg``."""
    y = lambda name: float(Y[OUT[name], j])  # noqa: E731
    model, accel = cat.model(cfg.model), cat.accelerator(cfg.accelerator)
    return Prediction(
        ttft_ms=y("ttft") * 1e3, ttft_p50_ms=y("ttft_p50") * 1e3,
        ttft_p95_ms=y("ttft_p95") * 1e3,
        tpot_ms=y("tpot") * 1e3, tpot_p50_ms=y("tpot_p50") * 1e3,
        tpot_p95_ms=y("tpot_p95") * 1e3,
        output_throughput_tok_s=y("out_tput"), total_throughput_tok_s=y("total_tput"),
        request_rate_rps=y("req_rate"), max_rate_under_slo_rps=y("max_rate_slo"),
        cost_per_mtok_usd=y("cost_mtok"), e2e_latency_s=y("e2e"),
        kv_pressure=y("kv_pressure"), comm_overhead_frac=y("comm_frac"),
        compute_util=y("compute_util"), membw_util=y("membw_util"),
        queue_util=y("queue_util"), batch_efficiency=y("batch_eff"),
        memory_headroom=y("mem_headroom"), batch_size=y("batch"),
        kv_capacity_tokens=kv_capacity_tokens(model, accel, cfg, cat.engine(cfg.engine)),
        weights_gb_per_gpu=weight_bytes_per_gpu(model, cfg) / 1e9,
    )


def predict_many(pairs: Sequence[tuple[DeploymentConfig, Workload]], *,
                 catalog: Catalog | None = None, calibration: Calibration | None = None,
                 backend: str = "numba", validate: bool = True,
                 kernels: bool | None = None) -> list[Prediction]:
    """Predictions for (config, workload) pairs; invalid configs raise when ``validate``.
    ``kernels``: time passes from the measured kernel tables where they cover a config
    (None: the predictor's default); ``pass_models`` says which each pair gets."""
    cat = catalog or load_catalog()
    cal = calibration or load_calibration(kernels=kernels)
    if validate:
        for cfg, _ in pairs:
            check(cfg, cat)
    X = build_inputs(pairs, cat, cal, kernels=kernels)
    Y = evaluate_matrix(X, backend=backend)
    return [wrap_outputs(Y, j, cfg, cat) for j, (cfg, _) in enumerate(pairs)]


def pass_models(configs: Sequence[DeploymentConfig], *, catalog: Catalog | None = None,
                kernels: bool | None = None) -> list[str]:
    """How each configuration's passes are timed: "kernel tables <system>/<engine-version>"
    where the measured tables cover it, else "roofline"."""
    cat = catalog or load_catalog()
    X = build_inputs([(cfg, Workload(1, 1)) for cfg in configs], cat, kernels=kernels)
    return [tables.REGISTRY.label(int(k)) for k in X[IN["ktab"]]]


def predict(config: DeploymentConfig, workload: Workload, **kwargs: object) -> Prediction:
    """Prediction for one configuration under one workload."""
    return predict_many([(config, workload)], **kwargs)[0]  # type: ignore[arg-type]
