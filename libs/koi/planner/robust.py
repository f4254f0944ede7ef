"""One robust prediction: the numbers the evaluator scores, the explanation reports and
the planner-api answers WhatIf and Explain's alternatives with.

A configuration's robust outcomes under a workload are its prediction on the learnt
model, then the worst case inside the DRO radii:

- **online** (any load but a saturated one): the kernel runs on the pass the fleet
  showed — every part of the forward pass ``pass_mult``× as long
  (``koi.predictor.passes``), so capacity and queueing delay move with it; the p95 TTFT
  is then times its learnt multiplier and tail factor, the p95 TPOT times its tail factor;
- **saturated** (a batch job's replica): predicted as the model has it, then corrected
  by the outcome multipliers of the regime its predicted mediators put it in (learning
  files a saturated replica's error under the edge those mediators pick);
- **the radii**: p95 latencies × e^r, and the rate a replica sustains × min(throughput
  multiplier · e^−r, 1) (robustness never raises a rate). The SLOs enter the kernel
  tightened (an SLO S is met robustly when the prediction meets S / (m·e^r)), so the
  kernel's rate under the SLO is already the robust one before that last factor.

``robust_rows`` is that computation over many rows in one kernel call (the evaluator's
and the explanation's), ``robust_predictions`` the same for (config, workload) pairs as
whole ``Prediction``s (the planner-api's). The corrections come from one place,
``robustness_fn``, over one set of radii, ``planned_radii``. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from koi.catalog import Catalog
from koi.causal.graph import LEARNT_OUTCOMES
from koi.causal.observe import attribute
from koi.causal.scope import Scope, scope_of
from koi.causal.store import BeliefStore
from koi.dro import DroCalibrator
from koi.predictor.api import evaluate_matrix, wrap_outputs
from koi.predictor.calibration import Calibration
from koi.predictor.columns import OUT
from koi.predictor.features import build_inputs
from koi.predictor.passes import scale_passes
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig

if TYPE_CHECKING:  # settings import the evaluator, which imports this module
    from koi.planner.settings import KoiSettings

# (N_IN, n) kernel inputs → (N_OUT, n) outputs, column by column (a column depends on
# its own inputs only, so a cache may answer some columns and compute the rest)
Kernel = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class Robustness:
    """Belief corrections (multipliers on the prediction) and DRO radii (log space)."""

    ttft_mult: float = 1.0    # on the p95 TTFT
    tpot_mult: float = 1.0    # on the p95 TPOT
    tput_mult: float = 1.0
    radius_ttft: float = 0.0
    radius_tpot: float = 0.0
    radius_tput: float = 0.0
    # the multiplier on the kernel's forward pass (koi.predictor.passes): an online
    # candidate is predicted with passes ``pass_mult``× as long in every part, so that
    # the queueing model runs on the learnt pass — a slower pass lowers the rate a
    # replica serves and queues it sooner, a faster one raises it (its tpot multiplier
    # is then the p95 tail factor only, its ttft one TTFT's error beyond the pass).
    # Batch candidates keep 1 and take outcome multipliers of their regime
    pass_mult: float = 1.0
    # the means' multipliers (the p95s' above include the tail factors): reported by a
    # robust ``Prediction``, never planned on (the SLOs are p95s)
    ttft_mean_mult: float = 1.0
    tpot_mean_mult: float = 1.0

    @property
    def ttft_factor(self) -> float:
        """Robust p95 TTFT ÷ raw prediction: the correction, then the worst case."""
        return self.ttft_mult * math.exp(self.radius_ttft)

    @property
    def tpot_factor(self) -> float:
        return self.tpot_mult * math.exp(self.radius_tpot)

    @property
    def rate_factor(self) -> float:
        """Robust ÷ predicted rate a replica sustains: the throughput correction and its
        radius, never above 1."""
        return min(self.tput_mult * math.exp(-self.radius_tput), 1.0)


NOMINAL = Robustness()

# robustness(config) in the base regime, or robustness(config, mediators) in the regime
# the configuration's predicted mediators (graph names) put it in
RobustnessFn = Callable[..., Robustness]


# --- the radii and the corrections ----------------------------------------------------

def calibrated_radii(calibrator: DroCalibrator, settings: KoiSettings) -> dict[str, float]:
    """The calibrator's finite radii by koi.dro outcome; none without DRO."""
    if not settings.use_dro:
        return {}
    return {o: r for o, r in calibrator.radii().items() if math.isfinite(r)}


def planned_radii(radii: Mapping[str, float], settings: KoiSettings) -> dict[str, float]:
    """The radii the planner widens by: those of ``settings.dro_outcomes``, none without
    DRO."""
    if not settings.use_dro:
        return {}
    return {o: r for o, r in radii.items() if o in settings.dro_outcomes}


