"""Unit tests for koi.jobs: lengths, arrivals, traces, parsing, YAML errors, round trips."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import yaml

from koi.errors import InvalidSpecError
from koi.jobs import (
    Arrival,
    BatchJob,
    LengthDist,
    OnlineJob,
    Slo,
    job_to_dict,
    load_job_yaml,
    load_jobs_yaml,
    load_trace,
    parse_job,
    parse_jobs,
    shared_data_dir,
    solve_lognormal,
)
from koi.jobs.trace import _load_cached

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "jobs"
TRACES = Path("/work/shared/data/traces")
if shared_data_dir() is not None:
    TRACES = shared_data_dir() / "traces"  # type: ignore[operator]
TRACE_ROWS = {
    "azure_llm_2023_conv.csv": 19366,
    "azure_llm_2023_code.csv": 8819,
    "mooncake_fast25_conversation.csv": 12031,
    "mooncake_fast25_synthetic_POISSON_ARRIVALS.csv": 3993,
}
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")


class FakeCatalog:
    """Only what the parser uses: ``models`` and ``model(id)`` raising KeyError."""

    models: ClassVar[dict[str, None]] = dict.fromkeys(
        ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b"))

    def model(self, model_id: str) -> None:
        raise KeyError(model_id)


CAT = FakeCatalog()


def online(**over: object) -> dict:
    base: dict = {"id": "chat", "model": "llama-3.1-8b", "arrival": {"rate_rps": 5.0},
                  "input_len": {"p50": 1000, "p99": 4000}, "output_len": 200,
                  "slo": {"ttft_ms": 500, "tpot_ms": 50}}
    base.update(over)
    return base


def batch(**over: object) -> dict:
    base: dict = {"kind": "batch", "id": "sum", "model": "llama-3.1-8b", "num_requests": 1000,
                  "input_len": 2000, "output_len": 250, "deadline_s": 3600}
    base.update(over)
    return base


def err(data: dict, **kw: object) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as info:
        parse_job(data, catalog=CAT, **kw)  # type: ignore[arg-type]
    return info.value


@pytest.fixture(autouse=True)
def _traces_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # trace references resolve only inside the traces directory: here, the test's own
    monkeypatch.setenv("KOI_TRACES_DIR", str(tmp_path))


def write_trace(tmp_path: Path, rows: list[str], name: str = "t.csv",
                header: str = "ts_s,input_tokens,output_tokens") -> Path:
    p = tmp_path / name
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


def small_trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, ["0.0,100,10", "1.0,200,20", "1.5,300,30", "4.0,400,40"])


# --- length distributions ----------------------------------------------------------------

def test_fixed_length_samples_the_constant() -> None:
    d = LengthDist.fixed(512)
    assert (d.sample(np.random.default_rng(0), 10) == 512).all()
    assert d.mean_value() == 512 and d.quantile(0.99) == 512


def test_lognormal_from_p50_p99_reproduces_percentiles() -> None:
    mean, sigma = solve_lognormal(p50=1000, p99=4000)
    d = LengthDist.lognormal(mean, sigma)
    assert d.quantile(0.5) == pytest.approx(1000, rel=1e-9)
    assert d.quantile(0.99) == pytest.approx(4000, rel=1e-9)
    samples = d.sample(np.random.default_rng(1), 200_000)
    assert samples.dtype == np.int64
    assert np.median(samples) == pytest.approx(1000, rel=0.02)
    assert samples.mean() == pytest.approx(d.mean_value(), rel=0.02)


def test_lognormal_from_mean_p99() -> None:
    mean, sigma = solve_lognormal(mean=211, p99=1000)
    d = LengthDist.lognormal(mean, sigma)
    assert d.mean == 211
    assert d.quantile(0.99) == pytest.approx(1000, rel=1e-9)


def test_lognormal_clipping_moves_mean_and_samples() -> None:
    d = LengthDist.lognormal(1000, 1.5, min=10, max=2000)
    s = d.sample(np.random.default_rng(2), 100_000)
    assert s.min() >= 10 and s.max() <= 2000
    assert d.mean_value() < 1000
    assert s.mean() == pytest.approx(d.mean_value(), rel=0.02)


def test_empirical_samples_only_given_values() -> None:
    d = LengthDist.empirical([5, 7, 7, 100])
    s = d.sample(np.random.default_rng(3), 1000)
    assert set(s.tolist()) <= {5, 7, 100}
    assert d.mean_value() == pytest.approx(29.75)
    assert d.quantile(0.5) == 7


@pytest.mark.parametrize(("given", "field"), [
    ({"p50": 1000, "p99": 900}, "p99"),
    ({"mean": 100, "p99": 5000}, "p99"),  # beyond what any lognormal allows
    ({"mean": 100, "p99": 50}, "p99"),
    ({"mean": 100, "sigma": 1, "p99": 500}, "kind"),
    ({"mean": -3, "sigma": 1}, "mean"),
])
def test_lognormal_bad_parameters_name_the_key(given: dict, field: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        solve_lognormal(**given)
    assert info.value.field == field


# --- traces ------------------------------------------------------------------------------

@needs_traces
@pytest.mark.parametrize("name", sorted(TRACE_ROWS))
def test_real_traces_load_fast(name: str) -> None:
    _load_cached.cache_clear()  # time a cold read, not the cache
    t0 = time.perf_counter()
    tr = load_trace(TRACES / name)
    assert time.perf_counter() - t0 < 0.5
    assert len(tr) == TRACE_ROWS[name]
    assert tr.ts_s[0] == 0.0 and (np.diff(tr.ts_s) >= 0).all()
    assert tr.input_tokens.min() >= 1 and tr.output_tokens.min() >= 1
    assert tr.mean_rate == pytest.approx(len(tr) / tr.duration_s)


@needs_traces
def test_conv_trace_matches_readme() -> None:
    tr = load_trace(TRACES / "azure_llm_2023_conv.csv")
    assert tr.mean_rate == pytest.approx(5.530, abs=5e-4)
    assert tr.duration_s == pytest.approx(3501.7, abs=0.1)
    assert tr.input_tokens.mean() == pytest.approx(1154.7, abs=0.1)


def test_trace_bad_header_names_line_1(tmp_path: Path) -> None:
    p = write_trace(tmp_path, ["0,1,1"], header="time,in,out")
    with pytest.raises(InvalidSpecError, match=r"line 1: header: must be exactly"):
        load_trace(p)


def test_trace_bad_row_names_file_line_and_column(tmp_path: Path) -> None:
    rows = [f"{i}.0,10,5" for i in range(15)] + ["15.0,10,abc"]
    p = write_trace(tmp_path, rows, name="trace.csv")
    with pytest.raises(InvalidSpecError) as info:
        load_trace(p)
    assert "trace.csv line 17: output_tokens: not an integer" in str(info.value)
    assert "abc" not in str(info.value)  # a trace's contents are never echoed


@pytest.mark.parametrize(("rows", "line", "column", "text"), [
    (["0.0,1,1", "2.0,1,1", "1.0,1,1"], 4, "ts_s", "non-decreasing"),
    (["0.0,0,1"], 2, "input_tokens", "must be an integer in [1, 262144]"),
    (["-1.0,1,1"], 2, "ts_s", ">= 0"),
    (["x,1,1"], 2, "ts_s", "not a number"),
    (["0.0,1.5,1"], 2, "input_tokens", "not an integer"),
    (["0.0,1"], 2, "row", "expected 3 columns"),
])
def test_trace_bad_rows(tmp_path: Path, rows: list[str], line: int, column: str,
                        text: str) -> None:
    p = write_trace(tmp_path, rows)
    with pytest.raises(InvalidSpecError) as info:
        load_trace(p)
    msg = str(info.value)
    assert f"line {line}: {column}:" in msg and text in msg


def test_trace_missing_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"nope\.csv"):
        load_trace(tmp_path / "nope.csv")


def test_trace_without_rows(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match="no rows"):
        load_trace(write_trace(tmp_path, []))


# --- arrivals ----------------------------------------------------------------------------

def test_poisson_count_within_four_sigma() -> None:
    arr = Arrival.poisson(20.0)
    times = arr.arrivals(np.random.default_rng(42), 0.0, 10_000.0)
    expected = 20.0 * 10_000
    assert abs(times.size - expected) < 4 * math.sqrt(expected)
    assert (np.diff(times) >= 0).all() and times.min() >= 0 and times.max() < 10_000
    gaps = np.diff(times)  # exponential gaps: mean ≈ std
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.02)


def test_diurnal_rate_peaks_at_phase() -> None:
    arr = Arrival.diurnal(10.0, 4.0, period_s=86400, phase_s=50400)
    peak, trough = arr.rate_at(50400), arr.rate_at(50400 + 43200)
    assert peak == pytest.approx(16.0) and trough == pytest.approx(4.0)
    assert peak / trough == pytest.approx(4.0)
    grid = np.linspace(0, 86400, 2000, endpoint=False)
    rates = [arr.rate_at(t) for t in grid]
    assert grid[int(np.argmax(rates))] == pytest.approx(50400, abs=86400 / 2000)
    assert np.mean(rates) == pytest.approx(10.0, rel=1e-6)
    assert arr.mean_rate() == 10.0 and arr.peak_rate() == pytest.approx(16.0)


def test_diurnal_thinning_follows_the_rate() -> None:
    arr = Arrival.diurnal(10.0, 4.0, period_s=86400, phase_s=50400)
    times = arr.arrivals(np.random.default_rng(7), 0.0, 86400.0)
    assert abs(times.size - 864_000) < 4 * math.sqrt(864_000)
    near_peak = ((times >= 48600) & (times < 52200)).sum() / 3600
    near_trough = ((times >= 5400) & (times < 9000)).sum() / 3600
    assert near_peak == pytest.approx(arr.rate_at(50400), rel=0.05)
    assert near_trough == pytest.approx(arr.rate_at(7200), rel=0.08)


def test_trace_replay_reproduces_timestamps_and_loops(tmp_path: Path) -> None:
    tr = load_trace(small_trace(tmp_path))
    arr = Arrival.replay(tr, loop=False)
    assert np.array_equal(arr.arrivals(None, 0.0, 100.0), tr.ts_s)
    looping = Arrival.replay(tr)
    period = tr.loop_period_s  # 4 s span + 4/3 s mean gap
    assert period == pytest.approx(16 / 3)
    times = looping.arrivals(None, 0.0, 2 * period)
    assert np.allclose(times, np.concatenate([tr.ts_s, tr.ts_s + period]))
    mid = looping.arrivals(None, 1.2, period + 1.2)  # window starting mid-trace
    assert np.allclose(mid, [1.5, 4.0, period, period + 1.0])


def test_trace_replay_time_scale_and_origin(tmp_path: Path) -> None:
    tr = load_trace(small_trace(tmp_path))
    fast = Arrival.replay(tr, time_scale=0.5, loop=False)
    assert np.allclose(fast.arrivals(None, 0, 100, origin_s=10), 10 + tr.ts_s * 0.5)
    assert fast.mean_rate() == pytest.approx(tr.mean_rate * 2)


@needs_traces
def test_real_trace_replay_matches_file_and_rate() -> None:
    tr = load_trace(TRACES / "azure_llm_2023_conv.csv")
    arr = Arrival.replay(tr)
    times, ins, outs = arr.sample_requests(None, 0.0, tr.duration_s + 1e-9)
    assert np.array_equal(times, tr.ts_s)
    assert np.array_equal(ins, tr.input_tokens) and np.array_equal(outs, tr.output_tokens)
    second = arr.arrivals(None, tr.loop_period_s, 2 * tr.loop_period_s)
    assert second.size == len(tr)
    assert 1.0 < arr.rate_at(1800.0) < 15.0


def test_rate_arrival_samples_lengths() -> None:
    times, ins, outs = Arrival.poisson(10).sample_requests(
        np.random.default_rng(0), 0, 100, LengthDist.fixed(7), LengthDist.fixed(3))
    assert times.size == ins.size == outs.size > 0
    assert (ins == 7).all() and (outs == 3).all()


def test_online_job_requests_stay_in_its_lifetime(tmp_path: Path) -> None:
    job = parse_job(online(submit_s=100, end_s=200), catalog=CAT)
    assert isinstance(job, OnlineJob)
    times, ins, _ = job.sample_requests(np.random.default_rng(0), 0, 1000)
    assert times.min() >= 100 and times.max() < 200 and ins.size == times.size
    traced = parse_job(online(arrival={"trace": str(small_trace(tmp_path)), "loop": False},
                              input_len="trace", output_len="trace", submit_s=50),
                       catalog=CAT)
    t2, i2, o2 = traced.sample_requests(None, 0, 1000)  # type: ignore[union-attr]
    assert np.allclose(t2, [50, 51, 51.5, 54]) and i2.tolist() == [100, 200, 300, 400]
    assert o2.tolist() == [10, 20, 30, 40]


# --- parsing and round trips ---------------------------------------------------------------

def roundtrip(job: object) -> None:
    data = job_to_dict(job)  # type: ignore[arg-type]
    assert parse_job(data, catalog=CAT) == job
    via_yaml = yaml.safe_load(yaml.safe_dump(data))
    assert parse_job(via_yaml, catalog=CAT) == job


def test_online_rate_roundtrip() -> None:
    job = parse_job(online(priority=9, prefix_share=0.4, client_region="aws/us-east-1",
                           end_s=500), catalog=CAT)
    assert job.kind == "online" and job.priority == 9
    roundtrip(job)


def test_online_diurnal_and_bounded_lengths_roundtrip() -> None:
    job = parse_job(online(arrival={"kind": "diurnal", "mean_rps": 3, "peak_to_trough": 2,
                                    "phase_s": 3600},
                           input_len={"kind": "fixed", "mean": 64, "max": 1024},
                           output_len={"values": [1, 2, 3]}), catalog=CAT)
    assert job.arrival.period_s == 86400  # type: ignore[union-attr]
    roundtrip(job)


def test_trace_job_roundtrip_keeps_the_name_in_the_traces_dir(tmp_path: Path) -> None:
    small_trace(tmp_path)
    job = parse_job(online(arrival={"trace": "t.csv", "time_scale": 2.0}, input_len="trace",
                           output_len="trace"), catalog=CAT)
    assert job.input_len.from_trace and job.input_len.mean == 250
    assert job.arrival.trace_path == "t.csv"  # type: ignore[union-attr]
    roundtrip(job)


def test_trace_lengths_default_to_the_trace(tmp_path: Path) -> None:
    data = online(arrival={"trace": str(small_trace(tmp_path))})
    del data["input_len"], data["output_len"]
    job = parse_job(data, catalog=CAT)
    assert job.output_len.from_trace and job.output_len.mean == 25


@needs_traces
def test_shared_prefix_resolves_to_shared_data() -> None:
    job = parse_job(online(arrival={"trace": "shared:traces/azure_llm_2023_code.csv"}),
                    catalog=CAT)
    assert job.arrival.trace is not None and len(job.arrival.trace) == 8819  # type: ignore
    assert job.arrival.trace_path == "shared:traces/azure_llm_2023_code.csv"  # type: ignore
    roundtrip(job)


def test_batch_from_num_requests_roundtrip() -> None:
    job = parse_job(batch(), catalog=CAT)
    assert isinstance(job, BatchJob) and job.kind == "batch"
    assert job.total_input_tokens == 2_000_000 and job.total_output_tokens == 250_000
    roundtrip(job)


def test_batch_from_total_output_tokens() -> None:
    data = batch(total_output_tokens=1_000_000, output_len=300)
    del data["num_requests"]
    job = parse_job(data, catalog=CAT)
    assert job.num_requests == 3334  # type: ignore[union-attr]
    assert 1_000_000 <= job.total_output_tokens < 1_000_300  # type: ignore[union-attr]
    roundtrip(job)


def test_parse_jobs_list_and_duplicate_ids() -> None:
    jobs = parse_jobs({"jobs": [online(), batch()]}, catalog=CAT)
    assert [j.kind for j in jobs] == ["online", "batch"]
    with pytest.raises(InvalidSpecError, match=r"jobs\[1\]\.id: duplicate job id 'chat'"):
        parse_jobs({"jobs": [online(), online()]}, catalog=CAT)


# --- bad input: every message names its field ---------------------------------------------

@pytest.mark.parametrize(("data", "field", "text"), [
    (online(slo={"ttft_ms": -5, "tpot_ms": 50}), "slo.ttft_ms", "must be >= 1.0 (got -5)"),
    (online(slo={"ttft_ms": 5, "tpot_ms": 0}), "slo.tpot_ms", "must be >= 0.1"),
    (online(slo={"ttft_ms": 5, "tpot_ms": 5, "percentile": 100}), "slo.percentile", "< 100"),
    (online(slo={"ttft_ms": 5, "tpot_ms": 5, "percentile": 50}), "slo.percentile", "> 50"),
    (online(slo={"ttft_ms": 5}), "slo.tpot_ms", "missing"),
    (online(arrival={"rate_rps": -2}), "arrival.rate_rps", "must be > 0 (got -2)"),
    (online(arrival={"rate_rps": "fast"}), "arrival.rate_rps", "must be a number"),
    (online(arrival={"rate_rps": True}), "arrival.rate_rps", "must be a number"),
    (online(arrival={"mean_rps": 2, "peak_to_trough": 0.5}), "arrival.peak_to_trough", ">= 1"),
    (online(arrival={"kind": "bursty"}), "arrival.kind", "not one of rate, diurnal, trace"),
    (online(arrival={}), "arrival.kind", "cannot tell"),
    (online(arrival={"rate_rps": 1, "burst": 2}), "arrival.burst", "allowed: kind, rate_rps"),
    (online(model="llama-3-8b"), "model", "did you mean llama-3.1-8b?"),
    (online(model="gpt-9"), "model", "known models:"),
    (online(priority=10), "priority", "<= 9 (got 10)"),
    (online(priority=2.5), "priority", "must be an integer"),
    (online(prefix_share=1.5), "prefix_share", "<= 1"),
    (online(end_s=0), "end_s", "must be > submit_s"),
    (online(id="bad id!"), "id", "letters, digits"),
    (online(colour="red"), "colour", "unknown key; allowed: kind, id, model"),
    (online(input_len="trace"), "input_len", "needs a trace arrival"),
    (online(input_len=0), "input_len", "must be > 0 (got 0)"),
    (online(input_len=200_000), "input_len", "must lie in [min, max] = [1, 131072]"),
    (online(input_len={"kind": "lognormal", "p50": 100}), "input_len.kind", "exactly one of"),
    (online(input_len={"kind": "gamma"}), "input_len.kind", "not one of fixed, lognormal"),
    (online(input_len={"mean": 10, "min": 20, "max": 5}), "input_len.min", "<= max"),
    (online(output_len={"values": [1, 0]}), "output_len.values[1]", "in [1, 262144]"),
    (online(output_len=[1, 2]), "output_len", "must be an integer (fixed length)"),
    (online(kind="stream"), "kind", "not one of online, batch"),
    (online(arrival={"trace": "missing.csv"}), "arrival.trace", "missing.csv"),
    ({"id": "x", "model": "llama-3.1-8b"}, "kind", "missing"),
    (batch(deadline_s=0), "deadline_s", "must be > 0 (got 0)"),
    (batch(deadline_s=-1), "deadline_s", "must be > 0"),
    (batch(total_output_tokens=5), "total_output_tokens", "not both"),
    ({k: v for k, v in batch().items() if k != "num_requests"}, "num_requests",
     "give num_requests or total_output_tokens"),
    (batch(num_requests=0), "num_requests", ">= 1"),
    (batch(arrival={"rate_rps": 1}), "arrival", "unknown key"),
])
def test_bad_input_names_the_field(data: dict, field: str, text: str) -> None:
    e = err(data)
    assert e.field == field
    assert f"{field}: " in str(e) and text in str(e), str(e)


def test_bad_trace_row_is_reported_under_arrival_trace(tmp_path: Path) -> None:
    p = write_trace(tmp_path, ["0.0,1,1", "1.0,1,abc"], name="trace.csv")
    e = err(online(arrival={"trace": str(p)}))
    assert e.field == "arrival.trace"
    assert "trace.csv line 3: output_tokens: not an integer" in str(e)


# --- YAML files: errors point at lines ----------------------------------------------------

def write_yaml(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


JOB_YAML = """\
kind: online
id: chat
model: llama-3.1-8b
arrival:
  rate_rps: 5
