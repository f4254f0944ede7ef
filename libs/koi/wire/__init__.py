"""The wire: the only place that converts protobuf (``koi.v1``) ⇄ domain objects.

Services decode a message, call the domain, encode the result; they import these
functions rather than touching ``_pb2`` fields themselves, and the domain (``koi.*``
outside this package) never imports ``koi.v1``. Decoding validates: a bad message
raises ``InvalidConfigError``/``InvalidSpecError`` naming the offending field. The
planning tick's messages (snapshot, telemetry, observations, candidates, plan, actions,
causal state, operator events) are in ``koi.wire.planning`` (the belief store and the
DRO calibrator inside the causal state: ``koi.wire.causal``); its public names are also
reachable here, imported on first use because that module pulls in the planner.
This package holds conversions only: no policy, no I/O beyond reading catalog and
trace files that decoding must check, and no NATS or gRPC code.
"""

from __future__ import annotations

from typing import Any

from koi.wire.codec import (
    decode,
    decode_config,
    decode_job,
    decode_prediction,
    decode_workload,
    encode,
    encode_config,
    encode_job,
    encode_prediction,
    encode_workload,
)
from koi.wire.config import config_from_proto, config_to_proto
from koi.wire.jobs import job_from_proto, job_to_proto
from koi.wire.predictor import (
    prediction_from_proto,
    prediction_to_proto,
    workload_from_proto,
    workload_to_proto,
)

# koi.wire.planning's public names, resolved lazily by __getattr__ below
PLANNING_NAMES = frozenset({
    "decode_actions", "decode_candidates", "decode_causal_state", "decode_observations",
    "decode_plan", "decode_plan_targets", "decode_snapshot", "decode_telemetry",
    "encode_actions", "encode_candidates", "encode_causal_state", "encode_observations",
    "encode_plan", "encode_snapshot", "encode_telemetry", "event_line",
    "explanations_from_proto", "make_event", "plan_to_proto", "causal_state_to_proto",
})


def __getattr__(name: str) -> Any:
    if name in PLANNING_NAMES:
        from koi.wire import planning

        return getattr(planning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "config_from_proto",
    "config_to_proto",
    "decode",
    "decode_config",
    "decode_job",
    "decode_prediction",
    "decode_workload",
    "encode",
    "encode_config",
    "encode_job",
    "encode_prediction",
    "encode_workload",
    "job_from_proto",
    "job_to_proto",
    "prediction_from_proto",
    "prediction_to_proto",
    "workload_from_proto",
    "workload_to_proto",
]
