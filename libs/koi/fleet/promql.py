"""Engine telemetry from a Prometheus server that scrapes the engines: the pure part.

Where a Prometheus already scrapes the fleet, Koi can ask it instead of reading the
pages itself. ``queries(window_s)`` builds the instant queries (``/api/v1/query``) for
one window, every name any supported release layout uses (``koi.fleet.engine_tables``
``PREFERENCE``), each summed per Koi deployment:

- counters: ``sum by (koi_deployment, koi_job) (increase(NAME[W]))``, vLLM's
  ``request_success_total`` also by ``finished_reason``;
- histograms: ``increase`` of each ``_bucket`` series summed by ``le``, and of ``_sum``;
- gauges: their value now and ``offset W`` ago (running and waiting summed, KV usage
  averaged over the replicas).

Series repeated per SGLang scheduler rank are first collapsed (``max without`` the rank
labels), SGLang's per-priority series are left out (``priority=""`` also matches
series without the label), as ``koi.fleet.engine_metrics.parse_page`` does for a page.
``telemetry(answers, ...)`` reads the JSON answers back into one ``DeploymentTelemetry``
per deployment of the snapshot, through the same ``merge`` as scraped pages.

The targets must carry Koi's labels (``koi.fleet.scrape``: ``koi_deployment``,
``koi_job``), as the simulator's ``/targets`` do and relabelling does on a real fleet.
Prometheus's ``increase`` extrapolates to the window's edges from the samples inside
it, so counters come back within about a scrape interval's share of the window (docs/
FLEETS.md), not exactly; a series with fewer than two samples in the window (a new
replica) has no increase: it is not read, as a first scrape is a baseline.

No HTTP here: the service sends the queries and passes the parsed JSON in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry
from koi.errors import KoiError
from koi.fleet.engine_metrics import Histogram, ReplicaWindow, merge
from koi.fleet.engine_tables import ABORT_REASONS, PREFERENCE
from koi.fleet.scrape import LABEL_DEPLOYMENT, LABEL_JOB, cost_of
from koi.safe_text import printable

__all__ = ["PromQLError", "Query", "queries", "telemetry"]

_RANKS = "tp_rank, pp_rank, moe_ep_rank, attn_tp_rank, attn_cp_rank"
_BY = f"{LABEL_DEPLOYMENT}, {LABEL_JOB}"
_COUNTERS = ("prompt_tokens", "generation_tokens", "requests_finished", "requests_aborted",
             "preemptions")
_GAUGES = ("running", "waiting", "kv_usage")
_HISTOGRAMS = ("ttft", "tpot", "e2e")
_SUCCESS = "request_success_total"


class PromQLError(KoiError, ValueError):
    """An answer from Prometheus that is not a successful instant vector."""


@dataclass(frozen=True, slots=True)
class Query:
    """One instant query: ``key`` names what it reads (``counter:<name>``,
    ``bucket:<base>``, ``sum:<base>``, ``gauge:<name>``, ``before:<name>``)."""

    key: str
    promql: str


def _duration(window_s: float) -> str:
    ms = round(window_s * 1000)
    if ms <= 0:
        raise ValueError(f"window of {window_s!r} s: must be positive")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _names(key: str) -> list[str]:
    """Every exposed name that feeds a Koi quantity, over both engines, in order."""
    out: list[str] = []
    for engine in ("vllm", "sglang"):
        for name in PREFERENCE[engine].get(key, ()):
            if name not in out:
                out.append(name)
    return out


def queries(window_s: float) -> list[Query]:
    """The instant queries for the window of ``window_s`` seconds ending at the query's
    evaluation time."""
    w = _duration(window_s)

    def collapsed(expr: str) -> str:
        return f"max without ({_RANKS}) ({expr})"

    def increase(series: str) -> str:
        return collapsed("increase(" + series + '{priority=""}[' + w + "])")

    out: list[Query] = []
    for key in _COUNTERS:
        for name in _names(key):
            if any(q.key == f"counter:{name}" for q in out):
                continue  # vLLM's request_success feeds finished and aborted
            by = f"{_BY}, finished_reason" if name.endswith(_SUCCESS) else _BY
            out.append(Query(f"counter:{name}", f"sum by ({by}) ({increase(name)})"))
    for key in _HISTOGRAMS:
        for base in _names(key):
            out.append(Query(f"bucket:{base}",
                             f"sum by ({_BY}, le) ({increase(base + '_bucket')})"))
            out.append(Query(f"sum:{base}", f"sum by ({_BY}) ({increase(base + '_sum')})"))
    for key in _GAUGES:
        agg = "avg" if key == "kv_usage" else "sum"
        for name in _names(key):
            sel = name + '{priority=""}'
            out.append(Query(f"gauge:{name}", f"{agg} by ({_BY}) ({collapsed(sel)})"))
            if key != "kv_usage":
                out.append(Query(f"before:{name}", f"{agg} by ({_BY}) "
                                                   f"({collapsed(sel + ' offset ' + w)})"))
    return out


# --- answers ----------------------------------------------------------------------------

Sample = tuple[dict[str, str], float]


def _vector(key: str, answer: object) -> list[Sample]:
    """An instant-vector answer's samples (label set, value); NaN and ±Inf are dropped
    (an ``avg`` of nothing, a ``rate`` of one sample)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        err = answer.get("error", "") if isinstance(answer, dict) else ""
        raise PromQLError(f"{key}: query failed: {printable(str(err), 200)}")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" \
            or not isinstance(data.get("result"), list):
        raise PromQLError(f"{key}: the answer is not an instant vector")
    out = []
    for r in data["result"]:
        try:
            labels = {str(k): str(v) for k, v in r["metric"].items()}
            value = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise PromQLError(f"{key}: a malformed sample") from None
        if math.isfinite(value):
            out.append((labels, value))
    return out