def robustness_fn(beliefs: BeliefStore | None, radii: Mapping[str, float],
                  catalog: Catalog) -> RobustnessFn:
    """A configuration's ``Robustness``: its learnt corrections from ``beliefs`` (None:
    the prior model, no correction) and ``radii`` (``planned_radii``). Cached per
    (configuration, regime)."""
    cache: dict = {}
    # the corrections depend on the mediators only through the regime they pick
    # (``BeliefStore.correction``), and on the configuration only through its scope
    by_scope: dict = {}

    def robustness(config: DeploymentConfig,
                   mediators: Mapping[str, float] | None = None) -> Robustness:
        """In the base regime, or in the one ``mediators`` (graph names) put it in."""
        regime = None if mediators is None or beliefs is None else \
            tuple(attribute(o, mediators, beliefs.regimes) for o in LEARNT_OUTCOMES)
        key = (config, regime)
        if key not in cache:
            scope = None if beliefs is None else scope_of(config, catalog)
            if (scope, regime) not in by_scope:
                learnt = NOMINAL if beliefs is None or scope is None else \
                    corrections(beliefs, scope, mediators)
                by_scope[(scope, regime)] = replace(
                    learnt, radius_ttft=radii.get("ttft_p95", 0.0),
                    radius_tpot=radii.get("tpot_p95", 0.0),
                    radius_tput=radii.get("throughput", 0.0))
            cache[key] = by_scope[(scope, regime)]
        return cache[key]

    return robustness


def corrections(beliefs: BeliefStore, scope: Scope,
                mediators: Mapping[str, float] | None) -> Robustness:
    """The learnt corrections of a candidate (no radii): online (``mediators`` None) its
    pass multiplier and tail factors (``BeliefStore.online_correction``); saturated the
    outcome multipliers of the regime ``mediators`` put it in
    (``BeliefStore.candidate_correction``). The SLOs are p95s, so the planned latency
    multipliers are the p95s'."""
    m = beliefs.candidate_correction(scope, mediators)
    return Robustness(ttft_mult=m["ttft_p95"], tpot_mult=m["tpot_p95"],
                      tput_mult=m["throughput"], pass_mult=m.get("pass", 1.0),
                      ttft_mean_mult=m["ttft"],
                      tpot_mean_mult=1.0 if mediators is None else m["tpot"])


# --- the prediction ---------------------------------------------------------------------

def graph_mediators(kv_pressure: float, comm_overhead_frac: float,
                    queue_util: float) -> dict[str, float]:
    """Predicted mediators under the causal graph's names (``BeliefStore.correction``)."""
    return {"kv_pressure": float(kv_pressure), "comm_overhead": float(comm_overhead_frac),
            "queue_util": float(queue_util)}


def _exp(x: np.ndarray) -> np.ndarray:
    """``math.exp`` of each element, computed once per distinct value (the radii take a
    few values over many rows; ``math.exp`` keeps each row's number what it is alone)."""
    values, where = np.unique(x, return_inverse=True)
    return np.array([math.exp(v) for v in values], dtype=float)[where.reshape(x.shape)]


_COLUMNS = ("ttft_mult", "tpot_mult", "tput_mult", "radius_ttft", "radius_tpot",
            "radius_tput", "pass_mult")


def _columns(robust: Sequence[Robustness]) -> dict[str, np.ndarray]:
    """The ``Robustness`` fields the rows are scored with, one array each."""
    if not robust:
        return {name: np.zeros(0) for name in _COLUMNS}
    table = np.array(list(map(attrgetter(*_COLUMNS), robust)), dtype=float)
    return {name: table[:, k] for k, name in enumerate(_COLUMNS)}


@dataclass(frozen=True)
class RobustRows:
    """Kernel outputs of rows on their learnt passes with tightened SLOs (``Y``), each
    row's final robustness, and the robust numbers they give."""

    Y: np.ndarray
    robustness: tuple[Robustness, ...]
    # ``_columns(robustness)`` when the caller has it already
    known_columns: dict[str, np.ndarray] | None = field(default=None, compare=False,
                                                        repr=False)

    @cached_property
    def columns(self) -> dict[str, np.ndarray]:
        """The robustness fields as arrays (``_columns``)."""
        return self.known_columns if self.known_columns is not None else \
            _columns(self.robustness)

    @cached_property
    def ttft_factors(self) -> np.ndarray:
        """Each row's ``Robustness.ttft_factor``."""
        return self.columns["ttft_mult"] * _exp(self.columns["radius_ttft"])

    @cached_property
    def tpot_factors(self) -> np.ndarray:
        return self.columns["tpot_mult"] * _exp(self.columns["radius_tpot"])

    @property
    def ttft_p95_ms(self) -> np.ndarray:
        return self.Y[OUT["ttft_p95"]] * 1e3 * self.ttft_factors

    @property
    def tpot_p95_ms(self) -> np.ndarray:
        return self.Y[OUT["tpot_p95"]] * 1e3 * self.tpot_factors

    @property
    def max_rate_rps(self) -> np.ndarray:
        """Req/s one replica sustains within the SLO robustly."""
        return self.Y[OUT["max_rate_slo"]] * self.rate_factors

    @cached_property
    def rate_factors(self) -> np.ndarray:
        """Each row's ``Robustness.rate_factor``."""
        return np.minimum(self.columns["tput_mult"] * _exp(-self.columns["radius_tput"]),
                          1.0)

    def mediators(self, j: int) -> dict[str, float]:
        """Row ``j``'s predicted mediators under the causal graph's names."""
        return graph_mediators(self.Y[OUT["kv_pressure"], j], self.Y[OUT["comm_frac"], j],
                               self.Y[OUT["queue_util"], j])


