"""Real engines' Prometheus ``/metrics`` pages, read into Koi's telemetry.

A serving engine (vLLM, SGLang) exposes cumulative counters, gauges and cumulative
histograms. ``parse_page`` reads one replica's page into an ``EngineScrape`` (which
engine, which release layout, Koi's quantities by name); ``window`` turns two scrapes of
one replica into what happened between them (a ``ReplicaWindow``: counter increments,
histogram increments, gauges at the window's end); ``merge`` sums the replicas of one
deployment into the ``DeploymentTelemetry`` that telemetry-ingest consumes.

The metric names of each supported release layout are data (``TABLES``), each read from
that release's own metric definitions; ``koi.fleet.exposition`` renders the same tables
for the simulator. Pure: no HTTP, no sockets, no asyncio, no clock. Fetching pages is the
scrape adapter's job.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from scipy.special import ndtri

from koi.cluster import DeploymentTelemetry
from koi.errors import KoiError
from koi.fleet.engine_tables import (
    ABORT_REASONS,
    COUNTER_KEYS,
    GAUGE_KEYS,
    HISTOGRAM_KEYS,
    PREFERENCE,
    TABLES,
    VersionTable,
    table,
)
from koi.safe_text import printable

__all__ = [
    "MAX_PAGE_BYTES", "TABLES", "EngineScrape", "Histogram", "MetricsPageError",
    "ReplicaWindow", "VersionTable", "detect", "histogram_quantile", "merge", "parse_page",
    "quantile_estimate", "rebucket", "table", "window",
]

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""Largest page ``parse_page`` reads. A vLLM page with LoRA and speculative-decoding
families is a few hundred kB; anything near this is not an engine's page."""

MAX_SERIES = 20_000
"""Most samples one page may hold (a label-cardinality bomb is refused, not summed)."""

# Labels whose series repeat the same engine state (every tensor/pipeline/expert rank of
# an SGLang scheduler reports when --enable-metrics-for-all-schedulers is on): only the
# lowest rank is read. Series split by any other label (vLLM's data-parallel ``engine``,
# SGLang's ``dp_rank`` and ``is_streaming``) are different work and are summed.
_RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank")


