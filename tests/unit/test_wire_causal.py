"""The belief store and the DRO calibrator travel as messages, field by field: a decoded
one equals the original and serialises to the same bytes (NaN spreads, pass curves,
prediction fields and a language-model prior included)."""

from __future__ import annotations

import math

from koi.causal.beliefs import Belief
from koi.causal.mechanisms import Mechanism
from koi.causal.observe import OutcomeObservation
from koi.causal.scope import ANY, Scope
from koi.causal.store import BeliefStore
from koi.dro import DroCalibrator
from koi.v1 import causal_pb2
from koi.wire.causal import (
    calibrator_from_proto,
    calibrator_to_proto,
    store_from_proto,
    store_to_proto,
)
from koi.wire.codec import decode, encode
from koi.wire.planning import causal_state_to_proto

SCOPE = Scope(accelerator="l4", engine="vllm", size_class="8B", parallelism="tp1",
              family="ada")
GENERAL = Scope(accelerator=ANY, engine="vllm", size_class=ANY, parallelism=ANY,
                family=ANY)


def test_a_calibrator_with_nan_spreads_and_observations_round_trips() -> None:
    obs = OutcomeObservation("d1", "chat", 4, SCOPE, predicted={"tpot_ms": 12.5, "ttft_ms": 80.0},
                             observed={"ttft_ms": 95.0}, weight=37.0,
                             curves={"tpot": (1.0, 1.5, 2.25), "ttft": (4.0, 4.5, 5.0)})
    cal = DroCalibrator(coverage=0.5, window=50, prior_radius=0.4, tick=4, version=3,
                        residuals={"ttft_p95": (0.1, -0.25)}, hits={"ttft_p95": (1, 0)},
                        spreads={"ttft_p95": (math.nan, 0.3)}, jobs={"ttft_p95": ("a", "b")},
                        observations=(obs,))
    back = calibrator_from_proto(decode(encode(calibrator_to_proto(cal)),
                                        causal_pb2.CalibratorState))
    assert back.to_bytes() == cal.to_bytes()
    assert math.isnan(back.spreads["ttft_p95"][0]) and back.hits == cal.hits
    assert back.observations[0].curves == obs.curves and back.observations[0].weight == 37.0


def test_a_belief_store_with_a_prior_and_a_mechanism_round_trips() -> None:
    edge = ("kv_pressure", "tpot")
    belief = Belief(edge=edge, scope=SCOPE, prior_precision=4.0, data_precision=2.5,
                    data_sum=0.75, weight=3.0, support=7, first_seen=1, last_confirmed=6,
                    as_of=6, sources=("d1|l4", "d2|l4"), prior_sum=0.2)
    mech = Mechanism(id="m-1", scope=GENERAL, edge=edge, condition="kv_pressure > 0.85",
                     effect=1.6, support=7, confidence=0.93, first_seen=3, last_confirmed=6,
                     retired_at=-1, source="rlm")
    store = BeliefStore(tick=6, version=9, beliefs={(edge, SCOPE): belief},
                        mechanisms={"m-1": mech})
    state = causal_state_to_proto(store, DroCalibrator(), 6)
    msg = decode(encode(state), causal_pb2.CausalState)
    back = store_from_proto(msg.store, msg.mechanisms)
    assert back == store and back.to_bytes() == store.to_bytes()
    assert store_from_proto(store_to_proto(BeliefStore()), ()) == BeliefStore()
