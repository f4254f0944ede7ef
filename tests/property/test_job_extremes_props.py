"""The simulator survives any job admitted at the extremes of the physical bounds.

Jobs are drawn with every field at (or near) the edge of what ``koi.jobs.bounds`` admits:
the highest rates, the longest and shortest requests, the tightest and loosest SLOs,
batches near the token ceiling, lives that start late or end a tick in. Each is parsed
through the same validation as a submission, launched by a fixed policy, and simulated
for two ticks at a small sample fraction. The property: the run finishes, nothing is
quarantined (no job's handling raised), and the telemetry is finite. Kept fast: a short
horizon, few examples, no deadline.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.jobs import bounds as B
from koi.jobs import parse_job
from koi.sim import Simulator
from koi.sim.testing import FixedPolicy, tiny_scenario

CAT = load_catalog()
OFFER = "aws/us-east-1/h100-sxm/on_demand"
TICK_S, HORIZON_S = 30.0, 60.0  # two ticks: a max-rate job costs ~2 s a tick
MODELS = ("llama-3.1-8b", "qwen2.5-7b")


def _edge(lo: float, hi: float) -> st.SearchStrategy[float]:
    """The bounds themselves, values just inside, and a few in between."""
    return st.sampled_from([lo, hi, lo * 1.001 if lo else 1e-9, hi * 0.999,
                            math.sqrt(max(lo, 1e-9) * hi)])


@st.composite
def lengths(draw: st.DrawFn, cap: int) -> object:
    kind = draw(st.sampled_from(["fixed", "lognormal", "empirical"]))
    if kind == "fixed":
        return {"kind": "fixed", "mean": draw(st.sampled_from([1, cap])), "max": cap}
    if kind == "lognormal":
        return {"kind": "lognormal", "mean": draw(_edge(1.0, float(cap))),
                "sigma": draw(st.sampled_from([1e-3, 5.0])), "max": cap}
    return {"kind": "empirical", "values": draw(st.lists(st.sampled_from([1, cap]),
                                                         min_size=1, max_size=5)),
            "max": cap}


@st.composite
def online_jobs(draw: st.DrawFn, i: int) -> dict:
    cap = B.MAX_REQUEST_TOKENS // 2  # input + output at the per-request bound
    arrival = draw(st.one_of(
        st.builds(lambda r: {"rate_rps": r}, _edge(1e-6, B.MAX_RATE_RPS)),
        st.builds(lambda m, p, per, ph: {"mean_rps": m, "peak_to_trough": p, "period_s": per,
                                         "phase_s": ph},
                  _edge(1e-6, B.MAX_RATE_RPS), st.sampled_from([1.0, 1000.0]),
                  st.sampled_from([1.0, B.MAX_HORIZON_S]),
                  st.sampled_from([-B.MAX_HORIZON_S, 0.0, B.MAX_HORIZON_S]))))
    submit = draw(st.sampled_from([0.0, HORIZON_S - 1.0, B.MAX_HORIZON_S]))
    end = draw(st.sampled_from([None, submit + 1e-3, B.MAX_HORIZON_S]))
    if end is not None and not submit < end <= B.MAX_HORIZON_S:
        end = None
    return {"kind": "online", "id": f"on-{i}", "model": draw(st.sampled_from(MODELS)),
            "arrival": arrival, "input_len": draw(lengths(cap)),
            "output_len": draw(lengths(cap)),
            "slo": {"ttft_ms": draw(_edge(B.MIN_TTFT_MS, B.MAX_TTFT_MS)),
                    "tpot_ms": draw(_edge(B.MIN_TPOT_MS, B.MAX_TPOT_MS)),
                    "percentile": draw(st.sampled_from([50.001, 99.999]))},
            "priority": draw(st.sampled_from([0, 9])),
            "prefix_share": draw(st.sampled_from([0.0, 1.0])),
            "submit_s": submit, "end_s": end}


@st.composite
def batch_jobs(draw: st.DrawFn, i: int) -> dict:
    inp, out = draw(st.sampled_from([(1, 1), (B.MAX_REQUEST_TOKENS // 2,) * 2]))
    most = int(B.MAX_BATCH_TOKENS // (inp + out))
    return {"kind": "batch", "id": f"batch-{i}", "model": draw(st.sampled_from(MODELS)),
            "num_requests": draw(st.sampled_from([1, min(most, 10**12)])),
            "input_len": inp, "output_len": out,
            "deadline_s": draw(st.sampled_from([1e-3, B.MAX_HORIZON_S])),
            "submit_s": draw(st.sampled_from([0.0, TICK_S]))}


@st.composite
def job_sets(draw: st.DrawFn) -> list:
    n = draw(st.integers(1, 2))
    specs = [draw(st.one_of(online_jobs(i), batch_jobs(i))) for i in range(n)]
    return [parse_job(s, catalog=CAT) for s in specs]


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(jobs=job_sets(), fraction=st.sampled_from([0.005, 0.01]))
def test_simulator_survives_jobs_at_the_bounds(jobs: list, fraction: float) -> None:
    scn = tiny_scenario(jobs, {OFFER: 16}, horizon_s=HORIZON_S, tick_s=TICK_S,
                        sample_fraction=fraction)
    sim = Simulator(scn, seed=3, catalog=CAT)
    policy = FixedPolicy([OFFER], catalog=CAT)
    telemetry: list = []
    while not sim.done:
        sim.apply(policy.decide(sim.snapshot(), telemetry))
        telemetry = sim.advance()
        for t in telemetry:
            assert all(math.isfinite(v) for v in (t.requests_arrived, t.prompt_tokens,
                                                  t.generation_tokens, t.kv_cache_usage))
    assert sim.tick == 2
    assert sim.quarantined == [], [sim.jobs[j].reason for j in sim.quarantined]


def test_a_window_where_thinning_keeps_no_request_is_simulated() -> None:
    # found by the property above: ten requests (10,000 req/s for 1 ms) at f = 0.005 keep
    # none, and grouping the kept ones raised ValueError, killing the sim for good
    job = parse_job({"kind": "online", "id": "blip", "model": "llama-3.1-8b",
                     "arrival": {"rate_rps": B.MAX_RATE_RPS}, "input_len": 1,
                     "output_len": 1, "slo": {"ttft_ms": 1, "tpot_ms": 0.1},
                     "end_s": 0.001}, catalog=CAT)
    sim = Simulator(tiny_scenario([job], {OFFER: 16}, horizon_s=HORIZON_S, tick_s=TICK_S,
                                  sample_fraction=0.005), seed=3, catalog=CAT)
    while not sim.done:
        sim.advance()
    assert sim.quarantined == []
