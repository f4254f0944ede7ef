"""Physical bounds on admitted jobs, job ids, trace confinement and job-file limits.

Every bound is checked on both ways in: the YAML/dict parser and the protobuf decoder
(``job_from_proto``), which must refuse the same value with the same reason, naming the
field. The bounds' numbers are tied to the catalog here, so a catalog that outgrows them
fails a test instead of having its jobs refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from koi import subjects
from koi.catalog import load_catalog
from koi.errors import InvalidSpecError
from koi.jobs import Arrival, load_jobs_yaml, load_trace, parse_job
from koi.jobs import bounds as B
from koi.jobs.trace import resolve_trace_path
from koi.paths import REPO_ROOT
from koi.scenario import load_scenario
from koi.v1 import jobs_pb2
from koi.wire.jobs import job_from_proto, job_to_proto

CAT = load_catalog()
SCENARIOS = sorted((REPO_ROOT / "libs/koi/scenario/data").glob("*.yaml"))
EXAMPLES = sorted((REPO_ROOT / "examples/jobs").glob("*.yaml"))
HEADER = "ts_s,input_tokens,output_tokens\n"


def online(**over: Any) -> dict[str, Any]:
    job = {"kind": "online", "id": "chat", "model": "llama-3.1-8b",
           "arrival": {"rate_rps": 5.0}, "input_len": 800, "output_len": 200,
           "slo": {"ttft_ms": 500.0, "tpot_ms": 50.0}}
    job.update(over)
    return job


def batch(**over: Any) -> dict[str, Any]:
    job = {"kind": "batch", "id": "nightly", "model": "llama-3.1-8b", "num_requests": 1000,
           "input_len": 1000, "output_len": 200, "deadline_s": 3600.0}
    job.update(over)
    return job


def yaml_error(data: dict[str, Any]) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as info:
        parse_job(data, catalog=CAT)
    return info.value


def proto_error(data: dict[str, Any], mutate: Callable[[jobs_pb2.JobSpec], None]
                ) -> InvalidSpecError:
    msg = job_to_proto(parse_job(data, catalog=CAT))
    mutate(msg)
    with pytest.raises(InvalidSpecError) as info:
        job_from_proto(msg, catalog=CAT)
    return info.value


def _set(path: str, value: Any) -> Callable[[jobs_pb2.JobSpec], None]:
    def mutate(msg: jobs_pb2.JobSpec) -> None:
        *parents, leaf = path.split(".")
        target: Any = msg
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, value)
    return mutate


DAY = 86_400.0
# (base job, its dict field → bad value, its proto path, the bad value there, reason text)
CASES = [
    (online(arrival={"rate_rps": 1e9}), "arrival.rate_rps", "online.arrival.rate.rate_rps",
     1e9, "<= 10000"),
    (online(arrival={"mean_rps": 2e4, "peak_to_trough": 2}), "arrival.mean_rps",
     "online.arrival.diurnal.mean_rps", 2e4, "<= 10000"),
    (online(arrival={"mean_rps": 5, "period_s": 40 * DAY}), "arrival.period_s",
     "online.arrival.diurnal.period_s", 40 * DAY, "<= 2592000"),
    (online(arrival={"mean_rps": 5, "phase_s": -40 * DAY}), "arrival.phase_s",
     "online.arrival.diurnal.phase_s", -40 * DAY, ">= -2592000"),
    (online(slo={"ttft_ms": 0.001, "tpot_ms": 50}), "slo.ttft_ms", "online.slo.ttft_ms",
     0.001, ">= 1"),
    (online(slo={"ttft_ms": 500, "tpot_ms": 1e-9}), "slo.tpot_ms", "online.slo.tpot_ms",
     1e-9, ">= 0.1"),
    (online(submit_s=31 * DAY), "submit_s", "submit_s", 31 * DAY, "<= 2592000"),
    (online(end_s=31 * DAY), "end_s", "online.end_s", 31 * DAY, "<= 2592000"),
    (batch(deadline_s=31 * DAY), "deadline_s", "batch.deadline_s", 31 * DAY, "<= 2592000"),
    (online(input_len={"kind": "lognormal", "mean": 1e9, "sigma": 1.0}), "input_len.mean",
     "online.input_len.lognormal.mean_tokens", 1e9, "<= 262144"),
    (online(input_len={"kind": "fixed", "mean": 100, "max": 10**7}), "input_len.max",
     "online.input_len.max_tokens", 10**7, "<= 262144"),
    (online(input_len={"kind": "fixed", "mean": 200_000, "max": 200_000},
            output_len={"kind": "fixed", "mean": 100_000, "max": 200_000}),
     "output_len", "online.output_len", None, "262144"),
    (batch(num_requests=10**12, input_len=100_000), "num_requests", "batch.num_requests",
     10**12, "1e+16"),
    (online(client_region="x" * 200), "client_region", "online.client_region", "x" * 200,
     "at most 128"),
]


@pytest.mark.parametrize(("data", "field", "proto_field", "value", "text"), CASES,
                         ids=[c[1] for c in CASES])
def test_each_bound_is_refused_the_same_way_in_yaml_and_protobuf(
        data: dict[str, Any], field: str, proto_field: str, value: Any, text: str) -> None:
    e = yaml_error(data)
    assert e.field == field and text in e.reason, str(e)
    if value is None:
        return  # a cross-field bound: its value cannot be set on a valid message alone
    p = proto_error(_valid_twin(data), _set(proto_field, value))
    assert p.field == proto_field and p.reason == e.reason, (str(p), str(e))


def _valid_twin(data: dict[str, Any]) -> dict[str, Any]:
    """The same kind of job with the offending value back within bounds."""
    if data["kind"] == "batch":
        return batch(input_len=data.get("input_len", 1000))
    arrival = data["arrival"]
    if "mean_rps" in arrival:
        return online(arrival={"mean_rps": 5, "peak_to_trough": 2})
    if isinstance(data.get("input_len"), dict) and data["input_len"].get("kind") == "lognormal":
        return online(input_len={"kind": "lognormal", "mean": 800, "sigma": 1.0})
    return online()


def test_a_rate_of_a_billion_is_refused_naming_the_field() -> None:
    # the job that killed the simulator for good (MemoryError, replayed every ~40 s)
    e = yaml_error(online(arrival={"rate_rps": 1e9}))
    assert str(e) == "<dict>: arrival.rate_rps: must be <= 10000.0 (got 1000000000)"


def test_a_trace_replayed_faster_than_the_rate_bound_is_refused(tmp_path: Path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("KOI_TRACES_DIR", str(tmp_path))
    (tmp_path / "t.csv").write_text(HEADER + "0.0,10,10\n0.0001,10,10\n0.0002,10,10\n")
    e = yaml_error(online(arrival={"trace": "t.csv", "time_scale": 1.0}))
    assert e.field == "arrival.time_scale" and "req/s" in e.reason
    e = yaml_error(online(arrival={"trace": "t.csv", "time_scale": 1e-6}))
    assert e.field == "arrival.time_scale" and ">= 0.001" in e.reason


def test_bounds_cover_the_catalog() -> None:
    # a request as long as the longest context any catalog model holds is admitted
    assert max(m.max_context for m in CAT.models.values()) <= B.MAX_REQUEST_TOKENS
    # the largest shipped fleet at the catalog's compute ceiling over the longest horizon
    fleet = max(sum(f.gpus for f in load_scenario(p).fleet) for p in SCENARIOS
                if "trace" not in p.name)
    peak_flops = max(max(a.bf16_tflops, a.fp8_tflops, a.fp4_tflops)
                     for a in CAT.accelerators.values()) * 1e12
    smallest = min(m.active_params_b for m in CAT.models.values()) * 1e9
    ceiling = fleet * peak_flops / (2 * smallest) * B.MAX_HORIZON_S
    assert ceiling <= B.MAX_BATCH_TOKENS


@pytest.mark.parametrize("path", SCENARIOS + EXAMPLES, ids=lambda p: p.name)
def test_shipped_jobs_are_within_bounds_and_ids_are_labels(path: Path) -> None:
    if "trace" in path.name and not (REPO_ROOT.parent / "shared" / "data").is_dir() \
            and not os.environ.get("KOI_SHARED_DATA"):
        pytest.skip("needs the shared traces")
    jobs = (load_scenario(path).jobs if path.parent.name == "data"
            else load_jobs_yaml(path, catalog=CAT))
    for job in jobs:
        assert B.ID_PATTERN.fullmatch(job.id) and len(job.id) <= 63


# --- job ids ------------------------------------------------------------------------------

@pytest.mark.parametrize("job_id", ["chat\r\nFORGED 00:00:00 ERROR admission", "x" * 10_000,
                                    "dot.b", "dot_b", "Chat", "-a", "a-", "a b", "ü", ""])
def test_ids_must_be_dns_labels_and_errors_stay_short(job_id: str) -> None:
    for e in (yaml_error(online(id=job_id)),
              proto_error(online(), _set("id", job_id))):
        assert e.field in ("id",) and "\n" not in str(e) and "\r" not in str(e)
        assert len(str(e)) < 300


@pytest.mark.parametrize("job_id", ["a", "chat-us-70b", "0", "a" * 63])
def test_dns_label_ids_are_accepted(job_id: str) -> None:
    assert parse_job(online(id=job_id), catalog=CAT).id == job_id


def test_accepted_subject_no_longer_maps_dots() -> None:
    assert subjects.job_accepted_subject("dot-b") == "koi.jobs.accepted.dot-b"
    with pytest.raises(ValueError):
        subjects.job_accepted_subject("dot.b")  # was koi.jobs.accepted.dot_b, as dot_b's


# --- trace confinement --------------------------------------------------------------------

@pytest.fixture
def traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    (d / "ok.csv").write_text(HEADER + "0.0,10,10\n1.0,20,20\n")
    monkeypatch.setenv("KOI_TRACES_DIR", str(d))
    return d


@pytest.mark.parametrize("ref", ["/etc/passwd", "../secret.csv", "/nonexistent/x.csv",
                                 "sub/../../secret.csv", "link.csv"])
def test_trace_outside_the_traces_dir_is_refused_unread(traces: Path, ref: str) -> None:
    secret = traces.parent / "secret.csv"
    secret.write_text("TOP-SECRET-LINE\n")
    (traces / "link.csv").symlink_to(secret)
    for e in (yaml_error(online(arrival={"trace": ref})),
              proto_error(online(arrival={"trace": "ok.csv"}),
                          _set("online.arrival.trace.path", ref))):
        assert "outside the traces directory" in str(e)
        assert "root:" not in str(e) and "TOP-SECRET" not in str(e)
        assert str(traces.parent) not in str(e)


def test_outside_answers_tell_nothing_of_existence(traces: Path) -> None:
    (traces.parent / "real.csv").write_text(HEADER + "0,1,1\n")
    there = yaml_error(online(arrival={"trace": str(traces.parent / "real.csv")})).reason
    absent = yaml_error(online(arrival={"trace": str(traces.parent / "nope.csv")})).reason
    assert there.replace("real", "X") == absent.replace("nope", "X")


def test_traces_inside_and_shared_names_resolve(traces: Path) -> None:
    assert resolve_trace_path("ok.csv") == (traces / "ok.csv").resolve()
    assert resolve_trace_path(str(traces / "ok.csv")) == (traces / "ok.csv").resolve()
    job = parse_job(online(arrival={"trace": "ok.csv"}), catalog=CAT)
    assert job_from_proto(job_to_proto(job), catalog=CAT) == job


def test_bad_trace_rows_never_echo_the_file(traces: Path) -> None:
    (traces / "bad.csv").write_text(HEADER + "0.0,10,10\n1.0,SECRET,10\n")
    (traces / "hdr.csv").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (traces / "bin.csv").write_bytes(HEADER.encode() + bytes(range(128, 256)))
    for name in ("bad.csv", "hdr.csv", "bin.csv"):
        e = str(yaml_error(online(arrival={"trace": name})))
        assert "SECRET" not in e and "root:x" not in e and "\n" not in e, e
    assert "UTF-8" in str(yaml_error(online(arrival={"trace": "bin.csv"})))


def test_trace_size_and_rows_are_bounded(traces: Path, monkeypatch) -> None:
    (traces / "long.csv").write_text(HEADER + "".join(f"{i},1,1\n" for i in range(50)))
    monkeypatch.setattr("koi.jobs.trace.MAX_TRACE_ROWS", 10)
    with pytest.raises(InvalidSpecError, match="at most 10 rows"):
        load_trace(traces / "long.csv")
    monkeypatch.setattr("koi.jobs.trace.MAX_TRACE_BYTES", 100)
    with pytest.raises(InvalidSpecError, match="at most 100"):
        load_trace(traces / "long.csv")


def test_looped_replay_matches_the_pass_by_pass_loop(traces: Path) -> None:
    arr = Arrival("trace", trace_path="ok.csv", time_scale=0.37, loop=True)
    times, rows = arr._replay(3.3, 61.7, 1.25)
    # the reference: one pass at a time, as the replay was first written
    tr = arr.trace
    assert tr is not None
    rel = (tr.ts_s - tr.ts_s[0]) * arr.time_scale
    period = tr.loop_period_s * arr.time_scale
    want_t, want_r = [], []
    for k in range(int(np.floor((3.3 - 1.25) / period)), int(np.ceil((61.7 - 1.25) / period)) + 1):
        shifted = rel + k * period
        sel = np.flatnonzero((shifted >= 3.3 - 1.25) & (shifted < 61.7 - 1.25))
        want_t.append(1.25 + shifted[sel])
        want_r.append(sel)
    assert np.array_equal(times, np.concatenate(want_t))
    assert np.array_equal(rows, np.concatenate(want_r))


# --- job files ----------------------------------------------------------------------------

def _bomb(levels: int = 9) -> str:
    out = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    out += [f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, levels)]
    return "\n".join([*out, f"jobs: *a{levels - 1}"]) + "\n"


@pytest.mark.parametrize(("content", "reason"), [
    (_bomb(), "holds more than 250000 YAML nodes"),
    ("a: &a [*a]\njobs: *a\n", "refers to itself"),
    (bytes(range(256)) * 4, "not UTF-8 text"),
    ("jobs:\n" + "  - {id: x, kind: batch}\n" * 60_000, "larger than 1048576 bytes"),
    # found by a longer fuzz hunt: a list where a kind belongs raised TypeError (unhashable)
    ("kind: online\nid: a\nmodel: llama-3.1-8b\narrival: {kind: [1]}\n"
     "slo: {ttft_ms: 500, tpot_ms: 50}\n", "arrival.kind: must be one of rate, diurnal"),
    ("kind: online\nid: a\nmodel: llama-3.1-8b\narrival: {rate_rps: 1}\n"
     "input_len: {kind: [null]}\nslo: {ttft_ms: 500, tpot_ms: 50}\n",
     "input_len.kind: [None] is not one of fixed"),
])
def test_hostile_job_files_are_refused_with_one_line(tmp_path: Path, content: str | bytes,
                                                     reason: str) -> None:
    p = tmp_path / "jobs.yaml"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    with pytest.raises(InvalidSpecError) as info:
        load_jobs_yaml(p, catalog=CAT)
    assert reason in str(info.value) and "\n" not in str(info.value)
