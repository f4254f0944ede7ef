"""Beliefs, the store's learning and back-off, mechanisms and their counts."""

from __future__ import annotations

import json
import math
import zlib

import pytest

from koi.causal import (
    GLOBAL,
    Belief,
    BeliefConfig,
    BeliefStore,
    OutcomeObservation,
    Scope,
    attribute,
    mechanism_id,
)
from koi.causal.beliefs import ThresholdBelief

L4 = Scope("l4", "vllm", "≤10B", "tp1", family="ada")
H100 = Scope("h100-sxm", "vllm", "≤10B", "tp1", family="hopper")
H200 = Scope("h200", "vllm", "≤10B", "tp1", family="hopper")
KV_TPOT = ("kv_pressure", "tpot")
MEMBW_TPOT = ("membw_util", "tpot")


def obs(scope: Scope = L4, *, tpot: float = 1.0, ttft: float = 1.0, tput: float = 1.0,
        kv: float = 0.5, comm: float = 0.05, queue: float = 0.3, requests: float = 200.0,
        dep: str = "d1", tick: int = 0, ttft_tail: float = 1.0, tpot_tail: float = 1.0
        ) -> OutcomeObservation:
    """One deployment's tick whose observed outcomes are the predicted ones × ratios (a
    p95 × its mean's ratio × its tail's)."""
    predicted = {"ttft_ms": 100.0, "ttft_p95_ms": 200.0, "tpot_ms": 20.0, "tpot_p95_ms": 30.0,
                 "output_throughput_tok_s": 1000.0, "kv_pressure": kv,
                 "comm_overhead_frac": comm, "compute_util": 0.5, "membw_util": 0.6,
                 "queue_util": queue, "batch_efficiency": 0.8}
    observed = {"ttft_ms": 100.0 * ttft, "ttft_p95_ms": 200.0 * ttft * ttft_tail,
                "tpot_ms": 20.0 * tpot, "tpot_p95_ms": 30.0 * tpot * tpot_tail,
                "output_tok_s": 1000.0 * tput}
    return OutcomeObservation(dep, "job", tick, scope, predicted, observed, requests)


def run(store: BeliefStore, ticks: range, **kw: float) -> BeliefStore:
    for t in ticks:
        store = store.update([obs(tick=t, **kw)], t)
    return store


def test_normal_update_matches_hand_values() -> None:
    cfg = BeliefConfig()
    b = Belief.prior(MEMBW_TPOT, L4, cfg)
    assert b.precision == 4.0 and b.mean == 0.0 and b.confidence == 0.5
    b = b.observe(0.2, noise_sd=0.1, weight=1.0, tick=3)
    assert b.mean == pytest.approx(100 * 0.2 / 104)
    assert b.sd == pytest.approx(104 ** -0.5)
    b = b.observe(0.4, noise_sd=0.1, weight=0.5, tick=4)
    assert b.mean == pytest.approx((20 + 50 * 0.4) / 154)
    assert b.sd == pytest.approx(154 ** -0.5)
    assert (b.support, b.first_seen, b.last_confirmed, b.as_of) == (2, 3, 4, 4)
    assert b.confidence == pytest.approx(0.5 * (1 + math.erf(b.mean / b.sd / math.sqrt(2))))


def test_forgetting_halves_the_data_precision_every_half_life() -> None:
    cfg = BeliefConfig(half_life_ticks=30)
    b = Belief.prior(MEMBW_TPOT, L4, cfg).observe(0.3, 0.1, 1.0, tick=0)
    later = b.decayed(30, cfg.decay)
    assert later.data_precision == pytest.approx(50.0)
    assert later.mean == pytest.approx(b.mean * 100 / 104 * 104 / 100 * 54 / 54 * (15 / 54)
                                       / (30 / 104))
    assert later.sd > b.sd
    assert later.decayed(30, cfg.decay) is later  # idempotent at the same tick


def test_attribution_rules() -> None:
    assert attribute("tpot", {"kv_pressure": 0.9, "comm_overhead": 0.5}) == KV_TPOT
    assert attribute("tpot", {"kv_pressure": 0.5, "comm_overhead_frac": 0.3}) == \
        ("comm_overhead", "tpot")
    assert attribute("tpot", {"kv_pressure": 0.85}) == MEMBW_TPOT
    assert attribute("ttft", {"queue_util": 0.8, "comm_overhead": 0.5}) == ("queue_util", "ttft")
    assert attribute("ttft", {"comm_overhead": 0.3}) == ("comm_overhead", "ttft")
    assert attribute("ttft", None) == ("compute_util", "ttft")
    assert attribute("throughput", {"kv_pressure": 1.2}) == ("kv_pressure", "throughput")
    assert attribute("throughput", {}) == ("batch_efficiency", "throughput")


