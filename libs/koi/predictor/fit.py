"""Fit the efficiency-factor table to public measurements (never per row).

Maximum a-posteriori fit in log space: every factor has a prior (``PRIORS``) with a
log-space spread, every in-scope measurement contributes its log error scaled by the
tolerance of its metric kind, and a soft-L1 loss keeps a few odd rows from dragging
the table. Only factors that some measurement touches move; the rest keep their
prior. ``cross_validate`` refits with each source held out, which shows how the table
does on measurements it has not seen.

No I/O besides writing the fitted table when asked (``write_calibration``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from koi.catalog import Catalog, load_catalog
from koi.predictor import tables
from koi.predictor.accuracy import METRIC_OUT, summarise
from koi.predictor.calibration import (
    PRIORS,
    Calibration,
    calibration_file,
    load_calibration,
    prior_calibration,
)
from koi.predictor.columns import IN, OUT
from koi.predictor.features import build_inputs, calibration_values
from koi.predictor.measurements import Case, load_cases
from koi.predictor.reference import predict_reference

# log-space prior spread per group: how far the data may pull a factor from its prior
PRIOR_SIGMA = {"mem": 0.25, "comp": 0.35, "precision_comp": 0.25, "engine_mem": 0.15,
               "engine_comp": 0.15, "engine_ovh_base_ms": 0.7, "engine_ovh_seq_us": 0.7,
               "engine_ttft_ms": 0.7, "link": 0.4, "global": 0.4, "kernel_scale": 0.3}
# tolerance per metric kind (log-space): TTFT is noisier than throughput in public data
OBS_SIGMA = {"throughput": 0.15, "tpot": 0.2, "ttft": 0.3}
BOUNDS = {"mem": (0.2, 0.95), "comp": (0.1, 0.9), "precision_comp": (0.3, 1.2),
          "engine_mem": (0.5, 1.05), "engine_comp": (0.5, 1.05),
          "engine_ovh_base_ms": (0.05, 20.0), "engine_ovh_seq_us": (0.1, 100.0),
          "engine_ttft_ms": (0.1, 40.0), "link": (0.1, 0.95), "kernel_scale": (0.5, 3.0)}
GLOBAL_BOUNDS = {"attn_mem": (0.3, 1.0), "moe_eff": (0.2, 1.0), "serial_frac": (0.02, 1.0)}


@dataclass(frozen=True)
class Param:
    group: str
    key: str
    prior: float

    @property
    def bounds(self) -> tuple[float, float]:
        return GLOBAL_BOUNDS[self.key] if self.group == "global" else BOUNDS[self.group]


def _prior(group: str, key: str) -> float:
    table = PRIORS[group]
    return table.get(key, table.get("_default", 1.0))


def parameters_for(cases: Sequence[Case], cat: Catalog, kernels: bool = False
                   ) -> list[Param]:
    """The factors that at least one case depends on (with ``kernels``, the kernel-time
    scale of each engine whose cases the kernel tables cover)."""
    keys: set[tuple[str, str]] = set()
    X = build_inputs([(c.config, c.workload) for c in cases], cat, prior_calibration(),
                     kernels=True) if kernels else None
    for j, case in enumerate(cases):
        if X is not None and X[IN["ktab"], j] >= 0:
            keys.add(("kernel_scale", case.config.engine))
        cfg = case.config
        accel = cat.accelerator(cfg.accelerator)
        keys |= {("mem", accel.id), ("comp", accel.id),
                 ("precision_comp", cfg.weight_precision.value), ("engine_mem", cfg.engine),
                 ("engine_comp", cfg.engine), ("engine_ovh_base_ms", cfg.engine),
                 ("engine_ovh_seq_us", cfg.engine), ("engine_ttft_ms", cfg.engine)}
        if cfg.tp > 1 or cfg.ep > 1:
            keys.add(("link", accel.interconnect.value))
    keys |= {("global", k) for k in PRIORS["global"]}
    # bf16 is the reference precision: its factor is 1 by definition
    keys.discard(("precision_comp", "bf16"))
    # trtllm is the reference engine for memory/compute efficiency
    keys -= {("engine_mem", "trtllm"), ("engine_comp", "trtllm")}
    return [Param(g, k, _prior(g, k)) for g, k in sorted(keys)]


def calibration_from_vector(params: Sequence[Param], theta: np.ndarray,
                            meta: dict | None = None,
                            base: Calibration | None = None) -> Calibration:
    """The table of these parameters at ``theta``, over ``base``'s factors (if any)."""
    factors: dict[str, dict[str, float]] = {g: dict(base.factors.get(g, {})) if base else {}
                                            for g in PRIORS}
    for p, t in zip(params, theta, strict=True):
        factors[p.group][p.key] = float(round(math.exp(t), 4))
    return Calibration(factors=factors, version="fitted", meta=meta or {})


