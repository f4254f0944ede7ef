"""DESIGN §4 metrics on hand-built run records: every value checked against hand arithmetic."""

from __future__ import annotations

import math

import pytest

from koi.catalog import load_catalog
from koi.jobs import Arrival, BatchJob, LengthDist, OnlineJob, Slo
from koi.metrics import (
    SCORE_WEIGHTS,
    cheapest_cost_per_token,
    compute_metrics,
    metrics_for,
    offered_goodput_tok_s,
    offered_output_tokens,
    reference_cost_per_token,
)
from koi.predictor.api import predict
from koi.predictor.types import Workload
from koi.records import JobOutcome, RunRecord
from koi.scenario.types import FleetEntry, Scenario
from koi.shapes import cheapest_on_demand, valid_default_configs


def online(job_id: str, **kw: float | bool) -> JobOutcome:
    kw.setdefault("submitted", True)
    kw.setdefault("admitted", True)
    return JobOutcome(job_id=job_id, kind="online", model="llama-3.1-8b",
                      rejected=not kw["admitted"], **kw)  # type: ignore[arg-type]


def batch(job_id: str, **kw: float | bool) -> JobOutcome:
    kw.setdefault("submitted", True)
    kw.setdefault("admitted", True)
    return JobOutcome(job_id=job_id, kind="batch", model="llama-3.1-8b",
                      rejected=not kw["admitted"], **kw)  # type: ignore[arg-type]


def record(*jobs: JobOutcome, spend: float = 10.0, horizon: float = 1000.0) -> RunRecord:
    return RunRecord(scenario="hand", policy="test", seed=0, horizon_s=horizon, tick_s=60.0,
                     spend_usd=spend, jobs=jobs)


MIXED = record(
    online("on1", offered_requests=100, served_requests=80, ttft_met_requests=60,
           tpot_met_requests=72, good_output_tokens=5000, served_output_tokens=8000),
    online("on2", offered_requests=20, served_requests=20, ttft_met_requests=20,
           tpot_met_requests=10, good_output_tokens=1000, served_output_tokens=2000),
    online("on3", admitted=False, offered_requests=50),
    batch("b1", tokens_requested=10_000, tokens_by_deadline=6000, tokens_processed=8000),
    batch("b2", admitted=False, tokens_requested=5000),
    batch("b3", submitted=False, admitted=False, tokens_requested=99_999),
)


def test_each_metric_equals_the_hand_value() -> None:
    m = compute_metrics(MIXED, reference_cost_per_token_usd=10 / 18_000 / 2,
                        offered_goodput_tok_s=24.0)
    assert m.batch_progress_pct == pytest.approx(40.0)         # 6000 / 15000
    assert m.admit_online_pct == pytest.approx(200 / 3)        # 2 of 3
    assert m.admit_batch_pct == pytest.approx(50.0)            # 1 of 2 (b3 not submitted)
    assert m.tokens_served == pytest.approx(18_000)            # 8000 + 2000 + 8000
    assert m.cost_per_token_usd == pytest.approx(10 / 18_000)
    assert m.ttft_met_pct == pytest.approx(87.5)               # mean(60/80, 20/20)
    assert m.tpot_met_pct == pytest.approx(70.0)               # mean(72/80, 10/20)
    assert m.goodput_tok_s == pytest.approx(12.0)              # (5000 + 1000 + 6000) / 1000
    assert m.score_terms["goodput"] == pytest.approx(0.5)      # 12 / 24
    assert m.score_terms["cost"] == pytest.approx(0.5)         # reference is half
    # 100 × (.15·.4 + .15·2/3 + .10·.5 + .15·.875 + .15·.7 + .15·.5 + .15·.5)
    assert m.overall_score == pytest.approx(59.625)
    assert m.offered_goodput_tok_s == 24.0
    assert m.reference_cost_per_token_usd == pytest.approx(10 / 36_000)


def test_per_job_metrics() -> None:
    m = compute_metrics(MIXED, 1e-4, 24.0)
    by_id = {j.job_id: j for j in m.jobs}
    assert set(by_id) == {"on1", "on2", "on3", "b1", "b2", "b3"}
    assert by_id["on1"].ttft_met_frac == pytest.approx(0.75)
    assert by_id["on1"].tpot_met_frac == pytest.approx(0.9)
    assert by_id["on1"].goodput_tok_s == pytest.approx(5.0)
    assert by_id["on3"].ttft_met_frac is None                 # never served
    assert by_id["b1"].batch_progress_frac == pytest.approx(0.6)
    assert by_id["b1"].served_output_tokens == 8000            # late tokens count as served
    assert by_id["b1"].goodput_tok_s == pytest.approx(6.0)
    assert by_id["b2"].batch_progress_frac == 0.0