def test_evidence_strengthens_a_belief_and_promotes_a_mechanism() -> None:
    store, sds, confs = BeliefStore(), [], []
    for t in range(8):
        store = store.update([obs(tpot=1.6, kv=0.9, tick=t)], t)
        b = store.belief(KV_TPOT, L4)
        assert b is not None
        sds.append(b.sd)
        confs.append(b.confidence)
    assert sds == sorted(sds, reverse=True) and confs[-1] > confs[0]
    assert store.version == 8 and store.tick == 7
    mechs = store.active_mechanisms()
    # the L4 scope's, not {*}'s: every general scope's evidence is L4's alone
    assert [m.scope for m in mechs if m.edge == KV_TPOT] == [L4]
    m = next(m for m in mechs if m.edge == KV_TPOT)
    assert m.id == mechanism_id(KV_TPOT, L4)
    assert m.condition == "kv_pressure > 0.85"
    assert m.effect == pytest.approx(1.6, rel=0.05)
    assert (m.support, m.first_seen, m.last_confirmed, m.active) == (8, 4, 7, True)
    assert m.confidence > 0.99
    assert m.line().startswith("kv_pressure > 0.85 → TPOT ×1.5")
    assert m.line().endswith("on {l4, vllm, ≤10B, tp1} (support 8, conf 1.00)")
    # the throughput residual was 1.0: no mechanism there
    assert not [m for m in mechs if m.edge[1] == "throughput"]


def test_contradicting_evidence_retires_a_mechanism() -> None:
    store = run(BeliefStore(), range(10), tpot=1.5, kv=0.9)
    mid = mechanism_id(KV_TPOT, L4)
    assert store.mechanisms[mid].active
    store = run(store, range(10, 13), tpot=0.8, kv=0.9)
    assert store.mechanisms[mid].active  # three contrary ticks do not undo ten
    store = run(store, range(13, 22), tpot=0.8, kv=0.9)
    m = store.mechanisms[mid]
    assert not m.active and 13 <= m.retired_at <= 21
    assert store.counts().active == 0 and store.counts().discovered >= 1
    assert m.last_confirmed < m.retired_at


def test_forgetting_tracks_a_step_change() -> None:
    store = run(BeliefStore(), range(60), tpot=1.5)
    assert store.lookup(MEMBW_TPOT, L4).multiplier == pytest.approx(1.5, rel=0.03)
    store = run(store, range(60, 105), tpot=0.7)  # 1.5 half-lives later: crossed over
    assert store.lookup(MEMBW_TPOT, L4).multiplier < 0.95
    store = run(store, range(105, 210), tpot=0.7)
    assert store.lookup(MEMBW_TPOT, L4).multiplier == pytest.approx(0.7, rel=0.05)
    stiff = run(BeliefStore(config=BeliefConfig(half_life_ticks=1e9)), range(60), tpot=1.5)
    stiff = run(stiff, range(60, 210), tpot=0.7)
    assert stiff.lookup(MEMBW_TPOT, L4).multiplier > 0.78  # the average: it cannot follow


def test_general_scopes_learn_from_all_specific_from_their_own() -> None:
    store = BeliefStore()
    for t in range(6):
        store = store.update([obs(L4, tpot=1.4, dep="a", tick=t),
                              obs(H100, tpot=0.8, dep="b", tick=t)], t)
    l4, h100 = store.belief(MEMBW_TPOT, L4), store.belief(MEMBW_TPOT, H100)
    glob = store.belief(MEMBW_TPOT, GLOBAL)
    assert l4 and h100 and glob
    assert (l4.support, h100.support, glob.support) == (6, 6, 12)
    assert l4.multiplier > 1.3 and h100.multiplier < 0.85
    assert glob.sources == tuple(sorted((L4.key(), H100.key())))
    assert store.belief(MEMBW_TPOT, Scope(family="ada")).support == 6
    # an h200 has no evidence of its own: it backs off to its family (the h100's)
    got = store.lookup(MEMBW_TPOT, H200)
    assert got.scope == Scope("*", "vllm", "≤10B", "tp1", family="hopper")
    assert got.multiplier == pytest.approx(h100.multiplier)
    # with too little support anywhere: the prior
    assert store.lookup(MEMBW_TPOT, H200, min_support=100).mean == 0.0


def test_correction_depends_on_the_regime() -> None:
    store = run(BeliefStore(), range(10), tpot=1.6, ttft=1.3, tput=0.7, kv=0.95)
    hot = store.correction(L4, {"kv_pressure": 0.95})
    assert hot["tpot"] == pytest.approx(1.6, rel=0.05)
    assert hot["throughput"] == pytest.approx(0.7, rel=0.05)
    assert hot["ttft"] == pytest.approx(1.3, rel=0.1)  # compute_util→ttft
    cool = store.correction(L4, {"kv_pressure": 0.5})
    assert cool["tpot"] == 1.0 and cool["throughput"] == 1.0
    residuals = store.corrected_residuals(obs(tpot=1.6, ttft=1.3, tput=0.7, kv=0.95))
    assert all(abs(r) < 0.05 for r in residuals.values())
    assert set(residuals) == {"ttft", "ttft_p95", "tpot", "tpot_p95", "throughput"}


