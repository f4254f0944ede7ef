"""What the causal store learns from: one deployment's tick, observed next to predicted.

``OutcomeObservation`` is the input type of ``BeliefStore.update``; it is built from a
``DeploymentTelemetry`` and the predictor's (uncorrected) ``Prediction`` by
``observation_from_telemetry``. ``attribute`` says which belief edge an outcome's
residual goes to, from the predicted mediators (the same rule chooses the edge whose
correction is applied at prediction time, so learning and applying agree).

Pure functions over frozen values; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from koi.causal.graph import BATCH_EFFICIENCY_EDGE, Edge
from koi.causal.scope import Scope
from koi.cluster import DeploymentTelemetry
from koi.predictor.passes import solve, value_at
from koi.predictor.types import MEDIATORS, Prediction

# outcome → (Prediction field, observed key). p95s share their mean's graph node.
OUTCOME_FIELDS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_ms", "ttft_ms"),
    "ttft_p95": ("ttft_p95_ms", "ttft_p95_ms"),
    "tpot": ("tpot_ms", "tpot_ms"),
    "tpot_p95": ("tpot_p95_ms", "tpot_p95_ms"),
    "throughput": ("output_throughput_tok_s", "output_tok_s"),
}
GRAPH_OUTCOME: dict[str, str] = {"ttft": "ttft", "ttft_p95": "ttft", "tpot": "tpot",
                                 "tpot_p95": "tpot", "throughput": "throughput"}
LATENCY_OUTCOMES = frozenset({"ttft", "ttft_p95", "tpot", "tpot_p95"})
# A p95 is its mean times a tail factor (p95 ÷ mean). The mean's error goes to the graph
# edge ``attribute`` picks; what is left of the p95's — how much longer the tail is than
# the predictor's queueing and length model says — is a scoped belief of its own, on
# the pseudo-edge (mean outcome, p95 outcome) (docs/CAUSAL.md §3).
TAIL_EDGES: dict[str, tuple[str, str]] = {"ttft_p95": ("ttft", "ttft_p95"),
                                          "tpot_p95": ("tpot", "tpot_p95")}

# graph mediator → Prediction field
MEDIATOR_FIELDS: dict[str, str] = {
    "kv_pressure": "kv_pressure", "comm_overhead": "comm_overhead_frac",
    "compute_util": "compute_util", "membw_util": "membw_util", "queue_util": "queue_util",
    "batch_efficiency": "batch_efficiency",
}

MIN_REQUESTS = 20.0  # below this a tick's means are too noisy to learn from


@dataclass(frozen=True, slots=True)
class Regimes:
    """Mediator thresholds that decide which edge explains an outcome's residual."""

    kv_cliff: float = 0.85     # kv_pressure above this: preemption/recompute regime
    comm_bound: float = 0.25   # comm_overhead_frac above this: collectives dominate
    queue_bound: float = 0.70  # queue_util above this: TTFT is mostly waiting


@dataclass(frozen=True, slots=True)
class OutcomeObservation:
    """One deployment over one tick: predicted vs observed, with the traffic behind it.

    ``predicted`` holds Prediction field names (outcomes and mediators) of the raw,
    uncorrected prediction; ``observed`` holds ``ttft_ms, ttft_p95_ms, tpot_ms,
    tpot_p95_ms, output_tok_s, kv_usage, preemptions`` (missing keys = not measured).
    ``weight`` is the number of requests behind the means. ``curves`` (online
    deployments) maps "ttft" / "tpot" to the log predicted mean (ms) at each pass
    multiplier of ``koi.predictor.passes.LOG_GRID`` (``pass_curves``): the model
    inverted, so that the store learns how much longer a pass takes rather than how
    much longer TPOT is (``pass_residual``), and TTFT's error beyond it.
    """

    deployment_id: str
    job_id: str
    tick: int
    scope: Scope
    predicted: Mapping[str, float] = field(default_factory=dict)
    observed: Mapping[str, float] = field(default_factory=dict)
    weight: float = 0.0
    curves: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def mediators(self) -> dict[str, float]:
        """Predicted mediators by graph name (0 for any the prediction lacks)."""
        return {m: float(self.predicted.get(f, 0.0)) for m, f in MEDIATOR_FIELDS.items()}


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0.0


def observation_from_telemetry(telemetry: DeploymentTelemetry, predicted: Prediction,
                               scope: Scope, *, min_requests: float = MIN_REQUESTS
                               ) -> OutcomeObservation | None:
    """The observation for one deployment's tick, or None with too little traffic."""
    if telemetry.requests_finished < min_requests:
        return None
    t = telemetry
    observed = {
        "ttft_ms": t.ttft_mean_s * 1000.0, "ttft_p95_ms": t.ttft_p95_s * 1000.0,
        "tpot_ms": t.tpot_mean_s * 1000.0, "tpot_p95_ms": t.tpot_p95_s * 1000.0,
        "output_tok_s": t.output_tok_s,
    }
    # A zero mean means "not measured" (e.g. one-token outputs have no TPOT).
    observed = {k: v for k, v in observed.items() if _finite_positive(v)}
    observed["kv_usage"] = t.kv_cache_usage
    observed["preemptions"] = t.num_preemptions
    keys = {f for f, _ in OUTCOME_FIELDS.values()} | set(MEDIATORS)
    pred = {k: float(getattr(predicted, k)) for k in sorted(keys)}
    return OutcomeObservation(deployment_id=t.deployment_id, job_id=t.job_id, tick=t.tick,
                              scope=scope, predicted=pred, observed=observed,
                              weight=float(t.requests_finished))