def robust_rows(pairs: Sequence[tuple[DeploymentConfig, Workload]],
                robust: Sequence[Robustness], *, regime: RobustnessFn | None,
                catalog: Catalog, calibration: Calibration | None,
                run: Kernel) -> RobustRows:
    """Rows (config, workload with its own SLOs) with their base-regime ``robust``, in
    one ``run`` of the kernel: a saturated row takes ``regime(config, mediators)``'s
    corrections after the kernel (None: it keeps its own)."""
    saturated = np.fromiter((wl.mode == LoadMode.SATURATED for _, wl in pairs), dtype=bool,
                            count=len(pairs))
    cols = _columns(robust)
    # the SLOs a prediction must meet for its robust value to meet the job's:
    # S / (m · e^r), 0 for none
    tight = []
    for row, mult, radius in (("slo_ttft", "ttft_mult", "radius_ttft"),
                              ("slo_tpot", "tpot_mult", "radius_tpot")):
        slo_ms = np.fromiter((getattr(wl, f"{row}_ms") for _, wl in pairs), dtype=float,
                             count=len(pairs))
        factor = cols[mult] * _exp(cols[radius])
        tight.append(np.divide(slo_ms, factor, out=np.zeros_like(slo_ms), where=slo_ms > 0))
    X = build_inputs(pairs, catalog, calibration, slo_ms=(tight[0], tight[1]))
    pass_mult = np.where(saturated, 1.0, cols["pass_mult"])
    Y = run(scale_passes(X, pass_mult) if np.any(pass_mult != 1.0) else X)
    rows = RobustRows(Y, tuple(robust), cols)
    if regime is None or not saturated.any():
        return rows
    # saturated: no SLO to tighten, so the regime's correction can come after the kernel
    final = list(robust)
    for j in np.flatnonzero(saturated).tolist():
        final[j] = regime(pairs[j][0], rows.mediators(j))
    return RobustRows(Y, tuple(final))


class RobustPrediction(NamedTuple):
    """One (config, workload)'s prior prediction, its robust one, and the corrections and
    radii that made it (for a saturated load, its regime's: ``robust_rows``)."""

    nominal: Prediction
    robust: Prediction
    robustness: Robustness


def robust_predictions(pairs: Sequence[tuple[DeploymentConfig, Workload]],
                       robustness: RobustnessFn, *, catalog: Catalog,
                       calibration: Calibration | None = None, backend: str = "numba",
                       kernel: Kernel | None = None) -> list[RobustPrediction]:
    """Per (config, workload) pair: the prior model's ``Prediction``, and the learnt
    model's worst case inside the radii as the evaluator scores it (its p95s and its
    ``max_rate_under_slo_rps`` are the evaluator's numbers at the calibrated margin;
    means are the learnt model's; throughputs scale as the sustained rate does, cost per
    token inversely), with the ``Robustness`` applied."""
    if not pairs:
        return []
    run = kernel or (lambda X: evaluate_matrix(X, backend=backend))
    Yn = run(build_inputs(pairs, catalog, calibration))
    rows = robust_rows(pairs, [robustness(cfg) for cfg, _ in pairs], regime=robustness,
                       catalog=catalog, calibration=calibration, run=run)
    ttft95, tpot95, rate = rows.ttft_p95_ms, rows.tpot_p95_ms, rows.max_rate_rps
    out = []
    for j, (cfg, _) in enumerate(pairs):
        r = rows.robustness[j]
        learnt = wrap_outputs(rows.Y, j, cfg, catalog)
        t, p, x = r.ttft_mean_mult, r.tpot_mean_mult, r.rate_factor
        decode_ms = max(learnt.e2e_latency_s * 1e3 - learnt.ttft_ms, 0.0)
        robust = replace(
            learnt, ttft_ms=learnt.ttft_ms * t, ttft_p50_ms=learnt.ttft_p50_ms * t,
            ttft_p95_ms=float(ttft95[j]), tpot_ms=learnt.tpot_ms * p,
            tpot_p50_ms=learnt.tpot_p50_ms * p, tpot_p95_ms=float(tpot95[j]),
            e2e_latency_s=learnt.e2e_latency_s
            + (learnt.ttft_ms * (t - 1.0) + decode_ms * (p - 1.0)) / 1e3,
            output_throughput_tok_s=learnt.output_throughput_tok_s * x,
            total_throughput_tok_s=learnt.total_throughput_tok_s * x,
            max_rate_under_slo_rps=float(rate[j]),
            cost_per_mtok_usd=learnt.cost_per_mtok_usd / x if x > 0 else math.inf)
        out.append(RobustPrediction(wrap_outputs(Yn, j, cfg, catalog), robust, r))
    return out
