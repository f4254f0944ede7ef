"""Proposer and evaluator: valid, ordered candidates; robust scoring tightens SLOs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.planner.evaluate import JobLoad, Robustness, evaluate
from koi.planner.propose import Hints, MechanismHint, ProposerLimits, propose
from koi.space import engine_default_config, validate

ACCELS = ["h100-sxm", "a100-80gb", "l40s", "l4", "mi300x"]


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_every_proposal_validates_and_is_unique(cat) -> None:
    props = propose("j", "llama-3.1-70b", ACCELS, cat)
    assert props
    assert all(not validate(p.config, cat) for p in props)
    assert len({p.config for p in props}) == len(props)
    assert all(p.config.offering == "" and p.config.replicas == 1 for p in props)


def test_cap_keeps_every_accelerator_represented(cat) -> None:
    props = propose("j", "llama-3.1-8b", ACCELS, cat, limits=ProposerLimits(max_per_job=25))
    assert len(props) == 25
    assert set(Counter(p.config.accelerator for p in props)) == set(ACCELS)


def test_running_config_comes_first(cat) -> None:
    current = engine_default_config("llama-3.1-8b", "l40s", "vllm", cat, replicas=3,
                                    offering="aws/us-east-1/l40s/on_demand")
    props = propose("j", "llama-3.1-8b", ACCELS, cat, current=current)
    assert props[0].config == current.with_(offering="", replicas=1)
    assert "keep" in props[0].hypothesis


def test_kv_bound_deployment_promotes_more_tp_and_fp8_kv(cat) -> None:
    current = engine_default_config("llama-3.1-70b", "h100-sxm", "vllm", cat, tp=2,
                                    weight_precision="fp8")
    props = propose("j", "llama-3.1-70b", ACCELS, cat, current=current,
                    hints=Hints(kv_pressure=0.95))
    promoted = [p for p in props[1:] if p.priority > 0]
    assert promoted
    assert all(p.config.tp > 2 or p.config.kv_dtype.value == "fp8" for p in promoted)
    assert all("KV-bound" in p.hypothesis for p in promoted)


def test_mediator_guidance_adds_a_bounded_number_to_the_capped_set(cat) -> None:
    # a saturated batch job is always KV-bound: its promoted candidates (more TP, fp8 KV
    # on the same part) must not crowd the cheap options on other parts out of the set
    current = engine_default_config("llama-3.1-8b", "l40s", "vllm", cat)
    lim = ProposerLimits(max_per_job=30, guided=5)
    plain = propose("j", "llama-3.1-8b", ACCELS, cat, current=current, limits=lim)
    kv = propose("j", "llama-3.1-8b", ACCELS, cat, current=current, limits=lim,
                 hints=Hints(kv_pressure=0.97))
    assert kv[0] == plain[0]  # the running configuration first
    guided = kv[1:6]
    assert all("KV-bound" in p.hypothesis and p.config.accelerator == "l40s" for p in guided)
    assert all(p.priority >= 3.0 for p in guided)
    # then the unguided set, whole: guided candidates come on top of it, not instead
    rest = [p.config for p in plain[1:] if p.config not in {g.config for g in guided}]
    assert [p.config for p in kv[6:]] == rest
    assert all(p.priority == 0.0 for p in kv[6:])
    assert 30 <= len(kv) <= 35
    assert set(Counter(p.config.accelerator for p in kv)) == set(ACCELS)


def test_a_full_kv_cache_that_does_not_preempt_is_not_kv_bound(cat) -> None:
    current = engine_default_config("llama-3.1-70b", "h100-sxm", "vllm", cat, tp=2,
                                    weight_precision="fp8")
    busy = propose("j", "llama-3.1-70b", ACCELS, cat, current=current,
                   hints=Hints(kv_pressure=0.97, kv_preemptions=0.0))
    assert not any("KV-bound" in p.hypothesis for p in busy)
    bound = propose("j", "llama-3.1-70b", ACCELS, cat, current=current,
                    hints=Hints(kv_pressure=0.97, kv_preemptions=12.0))
    assert any("KV-bound" in p.hypothesis for p in bound)


def test_comm_bound_deployment_promotes_fewer_ranks(cat) -> None:
    current = engine_default_config("llama-3.1-8b", "l40s", "vllm", cat, tp=4)
    props = propose("j", "llama-3.1-8b", ACCELS, cat, current=current,
                    hints=Hints(comm_overhead_frac=0.4))
    top = [p for p in props[1:] if p.priority > 0]  # props[0] keeps the running config
    assert top and all(p.config.tp < 4 for p in top)


def test_mechanisms_move_candidates_and_are_cited(cat) -> None:
    bad = MechanismHint(id="m1", accelerator="l4", effect=1.6, text="TPOT ×1.6 on {l4}")
    props = propose("j", "llama-3.1-8b", ACCELS, cat, mechanisms=[bad],
                    limits=ProposerLimits(max_per_job=100_000))
    l4 = [p for p in props if p.config.accelerator == "l4"]
    assert l4 and all("m1" in p.mechanism_ids and p.priority < 0 for p in l4)
    # demoted within its part, never out of a capped set: every part stays in
    tp1 = MechanismHint(id="m2", accelerator="l4", tp=1, effect=1.6, text="TTFT ×1.6")
    props = propose("j", "llama-3.1-8b", ACCELS, cat, mechanisms=[tp1],
                    limits=ProposerLimits(max_per_job=100_000))
    l4 = [p for p in props if p.config.accelerator == "l4"]
    demoted = [i for i, p in enumerate(l4) if p.priority < 0]
    assert demoted and all(l4[i].config.tp == 1 for i in demoted)
    assert demoted == list(range(len(l4) - len(demoted), len(l4)))  # last of the part's
    capped = propose("j", "llama-3.1-8b", ACCELS, cat, mechanisms=[bad],
                     limits=ProposerLimits(max_per_job=25))
    assert {p.config.accelerator for p in capped} == set(ACCELS)


def test_robustness_tightens_and_never_loosens(cat) -> None:
    props = propose("j", "llama-3.1-8b", ["h100-sxm", "l40s"], cat,
                    limits=ProposerLimits(max_per_job=30))
    loads = {"j": JobLoad("j", 1000, 200, 4.0, slo_ttft_ms=800, slo_tpot_ms=50)}
    nominal = evaluate(props, loads, backend="numpy")
    robust = evaluate(props, loads, backend="numpy",
                      robustness=lambda p: Robustness(ttft_mult=1.2, radius_tpot=0.3))
    assert np.all(robust.max_rate_rps <= nominal.max_rate_rps + 1e-9)
    assert np.any(robust.max_rate_rps < nominal.max_rate_rps)
    assert np.all(robust.goodput_tok_s == pytest.approx(robust.max_rate_rps * 200))


def test_learnt_passes_move_online_capacity_and_leave_batch_alone(cat) -> None:
    """An online candidate is predicted on its learnt passes: slower passes lower the rate
    a replica serves within SLO, faster ones raise it; a batch candidate, corrected in its saturated regime, ignores them."""
    props = propose("j", "llama-3.1-70b", ["h100-sxm", "h200"], cat,
                    limits=ProposerLimits(max_per_job=20))
    online = {"j": JobLoad("j", 1200, 211, 4.0, slo_ttft_ms=1500, slo_tpot_ms=80)}
    base = evaluate(props, online, backend="numpy")
    slow = evaluate(props, online, backend="numpy",
                    robustness=lambda p: Robustness(pass_mult=1.5))
    fast = evaluate(props, online, backend="numpy",
                    robustness=lambda p: Robustness(pass_mult=0.7))
    served = base.max_rate_rps > 0
    assert np.any(served)
    assert np.all(slow.max_rate_rps[served] < base.max_rate_rps[served])
    assert np.all(fast.max_rate_rps[served] >= base.max_rate_rps[served])
    assert np.any(fast.max_rate_rps[served] > base.max_rate_rps[served])
    assert slow.goodput_tok_s == pytest.approx(slow.max_rate_rps * 211)
    batch = {"j": JobLoad("j", 1200, 211, 0.0, batch=True)}
    assert evaluate(props, batch, backend="numpy",
                    robustness=lambda p, m=None: Robustness(pass_mult=1.5)).goodput_tok_s == \
        pytest.approx(evaluate(props, batch, backend="numpy").goodput_tok_s)


def test_learnt_passes_recover_the_capacity_of_a_slower_world(cat) -> None:
    """Through the planner's stages: telemetry of a world whose passes take 1.5× the
    model's, seen at half load, is inverted into a pass belief, and the evaluator's rate
    within SLO for that configuration comes within 10 % of the slower world's (the raw
    model's is far above it)."""
    from koi.causal import BeliefStore, scope_of
    from koi.cluster import ClusterSnapshot, JobStatus, OfferingCapacity
    from koi.dro import DroCalibrator
    from koi.jobs import parse_job
    from koi.planner.settings import KoiSettings
    from koi.planner.tick import evaluate_stage, tick_inputs
    from koi.predictor.api import evaluate_matrix
    from koi.predictor.columns import OUT
    from koi.predictor.features import build_inputs
    from koi.predictor.passes import scale_passes
    from koi.predictor.types import LoadMode, Workload
    from tests.support.learnt import learnt_pass_store

    cfg = engine_default_config("llama-3.1-70b", "h200", "vllm", cat, tp=4)
    run = lambda X: evaluate_matrix(X, backend="numpy")  # noqa: E731
    store = learnt_pass_store(cfg, cat, slower=1.5)
    assert store.online_correction(scope_of(cfg, cat))["pass"] == pytest.approx(1.5, rel=0.1)

    spec = parse_job({"kind": "online", "id": "chat", "model": "llama-3.1-70b",
                      "arrival": {"rate_rps": 4}, "input_len": 1200, "output_len": 211,
                      "slo": {"ttft_ms": 1500, "tpot_ms": 80}})
    snap = ClusterSnapshot(9, 540.0, 60.0, 7200.0,
                           (OfferingCapacity("gcp/us-central1/h200/on_demand", 8, 0),),
                           (), (JobStatus(spec, admitted=True, rejected=False),))
    proposal = propose("chat", "llama-3.1-70b", ["h200"], cat, current=cfg)[0]
    settings = KoiSettings(backend="numpy", use_dro=False, risk_coverages=())
    learnt = evaluate_stage([proposal], tick_inputs(snap, BeliefStore(), DroCalibrator(),
                                                    settings, cat))
    raw_rate = float(learnt.max_rate_rps[0])
    learnt = evaluate_stage([proposal], tick_inputs(snap, store, DroCalibrator(), settings, cat))
    slo = Workload(input_len=1200, output_len=211, mode=LoadMode.RATE, load=4.4,
                   slo_ttft_ms=1500, slo_tpot_ms=80)
    world_rate = float(run(scale_passes(build_inputs([(cfg, slo)], cat), 1.5))
                       [OUT["max_rate_slo"], 0])
    assert raw_rate > 1.2 * world_rate
    assert float(learnt.max_rate_rps[0]) == pytest.approx(world_rate, rel=0.1)