input_len: 800
output_len: 200
slo:
  ttft_ms: {ttft}
  tpot_ms: 50
"""


def test_yaml_error_names_field_and_line(tmp_path: Path) -> None:
    p = write_yaml(tmp_path, JOB_YAML.format(ttft=-5))
    with pytest.raises(InvalidSpecError) as info:
        load_job_yaml(p, catalog=CAT)
    assert str(info.value) == f"{p}:9: slo.ttft_ms: must be >= 1.0 (got -5)"


def test_yaml_missing_key_points_at_parent(tmp_path: Path) -> None:
    text = JOB_YAML.format(ttft=100).replace("  tpot_ms: 50\n", "")
    with pytest.raises(InvalidSpecError, match=r"job.yaml:8: slo.tpot_ms: missing"):
        load_job_yaml(write_yaml(tmp_path, text), catalog=CAT)


def test_yaml_jobs_list_error_has_index_and_line(tmp_path: Path) -> None:
    text = """\
jobs:
  - {kind: batch, id: a, model: llama-3.1-8b, num_requests: 5, input_len: 10,
     output_len: 10, deadline_s: 60}
  - kind: batch
    id: b
    model: llama-3.1-8b
    num_requests: 5
    input_len: 10
    output_len: 10
    deadline_s: 60
  - kind: batch
    id: c
    model: llama-3-8b
