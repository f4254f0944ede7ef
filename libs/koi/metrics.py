"""DESIGN §4 metrics, computed once, here, for every report, test and benchmark.

``compute_metrics(record, reference_cost_per_token_usd, offered_goodput_tok_s)`` turns a
``RunRecord`` into per-job ``JobMetrics`` and the run's ``RunMetrics`` (the columns of the
preprint's tables plus the overall score). The two yardsticks the score needs come from
the scenario, not the run: ``offered_goodput_tok_s(scenario)`` and
``reference_cost_per_token(scenario, catalog)``; ``metrics_for`` wires all three.

Definitions (fractions are 0..1; the ``*_pct`` fields are the same × 100). Only jobs
whose ``submitted`` flag is set (submit time inside the horizon) count anywhere.

- batch progress = Σ tokens_by_deadline ÷ Σ tokens_requested over submitted batch jobs.
- admit online / admit batch = admitted ÷ submitted jobs of that class.
- $/token = ``record.spend_usd`` ÷ tokens served, where tokens served = Σ online
  served_output_tokens + Σ batch tokens_processed (late batch tokens were paid for, so
  they count).
- TTFT met / TPOT met = mean over *served* online jobs (served_requests > 0) of
  ttft_met_requests ÷ served_requests (resp. tpot); each job counts once, whatever its
  volume.
- goodput tok/s = (Σ online good_output_tokens + Σ batch tokens_by_deadline) ÷ horizon_s.
- score = 100 × Σ weight·term with ``SCORE_WEIGHTS`` (they sum to 1): batch progress,
  admit online, admit batch, TTFT met, TPOT met, min(1, goodput ÷ offered goodput) and
  min(1, reference $/token ÷ $/token).

Edge cases (each chosen so that a policy can neither gain by serving nothing nor lose
for work that was never asked of it):

- A class with no submitted jobs scores 1.0 on its terms: no batch jobs → batch
  progress 1.0 and admit batch 1.0; no online jobs → admit online, TTFT met and TPOT met
  1.0. Likewise batch jobs that requested 0 tokens in total → progress 1.0.
- Online jobs were submitted but none was served: TTFT met and TPOT met are 0.0 when
  they offered any request (the demand went unserved), 1.0 when none offered a request.
- Zero tokens served → $/token = inf and the cost term 0 (even at zero spend). Tokens
  served at zero spend → $/token = 0 and the cost term 1.
- Offered goodput 0 → the goodput term is 1.0 (nothing was asked).
- Ratios are clipped to [0, 1]: a simulator's sampled lengths can overshoot a batch job's
  requested volume by rounding, and must not push a term past 1.

This module computes; it never runs a simulation, reads files or plots.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from koi.catalog import Catalog, load_catalog
from koi.jobs import JobSpec, OnlineJob
from koi.predictor.api import predict_many
from koi.predictor.types import LoadMode, Workload
from koi.records import JobOutcome, RunRecord
from koi.shapes import cheapest_on_demand, valid_default_configs

if TYPE_CHECKING:  # the scenario package is only read here, never imported at run time
    from koi.scenario.types import Scenario

SCORE_WEIGHTS: dict[str, float] = {
    "batch_progress": 0.15,
    "admit_online": 0.15,
    "admit_batch": 0.10,
    "ttft_met": 0.15,
    "tpot_met": 0.15,
    "goodput": 0.15,
    "cost": 0.15,
}
"""DESIGN §4's weights of the overall score; they sum to 1."""

REFERENCE_TPS: tuple[int, ...] = (1, 2, 4, 8)
REFERENCE_PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
REFERENCE_ENGINE = "vllm"