def test_impossible_slo_is_infeasible(cat) -> None:
    props = propose("j", "llama-3.1-70b", ["a100-80gb"], cat,
                    limits=ProposerLimits(max_per_job=10))
    loads = {"j": JobLoad("j", 4000, 200, 1.0, slo_ttft_ms=1.0, slo_tpot_ms=1.0)}
    ev = evaluate(props, loads, backend="numpy")
    assert not ev.slo_feasible.any()
    batch = evaluate(props, {"j": JobLoad("j", 4000, 200, 0.0, batch=True)}, backend="numpy")
    assert batch.slo_feasible.all() and (batch.goodput_tok_s > 0).all()


def test_numba_and_numpy_backends_agree(cat) -> None:
    props = propose("j", "mixtral-8x7b", ACCELS, cat, limits=ProposerLimits(max_per_job=40))
    loads = {"j": JobLoad("j", 600, 300, 6.0, slo_ttft_ms=1500, slo_tpot_ms=80)}
    a = evaluate(props, loads, backend="numpy")
    b = evaluate(props, loads, backend="numba")
    np.testing.assert_allclose(a.max_rate_rps, b.max_rate_rps, rtol=1e-9)
    np.testing.assert_allclose(a.ttft_p95_ms, b.ttft_p95_ms, rtol=1e-9)