def test_score_weights_sum_to_one_and_match_design() -> None:
    assert sum(SCORE_WEIGHTS.values()) == pytest.approx(1.0)
    assert SCORE_WEIGHTS["admit_batch"] == 0.10
    assert all(w == 0.15 for k, w in SCORE_WEIGHTS.items() if k != "admit_batch")


def test_perfect_run_scores_100() -> None:
    r = record(online("on", offered_requests=10, served_requests=10, ttft_met_requests=10,
                      tpot_met_requests=10, good_output_tokens=500, served_output_tokens=500),
               batch("b", tokens_requested=500, tokens_by_deadline=500, tokens_processed=500),
               spend=1e-3)
    m = compute_metrics(r, reference_cost_per_token_usd=1e-6, offered_goodput_tok_s=1.0)
    assert m.overall_score == pytest.approx(100.0)


def test_class_without_submitted_jobs_counts_as_met() -> None:
    only_online = record(online("on", offered_requests=10, served_requests=10,
                                ttft_met_requests=5, tpot_met_requests=5,
                                good_output_tokens=100, served_output_tokens=200),
                         batch("later", submitted=False, admitted=False, tokens_requested=9))
    m = compute_metrics(only_online, 1e-3, 1.0)
    assert m.batch_progress_pct == 100.0 and m.admit_batch_pct == 100.0
    only_batch = record(batch("b", tokens_requested=100, tokens_by_deadline=50,
                              tokens_processed=50))
    m = compute_metrics(only_batch, 1e-3, 1.0)
    assert (m.admit_online_pct, m.ttft_met_pct, m.tpot_met_pct) == (100.0, 100.0, 100.0)


def test_online_jobs_submitted_but_none_served() -> None:
    asked = record(online("on", admitted=False, offered_requests=30))
    m = compute_metrics(asked, 1e-3, 1.0)
    assert (m.ttft_met_pct, m.tpot_met_pct, m.admit_online_pct) == (0.0, 0.0, 0.0)
    silent = record(online("on", offered_requests=0))  # submitted at the very end
    m = compute_metrics(silent, 1e-3, 1.0)
    assert (m.ttft_met_pct, m.tpot_met_pct) == (100.0, 100.0)


def test_zero_tokens_served_costs_infinity_and_scores_no_cost_term() -> None:
    m = compute_metrics(record(batch("b", tokens_requested=100), spend=5.0), 1e-6, 1.0)
    assert math.isinf(m.cost_per_token_usd) and m.score_terms["cost"] == 0.0
    m = compute_metrics(record(batch("b", tokens_requested=100), spend=0.0), 1e-6, 1.0)
    assert math.isinf(m.cost_per_token_usd) and m.score_terms["cost"] == 0.0


def test_free_tokens_and_cheaper_than_reference_cap_the_cost_term_at_one() -> None:
    r = record(batch("b", tokens_requested=100, tokens_by_deadline=100, tokens_processed=100),
               spend=0.0)
    m = compute_metrics(r, 1e-6, 1.0)
    assert m.cost_per_token_usd == 0.0 and m.score_terms["cost"] == 1.0
    r = record(batch("b", tokens_requested=100, tokens_by_deadline=100, tokens_processed=100),
               spend=1e-5)
    assert compute_metrics(r, 1e-6, 1.0).score_terms["cost"] == 1.0  # 1e-7/token < 1e-6


def test_goodput_term_is_capped_and_zero_offer_counts_as_met() -> None:
    r = record(batch("b", tokens_requested=100, tokens_by_deadline=100, tokens_processed=100))
    assert compute_metrics(r, 1e-3, 0.01).score_terms["goodput"] == 1.0   # 0.1 tok/s ≥ 0.01
    assert compute_metrics(r, 1e-3, 0.0).score_terms["goodput"] == 1.0
    assert compute_metrics(r, 1e-3, 1.0).score_terms["goodput"] == pytest.approx(0.1)


def test_overshooting_batch_volume_is_clipped() -> None:
    r = record(batch("b", tokens_requested=100, tokens_by_deadline=103, tokens_processed=103))
    m = compute_metrics(r, 1e-3, 1.0)
    assert m.batch_progress_pct == 100.0
    assert m.jobs[0].batch_progress_frac == 1.0


@pytest.mark.parametrize(("ref", "offered", "horizon"), [
    (0.0, 1.0, 1000.0), (math.inf, 1.0, 1000.0), (math.nan, 1.0, 1000.0),
    (1e-6, -1.0, 1000.0), (1e-6, math.nan, 1000.0), (1e-6, 1.0, 0.0)])
