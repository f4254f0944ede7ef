"""What-if arithmetic shared by WhatIf and Explain, and Explain's alternatives.

A job's workload, the DRO radii of a causal state, which mechanisms cover a
configuration, and the robust predictor of a causal state: the planner's own
(``koi.planner.robust``: the learnt model, then the worst case inside the radii), so
that the API's robust numbers are the evaluator's. Explain's alternatives are the job's
other candidates of the decided tick (from the proposer's CandidateBatch), each
predicted that way and labelled with why it lost: a robust SLO breach when there is
one, else the composer's objective.

Pure functions over decoded messages: no NATS, no gRPC, and no planning decision (the
reason never re-decides; it reports the numbers and names the composer's choice).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import structlog

from koi.catalog import Catalog
from koi.causal.scope import scope_of
from koi.causal.store import BeliefStore
from koi.errors import InvalidConfigError, InvalidSpecError
from koi.jobs import OnlineJob
from koi.planner.robust import Kernel, planned_radii, robust_predictions, robustness_fn
from koi.planner.settings import KoiSettings
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig, check
from koi.v1 import bus_pb2, causal_pb2, common_pb2, config_pb2, plan_pb2, plan_service_pb2
from koi.wire.causal import store_from_proto
from koi.wire.config import config_from_proto
from koi.wire.predictor import prediction_to_proto

log = structlog.get_logger(__name__)

# Alternatives Explain predicts at most (each is one predictor call on the caller's
# thread): a job has up to a few dozen candidates, an operator reads the first few.
MAX_ALTERNATIVES = 8
# OutcomeCalibration.outcome may use koi.dro's names or the Outcomes field names.
RADIUS_ALIASES = {"ttft_ms": "ttft", "ttft_p95_ms": "ttft_p95", "tpot_ms": "tpot",
                  "tpot_p95_ms": "tpot_p95", "output_throughput_tok_s": "throughput",
                  "total_throughput_tok_s": "throughput"}
# (config, workload) → (nominal, robust) predictions; raises InvalidConfigError for a
# configuration the predictor cannot run
RobustPredictor = Callable[[DeploymentConfig, Workload], tuple[Prediction, Prediction]]


def job_workload(spec: object) -> Workload:
    """A job's per-deployment workload: its mean lengths, and for an online job its mean
    rate and SLO (a batch job's backlog keeps its replicas saturated)."""
    inp = max(1.0, spec.input_len.mean_value())  # type: ignore[attr-defined]
    out = max(1.0, spec.output_len.mean_value())  # type: ignore[attr-defined]
    if isinstance(spec, OnlineJob):
        return Workload(inp, out, mode=LoadMode.RATE, load=max(spec.arrival.mean_rate(), 1e-3),
                        slo_ttft_ms=spec.slo.ttft_ms, slo_tpot_ms=spec.slo.tpot_ms)
    return Workload(inp, out, mode=LoadMode.SATURATED)


def dro_radii(state: causal_pb2.CausalState) -> dict[str, float]:
    """Radius per koi.dro outcome name from the state's calibration entries."""
    radii: dict[str, float] = {}
    for c in state.calibration:
        if math.isfinite(c.dro_radius) and c.dro_radius > 0:
            name = RADIUS_ALIASES.get(c.outcome, c.outcome)
            radii[name] = max(radii.get(name, 0.0), c.dro_radius)
    return radii


def scope_covers(scope: common_pb2.Scope, cfg: DeploymentConfig, catalog: Catalog) -> bool:
    """Whether a wire scope (each empty or ``*`` field = any) contains the config's own
    scope (``koi.causal.scope.scope_of``)."""
    own = scope_of(cfg, catalog)
    wanted = ((scope.accelerator, own.accelerator), (scope.accelerator_family, own.family),
              (scope.engine, own.engine), (scope.model_size_class, own.size_class),
              (scope.parallelism_bucket, own.parallelism))
    return all(want in ("", "*") or want == have for want, have in wanted)


def belief_store_of(state: causal_pb2.CausalState) -> BeliefStore | None:
    """The belief store ``state`` carries (``store`` and its mechanisms), if it has one."""
    if not state.HasField("store"):
        return None
    try:
        return store_from_proto(state.store, state.mechanisms)
    except Exception as e:  # unreadable: robust outcomes fall back to the radii alone
        log.warning("belief_store_unreadable", version=state.version, error=str(e))
        return None


def robust_predictor(state: causal_pb2.CausalState | None, beliefs: BeliefStore | None,
                     settings: KoiSettings, catalog: Catalog,
                     kernel: Kernel | None = None) -> RobustPredictor:
    """The planner's robust prediction under ``state``: ``beliefs`` (its decoded store;
    None: the prior model) and its radii, with ``settings``' switches, exactly as the
    evaluator scores a candidate at its calibrated margin (``koi.planner.robust``).
    ``kernel`` replaces the predictor's kernel (tests, a cache)."""
    radii = planned_radii(dro_radii(state) if state is not None else {}, settings)
    robustness = robustness_fn(beliefs if settings.use_beliefs else None, radii, catalog)

    def predict(cfg: DeploymentConfig, workload: Workload) -> tuple[Prediction, Prediction]:
        check(cfg, catalog)  # a limit the predictor knows and validation does not
        nominal, robust, _ = robust_predictions([(cfg, workload)], robustness,
                                                catalog=catalog,
                                                calibration=settings.calibration,
                                                backend=settings.backend, kernel=kernel)[0]
        return nominal, robust

    return predict


# --- Explain's alternatives ---------------------------------------------------------------

def _config_key(cfg: config_pb2.DeploymentConfig) -> bytes:
    """A configuration without where and how often it runs: the proposer's candidates
    carry neither, the plan's decision carries both."""
    bare = config_pb2.DeploymentConfig()
    bare.CopyFrom(cfg)
    bare.ClearField("offering")
    bare.ClearField("replicas")
    return bare.SerializeToString(deterministic=True)


def other_candidates(batch: bus_pb2.CandidateBatch, decision: plan_pb2.Decision,
                     limit: int = MAX_ALTERNATIVES) -> list[plan_pb2.Candidate]:
    """The job's candidates of the batch that the decision did not choose, in the
    proposer's order (its best guess first), one per configuration, at most ``limit``."""
    seen = set()
    if decision.kind == plan_pb2.DECISION_KIND_PLACE and decision.HasField("config"):
        seen.add(_config_key(decision.config))
    out = []
    for c in batch.candidates:
        if c.job_id != decision.job_id:
            continue
        key = _config_key(c.config)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == limit:
            break
    return out


def losing_reason(robust: Prediction, workload: Workload, decision: plan_pb2.Decision) -> str:
    """Why an alternative was not chosen: its robust SLO breaches, else what the plan did."""
    breaches = []
    if workload.slo_ttft_ms > 0 and robust.ttft_p95_ms > workload.slo_ttft_ms:
        breaches.append(f"TTFT p95 {robust.ttft_p95_ms:.0f} ms > {workload.slo_ttft_ms:.0f}"
                        " (robust)")
    if workload.slo_tpot_ms > 0 and robust.tpot_p95_ms > workload.slo_tpot_ms:
        breaches.append(f"TPOT p95 {robust.tpot_p95_ms:.1f} ms > {workload.slo_tpot_ms:.0f}"
                        " (robust)")
    if breaches:
        at = f" at {workload.load:.2f} req/s" if workload.mode == LoadMode.RATE else ""
        return "; ".join(breaches) + at
    if decision.kind != plan_pb2.DECISION_KIND_PLACE:
        return f"not placed this tick: {decision.reason or 'no reason given'}"
    label = decision.explanation.config_label or decision.config.accelerator
    return (f"meets the SLO robustly ({robust.output_throughput_tok_s:.0f} tok/s per"
            f" replica), but the composer's objective (value − cost − risk − churn) chose"
            f" {label} (its term {decision.score_usd_per_hour:.2f}/h)")


def alternatives(candidates: Iterable[plan_pb2.Candidate], workload: Workload,
                 decision: plan_pb2.Decision, predict: RobustPredictor, catalog: Catalog
                 ) -> list[plan_service_pb2.Alternative]:
    """Each candidate predicted under ``workload``, nominal and robust, with why it lost;
    those meeting the SLO robustly first, then in the proposer's order."""
    scored: list[tuple[bool, plan_service_pb2.Alternative]] = []  # (breaches?, alt)
    for c in candidates:
        alt = plan_service_pb2.Alternative(candidate=c)
        try:
            cfg = config_from_proto(c.config, catalog=catalog)
            pred, robust = predict(cfg, workload)
        except (InvalidConfigError, InvalidSpecError) as e:
            alt.reason = f"cannot run here: {e}"
            scored.append((True, alt))
            continue
        alt.predicted.CopyFrom(prediction_to_proto(pred))
        alt.robust.CopyFrom(prediction_to_proto(robust).outcomes)
        alt.reason = losing_reason(robust, workload, decision)
        scored.append(("(robust)" in alt.reason, alt))
    return [a for _, a in sorted(scored, key=lambda s: s[0])]  # stable: proposer's order
