"""Engine ``/metrics`` pages in, ``DeploymentTelemetry`` out; the simulator's pages back.

Recorded pages (tests/data/engine_metrics/, one per release layout; each says in its
header where it came from) must parse to the right engine and layout; two scrapes give
the known increments; a restart, missing families and hostile pages are handled; and
render → parse → window → merge gives the tick back.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from koi.cluster import DeploymentTelemetry
from koi.fleet.engine_metrics import (
    TABLES,
    EngineScrape,
    Histogram,
    MetricsPageError,
    ReplicaWindow,
    histogram_quantile,
    merge,
    parse_page,
    quantile_estimate,
    rebucket,
    window,
)
from koi.fleet.engine_tables import PREFERENCE, table
from koi.fleet.exposition import ReplicaCounters, render, split_tick
from koi.sim.telemetry import TPOT_BOUNDS_S, TTFT_BOUNDS_S, build_telemetry

DATA = Path(__file__).resolve().parents[1] / "data" / "engine_metrics"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _page(name: str) -> str:
    return (DATA / f"{name}.txt").read_text()


# --- recorded pages ------------------------------------------------------------------------

def test_every_layout_has_a_recorded_page_and_every_page_a_layout() -> None:
    assert {p.stem for p in DATA.glob("*.txt")} == {t.key for t in TABLES}


@pytest.mark.parametrize("key", [t.key for t in TABLES])
def test_recorded_page_parses_to_its_layout(key: str) -> None:
    s = parse_page(_page(key))
    assert (s.engine, s.version) == (key.split("-")[0], key)
    assert s.model_names == (MODEL,)
    for k in ("prompt_tokens", "generation_tokens", "requests_finished"):
        assert s.counters[k] > 0
    assert {"running", "waiting", "kv_usage"} <= set(s.gauges)
    assert {"ttft", "tpot", "e2e"} <= set(s.histograms)
    assert s.histograms["ttft"].bounds == next(
        f.buckets for f in table(key).families if f.key == "ttft")


def test_the_real_sglang_capture_reads_as_published() -> None:
    s = parse_page(_page("sglang-0.4.0"))
    assert s.counters == {"prompt_tokens": 8.128902e6, "generation_tokens": 7.557572e6,
                          "requests_finished": 11228.0}   # e2e count: no request counter yet
    assert s.gauges == {"running": 162.0, "waiting": 2826.0, "kv_usage": 0.28}
    assert set(s.missing) == {"requests_aborted", "preemptions"}
    ttft = s.histograms["ttft"]
    assert (ttft.count, ttft.sum) == (11008.0, 2.3518979474117756e6)
    assert histogram_quantile(0.95, ttft) == 30.0   # rank in +Inf: the largest finite bound
    assert s.histograms["tpot"].count == 7.400757e6


@pytest.mark.parametrize(("key", "tpot_per_request"), [
    ("vllm-0.6.6", False), ("vllm-0.9.2", False), ("vllm-0.11.2", True),
    ("vllm-0.34.0", True), ("sglang-0.5.2", False), ("sglang-0.5.23", True)])
def test_tpot_is_per_request_where_the_engine_has_it(key: str, tpot_per_request: bool) -> None:
    s = parse_page(_page(key))
    per_request = s.histograms["tpot"].count == s.counters["requests_finished"]
    assert per_request == tpot_per_request


def test_aborted_requests_are_read_as_dropped() -> None:
    assert parse_page(_page("vllm-0.6.6")).counters["requests_aborted"] == 3.0
    assert parse_page(_page("vllm-0.34.0")).counters["requests_aborted"] == 2.0
    assert parse_page(_page("sglang-0.5.2")).counters["requests_aborted"] == 4.0


def test_every_family_of_every_table_is_read_by_its_engine() -> None:
    for t in TABLES:
        for f in t.families:
            if f.key == "gen_throughput":
                continue
            keys = ("requests_finished", "requests_aborted") if f.key == "requests" else (
                f.key,)
            for k in keys:
                assert f.name in PREFERENCE[t.engine][k], (t.key, f.name)


# --- hand-written pages: windows, restarts, data parallelism ------------------------------

def _vllm(prompt: float, gen: float, stop: float, abort: float, running: float,
          waiting: float, kv: float, ttft: tuple[float, float, float], ttft_sum: float,
          engine: str = "0") -> str:
    lb = f'engine="{engine}",model_name="m"'
    return "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lb}}} {running}",
        f"vllm:num_requests_waiting{{{lb}}} {waiting}",
        f"vllm:kv_cache_usage_perc{{{lb}}} {kv}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{lb}}} {prompt}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lb}}} {gen}",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{lb},finished_reason="stop"}} {stop}',
        f'vllm:request_success_total{{{lb},finished_reason="abort"}} {abort}',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{lb},le="0.5"}} {ttft[0]}',
        f'vllm:time_to_first_token_seconds_bucket{{{lb},le="1.0"}} {ttft[1]}',
        f'vllm:time_to_first_token_seconds_bucket{{{lb},le="+Inf"}} {ttft[2]}',
        f"vllm:time_to_first_token_seconds_count{{{lb}}} {ttft[2]}",
        f"vllm:time_to_first_token_seconds_sum{{{lb}}} {ttft_sum}",
        "# TYPE vllm:inter_token_latency_seconds histogram",
        f'vllm:inter_token_latency_seconds_bucket{{{lb},le="+Inf"}} 0',
        ""])


def test_two_scrapes_give_the_known_increments() -> None:
    prev = parse_page(_vllm(1000, 200, 10, 1, 4, 2, 0.3, (5, 9, 10), 6.0))
    cur = parse_page(_vllm(1600, 500, 16, 2, 5, 0, 0.5, (8, 14, 16), 10.0))
    assert cur.version == "vllm-0.34.0"
    w = window(prev, cur, tick=7, deployment_id="d", job_id="j", window_s=10.0)
    assert not w.restarted
    assert w.counters == {"prompt_tokens": 600.0, "generation_tokens": 300.0,
                          "requests_finished": 6.0, "requests_aborted": 1.0}
    assert w.histograms["ttft"].cumulative == (3.0, 5.0, 6.0)
    assert w.histograms["ttft"].sum == pytest.approx(4.0)
    assert w.gauges == {"running": 5.0, "waiting": 0.0, "kv_usage": 0.5}
    assert w.arrived == 6.0 + 1.0 + (5 + 0) - (4 + 2)   # finished + aborted + Δ queue
    t = merge([w], gpu_seconds=20.0, cost_usd=0.1, replica_preemptions=1)
    assert (t.tick, t.deployment_id, t.job_id, t.window_s) == (7, "d", "j", 10.0)
    assert (t.requests_finished, t.requests_dropped, t.output_tok_s) == (6.0, 1.0, 30.0)
    assert t.ttft_bucket_bounds_s == (0.5, 1.0)
    assert t.ttft_bucket_counts == (3.0, 2.0, 1.0)
    assert t.ttft_mean_s == pytest.approx(4.0 / 6.0)
    # rank 5.7 of 6 is in +Inf: above the largest finite bound (Prometheus's linear
    # interpolation answers the bound itself); the log-normal fit says how far above
    assert t.ttft_p95_s == quantile_estimate(0.95, w.histograms["ttft"]) > 1.0
    assert histogram_quantile(0.95, w.histograms["ttft"]) == 1.0
    # rank 4.5 lies in (0.5, 1.0], which holds 2 from 3 on: 0.5 + 0.5 * 1.5 / 2
    assert histogram_quantile(0.75, w.histograms["ttft"]) == pytest.approx(0.875)
    assert (t.gpu_seconds, t.cost_usd, t.replica_preemptions) == (20.0, 0.1, 1)
    assert t.num_preemptions == 0.0   # this page has no preemption counter


def test_a_counter_going_down_is_a_restart() -> None:
    prev = parse_page(_vllm(1000, 200, 10, 1, 4, 2, 0.3, (5, 9, 10), 6.0))
    cur = parse_page(_vllm(50, 20, 2, 0, 1, 0, 0.1, (1, 2, 2), 0.9))
    w = window(prev, cur, tick=8, deployment_id="d", job_id="j", window_s=10.0)
    assert w.restarted
    assert w.counters["prompt_tokens"] == 50.0 and w.counters["requests_finished"] == 2.0
    assert w.histograms["ttft"].cumulative == (1.0, 2.0, 2.0)
    assert w.arrived == 2.0 + 0.0 + 1.0   # the queue is counted from empty
    first = window(None, cur, tick=8, deployment_id="d", job_id="j", window_s=10.0)
    assert first.restarted and first.counters == w.counters


def test_data_parallel_engines_of_one_server_add_up() -> None:
    a = _vllm(100, 10, 1, 0, 4, 1, 0.2, (1, 1, 1), 0.2, engine="0")
    b = _vllm(300, 30, 3, 0, 6, 3, 0.6, (0, 2, 3), 2.0, engine="1")
    body = "\n".join(line for line in (a + b).splitlines() if not line.startswith("#"))
    s = parse_page(body)
    assert s.counters["prompt_tokens"] == 400.0
    assert s.gauges == {"running": 10.0, "waiting": 4.0, "kv_usage": pytest.approx(0.4)}
    assert s.histograms["ttft"].cumulative == (1.0, 3.0, 4.0)


def test_sglang_rank_duplicates_count_once_and_priority_aggregates_win() -> None:
    page = "\n".join([
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0',
        'sglang:num_running_reqs{model_name="m",tp_rank="1"} 4.0',
        'sglang:num_queue_reqs{model_name="m",priority="",tp_rank="0"} 7.0',
        'sglang:num_queue_reqs{model_name="m",priority="1",tp_rank="0"} 3.0',
        'sglang:num_queue_reqs{model_name="m",priority="2",tp_rank="0"} 4.0',
        'sglang:prompt_tokens_total{is_streaming="true",model_name="m"} 10.0',
        'sglang:prompt_tokens_total{is_streaming="false",model_name="m"} 5.0', ""])
    s = parse_page(page)
    assert s.gauges == {"running": 4.0, "waiting": 7.0}
    assert s.counters == {"prompt_tokens": 15.0}


def test_missing_families_are_named_and_merge_to_zero() -> None:
    s = parse_page('vllm:num_requests_running{model_name="m"} 3\n'
                   'vllm:prompt_tokens_total{model_name="m"} 10\n')
    assert s.version == "vllm-0.6.6"   # no engine label: V0
    assert "ttft" in s.missing and "requests_finished" in s.missing
    w = window(None, s, tick=1, deployment_id="d", job_id="j", window_s=5.0)
    t = merge([w])
    assert (t.requests_finished, t.ttft_p95_s, t.ttft_mean_s) == (0.0, 0.0, 0.0)
    assert t.ttft_bucket_bounds_s == () and t.ttft_bucket_counts == (0.0,)
    assert t.num_running == 3.0 and t.kv_cache_usage == 0.0


def test_ignored_families_may_hold_anything() -> None:
    page = _page("vllm-0.6.6") + 'vllm:spec_decode_efficiency{model_name="m"} NaN\n'
    assert parse_page(page).gauges["kv_usage"] == 0.43   # -1.0 hit rates ignored too


# --- hostile pages ----------------------------------------------------------------------------

@pytest.mark.parametrize(("page", "says"), [
    ("<html><body>502 Bad Gateway</body></html>", "not Prometheus"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    ("node_cpu_seconds_total{cpu=\"0\"} 12.5\n", "no vLLM or SGLang"),
    ('vllm:num_requests_running{engine="0"} 1\nsglang:num_running_reqs 1\n', "mixes"),
    ('vllm:prompt_tokens_total{engine="0"} NaN\n', "implausible"),
    ('vllm:prompt_tokens_total{engine="0"} -5\n', "implausible"),
    ('vllm:prompt_tokens_total{engine="0"} +Inf\n', "implausible"),
    ('vllm:num_requests_waiting{engine="0"} -1\n', "implausible"),
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="1"} 5\n'
     'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 3\n', "decrease"),
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="1"} 5\n', r"\+Inf"),
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="x"} 5\n', "le"),
    ('vllm:prompt_tokens_total{engine="0"} 1\nvllm:prompt_tokens_total{engine="0"} 1\n',
     "duplicate"),
])
def test_a_hostile_page_is_refused_with_a_clear_error(page: str | bytes, says: str) -> None:
    with pytest.raises(MetricsPageError, match=says):
        parse_page(page)


def test_a_page_over_the_limit_is_refused_before_it_is_parsed() -> None:
    big = "# " + "x" * 2000 + "\n"
    with pytest.raises(MetricsPageError, match="limit"):
        parse_page(big, max_bytes=1000)
    with pytest.raises(MetricsPageError, match="limit"):
        parse_page(big.encode(), max_bytes=1000)
    with pytest.raises(MetricsPageError, match="limit"):
        parse_page("é" * 600, max_bytes=1000)   # 600 characters, 1200 bytes


def test_a_label_cardinality_bomb_is_refused() -> None:
    page = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(20_001))
    with pytest.raises(MetricsPageError, match="series"):
        parse_page(page)


# --- quantiles and buckets ------------------------------------------------------------------

def _bucketed(values: np.ndarray, bounds: tuple[float, ...]) -> Histogram:
    idx = np.searchsorted(np.asarray(bounds), values, side="left")
    per = np.bincount(idx, minlength=len(bounds) + 1).astype(float)
    return Histogram(bounds, tuple(float(x) for x in np.cumsum(per)), float(values.sum()))


def test_the_p95_estimate_reads_skewed_latencies_closer_than_linear_interpolation() -> None:
    """Log-normal and gamma latencies (right-skewed, as TTFT and TPOT are) counted on
    vLLM's TTFT buckets: the fit's p95 is closer to the samples' own than Prometheus's
    linear interpolation, which reads high in the tail."""
    rng = np.random.default_rng(7)
    bounds = next(f.buckets for f in table("vllm-0.34.0").families if f.key == "ttft")
    fit_err, lin_err = [], []
    for _ in range(200):
        n = int(rng.integers(30, 3000))
        if rng.random() < 0.5:
            v = rng.lognormal(rng.uniform(-4.0, 1.0), rng.uniform(0.1, 1.2), n)
        else:
            v = rng.gamma(rng.uniform(1.0, 6.0), 1.0, n) * rng.uniform(0.01, 0.5)
        truth = float(np.quantile(v, 0.95))
        h = _bucketed(v, bounds)
        fit_err.append(abs(quantile_estimate(0.95, h) / truth - 1))
        lin_err.append(abs(histogram_quantile(0.95, h) / truth - 1))
    assert np.median(fit_err) < 0.5 * np.median(lin_err)
    assert np.median(fit_err) < 0.08


@settings(max_examples=200, deadline=None)
@given(per=st.lists(st.floats(0, 1e4), min_size=4, max_size=4),
       where=st.floats(0.0, 1.0), q=st.floats(0.01, 0.99))
def test_the_p95_estimate_stays_in_the_bucket_that_holds_the_rank(
        per: list[float], where: float, q: float) -> None:
    bounds = (0.1, 0.5, 2.0)
    cum = tuple(float(x) for x in np.cumsum(per))
    total = cum[-1]
    if total <= 0:
        assert quantile_estimate(q, Histogram(bounds, cum, 0.0)) == 0.0
        return
    # any sum the counts allow: each bucket's requests somewhere inside it
    lo_sum = sum(n * lo for n, lo in zip(per, (0.0, *bounds), strict=True))
    hi_sum = sum(n * hi for n, hi in zip(per[:3], bounds, strict=True)) + per[3] * 10.0
    h = Histogram(bounds, cum, lo_sum + where * (hi_sum - lo_sum))
    got = quantile_estimate(q, h)
    b = next((i for i in range(3) if cum[i] >= q * total), 3)
    lo = (0.0, *bounds)[b]
    hi = (*bounds, math.inf)[b]
    assert math.isfinite(got) and lo - 1e-12 <= got <= hi + 1e-12


def test_histogram_quantile_follows_prometheus() -> None:
    h = Histogram((1.0, 2.0), (10.0, 20.0, 20.0), 25.0)
    assert histogram_quantile(0.5, h) == 1.0
    assert histogram_quantile(0.75, h) == 1.5
    assert histogram_quantile(0.95, Histogram((1.0,), (1.0, 10.0), 50.0)) == 1.0
    assert histogram_quantile(0.95, Histogram((1.0,), (0.0, 0.0), 0.0)) == 0.0
    assert histogram_quantile(0.95, Histogram((), (4.0,), 2.0)) == 0.5


def test_rebucket_is_exact_on_a_subset_and_interpolates_otherwise() -> None:
    h = Histogram((1.0, 2.0, 4.0), (2.0, 6.0, 8.0, 10.0), 20.0)
    assert rebucket(h, (2.0, 4.0)).cumulative == (6.0, 8.0, 10.0)
    assert rebucket(h, (1.5, 8.0)).cumulative == (4.0, 8.0, 10.0)


def test_replicas_on_different_bounds_merge_on_the_shared_ones() -> None:
    def w(h: Histogram) -> ReplicaWindow:
        s = EngineScrape("vllm", "vllm-0.34.0", {"requests_finished": h.count}, {},
                         {"ttft": h})
        return window(None, s, tick=1, deployment_id="d", job_id="j", window_s=1.0)

    a = Histogram((0.5, 1.0, 2.0), (1.0, 2.0, 3.0, 4.0), 5.0)
    b = Histogram((1.0, 2.0, 4.0), (5.0, 6.0, 7.0, 8.0), 9.0)
    t = merge([w(a), w(b)])
    assert t.ttft_bucket_bounds_s == (1.0, 2.0)
    assert t.ttft_bucket_counts == (7.0, 2.0, 3.0)
    assert t.requests_finished == 12.0


def test_merge_refuses_windows_of_different_ticks() -> None:
    s = parse_page(_page("vllm-0.34.0"))
    w1 = window(None, s, tick=1, deployment_id="d", job_id="j", window_s=1.0)
    w2 = window(None, s, tick=2, deployment_id="d", job_id="j", window_s=1.0)
    with pytest.raises(ValueError, match="different ticks"):
        merge([w1, w2])
    with pytest.raises(ValueError, match="at least one"):
        merge([])


# --- the simulator's pages -------------------------------------------------------------------

def _tick(tick: int, seed: int) -> DeploymentTelemetry:
    rng = np.random.default_rng(seed)
    n = 150
    w = rng.uniform(0.5, 2.0, n)  # thinned-simulation weights: counts are fractional
    return build_telemetry(
        tick, "dep-1", "job-1", 30.0,
        counts={"arrived": float(w.sum()) + 7.0, "dropped": 2.5, "prompt_tokens": 1.2e5,
                "gen_tokens": 3.9e4, "preemptions": 3.0, "replica_preemptions": 1,
                "gpu_seconds": 240.0, "cost_usd": 0.3},
        ttft=rng.lognormal(-1.0, 0.9, n), tpot=rng.lognormal(-3.3, 0.5, n), weights=w,
        means={"kv": 0.61, "running": 17.3, "waiting": 4.4},
        end={"running": 16.0, "waiting": 5.5})


def _round_trip(ticks: list[DeploymentTelemetry], version: str, replicas: int
                ) -> DeploymentTelemetry:
    states = [ReplicaCounters(MODEL) for _ in range(replicas)]
    prev: list[EngineScrape | None] = [None] * replicas
    out = None
    for t in ticks:
        split_tick(t, states)
        cur = [parse_page(render(version, s)) for s in states]
        windows = [window(p, c, tick=t.tick, deployment_id=t.deployment_id, job_id=t.job_id,
                          window_s=t.window_s) for p, c in zip(prev, cur, strict=True)]
        out = merge(windows, gpu_seconds=t.gpu_seconds, cost_usd=t.cost_usd,
                    replica_preemptions=t.replica_preemptions)
        prev = list(cur)
    assert out is not None
    return out


def _in_bucket(value: float, raw: float, bounds: tuple[float, ...], slack: int) -> bool:
    """``value`` lies in the bucket of ``bounds`` holding ``raw`` (``slack`` buckets of
    room either side); beyond the last bound Prometheus answers that bound."""
    i = next((j for j, b in enumerate(bounds) if b >= raw), None)
    if i is None:
        return value == bounds[-1]
    lo = bounds[i - 1 - slack] if i - 1 - slack >= 0 else 0.0
    hi = bounds[min(i + slack, len(bounds) - 1)]
    return lo - 1e-12 <= value <= hi + 1e-12


@pytest.mark.parametrize("version", [t.key for t in TABLES])
def test_render_parse_window_merge_gives_the_tick_back(version: str) -> None:
    ticks = [_tick(1, 1), _tick(2, 2)]
    got, want = _round_trip(ticks, version, replicas=3), ticks[-1]
    exact = ["requests_finished", "prompt_tokens", "generation_tokens", "num_running_end",
             "num_waiting_end", "kv_cache_usage", "output_tok_s", "ttft_mean_s",
             "tpot_mean_s", "gpu_seconds", "cost_usd", "replica_preemptions"]
    if version != "sglang-0.4.0":   # it has no abort or preemption counter
        exact += ["requests_dropped", "num_preemptions"]
    for f in exact:
        assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-9), f
    # the pages' gauges are the queue at the window's end, in both pairs of fields
    assert (got.num_running, got.num_waiting) == (got.num_running_end, got.num_waiting_end)
    ttft_bounds = next(f.buckets for f in table(version).families if f.key == "ttft")
    assert got.ttft_bucket_bounds_s == ttft_bounds   # the engine's bounds are kept
    assert sum(got.ttft_bucket_counts) == pytest.approx(want.requests_finished, rel=1e-9)
    assert _in_bucket(got.ttft_p95_s, want.ttft_p95_s, ttft_bounds, 0)
    assert _in_bucket(got.tpot_p95_s, want.tpot_p95_s, got.tpot_bucket_bounds_s, 0)


@pytest.mark.parametrize("version", [t.key for t in TABLES])
def test_the_simulator_counts_on_every_bound_of_every_layout(version: str) -> None:
    """So a simulated replica's page holds what the real engine's would: each request
    counted in its release's own bucket, no bucket spread over finer ones."""
    for f in table(version).families:
        if f.key == "ttft":
            assert set(f.buckets) <= set(TTFT_BOUNDS_S), version
        if f.key == "tpot":
            assert set(f.buckets) <= set(TPOT_BOUNDS_S), version


