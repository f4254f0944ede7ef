"""The wire: the only place that converts protobuf (``koi.v1``) ⇄ domain objects.

Services decode a message, call the domain, encode the result; they import these
functions rather than touching ``_pb2`` fields themselves, and the domain (``koi.*``
outside this package) never imports ``koi.v1``. Decoding validates: a bad message
raises ``InvalidConfigError``/``InvalidSpecError`` naming the offending field. Messages
with no domain type yet (ClusterPlan, CausalState, Observation...) have no codec here.
This package holds conversions only: no policy, no I/O beyond reading catalog and
trace files that decoding must check, and no NATS or gRPC code.
"""

from __future__ import annotations

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
