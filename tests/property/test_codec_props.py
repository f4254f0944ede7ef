"""Property tests for koi.wire: every valid domain object survives domain → proto →
bytes → proto → domain unchanged, and equal objects encode to equal bytes.

Configs are generated from the knob metadata in ``koi.space`` (min/max/choices), so a
knob added to ``DeploymentConfig`` is covered without touching this file.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from enum import StrEnum
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.jobs import Arrival, BatchJob, LengthDist, OnlineJob, Slo, bounds
from koi.predictor.types import LoadMode, Prediction, Workload
from koi.space import DeploymentConfig, config_hash
from koi.wire import (
    decode_config,
    decode_job,
    decode_prediction,
    decode_workload,
    encode_config,
    encode_job,
    encode_prediction,
    encode_workload,
)

CATALOG = load_catalog()
# String knobs without choices name catalog ids; '' means "any" / "same as decode".
ID_KNOBS: dict[str, st.SearchStrategy[str]] = {
    "model": st.sampled_from(sorted(CATALOG.models)),
    "accelerator": st.sampled_from(sorted(CATALOG.accelerators)),
    "offering": st.sampled_from(["", *sorted(CATALOG.offerings)]),
    "prefill_accelerator": st.sampled_from(["", *sorted(CATALOG.accelerators)]),
}


def knob_strategy(f: Field[Any]) -> st.SearchStrategy[Any]:
    """Any value the knob's own metadata allows."""
    meta, default = f.metadata, f.default
    assert default is not MISSING, f"knob {f.name} has no default"
    if "choices" in meta:
        return st.sampled_from(meta["choices"])
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.integers(meta.get("min", 0), meta.get("max", 2**31 - 1))
    if isinstance(default, float):
        return st.floats(meta.get("min"), meta.get("max"), allow_nan=False,
                         allow_infinity=False)
    assert isinstance(default, str) and not isinstance(default, StrEnum), f.name
    return ID_KNOBS[f.name]


configs = st.fixed_dictionaries(
    {f.name: knob_strategy(f) for f in fields(DeploymentConfig)}
).map(lambda kw: DeploymentConfig(**kw))


@settings(max_examples=300, deadline=None)
@given(configs)
def test_config_round_trip_is_lossless(cfg: DeploymentConfig) -> None:
    data = encode_config(cfg)
    back = decode_config(data, catalog=CATALOG)
    assert back == cfg
    assert config_hash(back) == config_hash(cfg)
    assert encode_config(back) == data  # deterministic bytes


finite = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    mode = draw(st.sampled_from(list(LoadMode)))
    low = 0.0 if mode == LoadMode.SATURATED else 1e-6
    return Workload(
        input_len=draw(st.floats(1.0, 1e7)), output_len=draw(st.floats(1.0, 1e7)),
        mode=mode, load=draw(st.floats(low, 1e6)),
        prefix_hit=draw(st.floats(0.0, 1.0, exclude_max=True)),
        window_s=draw(st.floats(1e-3, 1e7)), slo_ttft_ms=draw(st.floats(0.0, 1e6)),
        slo_tpot_ms=draw(st.floats(0.0, 1e6)))


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_workload_round_trip_is_lossless(w: Workload) -> None:
    assert decode_workload(encode_workload(w)) == w


predictions = st.fixed_dictionaries(
    {f.name: st.floats(allow_nan=False) for f in fields(Prediction)}
).map(lambda kw: Prediction(**kw))


@settings(max_examples=200, deadline=None)
@given(predictions)
def test_prediction_round_trip_is_lossless(p: Prediction) -> None:
    assert decode_prediction(encode_prediction(p)) == p


# --- jobs ----------------------------------------------------------------------------------

# every value within the admission bounds (koi.jobs.bounds), up to them
job_ids = st.from_regex(bounds.ID_PATTERN, fullmatch=True).filter(
    lambda s: len(s) <= bounds.MAX_ID_LEN)
models = st.sampled_from(sorted(CATALOG.models))
rates = st.floats(1e-6, bounds.MAX_RATE_RPS)
times = st.floats(0.0, bounds.MAX_HORIZON_S)
arrivals = st.one_of(
    st.builds(Arrival.poisson, rates),
    st.builds(Arrival.diurnal, rates, st.floats(1.0, 1000.0),
              period_s=st.floats(1.0, bounds.MAX_HORIZON_S),
              phase_s=st.floats(-bounds.MAX_HORIZON_S, bounds.MAX_HORIZON_S)),
)
# input + output of one request stays within MAX_REQUEST_TOKENS
MAX_LEN = bounds.MAX_REQUEST_TOKENS // 2


@st.composite
def lengths(draw: st.DrawFn) -> LengthDist:
    lo = draw(st.integers(1, 64))
    hi = draw(st.integers(lo + 1, MAX_LEN))
    kind = draw(st.sampled_from(["fixed", "lognormal", "empirical"]))
    if kind == "fixed":
        return LengthDist("fixed", float(draw(st.integers(lo, hi))), min=lo, max=hi)
    if kind == "lognormal":
        return LengthDist.lognormal(draw(st.floats(1.0, MAX_LEN)),
                                    draw(st.floats(0.01, 5.0)), min=lo, max=hi)
    values = draw(st.lists(st.integers(1, MAX_LEN), min_size=1, max_size=20))
    return LengthDist.empirical(values, min=lo, max=draw(st.none() | st.just(hi)))


slos = st.builds(Slo, ttft_ms=st.floats(bounds.MIN_TTFT_MS, bounds.MAX_TTFT_MS),
                 tpot_ms=st.floats(bounds.MIN_TPOT_MS, bounds.MAX_TPOT_MS),
                 percentile=st.floats(50.0, 100.0, exclude_min=True, exclude_max=True))


@st.composite
def online_jobs(draw: st.DrawFn) -> OnlineJob:
    submit = draw(st.floats(0.0, bounds.MAX_HORIZON_S - 1.0))
    end = draw(st.none() | st.floats(submit + 1.0, bounds.MAX_HORIZON_S))
    return OnlineJob(id=draw(job_ids), model=draw(models), arrival=draw(arrivals),
                     input_len=draw(lengths()), output_len=draw(lengths()), slo=draw(slos),
                     priority=draw(st.integers(0, 9)), prefix_share=draw(st.floats(0.0, 1.0)),
                     submit_s=submit, end_s=end,
                     client_region=draw(st.sampled_from(["", "aws/eu-west-1"])))


batch_jobs = st.builds(BatchJob, id=job_ids, model=models,
                       # 10**10 requests of at most MAX_REQUEST_TOKENS: < MAX_BATCH_TOKENS
                       num_requests=st.integers(1, 10**10), input_len=lengths(),
                       output_len=lengths(), deadline_s=st.floats(1e-3, bounds.MAX_HORIZON_S),
                       submit_s=times, priority=st.integers(0, 9))


@settings(max_examples=200, deadline=None)
@given(st.one_of(online_jobs(), batch_jobs))
def test_job_round_trip_is_lossless(job: OnlineJob | BatchJob) -> None:
    data = encode_job(job)
    back = decode_job(data, catalog=CATALOG)
    assert back == job
    assert encode_job(back) == data