def _expected_exposition(version: str, s: ReplicaCounters) -> str:
    """The same values written by prometheus_client itself."""
    t = table(version)
    fams: list[Metric] = []
    for f in t.families:
        names = list(f.labels)
        values = [MODEL if n == "model_name" else
                  {"engine": "0", "engine_type": "unified", "is_streaming": "true"}.get(n, "0")
                  for n in names]
        base = f.name.removesuffix("_total") if f.kind == "counter" else f.name
        if f.key == "requests":
            c = CounterMetricFamily(base, f.help, labels=[*names, "finished_reason"])
            for r in t.finish_reasons:
                v = {"stop": s.requests_finished, "abort": s.requests_aborted}.get(r, 0.0)
                c.add_metric([*values, r], v)
            fams.append(c)
        elif f.kind == "counter":
            c = CounterMetricFamily(base, f.help, labels=names)
            c.add_metric(values, getattr(s, f.key))
            fams.append(c)
        elif f.kind == "gauge":
            g = GaugeMetricFamily(base, f.help, labels=names)
            g.add_metric(values, getattr(s, f.key))
            fams.append(g)
        else:
            h = rebucket(getattr(s, f.key), f.buckets)
            m = HistogramMetricFamily(base, f.help, labels=names)
            les = [floatToGoString(b) for b in (*f.buckets, math.inf)]
            m.add_metric(values, list(zip(les, h.cumulative, strict=True)), h.sum)
            fams.append(m)

    class _Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return fams

    reg = CollectorRegistry()
    reg.register(_Fixed())  # type: ignore[arg-type]
    return generate_latest(reg).decode()