class MetricsPageError(KoiError, ValueError):
    """A page that is not a readable engine ``/metrics`` page (too large, not the
    Prometheus text format, no engine metrics, or an implausible value)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram as Prometheus keeps it: ``cumulative[i]`` observations
    ≤ ``bounds[i]``; the last entry (``+Inf``) is the count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]   # len(bounds) + 1
    sum: float

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def per_bucket(self) -> tuple[float, ...]:
        """Observations per bucket, the last one above ``bounds[-1]``."""
        c = self.cumulative
        return (c[0], *(c[i] - c[i - 1] for i in range(1, len(c))))

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram(self.bounds, tuple(max(a - b, 0.0) for a, b in
                                            zip(self.cumulative, earlier.cumulative,
                                                strict=True)),
                         max(self.sum - earlier.sum, 0.0))

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            shared = tuple(b for b in self.bounds if b in set(other.bounds))
            return rebucket_exact(self, shared).plus(rebucket_exact(other, shared))
        return Histogram(self.bounds, tuple(a + b for a, b in
                                            zip(self.cumulative, other.cumulative,
                                                strict=True)), self.sum + other.sum)


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """One replica's page, in Koi's terms.

    ``counters`` (cumulative since the engine started): ``prompt_tokens``,
    ``generation_tokens``, ``requests_finished``, ``requests_aborted``, ``preemptions``;
    ``gauges`` (now): ``running``, ``waiting``, ``kv_usage``; ``histograms``: ``ttft``,
    ``tpot``, ``e2e``. A quantity the page did not carry is absent and named in
    ``missing``. ``version`` is the key of the ``TABLES`` layout the page matches."""

    engine: str
    version: str
    counters: Mapping[str, float]
    gauges: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    model_names: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaWindow:
    """What one replica did between two scrapes: counter and histogram increments, and
    its gauges at the window's end. ``restarted``: a counter went down (the engine
    restarted, or its version or bucket layout changed), so the increments are the
    current values. ``arrived``: the estimate ``finished + aborted + Δ(running +
    waiting)``, at least 0 (engines count no arrivals)."""

    tick: int
    deployment_id: str
    job_id: str
    window_s: float
    engine: str
    version: str
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]
    gauges: Mapping[str, float]
    arrived: float
    restarted: bool = False
    missing: tuple[str, ...] = field(default=())


# --- reading a page ---------------------------------------------------------------------

def _samples(page: str | bytes, max_bytes: int) -> list[tuple[str, dict[str, str], float]]:
    if isinstance(page, bytes):
        if len(page) > max_bytes:
            raise MetricsPageError(f"page of {len(page)} bytes, over the {max_bytes} limit")
        try:
            page = page.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MetricsPageError(f"page is not UTF-8 text: {e.reason}") from None
    elif len(page) > max_bytes or len(page.encode("utf-8", "surrogatepass")) > max_bytes:
        raise MetricsPageError(f"page over the {max_bytes}-byte limit")
    out: list[tuple[str, dict[str, str], float]] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    try:
        for family in text_string_to_metric_families(page):
            for s in family.samples:
                if not s.name.startswith(("vllm:", "sglang:")):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in seen:  # Prometheus refuses these; summing would double count
                    raise MetricsPageError(f"duplicate series {printable(s.name, 100)}")
                seen.add(key)
                out.append((s.name, dict(s.labels), float(s.value)))
                if len(out) > MAX_SERIES:
                    raise MetricsPageError(f"more than {MAX_SERIES} engine series")
    except MetricsPageError:
        raise
    except Exception as e:  # the parser raises bare ValueError/IndexError on garbage
        raise MetricsPageError("not Prometheus text exposition: "
                               f"{printable(f'{type(e).__name__}: {e}', 200)}") from None
    return out


def detect(names: Iterable[str], labels: Iterable[str] = ()) -> VersionTable:
    """The release layout a page matches, from the metric names on it (sample names,
    ``_total``/``_bucket``/``_count`` included) and the label names of its series."""
    names, labels = set(names), set(labels)
    engines = {n.split(":", 1)[0] for n in names if n.startswith(("vllm:", "sglang:"))}
    if len(engines) != 1:
        raise MetricsPageError("no vLLM or SGLang metrics on the page" if not engines else
                               "page mixes vLLM and SGLang metrics")
    engine = engines.pop()

    def has(name: str) -> bool:
        return any(n in names for n in (name, f"{name}_count", f"{name}_bucket"))

    for t in TABLES:
        if t.engine != engine:
            continue
        if t.engine_label is not None and ("engine" in labels) != t.engine_label:
            continue
        if all(has(n) for n in t.requires) and not any(has(n) for n in t.excludes):
            return t
    raise MetricsPageError(f"{engine} page matches no known release layout")  # unreachable


def _keep(series: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """Drop duplicate per-rank series (keep the lowest rank) and SGLang's per-priority
    series where the aggregate (``priority=""``) is there."""
    for label in _RANK_LABELS:
        ranks = [lb[label] for lb, _ in series if label in lb]
        if ranks:
            low = min(ranks, key=lambda r: (len(r), r))
            series = [(lb, v) for lb, v in series if lb.get(label, low) == low]
    if any(lb.get("priority") == "" for lb, _ in series):
        series = [(lb, v) for lb, v in series if lb.get("priority", "") == ""]
    return series


def _finite(name: str, v: float, *, nonneg: bool) -> float:
    if not math.isfinite(v) or (nonneg and v < 0):
        raise MetricsPageError(f"{name}: implausible value {v!r}")
    return v


def _histogram(base: str, by_name: Mapping[str, list[tuple[dict[str, str], float]]]
               ) -> Histogram | None:
    buckets = _keep(by_name.get(f"{base}_bucket", []))
    if not buckets:
        return None
    per_series: dict[tuple, dict[float, float]] = {}
    for lb, v in buckets:
        try:
            le = float(lb["le"])
        except (KeyError, ValueError):
            raise MetricsPageError(f"{base}_bucket without a numeric le label") from None
        if math.isnan(le):
            raise MetricsPageError(f"{base}_bucket with le=NaN")
        key = tuple(sorted((k, x) for k, x in lb.items() if k != "le"))
        per_series.setdefault(key, {})[le] = _finite(f"{base}_bucket", v, nonneg=True)
    total: Histogram | None = None
    for key, cum in per_series.items():
        if math.inf not in cum:
            raise MetricsPageError(f"{base}: no +Inf bucket")
        bounds = tuple(sorted(b for b in cum if b != math.inf))
        values = (*(cum[b] for b in bounds), cum[math.inf])
        if any(b < a for a, b in itertools.pairwise(values)):
            raise MetricsPageError(f"{base}: cumulative buckets decrease")
        sums = [v for lb, v in _keep(by_name.get(f"{base}_sum", []))
                if tuple(sorted(lb.items())) == key]
        s = _finite(f"{base}_sum", sums[0], nonneg=True) if sums else 0.0
        h = Histogram(bounds, values, s)
        total = h if total is None else total.plus(h)
    return total


def parse_page(page: str | bytes, *, max_bytes: int = MAX_PAGE_BYTES) -> EngineScrape:
    """One replica's ``/metrics`` page as an ``EngineScrape``.

    Only the series Koi reads are checked: a non-finite or negative counter or histogram
    value, a negative gauge, or a histogram whose cumulative buckets decrease raises
    ``MetricsPageError``; other families (``-1`` hit rates, LoRA info…) are ignored."""
    samples = _samples(page, max_bytes)
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))
    t = detect(by_name, (k for _, lb, _ in samples for k in lb))
    pref = PREFERENCE[t.engine]
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    for key in COUNTER_KEYS:
        for name in pref.get(key, ()):
            series = _keep(by_name.get(name, []))
            if not series:
                continue
            if key in ("requests_finished", "requests_aborted") and name.endswith(
                    "request_success_total"):
                aborted = key == "requests_aborted"
                series = [(lb, v) for lb, v in series
                          if (lb.get("finished_reason") in ABORT_REASONS) == aborted]
            counters[key] = sum(_finite(name, v, nonneg=True) for _, v in series)
            break
    for key in HISTOGRAM_KEYS:
        for base in pref.get(key, ()):
            h = _histogram(base, by_name)
            if h is not None:
                hists[key] = h
                break
    if "requests_finished" not in counters and "e2e" in hists:
        counters["requests_finished"] = hists["e2e"].count  # SGLang before 0.4.2
    for key in GAUGE_KEYS:
        for name in pref.get(key, ()):
            series = _keep(by_name.get(name, []))
            if series:
                vals = [_finite(name, v, nonneg=True) for _, v in series]
                # data-parallel engines of one server: counts add, a usage averages
                gauges[key] = sum(vals) / len(vals) if key == "kv_usage" else sum(vals)
                break
    models = sorted({lb["model_name"] for _, lb, _ in samples if "model_name" in lb})
    present = set(counters) | set(gauges) | set(hists)
    missing = tuple(k for k in (*COUNTER_KEYS, *GAUGE_KEYS, *HISTOGRAM_KEYS)
                    if k not in present)
    return EngineScrape(t.engine, t.key, counters, gauges, hists, tuple(models), missing)


# --- two scrapes, many replicas ------------------------------------------------------------

def window(prev: EngineScrape | None, cur: EngineScrape, *, tick: int, deployment_id: str,
           job_id: str, window_s: float) -> ReplicaWindow:
    """What one replica did between ``prev`` and ``cur`` (``None``: its first scrape, all
    of ``cur`` counts). A counter that went down means the engine restarted: every
    increment is then the current value, as Prometheus's ``increase()`` assumes."""
    restarted = prev is None or prev.engine != cur.engine or prev.version != cur.version
    if prev is not None and not restarted:
        restarted = any(cur.counters[k] < prev.counters[k]
                        for k in cur.counters if k in prev.counters)
        for k, h in cur.histograms.items():
            p = prev.histograms.get(k)
            if p is not None and (p.bounds != h.bounds or h.count < p.count or h.sum < p.sum):
                restarted = True
    base = None if restarted else prev
    counters = {k: v - (base.counters.get(k, 0.0) if base else 0.0)
                for k, v in cur.counters.items()}
    hists = {k: h.minus(base.histograms[k]) if base and k in base.histograms else h
             for k, h in cur.histograms.items()}
    queued = cur.gauges.get("running", 0.0) + cur.gauges.get("waiting", 0.0)
    before = (base.gauges.get("running", 0.0) + base.gauges.get("waiting", 0.0)
              if base else 0.0)
    arrived = max(counters.get("requests_finished", 0.0)
                  + counters.get("requests_aborted", 0.0) + queued - before, 0.0)
    return ReplicaWindow(tick, deployment_id, job_id, window_s, cur.engine, cur.version,
                         counters, hists, dict(cur.gauges), arrived, restarted, cur.missing)


