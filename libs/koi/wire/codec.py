"""Bytes ⇄ protobuf messages ⇄ domain objects: the helpers services call.

``encode``/``decode`` turn any generated message into deterministic bytes and back,
raising ``InvalidSpecError`` (field = the message's full name) on bytes that do not
parse. The typed pairs (``encode_job``/``decode_job``...) go all the way to domain
objects; their errors are one line of bounded length (``bounded_errors``), whatever
the input held. The per-type conversions live in ``config``, ``jobs`` and ``predictor``; this
module holds no conversion logic of its own and no transport (NATS, gRPC) code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from koi.catalog import Catalog
from koi.errors import (
    MAX_FIELD_CHARS,
    MAX_REASON_CHARS,
    InvalidConfigError,
    InvalidSpecError,
    bounded,
)
from koi.jobs import JobSpec
from koi.predictor.types import Prediction, Workload
from koi.safe_text import printable
from koi.space import DeploymentConfig
from koi.v1 import config_pb2, jobs_pb2, prediction_pb2
from koi.wire.config import config_from_proto, config_to_proto
from koi.wire.jobs import job_from_proto, job_to_proto, spend_from_proto, spend_to_proto
from koi.wire.predictor import (
    prediction_from_proto,
    prediction_to_proto,
    workload_from_proto,
    workload_to_proto,
)

M = TypeVar("M", bound=Message)
# a decode error's text ends up in a DLQ header, a JobAck, a log line: one line, and
# never the bulk of a hostile input (a 20,000-character id quoted back): koi.errors' caps


@contextmanager
def bounded_errors() -> Iterator[None]:
    """Re-raise a decode error (spec or config) with its text made one bounded line."""
    try:
        yield
    except InvalidSpecError as e:
        raise bounded(e) from None
    except InvalidConfigError as e:
        raise InvalidConfigError(printable(e.knob, MAX_FIELD_CHARS),
                                 printable(e.reason, MAX_REASON_CHARS)) from None


def encode(msg: Message) -> bytes:
    """Deterministic wire bytes (map entries sorted), so equal messages give equal bytes."""
    return msg.SerializeToString(deterministic=True)


def decode(data: bytes, message_type: type[M]) -> M:
    """Parse ``data`` as ``message_type``; malformed bytes raise ``InvalidSpecError``."""
    msg = message_type()
    try:
        msg.ParseFromString(data)
    except (DecodeError, TypeError) as e:
        name = message_type.DESCRIPTOR.full_name
        raise InvalidSpecError(name, f"not a serialized {name} ({len(data)} bytes): {e}",
                               source="wire") from None
    return msg


def encode_config(cfg: DeploymentConfig) -> bytes:
    return encode(config_to_proto(cfg))


def decode_config(data: bytes, *, catalog: Catalog | None = None,
                  strict: bool = False) -> DeploymentConfig:
    with bounded_errors():
        return config_from_proto(decode(data, config_pb2.DeploymentConfig), catalog=catalog,
                                 strict=strict)


def encode_job(job: JobSpec) -> bytes:
    return encode(job_to_proto(job))


def decode_job(data: bytes, *, catalog: Catalog | None = None) -> JobSpec:
    with bounded_errors():
        return job_from_proto(decode(data, jobs_pb2.JobSpec), catalog=catalog)


def encode_spend(replica: str, spent: dict[str, int]) -> bytes:
    return encode(spend_to_proto(replica, spent))


def decode_spend(data: bytes) -> tuple[str, dict[str, int]]:
    """A placer replica's ``koi.placer.spent`` report: ``(replica, {user: taken})``."""
    with bounded_errors():
        return spend_from_proto(decode(data, jobs_pb2.SubmitSpend))


def encode_workload(w: Workload) -> bytes:
    return encode(workload_to_proto(w))


def decode_workload(data: bytes) -> Workload:
    with bounded_errors():
        return workload_from_proto(decode(data, prediction_pb2.Workload))


def encode_prediction(p: Prediction) -> bytes:
    return encode(prediction_to_proto(p))


def decode_prediction(data: bytes) -> Prediction:
    with bounded_errors():
        return prediction_from_proto(decode(data, prediction_pb2.Prediction))