@pytest.mark.parametrize("version", [t.key for t in TABLES])
def test_render_writes_what_prometheus_client_writes(version: str) -> None:
    s = ReplicaCounters(MODEL)
    split_tick(_tick(1, 5), [s])
    assert render(version, s) == _expected_exposition(version, s)


@settings(max_examples=25, deadline=None)
@given(version=st.sampled_from([t.key for t in TABLES]),
       replicas=st.integers(1, 4),
       ttft=st.lists(st.floats(0, 50), min_size=len(TTFT_BOUNDS_S) + 1,
                     max_size=len(TTFT_BOUNDS_S) + 1),
       tpot=st.lists(st.floats(0, 50), min_size=len(TPOT_BOUNDS_S) + 1,
                     max_size=len(TPOT_BOUNDS_S) + 1),
       tokens=st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)),
       gauges=st.tuples(st.floats(0, 500), st.floats(0, 500), st.floats(0, 1)))
def test_round_trip_keeps_counters_for_any_tick(
        version: str, replicas: int, ttft: list[float], tpot: list[float],
        tokens: tuple[float, float], gauges: tuple[float, float, float]) -> None:
    finished = sum(ttft)
    t = DeploymentTelemetry(
        tick=3, deployment_id="d", job_id="j", window_s=10.0, requests_arrived=finished,
        requests_finished=finished, requests_dropped=1.0, prompt_tokens=tokens[0],
        generation_tokens=tokens[1], ttft_bucket_bounds_s=TTFT_BOUNDS_S,
        ttft_bucket_counts=tuple(ttft), tpot_bucket_bounds_s=TPOT_BOUNDS_S,
        tpot_bucket_counts=tuple(tpot), ttft_mean_s=0.4, ttft_p95_s=1.0, tpot_mean_s=0.04,
        tpot_p95_s=0.1, kv_cache_usage=gauges[2], num_running=gauges[0],
        num_waiting=gauges[1], num_preemptions=2.0, replica_preemptions=0,
        output_tok_s=tokens[1] / 10.0, gpu_seconds=1.0, cost_usd=0.0,
        num_running_end=gauges[0], num_waiting_end=gauges[1])
    got = _round_trip([t], version, replicas)
    for f in ("requests_finished", "prompt_tokens", "generation_tokens", "num_running",
              "num_waiting", "kv_cache_usage"):
        assert getattr(got, f) == pytest.approx(getattr(t, f), rel=1e-9, abs=1e-9), f
    assert sum(got.ttft_bucket_counts) == pytest.approx(sum(ttft), rel=1e-9, abs=1e-9)
    assert sum(got.tpot_bucket_counts) == pytest.approx(sum(tpot), rel=1e-9, abs=1e-9)
    assert math.isfinite(got.ttft_p95_s) and math.isfinite(got.tpot_p95_s)
