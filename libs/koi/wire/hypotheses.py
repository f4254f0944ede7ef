"""A hypothesis round ⇄ protobuf: ``koi.rlm.loop.RoundOutcome`` ⇄ ``HypothesisRound``.

``encode_hypotheses(outcome)`` / ``decode_hypotheses(data)`` carry a finished round's
accepted hypotheses (each ``koi.rlm.hypothesis.Hypothesis`` field by field; an
exploration's values as one JSON array, since they mix strings, numbers and booleans),
its dropped ones with their reasons (and the jobs they named, what they claimed), its
spend and triggers; ``decode(encode(x)) == x`` exactly (the hypothesis id travels as
sent). Decoding raises ``InvalidSpecError`` naming
the field for bytes that do not parse, a missing edge, scope or config, an unknown
direction or values that are not a JSON array of plain values. Conversions only.
"""

from __future__ import annotations

import json
from typing import Any

from koi.catalog import Catalog
from koi.errors import InvalidSpecError
from koi.rlm.client import Spend
from koi.rlm.hypothesis import CandidateTest, Direction, Dropped, Exploration, Hypothesis
from koi.rlm.loop import RoundOutcome
from koi.v1 import common_pb2, hypotheses_pb2
from koi.wire.codec import encode
from koi.wire.config import config_to_proto
from koi.wire.planning import _config, _decoded, _message
from koi.wire.scope import scope_from_proto, scope_to_proto

MAX_VALUES_JSON = 2000


def hypothesis_to_proto(h: Hypothesis) -> hypotheses_pb2.Hypothesis:
    return hypotheses_pb2.Hypothesis(
        id=h.id, edge=common_pb2.Edge(cause=h.edge[0], effect=h.edge[1]),
        scope=scope_to_proto(h.scope), direction=h.direction.value, size=h.size,
        size_low=h.size_low, size_high=h.size_high, expires_tick=h.expires_tick,
        source_model=h.source_model, round_id=h.round_id, why=list(h.why),
        tests=[hypotheses_pb2.CandidateTest(job_id=t.job_id, config=config_to_proto(t.config))
               for t in h.tests],
        explore=[hypotheses_pb2.Exploration(job_id=e.job_id, knob=e.knob,
                                            values_json=json.dumps(list(e.values)),
                                            accelerator=e.accelerator) for e in h.explore],
        statement=h.statement)


def _values(text: str, path: str) -> tuple[Any, ...]:
    try:
        values = json.loads(text) if len(text) <= MAX_VALUES_JSON else None
    except ValueError:
        values = None
    if not isinstance(values, list) or not all(
            isinstance(v, str | int | float | bool) for v in values):
        raise InvalidSpecError(path, "must be a JSON array of strings, numbers or booleans")
    return tuple(values)


def hypothesis_from_proto(msg: hypotheses_pb2.Hypothesis, path: str = "", *,
                          catalog: Catalog | None = None) -> Hypothesis:
    edge = _message(msg, "edge", path)
    if msg.direction not in {d.value for d in Direction}:
        raise InvalidSpecError(f"{path}direction", f"{msg.direction[:20]!r} is not increase"
                                                   " or decrease")
    tests = []
    for i, t in enumerate(msg.tests):
        cfg = _config(t, "config", f"{path}tests[{i}].", catalog)
        if cfg is None:
            raise InvalidSpecError(f"{path}tests[{i}].config", "missing (required)")
        tests.append(CandidateTest(t.job_id, cfg))
    return Hypothesis(
        edge=(edge.cause, edge.effect), scope=scope_from_proto(_message(msg, "scope", path)),
        direction=Direction(msg.direction), size=msg.size, size_low=msg.size_low,
        size_high=msg.size_high, expires_tick=msg.expires_tick,
        source_model=msg.source_model, round_id=msg.round_id, why=tuple(msg.why),
        tests=tuple(tests),
        explore=tuple(Exploration(e.job_id, e.knob,
                                  _values(e.values_json, f"{path}explore[{i}].values_json"),
                                  e.accelerator) for i, e in enumerate(msg.explore)),
        statement=msg.statement, id=msg.id)


def _spend_to_proto(s: Spend) -> hypotheses_pb2.ModelSpend:
    return hypotheses_pb2.ModelSpend(
        prompt_tokens=s.prompt_tokens, completion_tokens=s.completion_tokens, usd=s.usd,
        calls=s.calls, seconds=s.seconds, cache_hits=s.cache_hits, failures=s.failures)


def _spend_from_proto(m: hypotheses_pb2.ModelSpend) -> Spend:
    return Spend(prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens,
                 usd=m.usd, calls=m.calls, seconds=m.seconds, cache_hits=m.cache_hits,
                 failures=m.failures)


def hypotheses_to_proto(o: RoundOutcome) -> hypotheses_pb2.HypothesisRound:
    return hypotheses_pb2.HypothesisRound(
        tick=o.enters_tick, round_id=o.round_id, round_tick=o.round_tick, model=o.model,
        ok=o.ok, reason=o.reason, accepted=[hypothesis_to_proto(h) for h in o.hypotheses],
        dropped=[hypotheses_pb2.DroppedHypothesis(index=d.index, reason=d.reason,
                                                  hypothesis_id=d.hypothesis_id,
                                                  job_ids=list(d.job_ids), claim=d.claim)
                 for d in o.dropped],
        spend=_spend_to_proto(o.spend), triggers=list(o.triggers))


def hypotheses_from_proto(m: hypotheses_pb2.HypothesisRound, *,
                          catalog: Catalog | None = None) -> RoundOutcome:
    if not m.round_id:
        raise InvalidSpecError("round_id", "missing (required)")
    return RoundOutcome(
        enters_tick=m.tick, round_id=m.round_id, round_tick=m.round_tick, model=m.model,
        ok=m.ok, reason=m.reason,
        hypotheses=tuple(hypothesis_from_proto(h, f"accepted[{i}].", catalog=catalog)
                         for i, h in enumerate(m.accepted)),
        dropped=tuple(Dropped(d.index, d.reason, d.hypothesis_id, tuple(d.job_ids), d.claim)
                      for d in m.dropped),
        spend=_spend_from_proto(m.spend), triggers=tuple(m.triggers))


def encode_hypotheses(outcome: RoundOutcome) -> bytes:
    return encode(hypotheses_to_proto(outcome))


def decode_hypotheses(data: bytes, *, catalog: Catalog | None = None) -> RoundOutcome:
    return _decoded(data, hypotheses_pb2.HypothesisRound,
                    lambda m: hypotheses_from_proto(m, catalog=catalog))
