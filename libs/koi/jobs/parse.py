"""The job dict form (what YAML and the wire carry) ⇄ job dataclasses.

``parse_job`` validates a plain dict and builds an ``OnlineJob`` or ``BatchJob``; every
error is an ``InvalidSpecError`` with the dotted field path (``slo.ttft_ms``,
``jobs[2].model``) and, when the dict came from a YAML file, the file and line.
``job_to_dict`` is its inverse: ``parse_job(job_to_dict(j)) == j``. File reading and
line mapping live in ``yaml_io``; no transport imports here.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from koi.errors import InvalidSpecError
from koi.jobs.arrival import Arrival
from koi.jobs.bounds import MAX_EMPIRICAL_VALUES, MAX_REQUEST_TOKENS, check_id
from koi.jobs.lengths import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_TOKENS,
    LengthDist,
    solve_lognormal,
)
from koi.jobs.spec import BatchJob, JobSpec, OnlineJob, Slo
from koi.jobs.trace import load_trace, resolve_trace_path

_REQUIRED = object()
_INT_LIMIT = 2**63 - 1  # what the wire's int64 carries; a larger one does not fit a float

ONLINE_KEYS = ("kind", "id", "model", "arrival", "input_len", "output_len", "slo", "priority",
               "prefix_share", "submit_s", "end_s", "client_region", "pinned",
               "max_moves_per_hour")
BATCH_KEYS = ("kind", "id", "model", "num_requests", "total_output_tokens", "input_len",
              "output_len", "deadline_s", "submit_s", "priority", "pinned",
              "max_moves_per_hour")
SLO_KEYS = ("ttft_ms", "tpot_ms", "percentile")
ARRIVAL_KEYS = {
    "rate": ("kind", "rate_rps"),
    "diurnal": ("kind", "mean_rps", "peak_to_trough", "period_s", "phase_s"),
    "trace": ("kind", "trace", "time_scale", "loop"),
}
LENGTH_KEYS = {
    "fixed": ("kind", "mean", "min", "max"),
    "lognormal": ("kind", "mean", "sigma", "p50", "p99", "min", "max"),
    "empirical": ("kind", "values", "min", "max"),
}


@dataclass(frozen=True)
class Ctx:
    """Where in a document we are: builds field paths and file:line sources for errors."""

    source: str = "<dict>"
    base_dir: Path | None = None
    lines: dict[str, int] = field(default_factory=dict)
    prefix: str = ""
    catalog: Any = None

    def at(self, key: str) -> Ctx:
        return replace(self, prefix=self.path(key))

    def path(self, key: str = "") -> str:
        if not key:
            return self.prefix
        if not self.prefix or key.startswith("["):
            return f"{self.prefix}{key}"
        return f"{self.prefix}.{key}"

    def error(self, key: str, reason: str) -> InvalidSpecError:
        full = self.path(key)
        line = _line_for(full, self.lines)
        source = f"{self.source}:{line}" if line else self.source
        return InvalidSpecError(full or "<job>", reason, source=source)


def _line_for(path: str, lines: dict[str, int]) -> int | None:
    # The offending key's own line if known, else its nearest enclosing key's.
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return lines.get("")


# --- public API ------------------------------------------------------------------------

def parse_job(data: dict[str, Any], *, source: str = "<dict>", base_dir: Path | None = None,
              catalog: Any = None) -> JobSpec:
    """Validate one job dict and build it; ``catalog`` defaults to ``load_catalog()``."""
    return parse_job_in(Ctx(source, base_dir, catalog=catalog), data)


def parse_jobs(data: dict[str, Any] | list[Any], *, source: str = "<dict>",
               base_dir: Path | None = None, catalog: Any = None) -> list[JobSpec]:
    """A ``{jobs: [...]}`` dict, a bare list of jobs, or one job dict."""
    return parse_jobs_in(Ctx(source, base_dir, catalog=catalog), data)


def parse_jobs_in(ctx: Ctx, data: Any) -> list[JobSpec]:
    if isinstance(data, list):
        return _parse_items(replace(ctx, prefix="jobs"), data)
    if not (isinstance(data, dict) and "jobs" in data):
        return [parse_job_in(ctx, data)]
    check_keys(ctx, data, ("jobs",))
    items = data["jobs"]
    if not isinstance(items, list) or not items:
        raise ctx.error("jobs", f"must be a non-empty list of jobs (got {_show(items)})")
    return _parse_items(ctx.at("jobs"), items)


def _parse_items(ctx: Ctx, items: list[Any]) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        item_ctx = ctx.at(f"[{i}]")
        job = parse_job_in(item_ctx, item)
        if job.id in seen:
            raise item_ctx.error("id", f"duplicate job id {job.id!r}"
                                       f" (also {ctx.path(f'[{seen[job.id]}]')})")
        seen[job.id] = i
        jobs.append(job)
    return jobs


def parse_job_in(ctx: Ctx, data: Any) -> JobSpec:
    if not isinstance(data, dict):
        raise ctx.error("", f"a job must be a mapping of fields (got {_show(data)})")
    kind = data.get("kind", _infer_job_kind(data))
    if kind == "online":
        return _parse_online(ctx, data)
    if kind == "batch":
        return _parse_batch(ctx, data)
    if kind is None:
        raise ctx.error("kind", "missing; set kind: online (with arrival and slo) or"
                                " kind: batch (with deadline_s)")
    raise ctx.error("kind", f"{kind!r} is not one of online, batch")


def _infer_job_kind(data: dict[str, Any]) -> str | None:
    if "arrival" in data or "slo" in data:
        return "online"
    if {"deadline_s", "num_requests", "total_output_tokens"} & set(data):
        return "batch"
    return None


# --- jobs ------------------------------------------------------------------------------

def _parse_online(ctx: Ctx, data: dict[str, Any]) -> OnlineJob:
    check_keys(ctx, data, ONLINE_KEYS)
    job_id, model = valid_id(ctx, data), model_id(ctx, data)
    arrival = parse_arrival(ctx.at("arrival"), require(ctx, data, "arrival"))
    default_len = "trace" if arrival.kind == "trace" else _REQUIRED
    slo_data = require(ctx, data, "slo")
    return build(ctx, OnlineJob, id=job_id, model=model, arrival=arrival,
                 input_len=parse_length(ctx.at("input_len"), data.get("input_len", default_len),
                                        arrival, "input_tokens"),
                 output_len=parse_length(ctx.at("output_len"),
                                         data.get("output_len", default_len), arrival,
                                         "output_tokens"),
                 slo=parse_slo(ctx.at("slo"), slo_data),
                 priority=number(ctx, data, "priority", 5, integer=True),
                 prefix_share=number(ctx, data, "prefix_share", 0.0),
                 submit_s=number(ctx, data, "submit_s", 0.0),
                 end_s=number(ctx, data, "end_s", None),
                 client_region=string(ctx, data, "client_region", ""),
                 **_churn_fields(ctx, data))


def _parse_batch(ctx: Ctx, data: dict[str, Any]) -> BatchJob:
    check_keys(ctx, data, BATCH_KEYS)
    job_id, model = valid_id(ctx, data), model_id(ctx, data)
    input_len = parse_length(ctx.at("input_len"), data.get("input_len", _REQUIRED), None,
                             "input_tokens")
    output_len = parse_length(ctx.at("output_len"), data.get("output_len", _REQUIRED), None,
                              "output_tokens")
    has_n, has_tokens = "num_requests" in data, "total_output_tokens" in data
    if has_n and has_tokens:
        raise ctx.error("total_output_tokens", "give num_requests or total_output_tokens,"
                                               " not both")
    if not (has_n or has_tokens):
        raise ctx.error("num_requests", "missing; give num_requests or total_output_tokens")
    if has_n:
        n = number(ctx, data, "num_requests", integer=True)
    else:
        tokens = number(ctx, data, "total_output_tokens", integer=True)
        if tokens < 1:
            raise ctx.error("total_output_tokens", f"must be >= 1 (got {tokens})")
        n = BatchJob.requests_for_tokens(tokens, output_len)
    return build(ctx, BatchJob, id=job_id, model=model, num_requests=n, input_len=input_len,
                 output_len=output_len,
                 deadline_s=number(ctx, data, "deadline_s"),
                 submit_s=number(ctx, data, "submit_s", 0.0),
                 priority=number(ctx, data, "priority", 5, integer=True),
                 **_churn_fields(ctx, data))


def _churn_fields(ctx: Ctx, data: dict[str, Any]) -> dict[str, Any]:
    """The operator's churn controls (``pinned``, ``max_moves_per_hour``), either kind."""
    return {"pinned": boolean(ctx, data, "pinned", False),
            "max_moves_per_hour": number(ctx, data, "max_moves_per_hour", 0.0)}


