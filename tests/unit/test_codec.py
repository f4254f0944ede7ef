"""Unit tests for koi.wire: domain → proto → bytes → proto → domain round trips, schema
coverage of every domain field, and the errors bad messages raise (naming the field)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from koi.errors import InvalidConfigError, InvalidSpecError
from koi.jobs import (
    Arrival,
    BatchJob,
    LengthDist,
    OnlineJob,
    Slo,
    load_job_yaml,
    load_trace,
    shared_data_dir,
)
from koi.predictor.types import MEDIATORS, OUTCOMES, LoadMode, Prediction, Workload
from koi.space import (
    KNOBS,
    DeploymentConfig,
    KvDtype,
    Precision,
    PreemptionMode,
    SchedulingPolicy,
    SpecDecode,
    config_hash,
)
from koi.v1 import config_pb2, jobs_pb2, prediction_pb2
from koi.wire import (
    config_from_proto,
    config_to_proto,
    decode,
    decode_config,
    decode_job,
    decode_prediction,
    decode_workload,
    encode,
    encode_config,
    encode_job,
    encode_prediction,
    encode_workload,
    job_from_proto,
    job_to_proto,
    prediction_from_proto,
    prediction_to_proto,
    workload_from_proto,
    workload_to_proto,
)
from koi.wire.config import KNOB_ENUMS

REPO = Path(__file__).resolve().parents[2]
SHARED = shared_data_dir()
needs_shared = pytest.mark.skipif(SHARED is None, reason="shared data not present")


def via_bytes(msg):  # type: ignore[no-untyped-def]
    """proto → bytes → proto, as a message crosses the bus."""
    return decode(encode(msg), type(msg))


# --- DeploymentConfig --------------------------------------------------------------------

NON_DEFAULT = DeploymentConfig(
    model="mixtral-8x7b", accelerator="h200", offering="aws/us-east-1/h200/spot",
    engine="sglang", tp=4, pp=2, dp_attention=2, ep=8, replicas=3,
    weight_precision=Precision.FP8, kv_dtype=KvDtype.FP8, gpu_mem_fraction=0.85,
    max_num_seqs=128, max_batched_tokens=4096, max_model_len=16384, chunked_prefill=False,
    prefix_caching=False, cuda_graphs=False, spec_decode=SpecDecode.EAGLE, spec_tokens=3,
    block_size=32, scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption_mode=PreemptionMode.SWAP, multi_node=True, custom_allreduce=False,
    pd_disaggregation=True, prefill_accelerator="h100-sxm", prefill_tp=2, prefill_replicas=2)


def test_schema_has_every_knob_and_nothing_else() -> None:
    assert set(config_pb2.DeploymentConfig.DESCRIPTOR.fields_by_name) == set(KNOBS)


def test_non_default_config_round_trips_through_bytes() -> None:
    defaults = DeploymentConfig()
    assert all(getattr(NON_DEFAULT, k) != getattr(defaults, k) for k in KNOBS)
    msg = config_to_proto(NON_DEFAULT)
    back = config_from_proto(via_bytes(msg))
    assert back == NON_DEFAULT
    assert config_hash(back) == config_hash(NON_DEFAULT)
    assert decode_config(encode_config(NON_DEFAULT)) == NON_DEFAULT


def test_encoding_sets_every_optional_knob_explicitly() -> None:
    msg = config_to_proto(DeploymentConfig())
    for f in msg.DESCRIPTOR.fields:
        if f.has_presence:
            assert msg.HasField(f.name), f.name


def test_absent_optional_knobs_take_the_defaults() -> None:
    msg = config_pb2.DeploymentConfig(
        model="llama-3.1-8b", accelerator="l4", engine="vllm",
        weight_precision=config_pb2.PRECISION_BF16, kv_dtype=config_pb2.KV_DTYPE_AUTO,
        spec_decode=config_pb2.SPEC_DECODE_NONE,
        scheduling_policy=config_pb2.SCHEDULING_POLICY_FCFS,
        preemption_mode=config_pb2.PREEMPTION_MODE_RECOMPUTE)
    assert config_from_proto(msg) == DeploymentConfig(accelerator="l4")


def test_enum_codecs_cover_every_member_both_ways() -> None:
    for knob, codec in KNOB_ENUMS.items():
        numbers = {codec.to_proto(m) for m in codec.domain}
        assert 0 not in numbers and len(numbers) == len(codec.domain), knob
        for m in codec.domain:
            assert codec.from_proto(codec.to_proto(m), knob, InvalidConfigError) is m


@pytest.mark.parametrize("knob", sorted(KNOB_ENUMS))
def test_unspecified_enum_is_rejected_naming_the_knob(knob: str) -> None:
    msg = config_to_proto(DeploymentConfig())
    msg.ClearField(knob)
    with pytest.raises(InvalidConfigError) as info:
        config_from_proto(msg)
    assert info.value.knob == knob and "UNSPECIFIED" in info.value.reason


def test_unknown_enum_number_is_rejected() -> None:
    msg = config_to_proto(DeploymentConfig())
    msg.kv_dtype = 99  # type: ignore[assignment]  # a newer sender's value
    with pytest.raises(InvalidConfigError, match="unknown value 99") as info:
        config_from_proto(msg)
    assert info.value.knob == "kv_dtype"


@pytest.mark.parametrize(("knob", "value", "reason"), [
    ("model", "", "missing"),
    ("model", "llama-9-1t", "llama"),
    ("accelerator", "", "missing"),
    ("accelerator", "h1000", "h1000"),
    ("engine", "", "missing"),
    ("engine", "tgi", "not one of"),
    ("offering", "aws/mars-1/h100-sxm/spot", "mars"),
    ("prefill_accelerator", "tpu-v5", "tpu"),
    ("tp", 0, "below the minimum"),
    ("replicas", 5000, "above the maximum"),
    ("gpu_mem_fraction", 0.99, "above the maximum"),
    ("gpu_mem_fraction", float("nan"), "NaN"),
    ("block_size", 24, "not one of"),
])
def test_bad_knob_is_rejected_naming_it(knob: str, value: object, reason: str) -> None:
    msg = config_to_proto(DeploymentConfig())
    setattr(msg, knob, value)
    with pytest.raises(InvalidConfigError, match=reason) as info:
        config_from_proto(msg)
    assert info.value.knob == knob


def test_strict_decoding_runs_full_validation() -> None:
    # 405B in bf16 on one L4 decodes structurally but cannot run.
    cfg = DeploymentConfig(model="llama-3.1-405b", accelerator="l4")
    assert config_from_proto(config_to_proto(cfg)) == cfg
    with pytest.raises(InvalidConfigError):
        config_from_proto(config_to_proto(cfg), strict=True)


def test_encoding_an_out_of_range_int_names_the_knob() -> None:
    with pytest.raises(InvalidConfigError) as info:
        config_to_proto(DeploymentConfig(max_num_seqs=2**40))
    assert info.value.knob == "max_num_seqs"


def test_equal_configs_encode_to_equal_bytes() -> None:
    assert encode_config(NON_DEFAULT) == encode_config(NON_DEFAULT.with_())


# --- Workload and Prediction ---------------------------------------------------------------

@pytest.mark.parametrize("mode", list(LoadMode))
def test_workload_round_trips_in_every_mode(mode: LoadMode) -> None:
    load = 0.0 if mode == LoadMode.SATURATED else 12.5
    w = Workload(input_len=1234.5, output_len=321.0, mode=mode, load=load, prefix_hit=0.25,
                 window_s=300.0, slo_ttft_ms=800.0, slo_tpot_ms=50.0)
    assert workload_from_proto(via_bytes(workload_to_proto(w))) == w
    assert decode_workload(encode_workload(w)) == w


def test_workload_window_defaults_when_absent() -> None:
    msg = prediction_pb2.Workload(input_len_tokens=100, output_len_tokens=10,
                                  mode=prediction_pb2.LOAD_MODE_SATURATED)
    assert workload_from_proto(msg) == Workload(100, 10)


@pytest.mark.parametrize(("change", "field"), [
    ({"mode": prediction_pb2.LOAD_MODE_UNSPECIFIED}, "mode"),
    ({"input_len_tokens": 0.5}, "input_len_tokens"),
    ({"output_len_tokens": float("nan")}, "output_len_tokens"),
    ({"load": 0.0}, "load"),
    ({"prefix_hit": 1.0}, "prefix_hit"),
    ({"window_s": 0.0}, "window_s"),
    ({"slo_ttft_ms": -1.0}, "slo_ttft_ms"),
])
def test_bad_workload_is_rejected_naming_the_field(change: dict, field: str) -> None:
    msg = workload_to_proto(Workload(1000, 100, LoadMode.RATE, load=5.0))
    for key, value in change.items():
        setattr(msg, key, value)
    with pytest.raises(InvalidSpecError) as info:
        workload_from_proto(msg)
    assert info.value.field == field


def sample_prediction() -> Prediction:
    names = [f.name for f in fields(Prediction)]
    # Distinct, non-round values so a swapped field cannot go unnoticed.
    return Prediction(**{n: 1.0 + i / 7 for i, n in enumerate(names)})


def test_prediction_schema_covers_every_dataclass_field() -> None:
    outcomes = set(prediction_pb2.Outcomes.DESCRIPTOR.fields_by_name)
    mediators = set(prediction_pb2.Mediators.DESCRIPTOR.fields_by_name)
    context = set(prediction_pb2.Prediction.DESCRIPTOR.fields_by_name) - {"outcomes",
                                                                           "mediators"}
    assert set(OUTCOMES) <= outcomes and set(MEDIATORS) <= mediators
    assert {f.name for f in fields(Prediction)} == set(OUTCOMES) | set(MEDIATORS) | context


def test_prediction_round_trips() -> None:
    p = sample_prediction()
    assert prediction_from_proto(via_bytes(prediction_to_proto(p))) == p
    assert decode_prediction(encode_prediction(p)) == p


def test_prediction_carries_infinity() -> None:
    p = sample_prediction()
    overloaded = Prediction(**{**p.to_dict(), "ttft_ms": float("inf")})
    assert decode_prediction(encode_prediction(overloaded)) == overloaded


@pytest.mark.parametrize("path", ["outcomes.tpot_p95_ms", "mediators.kv_pressure",
                                  "outcomes", "mediators"])
def test_prediction_missing_field_is_named(path: str) -> None:
    msg = prediction_to_proto(sample_prediction())
    parent, _, name = path.rpartition(".")
    (getattr(msg, parent) if parent else msg).ClearField(name)
    with pytest.raises(InvalidSpecError) as info:
        prediction_from_proto(msg)
    assert info.value.field == path


# --- jobs ----------------------------------------------------------------------------------

def online(arrival: Arrival, **over: object) -> OnlineJob:
    base: dict = dict(id="chat-eu", model="llama-3.1-70b", arrival=arrival,
                      input_len=LengthDist.lognormal(1200.5, 0.7, min=4, max=16384),
                      output_len=LengthDist.fixed(256),
                      slo=Slo(ttft_ms=800.0, tpot_ms=50.0, percentile=99.0), priority=0,
                      prefix_share=0.3, submit_s=60.0, end_s=7200.0,
                      client_region="aws/eu-west-1")
    base.update(over)
    return OnlineJob(**base)


def write_trace(tmp_path: Path) -> Path:
    p = tmp_path / "mini.csv"
    p.write_text("ts_s,input_tokens,output_tokens\n0.0,100,10\n1.0,2000,20\n2.5,300,30\n")
    return p


def round_trip(job):  # type: ignore[no-untyped-def]
    back = job_from_proto(via_bytes(job_to_proto(job)))
    assert decode_job(encode_job(job)) == back
    return back


@pytest.mark.parametrize("arrival", [
    Arrival.poisson(3.5),
    Arrival.diurnal(12.0, 4.0, period_s=3600.0, phase_s=1800.0),
], ids=["rate", "diurnal"])
def test_online_job_round_trips(arrival: Arrival) -> None:
    job = online(arrival)
    assert round_trip(job) == job


def test_online_job_defaults_round_trip() -> None:
    job = OnlineJob(id="a", model="llama-3.1-8b", arrival=Arrival.poisson(1.0),
                    input_len=LengthDist.fixed(10), output_len=LengthDist.fixed(10),
                    slo=Slo(ttft_ms=100.0, tpot_ms=10.0))
    assert round_trip(job) == job
    assert not job_to_proto(job).online.HasField("end_s")


def test_trace_job_round_trips_with_trace_columns(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOI_TRACES_DIR", str(tmp_path))  # decoding reads traces only there
    trace = load_trace(write_trace(tmp_path))
    job = online(Arrival.replay(trace, time_scale=0.5, loop=False),
                 input_len=LengthDist.empirical(trace.input_tokens, from_trace=True),
                 output_len=LengthDist.empirical(trace.output_tokens, from_trace=True))
    msg = job_to_proto(job)
    assert msg.online.input_len.WhichOneof("kind") == "trace_column"
    assert not msg.online.input_len.empirical.token_counts  # the column is not copied
    back = round_trip(job)
    assert back == job and back.arrival.trace == trace  # type: ignore[union-attr]


def test_empirical_lengths_round_trip() -> None:
    dist = LengthDist.empirical([5, 9, 200_000], min=2)
    job = online(Arrival.poisson(1.0), input_len=dist)
    assert round_trip(job) == job


@pytest.mark.parametrize("name", ["chat-online.yaml", "batch-summarize.yaml",
                                  pytest.param("code-trace.yaml", marks=needs_shared)])
def test_example_jobs_round_trip(name: str) -> None:
    job = load_job_yaml(REPO / "examples" / "jobs" / name)
    assert round_trip(job) == job


def test_batch_job_round_trips() -> None:
    job = BatchJob(id="nightly-sum-1", model="llama-3.1-8b", num_requests=80_000,
                   input_len=LengthDist.lognormal(3000.0, 0.8, max=32768),
                   output_len=LengthDist.fixed(250), deadline_s=28800.0, submit_s=3600.0,
                   priority=3)
    assert round_trip(job) == job


def test_batch_total_output_tokens_derives_requests() -> None:
    msg = job_to_proto(BatchJob(id="b", model="llama-3.1-8b", num_requests=1,
                                input_len=LengthDist.fixed(100),
                                output_len=LengthDist.fixed(250), deadline_s=60.0))
    msg.batch.total_output_tokens = 1_000_000
    job = job_from_proto(msg)
    assert isinstance(job, BatchJob) and job.num_requests == 4000


def test_absent_optional_job_fields_take_the_defaults() -> None:
    msg = job_to_proto(online(Arrival.diurnal(2.0, 3.0)))
    for m, name in ((msg, "priority"), (msg.online.slo, "percentile"),
                    (msg.online.arrival.diurnal, "period_s"),
                    (msg.online.input_len, "max_tokens")):
        m.ClearField(name)
    job = job_from_proto(msg)
    assert isinstance(job, OnlineJob)
    assert (job.priority, job.slo.percentile, job.arrival.period_s) == (5, 95.0, 86400.0)
    assert job.input_len.max == 131_072


def bad_job(mutate, job=None) -> InvalidSpecError:  # type: ignore[no-untyped-def]
    msg = job_to_proto(job or online(Arrival.poisson(2.0)))
    mutate(msg)
    with pytest.raises(InvalidSpecError) as info:
        job_from_proto(msg)
    return info.value


BATCH = BatchJob(id="b", model="llama-3.1-8b", num_requests=10,
                 input_len=LengthDist.fixed(100), output_len=LengthDist.fixed(10),
                 deadline_s=60.0)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda m: m.ClearField("online"), "kind"),
    (lambda m: setattr(m, "model", "llama-3.1-9b"), "model"),
    (lambda m: setattr(m, "model", ""), "model"),
    (lambda m: setattr(m, "id", "no spaces"), "id"),
    (lambda m: setattr(m, "priority", 10), "priority"),
    (lambda m: m.online.ClearField("arrival"), "online.arrival"),
    (lambda m: m.online.ClearField("slo"), "online.slo"),
    (lambda m: m.online.arrival.ClearField("rate"), "online.arrival.kind"),
    (lambda m: setattr(m.online.arrival.rate, "rate_rps", 0.0), "online.arrival.rate.rate_rps"),
    (lambda m: setattr(m.online.arrival.diurnal, "mean_rps", -1.0),
     "online.arrival.diurnal.mean_rps"),
    (lambda m: m.online.arrival.trace.SetInParent(), "online.arrival.trace.path"),
    (lambda m: setattr(m.online.arrival.trace, "path", "/nonexistent/t.csv"),
     "online.arrival.trace.path"),
    (lambda m: setattr(m.online.slo, "tpot_ms", 0.0), "online.slo.tpot_ms"),
    (lambda m: setattr(m.online.slo, "percentile", 100.0), "online.slo.percentile"),
    (lambda m: setattr(m.online, "prefix_share", 1.5), "online.prefix_share"),
    (lambda m: setattr(m.online, "end_s", 10.0), "online.end_s"),
    (lambda m: m.online.input_len.ClearField("lognormal"), "online.input_len.kind"),
    (lambda m: setattr(m.online.input_len.lognormal, "sigma", 0.0),
     "online.input_len.lognormal.sigma"),
    (lambda m: setattr(m.online.output_len.fixed, "tokens", 0), "online.output_len.fixed.tokens"),
    (lambda m: setattr(m.online.output_len, "min_tokens", 0), "online.output_len.min_tokens"),
    (lambda m: setattr(m.online.output_len, "max_tokens", 100), "online.output_len.fixed.tokens"),
    (lambda m: m.online.output_len.trace_column.SetInParent(), "online.output_len.trace_column"),
    (lambda m: m.online.output_len.empirical.SetInParent(),
     "online.output_len.empirical.token_counts"),
    (lambda m: m.online.output_len.empirical.token_counts.extend([3, 0]),
     "online.output_len.empirical.token_counts"),
])
def test_bad_online_job_is_rejected_naming_the_field(mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    err = bad_job(mutate)
    assert err.field == field and err.source == "koi.v1.JobSpec"


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda m: m.batch.ClearField("num_requests"), "batch.num_requests"),
    (lambda m: setattr(m.batch, "num_requests", 0), "batch.num_requests"),
    (lambda m: setattr(m.batch, "total_output_tokens", 0), "batch.total_output_tokens"),
    (lambda m: setattr(m.batch, "deadline_s", 0.0), "batch.deadline_s"),
    (lambda m: m.batch.ClearField("output_len"), "batch.output_len"),
    (lambda m: m.batch.input_len.trace_column.SetInParent(), "batch.input_len.trace_column"),
    (lambda m: setattr(m, "submit_s", -1.0), "submit_s"),
])
def test_bad_batch_job_is_rejected_naming_the_field(mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    assert bad_job(mutate, BATCH).field == field


def test_unknown_model_error_suggests_the_closest() -> None:
    err = bad_job(lambda m: setattr(m, "model", "llama-3.1-7b"))
    assert "did you mean" in err.reason


def test_bad_trace_file_error_names_file_and_line(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOI_TRACES_DIR", str(tmp_path))
    p = tmp_path / "bad.csv"
    p.write_text("ts_s,input_tokens,output_tokens\n0,10,1\n1,zero,1\n")
    err = bad_job(lambda m: setattr(m.online.arrival.trace, "path", str(p)))
    assert err.field == "online.arrival.trace.path"
    assert "line 3" in err.reason and "input_tokens" in err.reason


# --- bytes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("message_type", [config_pb2.DeploymentConfig, jobs_pb2.JobSpec,
                                          prediction_pb2.Prediction])
def test_garbage_bytes_raise_invalid_spec(message_type: type) -> None:
    with pytest.raises(InvalidSpecError) as info:
        decode(b"\xff\xff\xff\xff\x0f", message_type)
    assert info.value.field == message_type.DESCRIPTOR.full_name


def test_decoding_empty_bytes_gives_precise_errors() -> None:
    with pytest.raises(InvalidConfigError) as info:
        decode_config(b"")
    assert info.value.knob == "weight_precision"
    with pytest.raises(InvalidSpecError) as job_info:
        decode_job(b"")
    assert job_info.value.field == "kind"