@dataclass(frozen=True, slots=True)
class JobMetrics:
    """One job's share of the run's metrics (None where a metric does not apply)."""

    job_id: str
    kind: str
    model: str
    submitted: bool
    admitted: bool
    served_output_tokens: float       # online served tokens, or batch tokens processed
    good_output_tokens: float         # online tokens meeting both SLOs, or batch by deadline
    goodput_tok_s: float              # good_output_tokens ÷ horizon
    ttft_met_frac: float | None = None   # online jobs with served requests
    tpot_met_frac: float | None = None
    batch_progress_frac: float | None = None  # batch jobs with tokens requested


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """DESIGN §4 for one run: the table columns, the yardsticks and the score."""

    batch_progress_pct: float
    admit_online_pct: float
    admit_batch_pct: float
    cost_per_token_usd: float
    ttft_met_pct: float
    tpot_met_pct: float
    goodput_tok_s: float
    offered_goodput_tok_s: float
    reference_cost_per_token_usd: float
    overall_score: float
    score_terms: dict[str, float]     # each term's fraction in 0..1, keyed as SCORE_WEIGHTS
    spend_usd: float
    tokens_served: float
    jobs: tuple[JobMetrics, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --- per run ----------------------------------------------------------------------------

def compute_metrics(record: RunRecord, reference_cost_per_token_usd: float,
                    offered_goodput_tok_s: float) -> RunMetrics:
    """DESIGN §4 metrics of one run (definitions and edge cases in the module docstring)."""
    if not record.horizon_s > 0:
        raise ValueError(f"horizon_s must be > 0 (got {record.horizon_s})")
    if not (reference_cost_per_token_usd > 0 and math.isfinite(reference_cost_per_token_usd)):
        raise ValueError("reference_cost_per_token_usd must be a positive finite number"
                         f" (got {reference_cost_per_token_usd})")
    if not (offered_goodput_tok_s >= 0 and math.isfinite(offered_goodput_tok_s)):
        raise ValueError("offered_goodput_tok_s must be a finite number ≥ 0"
                         f" (got {offered_goodput_tok_s})")
    jobs = [j for j in record.jobs if j.submitted]
    online = [j for j in jobs if j.kind == "online"]
    batch = [j for j in jobs if j.kind == "batch"]

    batch_progress = _ratio(sum(j.tokens_by_deadline for j in batch),
                            sum(j.tokens_requested for j in batch), empty=1.0)
    admit_online = _ratio(sum(j.admitted for j in online), len(online), empty=1.0)
    admit_batch = _ratio(sum(j.admitted for j in batch), len(batch), empty=1.0)
    ttft_met, tpot_met = _slo_met(online)

    tokens = (sum(j.served_output_tokens for j in online)
              + sum(j.tokens_processed for j in batch))
    cost = record.spend_usd / tokens if tokens > 0 else math.inf
    cost_term = _clip(reference_cost_per_token_usd / cost) if cost > 0 else 1.0
    good = sum(j.good_output_tokens for j in online) + sum(j.tokens_by_deadline for j in batch)
    goodput = good / record.horizon_s
    goodput_term = _ratio(goodput, offered_goodput_tok_s, empty=1.0)

    terms = {"batch_progress": batch_progress, "admit_online": admit_online,
             "admit_batch": admit_batch, "ttft_met": ttft_met, "tpot_met": tpot_met,
             "goodput": goodput_term, "cost": cost_term}
    score = 100.0 * sum(SCORE_WEIGHTS[k] * v for k, v in terms.items())
    return RunMetrics(
        batch_progress_pct=100.0 * batch_progress, admit_online_pct=100.0 * admit_online,
        admit_batch_pct=100.0 * admit_batch, cost_per_token_usd=cost,
        ttft_met_pct=100.0 * ttft_met, tpot_met_pct=100.0 * tpot_met,
        goodput_tok_s=goodput, offered_goodput_tok_s=offered_goodput_tok_s,
        reference_cost_per_token_usd=reference_cost_per_token_usd, overall_score=score,
        score_terms=terms, spend_usd=record.spend_usd, tokens_served=tokens,
        jobs=tuple(job_metrics(j, record.horizon_s) for j in record.jobs))


def job_metrics(job: JobOutcome, horizon_s: float) -> JobMetrics:
    """One job's metrics (its TTFT/TPOT met share, batch progress and goodput)."""
    if job.kind == "online":
        served, good = job.served_output_tokens, job.good_output_tokens
        has = job.served_requests > 0
        return JobMetrics(
            job.job_id, job.kind, job.model, job.submitted, job.admitted, served, good,
            good / horizon_s,
            ttft_met_frac=_clip(job.ttft_met_requests / job.served_requests) if has else None,
            tpot_met_frac=_clip(job.tpot_met_requests / job.served_requests) if has else None)
    progress = (_clip(job.tokens_by_deadline / job.tokens_requested)
                if job.tokens_requested > 0 else None)
    return JobMetrics(job.job_id, job.kind, job.model, job.submitted, job.admitted,
                      job.tokens_processed, job.tokens_by_deadline,
                      job.tokens_by_deadline / horizon_s, batch_progress_frac=progress)


def metrics_for(record: RunRecord, scenario: Scenario,
                catalog: Catalog | None = None) -> RunMetrics:
    """``compute_metrics`` with both yardsticks derived from the run's scenario."""
    return compute_metrics(record, reference_cost_per_token(scenario, catalog),
                           offered_goodput_tok_s(scenario))


def _slo_met(online: list[JobOutcome]) -> tuple[float, float]:
    served = [j for j in online if j.served_requests > 0]
    if not served:
        asked = sum(j.offered_requests for j in online) > 0
        return (0.0, 0.0) if asked else (1.0, 1.0)
    ttft = sum(_clip(j.ttft_met_requests / j.served_requests) for j in served) / len(served)
    tpot = sum(_clip(j.tpot_met_requests / j.served_requests) for j in served) / len(served)
    return ttft, tpot


def _ratio(num: float, den: float, *, empty: float) -> float:
    return _clip(num / den) if den > 0 else empty


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


# --- yardsticks from the scenario -------------------------------------------------------

def offered_output_tokens(job: JobSpec, horizon_s: float) -> float:
    """Output tokens a job asks for inside ``[0, horizon_s]``.

    Online: mean rate × mean output length × the length of its active window
    ``[submit_s, end_s or horizon]`` ∩ ``[0, horizon]``. Batch: its total output tokens
    spread evenly over ``[submit_s, submit_s + deadline_s]``, times the share of that
    window inside the horizon — all of it when the deadline falls inside the horizon,
    pro rata when the deadline lies beyond (the rate needed to finish on time), none when
    it is submitted at or after the horizon.
    """
    if isinstance(job, OnlineJob):
        end = horizon_s if job.end_s is None else min(job.end_s, horizon_s)
        window = max(0.0, end - max(job.submit_s, 0.0))
        return job.arrival.mean_rate() * job.output_len.mean_value() * window
    inside = max(0.0, min(job.due_s, horizon_s) - job.submit_s)
    return job.total_output_tokens * min(1.0, inside / job.deadline_s)


def offered_goodput_tok_s(scenario: Scenario) -> float:
    """What the scenario's jobs ask for: Σ ``offered_output_tokens`` ÷ horizon, tok/s."""
    h = scenario.horizon_s
    if not h > 0:
        raise ValueError(f"horizon_s must be > 0 (got {h})")
    return sum(offered_output_tokens(j, h) for j in scenario.jobs) / h


_REF_CACHE: weakref.WeakKeyDictionary[Catalog, dict[tuple, float]] = weakref.WeakKeyDictionary()


def cheapest_cost_per_token(model: str, input_len: float, output_len: float,
                            catalog: Catalog | None = None, *,
                            backend: str = "numpy") -> float:
    """The lowest on-demand $/output token the catalog allows for one model and lengths.

    min over accelerators with an on-demand offering, TP in (1, 2, 4, 8), bf16/fp8
    weights, vLLM defaults, configs that validate, of (cheapest on-demand $/GPU-hour ×
    GPUs per replica) ÷ (predicted saturated output tok/s × 3600). ``inf`` when no config
    serves the model. Cached per (catalog, model, input_len, output_len).
    """
    cat = catalog or load_catalog()
    cache = _REF_CACHE.setdefault(cat, {})
    key = (model, float(input_len), float(output_len), backend)
    if key in cache:
        return cache[key]
    candidates, prices = [], []
    for accel in sorted(cat.accelerators):
        offer = cheapest_on_demand(accel, cat)
        if offer is None:
            continue
        for cfg in valid_default_configs(model, accel, cat, tps=REFERENCE_TPS,
                                         precisions=REFERENCE_PRECISIONS,
                                         engine=REFERENCE_ENGINE):
            candidates.append(cfg)
            prices.append(offer.usd_per_gpu_hour * cfg.gpus_per_replica)
    best = math.inf
    if candidates:
        w = Workload(max(1.0, input_len), max(1.0, output_len), mode=LoadMode.SATURATED)
        preds = predict_many([(c, w) for c in candidates], catalog=cat, backend=backend,
                             validate=False)
        for usd_h, p in zip(prices, preds, strict=True):
            if p.output_throughput_tok_s > 0:
                best = min(best, usd_h / (p.output_throughput_tok_s * 3600.0))
    cache[key] = best
    return best


def reference_cost_per_token(scenario: Scenario, catalog: Catalog | None = None, *,
                             backend: str = "numpy") -> float:
    """The cheapest on-demand $/token the catalog allows for the scenario's job mix.

    Each job's ``cheapest_cost_per_token`` at its mean input/output lengths (full
    utilisation: the predictor's saturated throughput), averaged with weights = the job's
    ``offered_output_tokens`` in the horizon (equal weights if every job offers 0). This
    uses the predictor's prior-calibrated physics as a fixed yardstick: it is identical for
    every policy, and does not know the simulator's hidden world, so a policy may beat it.
    Raises ``ValueError`` naming a job whose model no catalog configuration can serve.
    """
    cat = catalog or load_catalog()
    if not scenario.jobs:
        raise ValueError(f"scenario {scenario.name!r} has no jobs: no reference $/token")
    costs, weights = [], []
    for job in scenario.jobs:
        c = cheapest_cost_per_token(job.model, job.input_len.mean_value(),
                                    job.output_len.mean_value(), cat, backend=backend)
        if not math.isfinite(c):
            raise ValueError(f"job {job.id}: no on-demand configuration in the catalog serves"
                             f" {job.model}")
        costs.append(c)
        weights.append(offered_output_tokens(job, scenario.horizon_s))
    total = sum(weights)
    if total <= 0:
        return sum(costs) / len(costs)
    return sum(c * w for c, w in zip(costs, weights, strict=True)) / total


__all__ = [
    "SCORE_WEIGHTS",
    "JobMetrics",
    "RunMetrics",
    "cheapest_cost_per_token",
    "compute_metrics",
    "job_metrics",
    "metrics_for",
    "offered_goodput_tok_s",
    "offered_output_tokens",
    "reference_cost_per_token",
]