def parse_slo(ctx: Ctx, data: Any) -> Slo:
    mapping(ctx, data)
    check_keys(ctx, data, SLO_KEYS)
    return build(ctx, Slo, ttft_ms=number(ctx, data, "ttft_ms"),
                 tpot_ms=number(ctx, data, "tpot_ms"),
                 percentile=number(ctx, data, "percentile", 95.0))


def valid_id(ctx: Ctx, data: dict[str, Any]) -> str:
    """The job id, checked first: it is cheap, and a bad one need not load a trace."""
    job_id = string(ctx, data, "id")
    try:
        check_id(job_id)
    except InvalidSpecError as e:
        raise ctx.error("id", e.reason) from None
    return job_id


def model_id(ctx: Ctx, data: dict[str, Any]) -> str:
    """The model id, checked against the catalog with a did-you-mean hint."""
    model = string(ctx, data, "model")
    catalog = ctx.catalog if ctx.catalog is not None else _default_catalog()
    known = catalog.models
    if model in known:
        return model
    try:
        catalog.model(model)  # the catalog may know aliases that are not dict keys
        return model
    except KeyError:
        pass
    close = difflib.get_close_matches(model, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"known models: {', '.join(sorted(known))}"
    raise ctx.error("model", f"unknown model {model!r}; {hint}")


def _default_catalog() -> Any:
    from koi.catalog import load_catalog  # lazy: the catalog loads data files

    return load_catalog()


# --- arrivals --------------------------------------------------------------------------

def parse_arrival(ctx: Ctx, data: Any) -> Arrival:
    mapping(ctx, data)
    kind = data.get("kind") or _infer_arrival_kind(data)
    if not isinstance(kind, str | None):  # a list or mapping is unhashable: say so
        raise ctx.error("kind", f"must be one of {', '.join(ARRIVAL_KEYS)} (got {_show(kind)})")
    if kind not in ARRIVAL_KEYS:
        if kind is None:
            raise ctx.error("kind", "cannot tell the arrival kind; set kind: rate (rate_rps),"
                                    " diurnal (mean_rps, peak_to_trough) or trace (trace)")
        raise ctx.error("kind", f"{kind!r} is not one of {', '.join(ARRIVAL_KEYS)}")
    check_keys(ctx, data, ARRIVAL_KEYS[kind])
    if kind == "rate":
        return build(ctx, Arrival, kind=kind, rate_rps=number(ctx, data, "rate_rps"))
    if kind == "diurnal":
        return build(ctx, Arrival, kind=kind, mean_rps=number(ctx, data, "mean_rps"),
                     peak_to_trough=number(ctx, data, "peak_to_trough", 1.0),
                     period_s=number(ctx, data, "period_s", 86400.0),
                     phase_s=number(ctx, data, "phase_s", 0.0))
    ref = string(ctx, data, "trace")
    try:
        trace = load_trace(resolve_trace_path(ref))
    except InvalidSpecError as e:
        detail = f"{e.source}: {e.field}: {e.reason}" if e.source else e.reason
        raise ctx.error("trace", detail) from None
    # The reference is kept as written: it names a file in the traces (or shared data)
    # directory wherever the job is decoded.
    return build(ctx, Arrival, kind=kind, trace_path=ref, trace=trace,
                 time_scale=number(ctx, data, "time_scale", 1.0),
                 loop=boolean(ctx, data, "loop", True))


def _infer_arrival_kind(data: dict[str, Any]) -> str | None:
    for key, kind in (("trace", "trace"), ("mean_rps", "diurnal"), ("rate_rps", "rate")):
        if key in data:
            return kind
    return None


# --- lengths ---------------------------------------------------------------------------

def parse_length(ctx: Ctx, data: Any, arrival: Arrival | None, column: str) -> LengthDist:
    """An int (fixed), 'trace' (the trace arrival's column) or a mapping."""
    if data is _REQUIRED:
        raise ctx.error("", "missing; give a token count, a mapping such as"
                            " {kind: lognormal, mean: 800, p99: 4000}, or 'trace'")
    if isinstance(data, int) and not isinstance(data, bool):
        try:
            return LengthDist.fixed(data)
        except InvalidSpecError as e:  # the user wrote a number, not a mapping with 'mean'
            raise ctx.error("", e.reason) from None
    if data == "trace":
        if arrival is None or arrival.kind != "trace" or arrival.trace is None:
            raise ctx.error("", "'trace' needs a trace arrival (arrival: {trace: file.csv})")
        return build_empirical(ctx, getattr(arrival.trace, column), from_trace=True)
    if not isinstance(data, dict):
        raise ctx.error("", f"must be an integer (fixed length), 'trace', or a mapping with"
                            f" kind fixed|lognormal|empirical (got {_show(data)})")
    kind = data.get("kind") or _infer_length_kind(data)
    if not isinstance(kind, str) or kind not in LENGTH_KEYS:
        raise ctx.error("kind", f"{kind!r} is not one of {', '.join(LENGTH_KEYS)}")
    check_keys(ctx, data, LENGTH_KEYS[kind])
    if kind == "empirical":
        return _parse_values(ctx, data)
    bounds = {"min": number(ctx, data, "min", DEFAULT_MIN_TOKENS, integer=True),
              "max": number(ctx, data, "max", DEFAULT_MAX_TOKENS, integer=True)}
    if kind == "fixed":
        return build(ctx, LengthDist, kind=kind, mean=number(ctx, data, "mean", integer=True),
                     **bounds)
    given = {k: number(ctx, data, k, None) for k in ("mean", "sigma", "p50", "p99")}
    try:
        mean, sigma = solve_lognormal(**given)
    except InvalidSpecError as e:
        raise ctx.error(e.field, e.reason) from None
    return build(ctx, LengthDist, kind=kind, mean=mean, sigma=sigma, **bounds)


def _infer_length_kind(data: dict[str, Any]) -> str:
    if "values" in data:
        return "empirical"
    if {"sigma", "p50", "p99"} & set(data):
        return "lognormal"
    return "fixed"


def _parse_values(ctx: Ctx, data: dict[str, Any]) -> LengthDist:
    values = data.get("values")
    if not isinstance(values, list) or not values:
        raise ctx.error("values", f"must be a non-empty list of token counts (got {_show(values)})")
    if len(values) > MAX_EMPIRICAL_VALUES:
        raise ctx.error("values", f"at most {MAX_EMPIRICAL_VALUES} values (got {len(values)})")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_REQUEST_TOKENS:
            raise ctx.error(f"values[{i}]", f"must be an integer in [1, {MAX_REQUEST_TOKENS}]"
                                            f" (got {_show(v)})")
    # max defaults to cover the values given, as for a trace column
    return build_empirical(ctx, values, min=number(ctx, data, "min", DEFAULT_MIN_TOKENS,
                                                   integer=True),
                           max=number(ctx, data, "max", None, integer=True))


def build_empirical(ctx: Ctx, values: Any, **kwargs: Any) -> LengthDist:
    try:
        return LengthDist.empirical(values, **kwargs)
    except InvalidSpecError as e:
        raise ctx.error(e.field, e.reason) from None


# --- field helpers ---------------------------------------------------------------------

def build(ctx: Ctx, cls: type, **kwargs: Any) -> Any:
    """Construct ``cls``; its own bound checks come back with the full path and line."""
    try:
        return cls(**kwargs)
    except InvalidSpecError as e:
        raise ctx.error(e.field, e.reason) from None


def mapping(ctx: Ctx, data: Any) -> None:
    if not isinstance(data, dict):
        raise ctx.error("", f"must be a mapping (got {_show(data)})")


def check_keys(ctx: Ctx, data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ctx.error(str(key), f"unknown key; {hint}allowed: {', '.join(allowed)}")


def require(ctx: Ctx, data: dict[str, Any], key: str) -> Any:
    if key not in data or data[key] is None:
        raise ctx.error(key, "missing (required)")
    return data[key]


def string(ctx: Ctx, data: dict[str, Any], key: str, default: Any = _REQUIRED) -> str:
    value = data.get(key, default)
    if value is _REQUIRED:
        raise ctx.error(key, "missing (required)")
    if not isinstance(value, str):
        raise ctx.error(key, f"must be a string (got {_show(value)})")
    return value


def boolean(ctx: Ctx, data: dict[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ctx.error(key, f"must be true or false (got {_show(value)})")
    return value


def number(ctx: Ctx, data: dict[str, Any], key: str, default: Any = _REQUIRED, *,
           integer: bool = False) -> Any:
    """A finite number (bools rejected: YAML's ``yes`` is not a rate)."""
    if key not in data:
        if default is _REQUIRED:
            raise ctx.error(key, "missing (required)")
        return default
    value = data[key]
    if value is None and default is None:
        return None  # an explicit null where null is the default (e.g. end_s)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ctx.error(key, f"must be a number (got {_show(value)})")
    if isinstance(value, int) and abs(value) > _INT_LIMIT:  # YAML ints are unbounded
        raise ctx.error(key, f"must be at most {_INT_LIMIT} in size (got {_show(value)})")
    if not math.isfinite(value):
        raise ctx.error(key, f"must be a finite number (got {value})")
    if integer:
        if value != int(value):
            raise ctx.error(key, f"must be an integer (got {value})")
        return int(value)
    return float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- job → dict ------------------------------------------------------------------------

def job_to_dict(job: JobSpec) -> dict[str, Any]:
    """The canonical dict (YAML) form of a job; ``parse_job`` of it gives back ``job``."""
    out: dict[str, Any] = {"kind": job.kind, "id": job.id, "model": job.model}
    if isinstance(job, OnlineJob):
        out["arrival"] = arrival_to_dict(job.arrival)
        out["input_len"] = length_to_dict(job.input_len)
        out["output_len"] = length_to_dict(job.output_len)
        out["slo"] = {"ttft_ms": job.slo.ttft_ms, "tpot_ms": job.slo.tpot_ms,
                      "percentile": job.slo.percentile}
        out.update(priority=job.priority, prefix_share=job.prefix_share,
                   submit_s=job.submit_s)
        if job.end_s is not None:
            out["end_s"] = job.end_s
        if job.client_region:
            out["client_region"] = job.client_region
        return _with_churn_fields(out, job)
    out.update(num_requests=job.num_requests, input_len=length_to_dict(job.input_len),
               output_len=length_to_dict(job.output_len), deadline_s=job.deadline_s,
               submit_s=job.submit_s, priority=job.priority)
    return _with_churn_fields(out, job)


def _with_churn_fields(out: dict[str, Any], job: JobSpec) -> dict[str, Any]:
    """``out`` with the churn controls a job sets (left out at their defaults)."""
    if job.pinned:
        out["pinned"] = True
    if job.max_moves_per_hour:
        out["max_moves_per_hour"] = job.max_moves_per_hour
    return out


def arrival_to_dict(arrival: Arrival) -> dict[str, Any]:
    if arrival.kind == "trace":
        return {"kind": "trace", "trace": arrival.trace_path, "time_scale": arrival.time_scale,
                "loop": arrival.loop}
    names = ARRIVAL_KEYS[arrival.kind][1:]
    return {"kind": arrival.kind, **{n: getattr(arrival, n) for n in names}}


def length_to_dict(dist: LengthDist) -> Any:
    default_bounds = dist.min == DEFAULT_MIN_TOKENS and dist.max == DEFAULT_MAX_TOKENS
    if dist.from_trace:
        return "trace"
    if dist.kind == "fixed" and default_bounds:
        return int(dist.mean)
    out: dict[str, Any] = {"kind": dist.kind}
    if dist.kind == "fixed":
        out["mean"] = int(dist.mean)
    elif dist.kind == "lognormal":
        out.update(mean=dist.mean, sigma=dist.sigma)
    else:
        out["values"] = list(dist.values)
    out.update(min=dist.min, max=dist.max)
    return out