@dataclass
class _Read:
    """What the answers say about one deployment, by exposed name."""

    job_id: str = ""
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # → reason → value
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # base → le → value
    sums: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)


def _collect(answers: Mapping[str, object]) -> dict[str, _Read]:
    reads: dict[str, _Read] = {}
    for key, answer in answers.items():
        kind, _, name = key.partition(":")
        for labels, value in _vector(key, answer):
            dep = labels.get(LABEL_DEPLOYMENT, "")
            if not dep:
                continue
            r = reads.setdefault(dep, _Read())
            r.job_id = r.job_id or labels.get(LABEL_JOB, "")
            if kind == "counter":
                by = r.counters.setdefault(name, {})
                reason = labels.get("finished_reason", "")
                by[reason] = by.get(reason, 0.0) + max(value, 0.0)
            elif kind == "bucket":
                try:
                    le = float(labels["le"])
                except (KeyError, ValueError):
                    raise PromQLError(f"{key}: a bucket without a numeric le") from None
                r.buckets.setdefault(name, {})[le] = max(value, 0.0)
            elif kind == "sum":
                r.sums[name] = max(value, 0.0)
            elif kind == "gauge":
                r.gauges[name] = max(value, 0.0)
            elif kind == "before":
                r.before[name] = max(value, 0.0)
    return reads


def _histogram(buckets: Mapping[float, float], total: float) -> Histogram | None:
    if math.inf not in buckets:
        return None
    bounds = tuple(sorted(b for b in buckets if b != math.inf))
    cum, acc = [], 0.0
    for b in (*bounds, math.inf):
        acc = max(acc, buckets[b])  # each bucket is extrapolated on its own: keep monotone
        cum.append(acc)
    return Histogram(bounds, tuple(cum), total)


def _engine(r: _Read) -> str:
    seen = [*r.counters, *r.buckets, *r.gauges]
    n_vllm = sum(n.startswith("vllm:") for n in seen)
    n_sglang = sum(n.startswith("sglang:") for n in seen)
    return "sglang" if n_sglang > n_vllm else "vllm"


def _window(r: _Read, *, tick: int, deployment_id: str, job_id: str,
            window_s: float) -> ReplicaWindow:
    """One deployment's answers as a single window (replicas already summed)."""
    engine = _engine(r)
    pref = PREFERENCE[engine]
    counters: dict[str, float] = {}
    for key in _COUNTERS:
        for name in pref.get(key, ()):
            if name not in r.counters:
                continue
            by = r.counters[name]
            if name.endswith(_SUCCESS):
                aborted = key == "requests_aborted"
                counters[key] = sum(v for reason, v in by.items()
                                    if (reason in ABORT_REASONS) == aborted)
            else:
                counters[key] = sum(by.values())
            break
    hists: dict[str, Histogram] = {}
    for key in _HISTOGRAMS:
        for base in pref.get(key, ()):
            h = _histogram(r.buckets.get(base, {}), r.sums.get(base, 0.0))
            if h is not None:
                hists[key] = h
                break
    if "requests_finished" not in counters and "e2e" in hists:
        counters["requests_finished"] = hists["e2e"].count  # SGLang before 0.4.2
    gauges: dict[str, float] = {}
    before = 0.0
    for key in _GAUGES:
        for name in pref.get(key, ()):
            if name in r.gauges:
                gauges[key] = r.gauges[name]
                before += r.before.get(name, 0.0) if key != "kv_usage" else 0.0
                break
    queued = gauges.get("running", 0.0) + gauges.get("waiting", 0.0)
    arrived = max(counters.get("requests_finished", 0.0)
                  + counters.get("requests_aborted", 0.0) + queued - before, 0.0)
    missing = tuple(k for k in (*_COUNTERS, *_GAUGES, *_HISTOGRAMS)
                    if k not in counters and k not in gauges and k not in hists)
    return ReplicaWindow(tick, deployment_id, job_id, window_s, engine, "prometheus",
                         counters, hists, gauges, arrived, False, missing)


def telemetry(answers: Mapping[str, object], snapshot: ClusterSnapshot, window_s: float,
              catalog: Catalog) -> list[DeploymentTelemetry]:
    """One ``DeploymentTelemetry`` per deployment of ``snapshot`` the answers (by
    ``Query.key``, each the parsed JSON of ``/api/v1/query``) have any counter or
    histogram for, in the snapshot's order; GPU-seconds and cost from the snapshot.
    Series of deployments the snapshot does not hold (gone, or another run's) are not
    read. Raises ``PromQLError`` for an answer that is not a successful vector."""
    reads = _collect(answers)
    out = []
    for dep in snapshot.deployments:
        r = reads.get(dep.id)
        if r is None or not (r.counters or r.buckets):
            continue
        w = _window(r, tick=max(snapshot.tick - 1, 0), deployment_id=dep.id,
                    job_id=r.job_id or dep.job_id, window_s=window_s)
        gpu_s, cost = cost_of(snapshot, dep.id, window_s, catalog)
        out.append(merge([w], gpu_seconds=gpu_s, cost_usd=cost))
    return out
