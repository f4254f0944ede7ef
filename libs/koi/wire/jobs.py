"""``koi.jobs`` (OnlineJob | BatchJob) ⇄ ``koi.v1.JobSpec``.

Encoding writes every field explicitly. Decoding builds the job dataclasses directly,
so their own bound checks apply, and reports every error as an ``InvalidSpecError``
whose field is the proto path (``online.arrival.rate.rate_rps``,
``batch.input_len.lognormal.sigma``). The model id is checked against the catalog and
a trace arrival's file is loaded (it must be in the traces directory, or be a ``shared:``
name, where the message is decoded); a trace path is kept as written. The physical bounds
(``koi.jobs.bounds``) are the dataclasses' own, so a submission is held to exactly what
YAML is. No bytes handling and no transport here.
"""

from __future__ import annotations

from typing import Any

from koi.catalog import Catalog
from koi.errors import InvalidSpecError
from koi.jobs import (
    Arrival,
    BatchJob,
    JobSpec,
    LengthDist,
    OnlineJob,
    Slo,
    load_trace,
    resolve_trace_path,
)
from koi.jobs.bounds import check_id
from koi.jobs.lengths import DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS
from koi.jobs.parse import Ctx, model_id
from koi.jobs.rate_limit import MAX_USERS
from koi.jobs.spec import DEFAULT_PRIORITY
from koi.subjects import token
from koi.v1 import jobs_pb2

SOURCE = "koi.v1.JobSpec"
DEFAULT_PERCENTILE = 95.0
# Domain field → proto field, where they differ (for error paths).
_ONLINE_FIELDS = {"prefix_share": "online.prefix_share", "end_s": "online.end_s",
                  "client_region": "online.client_region", "output_len": "online.output_len"}
_BATCH_FIELDS = {"num_requests": "batch.num_requests", "deadline_s": "batch.deadline_s",
                 "output_len": "batch.output_len"}
_ARRIVAL_FIELDS = {"trace_path": "path", "trace": "path"}
_LENGTH_FIELDS = {"min": "min_tokens", "max": "max_tokens", "mean": "fixed.tokens",
                  "values": "empirical.token_counts"}
_LOGNORMAL_FIELDS = {**_LENGTH_FIELDS, "mean": "lognormal.mean_tokens",
                     "sigma": "lognormal.sigma"}


def _err(path: str, reason: str) -> InvalidSpecError:
    return InvalidSpecError(path, reason, source=SOURCE)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _build(prefix: str, renames: dict[str, str], cls: Any, *args: Any, **kwargs: Any) -> Any:
    """Construct ``cls``; its bound errors come back with their proto path."""
    try:
        return cls(*args, **kwargs)
    except InvalidSpecError as e:
        raise _err(_join(prefix, renames.get(e.field, e.field)), e.reason) from None


# --- encode ----------------------------------------------------------------------------

def job_to_proto(job: JobSpec) -> jobs_pb2.JobSpec:
    msg = jobs_pb2.JobSpec(id=job.id, model=job.model, priority=job.priority,
                           submit_s=job.submit_s, pinned=job.pinned,
                           max_moves_per_hour=job.max_moves_per_hour)
    if isinstance(job, OnlineJob):
        on = msg.online
        _arrival_to_proto(job.arrival, on.arrival)
        _length_to_proto(job.input_len, on.input_len)
        _length_to_proto(job.output_len, on.output_len)
        on.slo.ttft_ms = job.slo.ttft_ms
        on.slo.tpot_ms = job.slo.tpot_ms
        on.slo.percentile = job.slo.percentile
        on.prefix_share = job.prefix_share
        if job.end_s is not None:
            on.end_s = job.end_s
        on.client_region = job.client_region
    elif isinstance(job, BatchJob):
        b = msg.batch
        b.num_requests = job.num_requests
        _length_to_proto(job.input_len, b.input_len)
        _length_to_proto(job.output_len, b.output_len)
        b.deadline_s = job.deadline_s
    else:
        raise TypeError(f"not a job: {type(job).__name__}")
    return msg