def test_mediator_hints_read_the_reported_kv_usage_and_the_predicted_rest() -> None:
    from koi.causal import OutcomeObservation, Scope
    from koi.planner.tick import mediator_hints

    pred = {"kv_pressure": 0.4, "comm_overhead_frac": 0.3, "queue_util": 0.9}
    seen = OutcomeObservation("d1", "j", 3, Scope(), pred,
                              {"kv_usage": 0.93, "preemptions": 4.0})
    unseen = OutcomeObservation("d2", "j", 3, Scope(), pred, {})
    hints = mediator_hints([seen, unseen])
    assert hints["d1"] == Hints(kv_pressure=0.93, comm_overhead_frac=0.3, queue_util=0.9,
                                kv_preemptions=4.0)
    # nothing reported: the prediction's KV pressure, preemptions unknown
    assert hints["d2"].kv_pressure == 0.4 and hints["d2"].kv_preemptions is None


def test_a_saturated_queue_promotes_only_more_capacity_per_replica(cat) -> None:
    current = engine_default_config("llama-3.1-8b", "l40s", "vllm", cat, tp=2)
    props = propose("j", "llama-3.1-8b", ACCELS, cat, current=current,
                    hints=Hints(queue_util=0.95), limits=ProposerLimits(guided=200))
    guided = [p for p in props[1:] if "queue near saturation" in p.hypothesis
              and p.priority > 0]
    assert guided
    l40s = cat.accelerator("l40s").bf16_tflops
    for p in guided:
        more_gpus = p.config.gpus_per_replica > current.gpus_per_replica
        same_but_faster = p.config.gpus_per_replica == current.gpus_per_replica and \
            cat.accelerator(p.config.accelerator).bf16_tflops > l40s
        assert more_gpus or same_but_faster


