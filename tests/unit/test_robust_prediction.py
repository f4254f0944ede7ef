"""One robust prediction: the evaluator's scores, the explanation's numbers and the
planner-api's WhatIf agree on the same configuration, workload and causal state
(``koi.planner.robust``), with a learnt pass far from the model's and DRO radii."""

from __future__ import annotations

import pytest

from koi.catalog import load_catalog
from koi.cluster import ClusterSnapshot, JobStatus, OfferingCapacity
from koi.dro import DroCalibrator
from koi.jobs import parse_job
from koi.planner.propose import Proposal
from koi.planner.robust import Robustness, robust_predictions, robustness_fn
from koi.planner.settings import KoiSettings
from koi.planner.tick import compose_stage, evaluate_stage, explain_stage, tick_inputs
from koi.predictor.api import predict
from koi.predictor.types import LoadMode, Workload
from koi.space import engine_default_config
from koi.v1 import causal_pb2, prediction_pb2
from koi.wire.config import config_to_proto
from koi.wire.planning import encode_causal_state
from services.planner_api.readmodel import ReadModel
from tests.support.learnt import learnt_pass_store

CAT = load_catalog()
H200 = "gcp/us-central1/h200/on_demand"
SETTINGS = KoiSettings(backend="numpy", risk_coverages=())  # one margin: the calibrated one
CFG = engine_default_config("llama-3.1-70b", "h200", "vllm", CAT, tp=4)
BATCH_CFG = engine_default_config("llama-3.1-8b", "h200", "vllm", CAT, tp=1)
RADIUS = 0.3


@pytest.fixture(scope="module")
def tick() -> dict:
    """One tick's evaluation, plan and explanations, and a read model fed its state."""
    chat = parse_job({"kind": "online", "id": "chat", "model": "llama-3.1-70b",
                      "arrival": {"rate_rps": 4}, "input_len": 1200, "output_len": 211,
                      "slo": {"ttft_ms": 1500, "tpot_ms": 80}})
    bulk = parse_job({"kind": "batch", "id": "bulk", "model": "llama-3.1-8b",
                      "num_requests": 20_000, "input_len": 600, "output_len": 200,
                      "deadline_s": 7200})
    snap = ClusterSnapshot(9, 540.0, 60.0, 7200.0, (OfferingCapacity(H200, 16, 0),), (),
                           (JobStatus(chat, admitted=True, rejected=False),
                            JobStatus(bulk, admitted=True, rejected=False)))
    store = learnt_pass_store(CFG, CAT)  # CFG's passes take 1.5× the model's
    calibrator = DroCalibrator(prior_radius=RADIUS)
    inputs = tick_inputs(snap, store, calibrator, SETTINGS, CAT)
    proposals = [Proposal("chat", CFG, "running"), Proposal("bulk", BATCH_CFG, "guess")]
    ev = evaluate_stage(proposals, inputs)
    plan = compose_stage(ev, inputs)
    model = ReadModel(catalog=CAT, settings=SETTINGS)
    model.on_causal(causal_pb2.CausalState.FromString(
        encode_causal_state(store, calibrator, 9)))
    return {"inputs": inputs, "ev": ev, "plan": plan, "model": model,
            "explanations": {e.job_id: e for e in explain_stage(plan, ev, inputs)}}


def what_if(model: ReadModel, cfg, **workload: object) -> prediction_pb2.Outcomes:
    resp = model.what_if(config_to_proto(cfg), workload=prediction_pb2.Workload(**workload))
    assert resp.valid
    return resp.robust


