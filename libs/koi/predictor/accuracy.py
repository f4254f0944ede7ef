"""Accuracy of the predictor against public measurements.

Predicts every in-scope case of ``perf_measurements.csv`` and summarises absolute
percentage errors by metric kind and by accelerator. Used by ``koi bench accuracy``,
``docs/PREDICTOR.md`` and the fit. No fitting here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import OUT
from koi.predictor.features import build_inputs
from koi.predictor.measurements import Case, load_cases

METRIC_OUT = {"output_throughput_tok_s": ("out_tput", 1.0),
              "total_throughput_tok_s": ("total_tput", 1.0),
              "tpot_ms": ("tpot", 1e3), "ttft_ms": ("ttft", 1e3)}


@dataclass(frozen=True)
class CaseResult:
    case: Case
    predicted: float

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.case.value) / self.case.value

    @property
    def log_ratio(self) -> float:
        return float(np.log(max(self.predicted, 1e-12) / self.case.value))


def predict_cases(cases: Sequence[Case], catalog: Catalog | None = None,
                  calibration: Calibration | None = None, backend: str = "numpy",
                  kernels: bool | None = None) -> list[CaseResult]:
    from koi.predictor.api import evaluate_matrix

    cat = catalog or load_catalog()
    cal = calibration or load_calibration(kernels=kernels)
    X = build_inputs([(c.config, c.workload) for c in cases], cat, cal, kernels=kernels)
    Y = evaluate_matrix(X, backend=backend)
    out = []
    for j, case in enumerate(cases):
        name, scale = METRIC_OUT[case.metric]
        out.append(CaseResult(case, float(Y[OUT[name], j]) * scale))
    return out


def summarise(results: Sequence[CaseResult]) -> dict[str, dict[str, float]]:
    """Median APE (and count) by metric kind, by accelerator and overall."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in results:
        groups[f"kind:{r.case.kind}"].append(r.ape)
        groups[f"accelerator:{r.case.config.accelerator}"].append(r.ape)
        groups[f"accelerator:{r.case.config.accelerator}:{r.case.kind}"].append(r.ape)
        groups["all"].append(r.ape)
    return {k: {"median_ape": float(np.median(v)), "n": float(len(v)),
                "p90_ape": float(np.percentile(v, 90))} for k, v in sorted(groups.items())}


def accuracy_report(calibration: Calibration | None = None) -> tuple[list[CaseResult],
                                                                    dict[str, dict[str, float]]]:
    results = predict_cases(load_cases(), calibration=calibration)
    return results, summarise(results)