def histogram_quantile(q: float, h: Histogram) -> float:
    """The ``q`` quantile by linear interpolation within its bucket, as Prometheus's
    ``histogram_quantile`` computes it: a rank in the ``+Inf`` bucket gives the largest
    finite bound; the first bucket starts at 0. An empty histogram gives 0.0 (Koi's
    convention for "nothing finished"), one with no finite bound its mean."""
    total = h.count
    if total <= 0:
        return 0.0
    if not h.bounds:
        return h.sum / total
    rank = q * total
    c = h.cumulative
    b = _rank_bucket(h, rank)
    if b == len(h.bounds):
        return h.bounds[-1]
    if b == 0 and h.bounds[0] <= 0:
        return h.bounds[0]
    start = h.bounds[b - 1] if b > 0 else 0.0
    below = c[b - 1] if b > 0 else 0.0
    inside = c[b] - below
    if inside <= 0:
        return h.bounds[b]
    return start + (h.bounds[b] - start) * ((rank - below) / inside)


def quantile_estimate(q: float, h: Histogram) -> float:
    """The ``q`` quantile of what ``h`` counted, from its buckets *and* its mean.

    Prometheus's linear interpolation (``histogram_quantile``) spreads a bucket's
    requests evenly over it; latencies are right-skewed, so in the tail, where a p95
    falls, it reads high: by a median 15 % (TTFT) and 8 % (TPOT) on the simulated
    fleet's pages of hetero-3h, 18 % on a generated one (docs/FLEETS.md). Here a log-normal
    is fitted to the histogram: its mean is the histogram's (``sum / count``, exact on
    every engine) and its σ the least-squares fit of ``log(bound) = μ + σ·Φ⁻¹(F(bound))``
    over the bounds the cumulative fraction ``F`` is strictly inside (0, 1) at. Its ``q``
    quantile is kept inside the bucket the rank falls in, which the counts prove holds
    it (or above the largest bound, for a rank in ``+Inf``). Without a bound inside (all
    in one bucket) or a positive mean, the answer is ``histogram_quantile``'s."""
    total = h.count
    if total <= 0 or not h.bounds or h.sum <= 0 or not 0.0 < q < 1.0:
        return histogram_quantile(q, h)
    c = h.cumulative
    zs = [(float(ndtri(c[i] / total)), b) for i, b in enumerate(h.bounds)
          if 0.0 < c[i] < total and b > 0]
    pts = [(z, math.log(b)) for z, b in zs if math.isfinite(z)]   # a fraction can round
    # to 0 or 1 (a subnormal count), whose probit is infinite
    if not pts:
        return histogram_quantile(q, h)
    log_mean = math.log(h.sum / total)
    sigma = _lognormal_sigma(pts, log_mean)
    value = math.exp(log_mean - sigma * sigma / 2 + sigma * float(ndtri(q)))
    b = _rank_bucket(h, q * total)
    lo = h.bounds[b - 1] if b > 0 else 0.0
    hi = h.bounds[b] if b < len(h.bounds) else math.inf
    return min(max(value, lo), hi)


