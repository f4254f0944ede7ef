"""The engine-metrics adapter's pure parts, and the small HTTP pieces around them.

* targets: a Prometheus ``http_sd`` document read into replica pages (Koi's labels,
  scheme and path, what is skipped and what is refused);
* the scrape book: a first scrape is a baseline, a failed replica leaves its deployment
  out, a deployment id change or a missed tick starts again, nothing is kept until the
  caller commits;
* the simulated engines: every tick's counters come back exactly from the pages of
  replicas that come and go;
* PromQL: the queries, and answers read back into telemetry (errors refused);
* HTTP: the page server, and reads that are bounded in size, time and redirects.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.cluster import (
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    DeploymentTelemetry,
)
from koi.fleet.engine_metrics import parse_page
from koi.fleet.exposition import ReplicaCounters, render, split_tick
from koi.fleet.promql import PromQLError, queries, telemetry
from koi.fleet.scrape import (
    MAX_TARGETS,
    ScrapeBook,
    ScrapeTarget,
    TargetsError,
    parse_targets,
    replica_path,
    targets_document,
)
from koi.fleet.sim_pages import SimulatedEngines
from koi.sim.telemetry import build_telemetry
from koi.space import engine_default_config
from services.engine_metrics import fetch
from services.sim.metrics_http import PageServer

CAT = load_catalog()
MODEL = "llama-3.1-8b"


def _offering() -> str:
    return next(o.id for o in CAT.offerings.values() if o.accelerator == "h100-sxm")


def _dep(dep_id: str, ready: int, starting: int = 0, engine: str = "vllm",
         state: DeploymentState = DeploymentState.RUNNING) -> Deployment:
    cfg = engine_default_config(MODEL, "h100-sxm", engine, CAT).with_(replicas=ready + starting)
    return Deployment(dep_id, f"job-{dep_id}", cfg, _offering(), state, ready, starting, 0.0)


def _snap(tick: int, *deps: Deployment) -> ClusterSnapshot:
    return ClusterSnapshot(tick, 60.0 * tick, 60.0, 3600.0, (), tuple(deps), ())


def _tick(tick: int, dep_id: str, seed: int) -> DeploymentTelemetry:
    rng = np.random.default_rng(seed)
    n = 120
    w = rng.uniform(0.5, 2.0, n)
    return build_telemetry(
        tick, dep_id, f"job-{dep_id}", 60.0,
        counts={"arrived": float(w.sum()), "dropped": 1.5, "prompt_tokens": 9e4,
                "gen_tokens": 3e4, "preemptions": 2.0, "replica_preemptions": 0,
                "gpu_seconds": 60.0, "cost_usd": 0.1},
        ttft=rng.lognormal(-1.5, 0.7, n), tpot=rng.lognormal(-3.5, 0.4, n), weights=w,
        means={"kv": 0.5, "running": 12.0, "waiting": 3.0},
        end={"running": 10.0 + seed % 4, "waiting": 1.0 + seed % 3})


# --- targets -------------------------------------------------------------------------------

def test_targets_are_read_with_koi_labels_scheme_and_path() -> None:
    doc = json.dumps([
        {"targets": ["10.0.0.5:8000", "10.0.0.6:8000"],
         "labels": {"koi_deployment": "d1", "koi_job": "j1", "koi_engine": "vllm"}},
        {"targets": ["[::1]:9000"], "labels": {"__scheme__": "https", "koi_deployment": "d2",
                                               "__metrics_path__": "/x/metrics"}},
        {"targets": ["other:9100"], "labels": {"job": "node"}},   # not Koi's
        {"targets": ["10.0.0.5:8000"], "labels": {"koi_deployment": "d1"}},   # twice
    ])
    targets, skipped = parse_targets(doc)
    assert skipped == 1
    assert targets == [
        ScrapeTarget("http://10.0.0.5:8000/metrics", "d1", "j1", "", "vllm"),
        ScrapeTarget("http://10.0.0.6:8000/metrics", "d1", "j1", "", "vllm"),
        ScrapeTarget("https://[::1]:9000/x/metrics", "d2")]


def test_the_simulators_document_reads_back() -> None:
    doc = targets_document("127.0.0.1:9", [("dep/1", "j", 0, "sglang"), ("d2", "k", 3, "vllm")])
    targets, _ = parse_targets(doc)
    assert [t.url for t in targets] == ["http://127.0.0.1:9/replicas/dep%2F1/0/metrics",
                                        "http://127.0.0.1:9" + replica_path("d2", 3)]
    assert (targets[0].deployment_id, targets[0].replica, targets[0].engine) == \
        ("dep/1", "0", "sglang")


@pytest.mark.parametrize(("doc", "says"), [
    ("{not json", "not JSON"),
    ('{"targets": []}', "list of target groups"),
    ('[{"targets": "h:1"}]', "list of targets"),
    ('[{"targets": ["h:1/evil"], "labels": {"koi_deployment": "d"}}]', "not host:port"),
    ('[{"targets": ["h:1"], "labels": {"__scheme__": "file", "koi_deployment": "d"}}]',
     "http or https"),
    ('[{"targets": ["h:1"], "labels": {"__metrics_path__": "m?x=1", "koi_deployment": "d"}}]',
     "absolute path"),
    ('[{"targets": ["h:1"], "labels": {"koi_deployment": 7}}]', "not a string"),
])
def test_a_bad_targets_document_is_refused(doc: str, says: str) -> None:
    with pytest.raises(TargetsError, match=says):
        parse_targets(doc)


def test_too_many_targets_are_refused() -> None:
    doc = json.dumps([{"targets": [f"h{i}:1" for i in range(MAX_TARGETS + 1)],
                       "labels": {"koi_deployment": "d"}}])
    with pytest.raises(TargetsError, match="more than"):
        parse_targets(doc)


# --- the scrape book -----------------------------------------------------------------------

def _page_of(counters: ReplicaCounters, version: str = "vllm-0.34.0"):
    return parse_page(render(version, counters))


def test_first_scrape_is_a_baseline_then_windows_give_the_tick_back() -> None:
    deps = (_dep("d1", 2),)
    reps = [ReplicaCounters(MODEL), ReplicaCounters(MODEL)]
    targets = [ScrapeTarget(f"http://h:1/{i}", "d1", "job-d1") for i in range(2)]
    split_tick(_tick(0, "d1", 1), reps)   # traffic before the first scrape: never counted
    book = ScrapeBook()
    out, book = book.step(_snap(1, *deps), [(t, _page_of(r)) for t, r in zip(targets, reps, strict=True)],
                          CAT)
    assert out.telemetry == [] and out.baselines == 2 and not out.failed
    t2 = _tick(1, "d1", 2)
    split_tick(t2, reps)
    out, book = book.step(_snap(2, *deps), [(t, _page_of(r)) for t, r in zip(targets, reps, strict=True)],
                          CAT)
    (got,) = out.telemetry
    assert (got.tick, got.deployment_id, got.job_id, got.window_s) == (1, "d1", "job-d1", 60.0)
    for f in ("requests_finished", "requests_dropped", "prompt_tokens", "generation_tokens",
              "num_running", "num_waiting", "kv_cache_usage", "num_preemptions"):
        assert getattr(got, f) == pytest.approx(getattr(t2, f), rel=1e-9), f
    gpus = deps[0].gpus
    price = CAT.offering(_offering()).usd_per_gpu_hour
    assert got.gpu_seconds == pytest.approx(gpus * 60.0)
    assert got.cost_usd == pytest.approx(gpus * 60.0 * price / 3600.0)


def test_a_replica_that_cannot_be_read_leaves_its_deployment_out() -> None:
    deps = (_dep("d1", 2), _dep("d2", 1))
    r1, r2, r3 = (ReplicaCounters(MODEL) for _ in range(3))
    t = [ScrapeTarget("http://h:1/a", "d1"), ScrapeTarget("http://h:1/b", "d1"), ScrapeTarget("http://h:1/c", "d2")]
    _, book = ScrapeBook().step(_snap(1, *deps),
                                [(t[0], _page_of(r1)), (t[1], _page_of(r2)),
                                 (t[2], _page_of(r3))], CAT)
    for r, dep in ((r1, "d1"), (r2, "d1"), (r3, "d2")):
        split_tick(_tick(1, dep, 3), [r])
    out, book = book.step(_snap(2, *deps), [(t[0], _page_of(r1)), (t[1], "h:1: HTTP 500"),
                                            (t[2], _page_of(r3))], CAT)
    assert [x.deployment_id for x in out.telemetry] == ["d2"]
    assert out.failed == {"d1": "h:1: HTTP 500"}
    # the failed replica was forgotten: its next scrape is a baseline, so d1 is read from
    # the replica that has a window (partial reads name themselves in the baselines)
    out, _ = book.step(_snap(3, *deps), [(t[0], _page_of(r1)), (t[1], _page_of(r2)),
                                         (t[2], _page_of(r3))], CAT)
    assert [x.deployment_id for x in out.telemetry] == ["d1", "d2"] and out.baselines == 1


def test_the_book_moves_only_when_committed_and_a_retry_reads_the_same() -> None:
    deps = (_dep("d1", 1),)
    r = ReplicaCounters(MODEL)
    t = ScrapeTarget("http://h:1/a", "d1")
    _, book = ScrapeBook().step(_snap(1, *deps), [(t, _page_of(r))], CAT)
    split_tick(_tick(1, "d1", 4), [r])
    first, _ = book.step(_snap(2, *deps), [(t, _page_of(r))], CAT)
    again, _ = book.step(_snap(2, *deps), [(t, _page_of(r))], CAT)   # not committed: retry
    assert first.telemetry == again.telemetry and len(first.telemetry) == 1


def test_the_snapshots_job_wins_over_disagreeing_labels() -> None:
    deps = (_dep("d1", 2),)
    a, b = ReplicaCounters(MODEL), ReplicaCounters(MODEL)
    ta, tb = ScrapeTarget("http://h:1/a", "d1", "stale-label"), ScrapeTarget("http://h:1/b", "d1")
    _, book = ScrapeBook().step(_snap(1, *deps), [(ta, _page_of(a)), (tb, _page_of(b))], CAT)
    split_tick(_tick(1, "d1", 6), [a, b])
    out, _ = book.step(_snap(2, *deps), [(ta, _page_of(a)), (tb, _page_of(b))], CAT)
    assert [t.job_id for t in out.telemetry] == ["job-d1"]


def test_a_new_deployment_on_an_old_url_or_a_repeated_snapshot_is_a_baseline() -> None:
    r = ReplicaCounters(MODEL)
    t1, t2 = ScrapeTarget("http://h:1/a", "d1"), ScrapeTarget("http://h:1/a", "d9")
    _, book = ScrapeBook().step(_snap(1, _dep("d1", 1)), [(t1, _page_of(r))], CAT)
    out, _ = book.step(_snap(2, _dep("d9", 1)), [(t2, _page_of(r))], CAT)
    assert out.telemetry == [] and out.baselines == 1
    out, _ = book.step(_snap(1, _dep("d1", 1)), [(t1, _page_of(r))], CAT)   # same time
    assert out.telemetry == [] and out.baselines == 1


def test_a_replica_that_missed_a_tick_does_not_mix_window_lengths() -> None:
    deps = (_dep("d1", 2),)
    a, b = ReplicaCounters(MODEL), ReplicaCounters(MODEL)
    ta, tb = ScrapeTarget("http://h:1/a", "d1"), ScrapeTarget("http://h:1/b", "d1")
    _, book = ScrapeBook().step(_snap(1, *deps), [(ta, _page_of(a)), (tb, _page_of(b))], CAT)
    _, book2 = book.step(_snap(2, *deps), [(ta, _page_of(a))], CAT)   # b not listed
    keep = dict(book2.previous)
    keep[tb.key] = book.previous[tb.key]   # b's scrape from tick 1 (two ticks old)
    out, _ = ScrapeBook(keep).step(_snap(3, *deps), [(ta, _page_of(a)), (tb, _page_of(b))],
                                   CAT)
    (got,) = out.telemetry
    assert got.window_s == 60.0 and out.baselines == 1   # b's 120-s window left out


# --- the simulated engines -------------------------------------------------------------------

def test_simulated_pages_give_every_tick_back_as_replicas_come_and_go() -> None:
    """Ready and starting replicas listed, scaled up and down, a draining deployment that
    keeps its list: each tick's counters and end-of-window gauges come back from the
    pages."""
    eng, book = SimulatedEngines(), ScrapeBook()
    plan = [  # (ready, starting, state) of d1 at each snapshot; d2 an SGLang one beside it
        (0, 2, DeploymentState.STARTING), (2, 0, DeploymentState.RUNNING),
        (2, 1, DeploymentState.RUNNING), (3, 0, DeploymentState.RUNNING),
        (1, 0, DeploymentState.RUNNING), (0, 0, DeploymentState.DRAINING)]
    telemetry: list[DeploymentTelemetry] = []
    for n, (ready, starting, state) in enumerate(plan):
        snap = _snap(n, _dep("d1", ready, starting, state=state),
                     _dep("d2", 2, engine="sglang"))
        assert eng.update(snap, telemetry) and not eng.update(snap, telemetry)
        pages = eng.pages()
        targets, _ = parse_targets(eng.targets("sim:1"))
        assert len(targets) == len(pages)
        out, book = book.step(snap, [(t, parse_page(pages[t.url.removeprefix("http://sim:1")]))
                                     for t in targets], CAT)
        if n >= 2:
            got = {t.deployment_id: t for t in out.telemetry}
            for want in telemetry:
                have = got[want.deployment_id]
                for f in ("requests_finished", "prompt_tokens", "generation_tokens",
                          "num_running_end", "num_waiting_end", "kv_cache_usage",
                          "requests_dropped"):
                    assert getattr(have, f) == pytest.approx(getattr(want, f), rel=1e-9), \
                        (n, want.deployment_id, f)
                # an engine's gauges are the queue at the window's end, not its mean
                assert have.num_running == pytest.approx(want.num_running_end, rel=1e-9)
                assert have.num_waiting == pytest.approx(want.num_waiting_end, rel=1e-9)
        telemetry = [_tick(n, "d1", 10 + n), _tick(n, "d2", 20 + n)]
    engine_of = {t.deployment_id: t.engine for t in targets}
    assert engine_of == {"d1": "vllm", "d2": "sglang"}
    assert eng.lost == 0
    # a window of a deployment no page listed before it (its first tick) is on no page
    eng.update(_snap(len(plan), _dep("d3", 1)), [_tick(9, "d3", 9)])
    assert eng.lost == 1


def test_what_no_engine_could_show_is_shown_as_zero() -> None:
    """The simulator's tick means can be a rounding error below zero, and a batch job's
    mean TTFT has come out negative: the pages show 0, and stay readable."""
    eng = SimulatedEngines()
    eng.update(_snap(0, _dep("d1", 1)), [])
    bad = dataclasses.replace(_tick(0, "d1", 5), num_waiting=-3e-15, num_waiting_end=-3e-15,
                              ttft_mean_s=-3.3)
    eng.update(_snap(1, _dep("d1", 1)), [bad])
    page = parse_page(eng.page("d1", 0))
    assert page.gauges["waiting"] == 0.0 and page.histograms["ttft"].sum == 0.0
    assert page.counters["requests_finished"] == pytest.approx(bad.requests_finished)


def test_a_page_for_an_unknown_replica_is_none() -> None:
    eng = SimulatedEngines()
    eng.update(_snap(0, _dep("d1", 1)), [])
    assert eng.page("d1", 0) is not None
    assert eng.page("d1", 1) is None and eng.page("nope", 0) is None


# --- PromQL ----------------------------------------------------------------------------------

def test_queries_read_every_layouts_names_per_deployment() -> None:
    qs = {q.key: q.promql for q in queries(60.0)}
    assert qs["counter:vllm:request_success_total"].startswith(
        "sum by (koi_deployment, koi_job, finished_reason) (")
    assert "increase(vllm:time_to_first_token_seconds_bucket{priority=\"\"}[60s])" in \
        qs["bucket:vllm:time_to_first_token_seconds"]
    assert qs["gauge:sglang:token_usage"].startswith("avg by (koi_deployment, koi_job)")
    assert "offset 60s" in qs["before:vllm:num_requests_running"]
    assert "[1500ms]" in queries(1.5)[0].promql
    with pytest.raises(ValueError):
        queries(0.0)


def _vector(*samples: tuple[dict[str, str], float]) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1.0, repr(v)]} for m, v in samples]}}


def test_answers_read_back_into_telemetry() -> None:
    d = {"koi_deployment": "d1", "koi_job": "job-d1"}
    other = {"koi_deployment": "gone", "koi_job": "x"}
    answers = {q.key: _vector() for q in queries(60.0)}
    answers["counter:vllm:request_success_total"] = _vector(
        ({**d, "finished_reason": "stop"}, 90.0), ({**d, "finished_reason": "length"}, 10.0),
        ({**d, "finished_reason": "abort"}, 4.0))
    answers["counter:vllm:prompt_tokens_total"] = _vector((d, 5e4), (other, 1.0))
    answers["counter:vllm:generation_tokens_total"] = _vector((d, 2e4))
    answers["bucket:vllm:time_to_first_token_seconds"] = _vector(
        ({**d, "le": "0.1"}, 50.0), ({**d, "le": "0.5"}, 97.0), ({**d, "le": "+Inf"}, 100.0))
    answers["sum:vllm:time_to_first_token_seconds"] = _vector((d, 20.0))
    answers["gauge:vllm:num_requests_running"] = _vector((d, 7.0))
    answers["before:vllm:num_requests_running"] = _vector((d, 5.0))
    answers["gauge:vllm:kv_cache_usage_perc"] = _vector((d, 0.25))
    answers["gauge:vllm:gpu_cache_usage_perc"] = _vector((d, float("nan")))
    snap = _snap(5, _dep("d1", 2))
    (t,) = telemetry(answers, snap, 60.0, CAT)
    assert (t.tick, t.deployment_id, t.job_id, t.window_s) == (4, "d1", "job-d1", 60.0)
    assert (t.requests_finished, t.requests_dropped) == (100.0, 4.0)
    assert t.requests_arrived == pytest.approx(100.0 + 4.0 + 7.0 - 5.0)
    assert (t.prompt_tokens, t.generation_tokens, t.num_running) == (5e4, 2e4, 7.0)
    assert t.ttft_mean_s == pytest.approx(0.2) and t.kv_cache_usage == 0.25
    assert 0.1 < t.ttft_p95_s <= 0.5
    assert t.gpu_seconds == pytest.approx(_dep("d1", 2).gpus * 60.0)


@pytest.mark.parametrize("answer", [
    {"status": "error", "errorType": "bad_data", "error": "parse error"},
    {"status": "success", "data": {"resultType": "matrix", "result": []}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
    "not an object",
])
def test_an_answer_that_is_not_a_vector_is_refused(answer: object) -> None:
    answers = {q.key: _vector() for q in queries(60.0)}
    answers["counter:vllm:prompt_tokens_total"] = answer
    with pytest.raises(PromQLError):
        telemetry(answers, _snap(1, _dep("d1", 1)), 60.0, CAT)


# --- HTTP ------------------------------------------------------------------------------------

def test_the_page_server_serves_pages_and_targets() -> None:
    with PageServer() as server:
        server.publish({"/replicas/d1/0/metrics": b"vllm:x 1\n"}, '[{"targets": []}]')
        base = f"http://{server.address}"
        assert fetch.get(base + "/replicas/d1/0/metrics", timeout_s=5, max_bytes=100) == \
            b"vllm:x 1\n"
        assert json.loads(fetch.get(base + "/targets", timeout_s=5, max_bytes=100))
        with pytest.raises(fetch.FetchError, match="HTTP 404"):
            fetch.get(base + "/nope", timeout_s=5, max_bytes=100)
        with pytest.raises(fetch.FetchError, match="limit"):
            fetch.get(base + "/replicas/d1/0/metrics", timeout_s=5, max_bytes=4)
        assert "HTTP 404" in str(fetch.scrape(base + "/nope", timeout_s=5))
        server.publish({"/p": b"garbage {{{"}, "[]")
        assert "not Prometheus text" in str(fetch.scrape(base + "/p", timeout_s=5))


class _Awkward(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/")
            self.end_headers()
            return
        self.send_response(200)   # a slow drip: a byte at a time, for longer than allowed
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.01)

    def log_message(self, *args: object) -> None:
        return


def test_reads_refuse_redirects_and_slow_drips() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Awkward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(fetch.FetchError, match="HTTP 302"):
            fetch.get(base + "/redirect", timeout_s=5, max_bytes=100)
        t0 = time.monotonic()
        with pytest.raises(fetch.FetchError, match="not read within"):
            fetch.get(base + "/slow", timeout_s=0.3, max_bytes=10_000)
        assert time.monotonic() - t0 < 3
        with pytest.raises(fetch.FetchError):
            fetch.get("http://127.0.0.1:1/", timeout_s=1, max_bytes=10)
    finally:
        server.shutdown()
        server.server_close()


def test_replace_keeps_targets_hashable_and_frozen() -> None:
    t = ScrapeTarget("http://h:1/m", "d")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.url = "x"  # type: ignore[misc]
    assert t.key == "http://h:1/m" and {t: 1}[t] == 1