def test_invalid_yardsticks_are_refused(ref: float, offered: float, horizon: float) -> None:
    with pytest.raises(ValueError):
        compute_metrics(record(horizon=horizon), ref, offered)


# --- yardsticks from a scenario ---------------------------------------------------------

def _online_spec(job_id: str, rate: float, out: int, submit: float = 0.0,
                 end: float | None = None, model: str = "llama-3.1-8b") -> OnlineJob:
    return OnlineJob(id=job_id, model=model, arrival=Arrival.poisson(rate),
                     input_len=LengthDist.fixed(512), output_len=LengthDist.fixed(out),
                     slo=Slo(ttft_ms=1000, tpot_ms=100), submit_s=submit, end_s=end)


def _batch_spec(job_id: str, n: int, out: int, deadline: float, submit: float = 0.0,
                model: str = "llama-3.1-8b") -> BatchJob:
    return BatchJob(id=job_id, model=model, num_requests=n, input_len=LengthDist.fixed(256),
                    output_len=LengthDist.fixed(out), deadline_s=deadline, submit_s=submit)


def _scenario(*jobs: OnlineJob | BatchJob, horizon: float = 1000.0) -> Scenario:
    return Scenario(name="hand", description="", horizon_s=horizon, tick_s=60.0, seed=0,
                    fleet=(FleetEntry("aws/us-east-1/h100-sxm/on_demand", 8),), jobs=jobs)


def test_offered_goodput_hand_value() -> None:
    sc = _scenario(
        _online_spec("all-run", rate=2.0, out=100),                       # 2·100·1000
        _online_spec("window", rate=1.0, out=200, submit=500, end=750),   # 1·200·250
        _batch_spec("due-in", n=10, out=100, deadline=300),               # 1000
        _batch_spec("due-out", n=40, out=100, submit=800, deadline=400),  # 4000 · 200/400
        _batch_spec("too-late", n=10, out=100, submit=1200, deadline=100),  # 0
    )
    assert offered_output_tokens(sc.jobs[1], 1000.0) == pytest.approx(50_000)
    assert offered_output_tokens(sc.jobs[3], 1000.0) == pytest.approx(2000)
    assert offered_output_tokens(sc.jobs[4], 1000.0) == 0.0
    assert offered_goodput_tok_s(sc) == pytest.approx(200 + 50 + 1 + 2)


def _brute_force_reference(model: str, in_len: float, out_len: float) -> float:
    cat = load_catalog()
    best = math.inf
    for accel in cat.accelerators:
        offer = cheapest_on_demand(accel, cat)
        if offer is None:
            continue
        for cfg in valid_default_configs(model, accel, cat):
            p = predict(cfg, Workload(in_len, out_len), catalog=cat, backend="numpy")
            usd_s = offer.usd_per_gpu_hour * cfg.gpus_per_replica / 3600
            best = min(best, usd_s / p.output_throughput_tok_s)
    return best


def test_reference_cost_is_the_cheapest_on_demand_config() -> None:
    ref = cheapest_cost_per_token("llama-3.1-8b", 512, 100)
    assert ref == pytest.approx(_brute_force_reference("llama-3.1-8b", 512, 100))
    assert 0 < ref < 1e-5
    # A single-job scenario's reference is that job's; a second call hits the cache.
    sc = _scenario(_online_spec("a", rate=2.0, out=100))
    assert reference_cost_per_token(sc) == pytest.approx(ref)
    assert reference_cost_per_token(sc) == reference_cost_per_token(sc)


def test_reference_cost_weights_jobs_by_offered_tokens() -> None:
    small = _online_spec("small", rate=1.0, out=100)                    # 100 000 tokens
    big = _online_spec("big", rate=3.0, out=100, model="llama-3.1-70b")  # 300 000 tokens
    c_small = cheapest_cost_per_token("llama-3.1-8b", 512, 100)
    c_big = cheapest_cost_per_token("llama-3.1-70b", 512, 100)
    assert c_big > c_small
    ref = reference_cost_per_token(_scenario(small, big))
    assert ref == pytest.approx((c_small * 1 + c_big * 3) / 4)


def test_metrics_for_wires_both_yardsticks() -> None:
    sc = _scenario(_batch_spec("b", n=100, out=100, deadline=500))
    r = record(batch("b", tokens_requested=10_000, tokens_by_deadline=10_000,
                     tokens_processed=10_000), spend=0.01)
    m = metrics_for(r, sc)
    assert m.offered_goodput_tok_s == pytest.approx(10.0)
    assert m.reference_cost_per_token_usd == pytest.approx(
        cheapest_cost_per_token("llama-3.1-8b", 256, 100))
    assert m.goodput_tok_s == pytest.approx(10.0)