def log_residuals(obs: OutcomeObservation) -> dict[str, float]:
    """log(observed / predicted) per outcome, for outcomes measured and predicted > 0."""
    out: dict[str, float] = {}
    for outcome, (pkey, okey) in OUTCOME_FIELDS.items():
        p, o = obs.predicted.get(pkey, 0.0), obs.observed.get(okey, 0.0)
        if _finite_positive(p) and _finite_positive(o):
            out[outcome] = math.log(o / p)
    return out


def tail_residuals(obs: OutcomeObservation) -> dict[str, float]:
    """log((observed p95 / observed mean) / (predicted p95 / predicted mean)) per p95
    outcome with both its p95 and its mean measured: the tail factor's error."""
    res = log_residuals(obs)
    return {p95: res[p95] - res[GRAPH_OUTCOME[p95]] for p95 in TAIL_EDGES
            if p95 in res and GRAPH_OUTCOME[p95] in res}


# An observation's noise in multiplier space is its outcome's noise over the curve's
# slope, the slope clipped to [PASS_MIN_SLOPE, PASS_MAX_SLOPE]: a flat curve says next
# to nothing about its multiplier, and a steep one no more than a proportional one — an
# outcome's tick-to-tick scatter grows with its sensitivity to the pass (queueing
# amplifies both), and near a slot or saturation limit a curve steps (in a first version
# that also inverted TTFT, one slope of 41 on real-104 seed 2 outweighed 30 later
# observations of the opposite sign)
PASS_MIN_SLOPE, PASS_MAX_SLOPE = 0.1, 1.0


def pass_noise(noise: float, slope: float) -> float:
    """The noise of a pass residual whose outcome has ``noise`` and curve ``slope``."""
    return noise / min(max(slope, PASS_MIN_SLOPE), PASS_MAX_SLOPE)


def pass_residual(obs: OutcomeObservation) -> tuple[float, float] | None:
    """(log pass multiplier at which the model predicts the observed mean TPOT, the TPOT
    curve's slope there), or None without a TPOT curve and a measured mean."""
    curve = obs.curves.get("tpot")
    o = obs.observed.get(OUTCOME_FIELDS["tpot"][1], 0.0)
    return solve(curve, math.log(o)) if curve and _finite_positive(o) else None


def curve_residual(obs: OutcomeObservation, outcome: str, theta: float) -> float | None:
    """log(observed / predicted) of ``outcome``'s mean with passes e^theta as long (None
    without its curve or a measured mean)."""
    curve = obs.curves.get(outcome)
    o = obs.observed.get(OUTCOME_FIELDS[outcome][1], 0.0)
    if not curve or not _finite_positive(o):
        return None
    return math.log(o) - value_at(curve, theta)


def attribute(outcome: str, mediators: Mapping[str, float] | None,
              regimes: Regimes = Regimes()) -> Edge:
    """The belief edge that explains ``outcome`` (a graph outcome) in this regime.

    - tpot ← kv_pressure if kv_pressure > kv_cliff, else comm_overhead if
      comm_overhead > comm_bound, else membw_util (decode is memory-bound);
    - ttft ← queue_util if queue_util > queue_bound, else comm_overhead if
      comm_overhead > comm_bound, else compute_util (prefill is compute-bound);
    - throughput ← kv_pressure if kv_pressure > kv_cliff, else batch_efficiency.

    With ``mediators=None`` the base regime (no cliff, no comm/queue bound) is used.
    """
    m = mediators or {}
    kv = m.get("kv_pressure", 0.0)
    comm = m.get("comm_overhead", m.get("comm_overhead_frac", 0.0))
    if outcome == "tpot":
        if kv > regimes.kv_cliff:
            return ("kv_pressure", "tpot")
        if comm > regimes.comm_bound:
            return ("comm_overhead", "tpot")
        return ("membw_util", "tpot")
    if outcome == "ttft":
        if m.get("queue_util", 0.0) > regimes.queue_bound:
            return ("queue_util", "ttft")
        if comm > regimes.comm_bound:
            return ("comm_overhead", "ttft")
        return ("compute_util", "ttft")
    if outcome == "throughput":
        return ("kv_pressure", "throughput") if kv > regimes.kv_cliff else BATCH_EFFICIENCY_EDGE
    raise KeyError(f"no belief edge ends in {outcome!r}")


def condition_text(edge: Edge, regimes: Regimes = Regimes()) -> str:
    """When the edge's belief applies, in operator words (``kv_pressure > 0.85``)."""
    mediator = edge[0]
    if mediator == "kv_pressure":
        return f"kv_pressure > {regimes.kv_cliff:.2f}"
    if mediator == "comm_overhead":
        return f"comm_overhead > {regimes.comm_bound:.2f}"
    if mediator == "queue_util":
        return f"queue_util > {regimes.queue_bound:.2f}"
    if mediator == "membw_util":
        return "memory-bound decode"
    if mediator == "compute_util":
        return "compute-bound prefill"
    if mediator == "batch_efficiency":
        return f"batching below the KV cliff (kv_pressure ≤ {regimes.kv_cliff:.2f})"
    return mediator