def _rank_bucket(h: Histogram, rank: float) -> int:
    """The bucket whose cumulative count first reaches ``rank`` (``len(bounds)``: +Inf)."""
    c = h.cumulative
    return next((i for i in range(len(h.bounds)) if c[i] >= rank), len(h.bounds))


def _lognormal_sigma(pts: Sequence[tuple[float, float]], log_mean: float) -> float:
    """σ > 0 minimising Σ (x − μ(σ) − σ·z)² with μ(σ) = log_mean − σ²/2 over the points
    (z, x): the roots of its derivative, a cubic, and the edges of the range."""
    n = len(pts)
    sz = sum(z for z, _ in pts)
    szz = sum(z * z for z, _ in pts)
    sa = sum(x - log_mean for _, x in pts)
    saz = sum((x - log_mean) * z for z, x in pts)

    def err(sig: float) -> float:
        return sum((x - log_mean + sig * sig / 2 - sig * z) ** 2 for z, x in pts)

    # d err / dσ ∝ (n/2)σ³ − (3/2)(Σz)σ² + (Σa + Σz²)σ − Σaz
    roots = np.roots([n / 2.0, -1.5 * sz, sa + szz, -saz])
    candidates = [float(r.real) for r in roots if abs(r.imag) < 1e-9 and
                  _SIGMA_MIN < r.real < _SIGMA_MAX] + [_SIGMA_MIN, _SIGMA_MAX]
    return min(candidates, key=lambda sig: (err(sig), sig))


_SIGMA_MIN, _SIGMA_MAX = 1e-3, 5.0   # a log-normal's σ: from a near-constant to 5 decades


def rebucket_exact(h: Histogram, bounds: Sequence[float]) -> Histogram:
    """``h`` on a subset of its own bounds (exact: cumulative counts are only kept)."""
    at = dict(zip(h.bounds, h.cumulative, strict=False))
    return Histogram(tuple(bounds), (*(at[b] for b in bounds), h.count), h.sum)