def _arrival_to_proto(a: Arrival, out: jobs_pb2.Arrival) -> None:
    if a.kind == "rate":
        out.rate.rate_rps = a.rate_rps
    elif a.kind == "diurnal":
        out.diurnal.mean_rps = a.mean_rps
        out.diurnal.peak_to_trough = a.peak_to_trough
        out.diurnal.period_s = a.period_s
        out.diurnal.phase_s = a.phase_s
    else:
        out.trace.path = a.trace_path
        out.trace.time_scale = a.time_scale
        out.trace.loop = a.loop


def _length_to_proto(d: LengthDist, out: jobs_pb2.LengthDist) -> None:
    if d.from_trace:
        out.trace_column.SetInParent()  # the column carries its own bounds
        return
    if d.kind == "fixed":
        out.fixed.tokens = int(d.mean)
    elif d.kind == "lognormal":
        out.lognormal.mean_tokens = d.mean
        out.lognormal.sigma = d.sigma
    else:
        out.empirical.token_counts.extend(d.values)
    out.min_tokens = d.min
    out.max_tokens = d.max


# --- decode ----------------------------------------------------------------------------

def job_from_proto(msg: jobs_pb2.JobSpec, *, catalog: Catalog | None = None) -> JobSpec:
    """Decode and validate a job; ``catalog`` defaults to ``load_catalog()``."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise _err("kind", "missing; set online (arrival, lengths, slo) or batch"
                           " (volume, lengths, deadline_s)")
    try:
        check_id(msg.id)  # first: cheap, and a bad id need not load a trace
    except InvalidSpecError as e:
        raise _err("id", e.reason) from None
    if not msg.model:
        raise _err("model", "missing (required)")
    model = model_id(Ctx(SOURCE, catalog=catalog), {"model": msg.model})
    priority = msg.priority if msg.HasField("priority") else DEFAULT_PRIORITY
    common = {"id": msg.id, "model": model, "priority": priority, "submit_s": msg.submit_s,
              "pinned": msg.pinned, "max_moves_per_hour": msg.max_moves_per_hour}
    if kind == "online":
        return _online_from_proto(msg.online, common)
    return _batch_from_proto(msg.batch, common)


def _online_from_proto(on: jobs_pb2.OnlineJob, common: dict[str, Any]) -> OnlineJob:
    _require(on, "online", ("arrival", "input_len", "output_len", "slo"))
    arrival = _arrival_from_proto(on.arrival, "online.arrival")
    slo = on.slo
    percentile = slo.percentile if slo.HasField("percentile") else DEFAULT_PERCENTILE
    return _build("", _ONLINE_FIELDS, OnlineJob, **common, arrival=arrival,
                  input_len=_length_from_proto(on.input_len, "online.input_len", arrival,
                                               "input_tokens"),
                  output_len=_length_from_proto(on.output_len, "online.output_len", arrival,
                                                "output_tokens"),
                  slo=_build("online.slo", {}, Slo, ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms,
                             percentile=percentile),
                  prefix_share=on.prefix_share,
                  end_s=on.end_s if on.HasField("end_s") else None,
                  client_region=on.client_region)


def _batch_from_proto(b: jobs_pb2.BatchJob, common: dict[str, Any]) -> BatchJob:
    _require(b, "batch", ("input_len", "output_len"))
    input_len = _length_from_proto(b.input_len, "batch.input_len", None, "input_tokens")
    output_len = _length_from_proto(b.output_len, "batch.output_len", None, "output_tokens")
    volume = b.WhichOneof("volume")
    if volume is None:
        raise _err("batch.num_requests", "missing; give num_requests or total_output_tokens")
    if volume == "num_requests":
        n = b.num_requests
    else:
        if b.total_output_tokens < 1:
            raise _err("batch.total_output_tokens",
                       f"must be >= 1 (got {b.total_output_tokens})")
        n = BatchJob.requests_for_tokens(b.total_output_tokens, output_len)
    return _build("", _BATCH_FIELDS, BatchJob, **common, num_requests=n, input_len=input_len,
                  output_len=output_len, deadline_s=b.deadline_s)


def _require(msg: Any, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        if not msg.HasField(name):
            raise _err(f"{prefix}.{name}", "missing (required)")


def _arrival_from_proto(a: jobs_pb2.Arrival, prefix: str) -> Arrival:
    kind = a.WhichOneof("kind")
    if kind is None:
        raise _err(f"{prefix}.kind", "missing; set one of rate, diurnal, trace")
    where = f"{prefix}.{kind}"
    if kind == "rate":
        return _build(where, {}, Arrival, kind="rate", rate_rps=a.rate.rate_rps)
    if kind == "diurnal":
        d = a.diurnal
        return _build(where, {}, Arrival, kind="diurnal", mean_rps=d.mean_rps,
                      peak_to_trough=d.peak_to_trough if d.HasField("peak_to_trough") else 1.0,
                      period_s=d.period_s if d.HasField("period_s") else 86400.0,
                      phase_s=d.phase_s)
    t = a.trace
    if not t.path:
        raise _err(f"{where}.path", "missing (required): a trace CSV file")
    try:
        trace = load_trace(resolve_trace_path(t.path))
    except InvalidSpecError as e:
        detail = f"{e.source}: {e.field}: {e.reason}" if e.source else e.reason
        raise _err(f"{where}.path", detail) from None
    return _build(where, _ARRIVAL_FIELDS, Arrival, kind="trace", trace_path=t.path,
                  trace=trace, time_scale=t.time_scale if t.HasField("time_scale") else 1.0,
                  loop=t.loop if t.HasField("loop") else True)


def _length_from_proto(d: jobs_pb2.LengthDist, prefix: str, arrival: Arrival | None,
                       column: str) -> LengthDist:
    kind = d.WhichOneof("kind")
    if kind is None:
        raise _err(f"{prefix}.kind", "missing; set one of fixed, lognormal, empirical,"
                                     " trace_column")
    if kind == "trace_column":
        if arrival is None or arrival.trace is None:
            raise _err(f"{prefix}.trace_column", "needs a trace arrival to take lengths from")
        return _build(prefix, _LENGTH_FIELDS, LengthDist.empirical,
                      getattr(arrival.trace, column), from_trace=True)
    lo = d.min_tokens if d.HasField("min_tokens") else DEFAULT_MIN_TOKENS
    if kind == "empirical":
        hi = d.max_tokens if d.HasField("max_tokens") else None
        return _build(prefix, _LENGTH_FIELDS, LengthDist.empirical,
                      list(d.empirical.token_counts), min=lo, max=hi)
    hi = d.max_tokens if d.HasField("max_tokens") else DEFAULT_MAX_TOKENS
    if kind == "fixed":
        return _build(prefix, _LENGTH_FIELDS, LengthDist, kind="fixed",
                      mean=float(d.fixed.tokens), min=lo, max=hi)
    return _build(prefix, _LOGNORMAL_FIELDS, LengthDist, kind="lognormal",
                  mean=d.lognormal.mean_tokens, sigma=d.lognormal.sigma, min=lo, max=hi)


# --- the placer replicas' shared rate-limit budget (koi.placer.spent) -----------------------
SPEND_SOURCE = "koi.v1.SubmitSpend"
MAX_SPEND_EACH = 1_000_000  # submissions per submitter in one report at most


def spend_to_proto(replica: str, spent: dict[str, int]) -> jobs_pb2.SubmitSpend:
    return jobs_pb2.SubmitSpend(replica=replica, spent=spent)


def spend_from_proto(msg: jobs_pb2.SubmitSpend) -> tuple[str, dict[str, int]]:
    """``(replica, {user: submissions})``; ``InvalidSpecError`` for a report no replica
    sends (no replica, a submitter that is not one subject token, a count out of range)."""
    if not msg.replica:
        raise InvalidSpecError("replica", "empty", source=SPEND_SOURCE)
    if len(msg.spent) > MAX_USERS:
        raise InvalidSpecError("spent", f"{len(msg.spent)} submitters, more than "
                               f"{MAX_USERS}", source=SPEND_SOURCE)
    out: dict[str, int] = {}
    for user, n in msg.spent.items():
        try:
            token(user)
        except ValueError as e:
            raise InvalidSpecError("spent", str(e), source=SPEND_SOURCE) from None
        if not 0 < n <= MAX_SPEND_EACH:
            raise InvalidSpecError(f"spent[{user}]", f"{n} submissions, need 1.."
                                   f"{MAX_SPEND_EACH}", source=SPEND_SOURCE)
        out[user] = int(n)
    return msg.replica, out