class _Objective:
    """Residuals of a parameter vector; rebuilds only the calibration rows of X."""

    def __init__(self, cases: Sequence[Case], params: Sequence[Param], cat: Catalog,
                 kernels: bool = False, base: Calibration | None = None) -> None:
        self.cases, self.params, self.cat, self.base = list(cases), list(params), cat, base
        self.X = build_inputs([(c.config, c.workload) for c in cases], cat, prior_calibration(),
                              kernels=kernels)
        self.rows = [(OUT[METRIC_OUT[c.metric][0]], METRIC_OUT[c.metric][1]) for c in cases]
        self.obs_sigma = np.array([OBS_SIGMA[c.kind] for c in cases])
        self.log_value = np.log([c.value for c in cases])
        self.prior = np.log([p.prior for p in params])
        self.prior_sigma = np.array([PRIOR_SIGMA[p.group] for p in params])

    def predictions(self, theta: np.ndarray) -> np.ndarray:
        cal = calibration_from_vector(self.params, theta, base=self.base)
        X = self.X
        for j, case in enumerate(self.cases):
            accel = self.cat.accelerator(case.config.accelerator)
            for name, value in calibration_values(cal, accel, case.config).items():
                X[IN[name], j] = value
        Y = predict_reference(X)
        return np.array([Y[row, j] * scale for j, (row, scale) in enumerate(self.rows)])

    def __call__(self, theta: np.ndarray) -> np.ndarray:
        pred = np.maximum(self.predictions(theta), 1e-9)
        data = (np.log(pred) - self.log_value) / self.obs_sigma
        prior = (theta - self.prior) / self.prior_sigma
        return np.concatenate([data, prior])


def fit(cases: Sequence[Case], catalog: Catalog | None = None,
        priors: Calibration | None = None, kernels: bool | None = None,
        roofline: Calibration | None = None) -> Calibration:
    """MAP fit of the factor table on these cases; ``priors`` replaces the built-in prior
    of every factor it holds (the spreads stay ``PRIOR_SIGMA``). With ``kernels`` the
    cases the kernel tables cover are predicted from them (and their scale is fitted),
    over ``roofline`` (default: the roofline table fitted on these cases)."""
    cat = catalog or load_catalog()
    if tables.DEFAULT if kernels is None else kernels:
        return _fit_kernels(cases, cat, priors, roofline)
    return _fit(cases, parameters_for(cases, cat), cat, priors)


# what a pass timed from the kernel tables depends on (eff_mem/eff_comp only feed the
# mediators there; the link only the roofline collectives that PCIe parts keep)
KERNEL_GROUPS = ("kernel_scale", "engine_ovh_base_ms", "engine_ovh_seq_us", "engine_ttft_ms",
                 "link")


def _fit_kernels(cases: Sequence[Case], cat: Catalog, priors: Calibration | None,
                 roofline: Calibration | None) -> Calibration:
    """The roofline table (fitted on every case unless given), then the factors a
    kernel-table pass depends on (``KERNEL_GROUPS``) refitted on the cases the tables
    cover: parts and engines without tables are predicted exactly as by the roofline."""
    base = roofline or _fit(cases, parameters_for(cases, cat), cat, priors)
    X = build_inputs([(c.config, c.workload) for c in cases], cat, prior_calibration(),
                     kernels=True)
    covered = [c for j, c in enumerate(cases) if X[IN["ktab"], j] >= 0]
    if not covered:
        return base
    params = [p for p in parameters_for(covered, cat, kernels=True)
              if p.group in KERNEL_GROUPS and (p.group != "link" or p.key == "pcie")]
    return _fit(covered, params, cat, priors, kernels=True, base=base)


def _fit(cases: Sequence[Case], params: list[Param], cat: Catalog,
         priors: Calibration | None, kernels: bool = False,
         base: Calibration | None = None) -> Calibration:
    if priors is not None:
        params = [replace(p, prior=priors.factors.get(p.group, {}).get(p.key, p.prior))
                  for p in params]
    objective = _Objective(cases, params, cat, kernels, base)
    lo = np.log([p.bounds[0] for p in params])
    hi = np.log([p.bounds[1] for p in params])
    theta0 = np.clip(objective.prior, lo + 1e-6, hi - 1e-6)
    result = least_squares(objective, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=1.0,
                           diff_step=1e-3, max_nfev=400)
    meta = {"cases": len(cases), "cost": float(result.cost), "nfev": int(result.nfev),
            "method": "MAP least squares in log space, soft-L1 loss (scipy least_squares)"}
    if kernels:
        meta["kernel_tables"] = ("the roofline table, with the factors a kernel-table pass "
                                 "depends on refitted on the cases the tables cover")
    return calibration_from_vector(params, result.x, meta, base=base)


def cross_validate(cases: Sequence[Case], catalog: Catalog | None = None,
                   kernels: bool | None = None) -> list[tuple[Case, float]]:
    """Leave-one-source-out: each case predicted by a table fitted without its source."""
    from koi.predictor.accuracy import predict_cases

    cat = catalog or load_catalog()
    out: list[tuple[Case, float]] = []
    for source in sorted({c.source for c in cases}):
        train = [c for c in cases if c.source != source]
        test = [c for c in cases if c.source == source]
        cal = fit(train, cat, kernels=kernels)
        out += [(r.case, r.predicted) for r in predict_cases(test, cat, cal, kernels=kernels)]
    return out


def write_calibration(cal: Calibration, path: Path | None = None,
                      kernels: bool | None = None) -> None:
    header = ("# Fitted efficiency factors. Generated by `koi calibrate`; see docs/PREDICTOR.md.\n"
              "# Factors absent here keep their prior (koi/predictor/calibration.py).\n")
    path = path or calibration_file(kernels)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(cal.to_yaml_dict(), sort_keys=True))


def fit_and_report(write: bool = False, kernels: bool | None = None
                   ) -> tuple[Calibration, dict[str, dict[str, float]]]:
    from koi.predictor.accuracy import predict_cases

    cases = load_cases()
    # the kernel-table table sits on the shipped roofline table, not on a refit of it
    cal = fit(cases, kernels=kernels,
              roofline=load_calibration(kernels=False) if kernels else None)
    if write:
        write_calibration(cal, kernels=kernels)
    return cal, summarise(predict_cases(cases, calibration=cal, kernels=kernels))
