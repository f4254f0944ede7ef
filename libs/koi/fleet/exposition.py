"""The simulator's replicas as vLLM/SGLang ``/metrics`` pages.

A real engine keeps cumulative counters and histograms; the simulator produces one
``DeploymentTelemetry`` per deployment per tick. ``ReplicaCounters`` is one simulated
replica's engine state: ``add`` accumulates its share of a tick, and ``render`` writes it
as the page the chosen release would serve (its names, HELP and TYPE lines, label names,
bucket bounds; labels sorted and values formatted as ``prometheus_client`` writes them;
no ``_created`` series). Reading the pages back (``koi.fleet.engine_metrics``) gives the
tick again: counters exactly (up to float rounding), p95s up to the release's buckets.

Pure: no HTTP server here (the simulator's adapter serves the text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from koi.cluster import DeploymentTelemetry
from koi.fleet.engine_metrics import Histogram, rebucket
from koi.fleet.engine_tables import Family, VersionTable, table

# label values a single-replica server of each engine shows
_LABEL_VALUES = {"engine": "0", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                 "moe_ep_rank": "0", "is_streaming": "true"}


def _empty() -> Histogram:
    return Histogram((), (0.0,), 0.0)


@dataclass(slots=True)
class ReplicaCounters:
    """One simulated replica's engine state: counters and histograms cumulative since
    the replica started, gauges as of the last tick. Histograms are kept on the bounds
    of the first telemetry added (the simulator's); ``render`` moves them onto the
    release's own."""

    model_name: str
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_finished: float = 0.0
    requests_aborted: float = 0.0
    preemptions: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    gen_throughput: float = 0.0
    ttft: Histogram = field(default_factory=_empty)
    tpot: Histogram = field(default_factory=_empty)
    e2e: Histogram = field(default_factory=_empty)

    def add(self, t: DeploymentTelemetry, share: float = 1.0) -> None:
        """Accumulate ``share`` of one tick of a deployment (``1/ready replicas`` when
        the tick is divided evenly). Running and waiting show the queue at the tick's
        end, scaled by ``share``, as an engine's gauges show it when scraped (so a
        reader's arrivals, finished + aborted + Δ queue, are the tick's own); KV usage
        shows the tick's mean, as is."""
        self.prompt_tokens += share * t.prompt_tokens
        self.generation_tokens += share * t.generation_tokens
        self.requests_finished += share * t.requests_finished
        self.requests_aborted += share * t.requests_dropped
        self.preemptions += share * t.num_preemptions
        self.running = share * t.num_running_end
        self.waiting = share * t.num_waiting_end
        self.kv_usage = t.kv_cache_usage
        self.gen_throughput = share * t.output_tok_s
        ttft = _tick_histogram(t.ttft_bucket_bounds_s, t.ttft_bucket_counts, t.ttft_mean_s,
                               share)
        tpot = _tick_histogram(t.tpot_bucket_bounds_s, t.tpot_bucket_counts, t.tpot_mean_s,
                               share)
        self.ttft = _accumulate(self.ttft, ttft)
        self.tpot = _accumulate(self.tpot, tpot)
        self.e2e = _accumulate(self.e2e, _e2e_estimate(t, ttft, tpot))


def _tick_histogram(bounds: Sequence[float], counts: Sequence[float], mean: float,
                    share: float) -> Histogram:
    cum, acc = [], 0.0
    for c in counts:
        acc += share * c
        cum.append(acc)
    return Histogram(tuple(bounds), tuple(cum) if cum else (0.0,), mean * acc)


def _accumulate(total: Histogram, tick: Histogram) -> Histogram:
    if total.count == 0 and total.sum == 0 and total.bounds != tick.bounds:
        return tick  # the first tick fixes the bounds
    return total.plus(rebucket(tick, total.bounds) if tick.bounds != total.bounds else tick)


def _e2e_estimate(t: DeploymentTelemetry, ttft: Histogram, tpot: Histogram) -> Histogram:
    """The simulator's telemetry has no end-to-end distribution: each request is taken
    to spend the tick's mean decode time after its first token (TTFT shifted by
    ``tpot_mean × (mean output tokens − 1)``). Only its count is read back (SGLang
    before 0.4.2 counts finished requests by it)."""
    n = ttft.count
    out = t.generation_tokens / t.requests_finished if t.requests_finished > 0 else 1.0
    decode = t.tpot_mean_s * max(out - 1.0, 0.0)
    if n <= 0:
        return Histogram(ttft.bounds, ttft.cumulative, 0.0)
    shifted = tuple(b + decode for b in ttft.bounds)
    return Histogram(shifted, ttft.cumulative, ttft.sum + decode * n)


def _labels(names: Sequence[str], model: str, **extra: str) -> str:
    values = {n: model if n == "model_name" else _LABEL_VALUES[n] for n in names}
    values.update(extra)
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(values.items()))
    return "{" + body + "}" if body else ""


def _escape(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _family_lines(f: Family, t: VersionTable, s: ReplicaCounters) -> list[str]:
    lines = [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}"]
    m = s.model_name
    if f.key == "requests":  # vLLM: one series per finish reason
        for reason in t.finish_reasons:
            v = (s.requests_aborted if reason == "abort" else
                 s.requests_finished if reason == "stop" else 0.0)
            lines.append(f"{f.name}{_labels(f.labels, m, finished_reason=reason)} "
                         f"{floatToGoString(v)}")
        return lines
    if f.kind != "histogram":
        v = getattr(s, f.key)
        lines.append(f"{f.name}{_labels(f.labels, m)} {floatToGoString(v)}")
        return lines
    h = rebucket(getattr(s, f.key), f.buckets)
    for b, c in zip((*f.buckets, float("inf")), h.cumulative, strict=True):
        lines.append(f"{f.name}_bucket{_labels(f.labels, m, le=floatToGoString(b))} "
                     f"{floatToGoString(c)}")
    lines.append(f"{f.name}_count{_labels(f.labels, m)} {floatToGoString(h.count)}")
    lines.append(f"{f.name}_sum{_labels(f.labels, m)} {floatToGoString(h.sum)}")
    return lines


def render(version: str, state: ReplicaCounters) -> str:
    """``state`` as the ``/metrics`` page of the release layout ``version`` (a key of
    ``koi.fleet.engine_metrics.TABLES``, e.g. ``vllm-0.11.2``), for a one-engine server.
    Histograms are moved onto the release's bounds by ``rebucket`` (exact where its
    bounds are the simulator's, interpolated within a bucket where not); every
    histogram family of the release is filled from the same Koi quantity (vLLM 0.11's
    deprecated ``time_per_output_token_seconds``, its ``inter_token_latency_seconds``
    and ``request_time_per_output_token_seconds`` all carry the simulator's per-request
    TPOT, which it has in place of per-token intervals). vLLM shows a series for every
    finish reason from the start (V0 only once a request first finished that way)."""
    t = table(version)
    lines: list[str] = []
    for f in t.families:
        lines += _family_lines(f, t, state)
    return "\n".join(lines) + "\n"


def split_tick(t: DeploymentTelemetry, replicas: Sequence[ReplicaCounters]) -> None:
    """Add one tick of a deployment to its ready replicas, evenly (the simulator's
    ``DeploymentTelemetry`` is per deployment; its per-slot stats are not kept past the
    tick)."""
    if not replicas:
        return
    share = 1.0 / len(replicas)
    for r in replicas:
        r.add(t, share)