def test_tail_beliefs_learn_how_much_longer_a_p95_is_per_scope() -> None:
    # L4's TTFT p95 is 1.8× what the predictor's tail says (its mean is 1.2× off); the
    # H100's tail is as predicted; the tail does not touch the mean's correction
    store = BeliefStore()
    for t in range(12):
        store = store.update([obs(L4, ttft=1.2, ttft_tail=1.8, tpot_tail=1.3, dep="a", tick=t),
                              obs(H100, ttft=1.2, dep="b", tick=t)], t)
    l4, h100 = store.correction(L4), store.correction(H100)
    assert l4["ttft"] == pytest.approx(1.2, rel=0.05) == h100["ttft"]
    assert l4["ttft_p95"] == pytest.approx(1.2 * 1.8, rel=0.08)
    assert l4["tpot_p95"] == pytest.approx(1.3, rel=0.05)
    assert h100["ttft_p95"] == pytest.approx(1.2, rel=0.05)
    assert store.tail("ttft_p95", L4).scope == L4
    # an h200 backs off to the hopper family's tail (the H100's), not the global one
    assert store.tail("ttft_p95", H200).multiplier == pytest.approx(1.0, abs=0.03)
    # what calibration sees is left after the tail as well as the mean
    left = store.corrected_residuals(obs(L4, ttft=1.2, ttft_tail=1.8, tpot_tail=1.3))
    assert all(abs(r) < 0.08 for r in left.values())
    assert not any(m.edge[1].endswith("_p95") for m in store.active_mechanisms())
    assert BeliefStore.from_bytes(store.to_bytes()) == store
    # a store written before tail beliefs existed decodes with none
    doc = json.loads(zlib.decompress(store.to_bytes()))
    del doc["tails"]
    old = BeliefStore.from_bytes(zlib.compress(json.dumps(doc).encode()))
    assert not old.tails and old.beliefs == store.beliefs


def test_counts_active_applicable_cumulative() -> None:
    store = BeliefStore()
    for t in range(8):
        store = store.update([obs(L4, tpot=1.5, dep="a", tick=t),
                              obs(H100, ttft=0.6, dep="b", tick=t)], t)
    c = store.counts([L4])
    assert c.active == 2 and c.applicable == 1 and c.discovered == 2
    assert store.counts([L4, H100]).applicable == 2
    assert store.counts([H200]).applicable == 0
    assert store.applicable_mechanisms([H100])[0].line().startswith(
        "compute-bound prefill → TTFT ×0.6")
    store = run(store, range(8, 20), tpot=0.8)  # L4 turns the other way: retired
    assert store.counts([L4]).active == 1 and store.counts().discovered == 2


def test_several_sources_make_a_general_mechanism() -> None:
    store = BeliefStore()
    for t in range(8):
        store = store.update([obs(L4, tpot=1.5, dep="a", tick=t),
                              obs(H100, tpot=1.5, dep="b", tick=t)], t)
    mechs = [m for m in store.active_mechanisms() if m.edge == MEMBW_TPOT]
    assert [m.scope for m in mechs] == [Scope("*", "vllm", "≤10B", "tp1")]
    assert mechs[0].line().split(" on ")[1].startswith("{vllm, ≤10B, tp1}")


def test_store_guards() -> None:
    store = BeliefStore().update([], 5)
    assert store.version == 1 and store.tick == 5
    with pytest.raises(ValueError, match="before"):
        store.update([], 4)
    quiet = store.update([obs(requests=0)], 6)
    assert not quiet.beliefs


def test_kv_cliff_position() -> None:
    cliff = ThresholdBelief(scope=L4)
    flat = ThresholdBelief(scope=L4)
    kvs = [0.6 + 0.02 * i for i in range(26)]  # 0.60 .. 1.10
    for i, kv in enumerate(kvs * 2):
        jump = 0.5 if kv > 0.9 else 0.0
        noise = 0.05 * math.sin(7 * i)
        cliff = cliff.observe(kv, jump + noise, 1.0, i)
        flat = flat.observe(kv, noise, 1.0, i)
    pos, p = cliff.cliff(0.15, 0.5)
    assert p > 0.95 and 0.85 <= pos <= 0.92
    assert flat.cliff(0.15, 0.5)[1] < 0.5
    store = run(BeliefStore(), range(6), tpot=1.0, kv=0.95)
    assert store.kv_cliff(L4) is not None and store.kv_cliff(H200) == store.kv_cliff(GLOBAL)
    assert store.kv_cliff(H200, min_support=100) is None