def rebucket(h: Histogram, bounds: Sequence[float]) -> Histogram:
    """``h`` on other bounds: the cumulative count at each new bound interpolated
    linearly within the old bucket it falls in (exact where the new bound is an old one;
    above the old largest bound nothing more is known, so the count stays there)."""
    out = []
    for b in bounds:
        i = next((j for j, x in enumerate(h.bounds) if x >= b), None)
        if i is None:
            out.append(h.cumulative[len(h.bounds) - 1] if h.bounds else 0.0)
        elif h.bounds[i] == b:
            out.append(h.cumulative[i])
        else:
            lo, below = (h.bounds[i - 1], h.cumulative[i - 1]) if i > 0 else (0.0, 0.0)
            frac = max(b - lo, 0.0) / (h.bounds[i] - lo)
            out.append(below + (h.cumulative[i] - below) * frac)
    return Histogram(tuple(bounds), (*out, h.count), h.sum)


def merge(windows: Sequence[ReplicaWindow], *, gpu_seconds: float = 0.0,
          cost_usd: float = 0.0, replica_preemptions: int = 0,
          requests_arrived: float | None = None,
          requests_dropped: float | None = None) -> DeploymentTelemetry:
    """One deployment's telemetry from the windows of its replicas (one tick).

    Counters and histograms are summed (histograms bucket-wise; replicas with different
    bounds are summed on the bounds they share), ``running``/``waiting`` summed (gauges
    at the window's end, not means over it), KV usage averaged over replicas. p95s by
    ``quantile_estimate`` (buckets and mean), means from ``_sum``/``_count``. Engines do
    not report GPU time, cost or spot reclaims: ``gpu_seconds``, ``cost_usd`` and
    ``replica_preemptions`` are the caller's (0 when it has none). ``requests_dropped``
    is the engines' aborted requests (vLLM ``finished_reason`` abort/error, SGLang
    ``num_aborted_requests``; 0 for layouts without one) unless the caller knows better
    (a router's count); ``requests_arrived`` defaults to the replicas' ``arrived``
    estimates summed."""
    if not windows:
        raise ValueError("merge needs at least one replica window")
    w0 = windows[0]
    for w in windows[1:]:
        if (w.tick, w.deployment_id, w.job_id, w.window_s) != (
                w0.tick, w0.deployment_id, w0.job_id, w0.window_s):
            raise ValueError(f"windows of different ticks or deployments: "
                             f"{w0.deployment_id}@{w0.tick} and {w.deployment_id}@{w.tick}")

    def total(key: str) -> float:
        return sum(w.counters.get(key, 0.0) for w in windows)

    def hist(key: str) -> Histogram:
        hs = [w.histograms[key] for w in windows if key in w.histograms]
        if not hs:
            return Histogram((), (0.0,), 0.0)
        acc = hs[0]
        for h in hs[1:]:
            acc = acc.plus(h)
        return acc

    ttft, tpot = hist("ttft"), hist("tpot")
    running = sum(w.gauges.get("running", 0.0) for w in windows)   # gauges: the end
    waiting = sum(w.gauges.get("waiting", 0.0) for w in windows)
    kv = [w.gauges["kv_usage"] for w in windows if "kv_usage" in w.gauges]
    gen = total("generation_tokens")
    return DeploymentTelemetry(
        tick=w0.tick, deployment_id=w0.deployment_id, job_id=w0.job_id,
        window_s=w0.window_s,
        requests_arrived=(sum(w.arrived for w in windows) if requests_arrived is None
                          else requests_arrived),
        requests_finished=total("requests_finished"),
        requests_dropped=(total("requests_aborted") if requests_dropped is None
                          else requests_dropped),
        prompt_tokens=total("prompt_tokens"), generation_tokens=gen,
        ttft_bucket_bounds_s=ttft.bounds, ttft_bucket_counts=ttft.per_bucket(),
        tpot_bucket_bounds_s=tpot.bounds, tpot_bucket_counts=tpot.per_bucket(),
        ttft_mean_s=ttft.sum / ttft.count if ttft.count > 0 else 0.0,
        ttft_p95_s=quantile_estimate(0.95, ttft),
        tpot_mean_s=tpot.sum / tpot.count if tpot.count > 0 else 0.0,
        tpot_p95_s=quantile_estimate(0.95, tpot),
        kv_cache_usage=sum(kv) / len(kv) if kv else 0.0,
        num_running=running, num_waiting=waiting,
        num_preemptions=total("preemptions"), replica_preemptions=replica_preemptions,
        output_tok_s=gen / w0.window_s if w0.window_s > 0 else 0.0,
        gpu_seconds=gpu_seconds, cost_usd=cost_usd,
        num_running_end=running, num_waiting_end=waiting)