def test_the_api_answers_what_the_evaluator_scored(tick: dict) -> None:
    ev = tick["ev"]
    assert [p.job_id for p in ev.proposals] == ["chat", "bulk"]  # one margin each
    # the evaluator predicts one replica at the job's whole rate (4 req/s × headroom)
    load = tick["inputs"].loads["chat"]
    robust = what_if(tick["model"], CFG, input_len_tokens=load.input_len,
                     output_len_tokens=load.output_len, mode=prediction_pb2.LOAD_MODE_RATE,
                     load=load.rate_rps, slo_ttft_ms=load.slo_ttft_ms,
                     slo_tpot_ms=load.slo_tpot_ms)
    assert robust.ttft_p95_ms == pytest.approx(ev.ttft_p95_ms[0], rel=1e-9)
    assert robust.tpot_p95_ms == pytest.approx(ev.tpot_p95_ms[0], rel=1e-9)
    assert robust.max_rate_under_slo_rps == pytest.approx(ev.max_rate_rps[0], rel=1e-9)
    # the learnt pass (×1.5) is in it: the raw model sustains far more
    raw = predict(CFG, Workload(load.input_len, load.output_len, mode=LoadMode.RATE,
                                load=load.rate_rps, slo_ttft_ms=load.slo_ttft_ms,
                                slo_tpot_ms=load.slo_tpot_ms), catalog=CAT, backend="numpy")
    assert robust.max_rate_under_slo_rps < 0.8 * raw.max_rate_under_slo_rps
    # batch: predicted saturated, the rate a replica sustains is the evaluator's
    bulk = tick["inputs"].loads["bulk"]
    saturated = what_if(tick["model"], BATCH_CFG, input_len_tokens=bulk.input_len,
                        output_len_tokens=bulk.output_len,
                        mode=prediction_pb2.LOAD_MODE_SATURATED)
    assert saturated.max_rate_under_slo_rps * bulk.output_len == \
        pytest.approx(ev.goodput_tok_s[1], rel=1e-9)


def test_the_explanation_and_the_api_agree_at_the_planned_rate(tick: dict) -> None:
    e = tick["explanations"]["chat"]
    assert e.decision == "place" and e.planned_rate_rps > 0
    load = tick["inputs"].loads["chat"]
    robust = what_if(tick["model"], CFG, input_len_tokens=load.input_len,
                     output_len_tokens=load.output_len, mode=prediction_pb2.LOAD_MODE_RATE,
                     load=e.planned_rate_rps)
    assert robust.ttft_p95_ms == pytest.approx(e.ttft_p95_ms_robust, rel=1e-9)
    assert robust.tpot_p95_ms == pytest.approx(e.tpot_p95_ms_robust, rel=1e-9)


def test_without_beliefs_or_radii_robust_is_the_prediction() -> None:
    wl = Workload(1000, 200, mode=LoadMode.RATE, load=2.0, slo_ttft_ms=800, slo_tpot_ms=60)
    nominal, robust, _ = robust_predictions([(CFG, wl)], robustness_fn(None, {}, CAT),
                                            catalog=CAT, backend="numpy")[0]
    assert robust == nominal


def test_radii_widen_p95s_and_never_raise_a_rate() -> None:
    wl = Workload(1000, 200, mode=LoadMode.RATE, load=2.0, slo_ttft_ms=800, slo_tpot_ms=60)
    radii = {"ttft_p95": 0.2, "tpot_p95": 0.1, "throughput": 0.15}
    nominal, robust, _ = robust_predictions([(CFG, wl)], robustness_fn(None, radii, CAT),
                                            catalog=CAT, backend="numpy")[0]
    assert robust.ttft_p95_ms == pytest.approx(nominal.ttft_p95_ms * 1.2214027581601699)
    assert robust.tpot_p95_ms == pytest.approx(nominal.tpot_p95_ms * 1.1051709180756477)
    assert robust.ttft_ms == nominal.ttft_ms  # the means carry no radius
    assert robust.max_rate_under_slo_rps < nominal.max_rate_under_slo_rps
    # a throughput belief above 1 does not raise the rate above the prediction's
    up = lambda cfg, m=None: Robustness(tput_mult=2.0)  # noqa: E731
    _, robust, _ = robust_predictions([(CFG, wl)], up, catalog=CAT, backend="numpy")[0]
    assert robust.max_rate_under_slo_rps == pytest.approx(nominal.max_rate_under_slo_rps)


def test_each_prediction_carries_the_robustness_that_made_it() -> None:
    """A rate load keeps the base regime's corrections; a saturated load takes its regime's,
    chosen on the learnt model's mediators (what the language model's ``predict`` tool
    reports as belief multipliers)."""
    seen: list[object] = []

    def regime(cfg, mediators=None):  # type: ignore[no-untyped-def]
        seen.append(mediators)
        return Robustness(tput_mult=0.5) if mediators is not None else Robustness()

    rate = Workload(1000, 200, mode=LoadMode.RATE, load=2.0, slo_ttft_ms=800, slo_tpot_ms=60)
    saturated = Workload(1000, 200)
    (_, _, r_rate), (_, _, r_sat) = robust_predictions(
        [(CFG, rate), (CFG, saturated)], regime, catalog=CAT, backend="numpy")
    assert r_rate == Robustness()
    assert r_sat.tput_mult == 0.5
    assert [m is None for m in seen] == [True, True, False]   # base twice, one regime
    assert set(seen[2]) == {"kv_pressure", "comm_overhead", "queue_util"}
