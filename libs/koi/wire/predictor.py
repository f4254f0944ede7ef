"""``koi.predictor.types`` (Workload, Prediction) ⇄ ``koi.v1`` (Workload, Prediction).

A ``Prediction``'s outcomes and mediators travel in the shared ``Outcomes`` and
``Mediators`` messages under the same names (``OUTCOMES``/``MEDIATORS``); its context
fields sit on ``Prediction`` itself. Decoding requires every predictor field to be
present and names the missing one (``outcomes.ttft_ms``); a bad workload raises
``InvalidSpecError`` naming its proto field. No bytes handling and no transport here.
"""

from __future__ import annotations

import math
from dataclasses import fields

from koi.errors import InvalidSpecError
from koi.predictor.types import MEDIATORS, OUTCOMES, LoadMode, Prediction, Workload
from koi.v1 import prediction_pb2
from koi.wire._enums import EnumCodec, has_field

LOAD_MODES: EnumCodec[LoadMode] = EnumCodec(LoadMode, prediction_pb2.LoadMode)
CONTEXT = tuple(f.name for f in fields(Prediction) if f.name not in OUTCOMES + MEDIATORS)
DEFAULT_WINDOW_S = 600.0


def _err(field: str, reason: str) -> InvalidSpecError:
    return InvalidSpecError(field, reason, source="koi.v1.Workload")


# --- workload --------------------------------------------------------------------------

def workload_to_proto(w: Workload) -> prediction_pb2.Workload:
    return prediction_pb2.Workload(
        input_len_tokens=w.input_len, output_len_tokens=w.output_len,
        mode=LOAD_MODES.to_proto(w.mode), load=w.load, prefix_hit=w.prefix_hit,
        window_s=w.window_s, slo_ttft_ms=w.slo_ttft_ms, slo_tpot_ms=w.slo_tpot_ms)


def workload_from_proto(msg: prediction_pb2.Workload) -> Workload:
    """Decode a workload; every bound the dataclass enforces is reported by proto field."""
    mode = LOAD_MODES.from_proto(msg.mode, "mode", _err)
    window_s = msg.window_s if msg.HasField("window_s") else DEFAULT_WINDOW_S
    numbers = {"input_len_tokens": msg.input_len_tokens,
               "output_len_tokens": msg.output_len_tokens, "load": msg.load,
               "prefix_hit": msg.prefix_hit, "window_s": window_s,
               "slo_ttft_ms": msg.slo_ttft_ms, "slo_tpot_ms": msg.slo_tpot_ms}
    for name, value in numbers.items():
        if not math.isfinite(value):
            raise _err(name, f"must be a finite number (got {value})")
    for name in ("input_len_tokens", "output_len_tokens"):
        if numbers[name] < 1:
            raise _err(name, f"must be >= 1 token (got {numbers[name]:g})")
    if mode != LoadMode.SATURATED and msg.load <= 0:
        raise _err("load", f"a {mode} workload needs load > 0 (got {msg.load:g})")
    if not 0.0 <= msg.prefix_hit < 1.0:
        raise _err("prefix_hit", f"must be in [0, 1) (got {msg.prefix_hit:g})")
    if window_s <= 0:
        raise _err("window_s", f"must be > 0 (got {window_s:g})")
    for name in ("load", "slo_ttft_ms", "slo_tpot_ms"):
        if numbers[name] < 0:
            raise _err(name, f"must be >= 0 (got {numbers[name]:g})")
    return Workload(input_len=msg.input_len_tokens, output_len=msg.output_len_tokens,
                    mode=mode, load=msg.load, prefix_hit=msg.prefix_hit, window_s=window_s,
                    slo_ttft_ms=msg.slo_ttft_ms, slo_tpot_ms=msg.slo_tpot_ms)


# --- prediction ------------------------------------------------------------------------

def prediction_to_proto(p: Prediction) -> prediction_pb2.Prediction:
    msg = prediction_pb2.Prediction()
    for name in OUTCOMES:
        setattr(msg.outcomes, name, getattr(p, name))
    for name in MEDIATORS:
        setattr(msg.mediators, name, getattr(p, name))
    for name in CONTEXT:
        setattr(msg, name, getattr(p, name))
    return msg


def prediction_from_proto(msg: prediction_pb2.Prediction) -> Prediction:
    """Decode a prediction; every outcome and mediator of the dataclass must be present."""
    values: dict[str, float] = {}
    for group, names in (("outcomes", OUTCOMES), ("mediators", MEDIATORS)):
        if not has_field(msg, group):
            raise InvalidSpecError(group, "missing (required)", source="koi.v1.Prediction")
        sub = getattr(msg, group)
        for name in names:
            if not sub.HasField(name):
                raise InvalidSpecError(f"{group}.{name}", "missing (required)",
                                       source="koi.v1.Prediction")
            values[name] = getattr(sub, name)
    for name in CONTEXT:
        values[name] = getattr(msg, name)
    return Prediction(**values)
