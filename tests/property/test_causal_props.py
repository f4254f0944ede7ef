"""Invariants of the causal store and the calibrator: lossless, order-free, well-formed."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from koi.causal import Belief, BeliefConfig, BeliefStore, OutcomeObservation, Scope
from koi.dro import DroCalibrator, adverse

SCOPES = (Scope("l4", "vllm", "≤10B", "tp1", family="ada"),
          Scope("h100-sxm", "sglang", "40–100B", "tp4", family="hopper"),
          Scope("h200", "vllm", "40–100B", "tp4", family="hopper"))
ratio = st.floats(0.2, 5.0)
any_float = st.floats(allow_nan=False)


@st.composite
def observations(draw: st.DrawFn) -> OutcomeObservation:
    i = draw(st.integers(0, len(SCOPES) - 1))
    pred = {"ttft_ms": 100.0, "ttft_p95_ms": 200.0, "tpot_ms": 20.0, "tpot_p95_ms": 30.0,
            "output_throughput_tok_s": 1000.0, "kv_pressure": draw(st.floats(0.0, 1.5)),
            "comm_overhead_frac": draw(st.floats(0.0, 0.5)),
            "queue_util": draw(st.floats(0.0, 1.2))}
    obsd = {"ttft_ms": 100.0 * draw(ratio), "tpot_ms": 20.0 * draw(ratio),
            "output_tok_s": 1000.0 * draw(ratio)}
    if draw(st.booleans()):  # p95s measured too: tail beliefs learn
        obsd |= {"ttft_p95_ms": 200.0 * draw(ratio), "tpot_p95_ms": 30.0 * draw(ratio)}
    return OutcomeObservation(f"d{draw(st.integers(0, 9))}", "j", 0, SCOPES[i], pred, obsd,
                              draw(st.floats(0.0, 500.0)))


ticks = st.lists(st.lists(observations(), max_size=4), min_size=1, max_size=8)


def build(batches: list[list[OutcomeObservation]]) -> BeliefStore:
    store = BeliefStore(config=BeliefConfig(min_support=2))
    for t, batch in enumerate(batches):
        store = store.update(batch, 3 * t)
    return store


@settings(max_examples=25, deadline=None)
@given(ticks)
def test_store_round_trip_is_lossless_and_deterministic(batches: list) -> None:
    store = build(batches)
    data = store.to_bytes()
    back = BeliefStore.from_bytes(data)
    assert back == store
    assert back.to_bytes() == data
    assert back.update(batches[0], store.tick + 1) == store.update(batches[0], store.tick + 1)


@settings(max_examples=50, deadline=None)
@given(st.tuples(any_float, any_float, any_float, any_float),
       st.integers(0, 10**6), st.sampled_from(SCOPES))
def test_every_float_survives_serialisation(xs: tuple, n: int, scope: Scope) -> None:
    b = Belief(("membw_util", "tpot"), scope, prior_precision=xs[0], data_precision=xs[1],
               data_sum=xs[2], weight=xs[3], support=n, first_seen=n, as_of=n,
               sources=(scope.key(),))
    store = replace(BeliefStore(), beliefs={(b.edge, b.scope): b}, tick=n)
    assert BeliefStore.from_bytes(store.to_bytes()) == store


@settings(max_examples=25, deadline=None)
@given(st.lists(observations(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_update_does_not_depend_on_arrival_order(batch: list, rnd) -> None:
    shuffled = list(batch)
    rnd.shuffle(shuffled)
    assert BeliefStore().update(batch, 1).to_bytes() == \
        BeliefStore().update(shuffled, 1).to_bytes()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(0.01, 1.0)), max_size=20))
def test_evidence_never_widens_a_belief(steps: list) -> None:
    b = Belief.prior(("membw_util", "tpot"), SCOPES[0], BeliefConfig())
    for t, (r, w) in enumerate(steps):
        nb = b.observe(r, 0.15, w, t)
        assert nb.sd <= b.sd and 0.5 <= nb.confidence <= 1.0
        b = nb


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(("ttft", "tpot", "throughput")),
                                st.floats(-1e6, 1e6)), max_size=30),
       st.integers(1, 50))
def test_calibrator_round_trip_and_radius_bounds(batch: list, window: int) -> None:
    cal = DroCalibrator(window=window).update(batch, 1)
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
    for o in ("ttft", "tpot", "throughput"):
        res = cal.residuals.get(o, ())
        assert len(res) <= window
        assert cal.radius(o) >= 0.0
        if res:
            # one-sided: only the adverse part of a residual can widen the radius
            assert cal.radius(o) <= max(max(max(adverse(o, r), 0.0) for r in res),
                                        cal.prior_radius)


@settings(max_examples=25, deadline=None)
@given(ticks, st.integers(1, 12))
def test_rescored_calibrator_round_trips_and_scores_its_window_under_the_store(
        batches: list, window: int) -> None:
    store, cal = BeliefStore(config=BeliefConfig(min_support=2)), DroCalibrator(window=window)
    for t, batch in enumerate(batches):
        before = [store.corrected_residuals(o) for o in batch]
        store = store.update(batch, t)
        cal = cal.update(before, t, observations=batch, rescore=store.corrected_residuals)
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
    kept = [o for b in batches for o in b][-window:]
    assert cal.observations == tuple(kept)
    for o in ("ttft", "tpot", "throughput"):
        assert cal.residuals.get(o, ()) == tuple(
            r[o] for r in map(store.corrected_residuals, kept) if o in r)