def test_a_batch_candidate_takes_the_throughput_belief_of_its_saturated_regime(cat) -> None:
    """Learning files a saturated replica's throughput error under the edge its mediators
    pick (above the KV cliff: kv_pressure → throughput); the evaluator predicts a batch
    candidate saturated and looks its correction up in that regime, not the base one."""
    from dataclasses import fields

    from koi.causal import BeliefStore, OutcomeObservation, attribute, scope_of
    from koi.cluster import ClusterSnapshot, JobStatus, OfferingCapacity
    from koi.dro import DroCalibrator
    from koi.jobs import parse_job
    from koi.planner.settings import KoiSettings
    from koi.planner.tick import evaluate_stage, tick_inputs
    from koi.predictor.api import predict_many
    from koi.predictor.types import LoadMode, Workload

    cfg = engine_default_config("llama-3.1-70b", "h100-sxm", "vllm", cat, tp=2)
    pred = predict_many([(cfg, Workload(input_len=1000, output_len=400,
                                        mode=LoadMode.SATURATED, load=0.0))],
                        catalog=cat, backend="numpy")[0]
    predicted = {f.name: float(getattr(pred, f.name)) for f in fields(pred)
                 if isinstance(getattr(pred, f.name), float)}
    obs = OutcomeObservation("d1", "bulk", 1, scope_of(cfg, cat), predicted,
                             {"output_tok_s": 0.6 * pred.output_throughput_tok_s},
                             weight=5000.0)
    assert attribute("throughput", obs.mediators()) == ("kv_pressure", "throughput")
    store = BeliefStore()
    for tick in range(1, 9):
        store = store.update([obs], tick)
    assert store.correction(obs.scope)["throughput"] == pytest.approx(1.0)  # base regime
    learnt = store.correction(obs.scope, obs.mediators())["throughput"]
    assert learnt < 0.75

    spec = parse_job({"kind": "batch", "id": "bulk", "model": "llama-3.1-70b",
                      "num_requests": 10_000, "input_len": 1000, "output_len": 400,
                      "deadline_s": 7200})
    snap = ClusterSnapshot(9, 540.0, 60.0, 7200.0,
                           (OfferingCapacity("aws/us-east-1/h100-sxm/on_demand", 8, 0),),
                           (), (JobStatus(spec, admitted=True, rejected=False),))
    proposal = propose("bulk", "llama-3.1-70b", ["h100-sxm"], cat, current=cfg)[0]
    assert proposal.config == cfg
    fast = KoiSettings(backend="numpy", use_dro=False)
    before = evaluate_stage([proposal], tick_inputs(snap, BeliefStore(), DroCalibrator(),
                                                    fast, cat))
    after = evaluate_stage([proposal], tick_inputs(snap, store, DroCalibrator(), fast, cat))
    assert after.goodput_tok_s[0] == pytest.approx(learnt * before.goodput_tok_s[0])