"""
    with pytest.raises(InvalidSpecError) as info:
        load_jobs_yaml(write_yaml(tmp_path, text), catalog=CAT)
    msg = str(info.value)
    assert ":13: jobs[2].model: unknown model 'llama-3-8b'; did you mean llama-3.1-8b?" in msg


def test_yaml_unknown_key_line(tmp_path: Path) -> None:
    text = JOB_YAML.format(ttft=100) + "colour: red\n"
    with pytest.raises(InvalidSpecError, match=r"job.yaml:11: colour: unknown key; allowed:"):
        load_job_yaml(write_yaml(tmp_path, text), catalog=CAT)


def test_yaml_trace_in_the_traces_dir_and_missing_trace(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "specs"
    sub.mkdir()
    small_trace(sub)
    monkeypatch.setenv("KOI_TRACES_DIR", str(sub))
    text = JOB_YAML.format(ttft=100).replace("  rate_rps: 5", "  trace: t.csv")
    job = load_job_yaml(write_yaml(sub, text), catalog=CAT)
    assert job.arrival.kind == "trace"  # type: ignore[union-attr]
    text = text.replace("t.csv", "gone.csv")
    with pytest.raises(InvalidSpecError, match=r"job.yaml:5: arrival.trace: .*gone.csv"):
        load_job_yaml(write_yaml(sub, text), catalog=CAT)


def test_yaml_bad_trace_row_reports_both_files(tmp_path: Path) -> None:
    write_trace(tmp_path, ["0.0,1,1", "0.5,1,1", "0.2,1,1"])
    text = JOB_YAML.format(ttft=100).replace("  rate_rps: 5", "  trace: t.csv")
    with pytest.raises(InvalidSpecError) as info:
        load_job_yaml(write_yaml(tmp_path, text), catalog=CAT)
    msg = str(info.value)
    assert "job.yaml:5: arrival.trace:" in msg and "t.csv line 4: ts_s:" in msg


@pytest.mark.parametrize(("text", "pattern"), [
    ("kind: online\nid: [unclosed\n", r"job.yaml:\d+: yaml: not valid YAML"),
    ("", r"job.yaml: file: is empty"),
    ("id: a\nid: b\n", r"job.yaml:2: id: duplicate key \(first on line 1\)"),
    ("- 1\n- 2\n", r"jobs\[0\]: a job must be a mapping"),
])
def test_yaml_structural_errors(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(InvalidSpecError, match=pattern):
        load_jobs_yaml(write_yaml(tmp_path, text), catalog=CAT)


def test_load_job_yaml_refuses_several_jobs(tmp_path: Path) -> None:
    body = yaml.safe_dump({"jobs": [batch(id="a"), batch(id="b")]})
    with pytest.raises(InvalidSpecError, match="holds 2 jobs"):
        load_job_yaml(write_yaml(tmp_path, body), catalog=CAT)


def test_missing_yaml_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"nothere\.yaml"):
        load_jobs_yaml(tmp_path / "nothere.yaml", catalog=CAT)


# --- examples -----------------------------------------------------------------------------

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLE_FILES}
    assert {"chat-online.yaml", "code-trace.yaml", "batch-summarize.yaml"} <= names


@needs_traces
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_examples_parse_with_the_real_catalog(path: Path) -> None:
    pytest.importorskip("koi.catalog")
    job = load_job_yaml(path)
    assert parse_job(job_to_dict(job)) == job
    if job.kind == "batch":
        assert job.total_output_tokens >= 200_000_000  # type: ignore[union-attr]
    if job.arrival.kind == "trace" if job.kind == "online" else False:  # type: ignore
        assert job.arrival.mean_rate() == pytest.approx(2 * 2.5667, rel=1e-3)  # type: ignore


def test_arrival_refuses_another_kinds_fields() -> None:
    with pytest.raises(InvalidSpecError, match="mean_rps: only applies to kind diurnal"):
        Arrival("rate", rate_rps=1.0, mean_rps=2.0)


def test_slo_defaults_and_direct_construction() -> None:
    slo = Slo(ttft_ms=300, tpot_ms=30)
    assert slo.percentile == 95
    with pytest.raises(InvalidSpecError, match="percentile"):
        Slo(ttft_ms=300, tpot_ms=30, percentile=40)