def test_online_candidates_are_scored_at_every_risk_level_batch_at_one(cat) -> None:
    from koi.planner.evaluate import RiskLevel

    props = propose("web", "llama-3.1-8b", ["h100-sxm", "l40s"], cat,
                    limits=ProposerLimits(max_per_job=12))
    props += propose("bulk", "llama-3.1-8b", ["h100-sxm"], cat,
                     limits=ProposerLimits(max_per_job=5))
    loads = {"web": JobLoad("web", 1000, 200, 4.0, slo_ttft_ms=800, slo_tpot_ms=50),
             "bulk": JobLoad("bulk", 1000, 200, 0.0, batch=True)}
    levels = (RiskLevel(0.0, 0.0, 0.12), RiskLevel(0.3, 0.1, 0.04), RiskLevel(0.6, 0.2, 0.01))
    ev = evaluate(props, loads, levels=lambda job: levels, backend="numpy")
    web = [i for i, p in enumerate(ev.proposals) if p.job_id == "web"]
    bulk = [i for i, p in enumerate(ev.proposals) if p.job_id == "bulk"]
    assert len(web) == 12 * 3 and len(bulk) == 5
    # a proposal's rows are consecutive, in level order, with the level's radii and risk
    for k in range(12):
        rows = web[3 * k:3 * k + 3]
        assert len({ev.proposals[i] for i in rows}) == 1
        assert ev.radius_ttft[rows].tolist() == [0.0, 0.3, 0.6]
        assert ev.radius_tpot[rows].tolist() == [0.0, 0.1, 0.2]
        assert ev.slo_risk[rows].tolist() == [0.12, 0.04, 0.01]
        # a wider margin never sustains more, and the first level is the plain score
        assert np.all(np.diff(ev.max_rate_rps[rows]) <= 1e-9)
    plain = evaluate(props, loads, backend="numpy")
    np.testing.assert_allclose(ev.max_rate_rps[web[::3]], plain.max_rate_rps[:12])
    assert np.any(ev.max_rate_rps[web[2::3]] < ev.max_rate_rps[web[::3]])
    assert (ev.slo_risk[bulk] == 0).all() and (ev.radius_ttft[bulk] == 0).all()


def test_risk_levels_come_from_the_calibrator_and_fall_with_the_margin() -> None:
    import math

    from koi.causal import OutcomeObservation
    from koi.causal.observe import log_residuals
    from koi.causal.scope import Scope
    from koi.dro import DroCalibrator
    from koi.planner.settings import KoiSettings
    from koi.planner.tick import risk_levels

    rng = np.random.default_rng(5)
    obs = [OutcomeObservation(
        f"d{i}", "j", 1, Scope(accelerator="h100"),
        {"ttft_p95_ms": 100.0, "tpot_p95_ms": 20.0},
        {"ttft_ms": 60.0 * math.exp(e), "ttft_p95_ms": 100.0 * math.exp(e),
         "tpot_ms": 15.0, "tpot_p95_ms": 20.0 * math.exp(e / 4)}, weight=10.0)
        for i, e in enumerate(rng.normal(0.0, 0.4, 60))]
    cal = DroCalibrator(coverage=0.5)
    settings = KoiSettings()
    # before any spreads: one level, the calibrated (prior) radius, risk not priced
    assert risk_levels(cal, settings) == (
        risk_levels(cal, settings)[0],) and risk_levels(cal, settings)[0].slo_risk == 0.0
    cal = cal.update([log_residuals(o) for o in obs], 1, observations=obs,
                     rescore=log_residuals)
    levels = risk_levels(cal, settings)
    assert len(levels) == 3
    assert levels[0].radius_ttft == pytest.approx(cal.radius("ttft_p95"))
    assert [lv.radius_ttft for lv in levels] == sorted(lv.radius_ttft for lv in levels)
    assert levels[1].radius_ttft == pytest.approx(cal.radius_at("ttft_p95", 0.8))
    risks = [lv.slo_risk for lv in levels]
    assert risks == sorted(risks, reverse=True) and 0 < risks[-1] < risks[0] < 1
    # no DRO (koi-no-dro), or no extra coverages: one level at radius 0 / the radius
    assert [(lv.radius_ttft, lv.slo_risk) for lv in
            risk_levels(cal, KoiSettings(use_dro=False))] == [(0.0, 0.0)]
    assert len(risk_levels(cal, KoiSettings(risk_coverages=()))) == 1
