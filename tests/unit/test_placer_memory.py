"""A placer that takes over rebuilds the churn memory its predecessor kept by replaying
the placements of the memory's span (``koi.planner.tick.replay_placements``): the last
span of history gives exactly the memory the whole history gives."""

from __future__ import annotations

from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus
from koi.jobs import parse_job
from koi.planner.place import Target
from koi.planner.settings import KoiSettings
from koi.planner.stability import ChurnMemory, ChurnSettings
from koi.planner.tick import churn_memory_span_s, replay_placements
from koi.space import engine_default_config

OFF = "aws/us-east-1/h100-sxm/on_demand"
TICK_S = 120.0
SETTINGS = KoiSettings()


def history(ticks: int) -> list[tuple[ClusterSnapshot, list[Target] | None]]:
    """A job whose replicas waver 3–5 and that changes shape every 25 ticks (a new
    deployment), with a plan asking one replica fewer or more than it runs, and every
    seventh tick placed with no plan."""
    spec = parse_job({"kind": "online", "id": "a", "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": 1000, "tpot_ms": 50}})
    job = JobStatus(spec=spec, admitted=True, rejected=False)
    out: list[tuple[ClusterSnapshot, list[Target] | None]] = []
    for k in range(ticks):
        shape = k // 25
        cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm",
                                    max_num_seqs=128 * (1 + shape % 2))
        n = 3 + k % 3
        dep = Deployment(f"d{shape}", "a", cfg.with_(offering=OFF, replicas=n), OFF,
                         DeploymentState.RUNNING, n, 0, 25 * shape * TICK_S)
        snap = ClusterSnapshot(k, k * TICK_S, TICK_S, 10 * 3600.0, (), (dep,), (job,))
        plan = None if k % 7 == 6 else [Target("a", "place", "plan", cfg, OFF,
                                               n + (1 if k % 2 else -1))]
        out.append((snap, plan))
    return out


def tail(hist: list, span_s: float) -> list:
    end = hist[-1][0].time_s
    return [(s, t) for s, t in hist if end - s.time_s <= span_s + s.tick_s]


def test_the_last_span_rebuilds_the_memory_the_whole_history_gives() -> None:
    hist = history(90)  # 3 hours of 2-minute ticks
    full = replay_placements(hist, SETTINGS)
    assert full.moves["a"] and full.plans["a"] and full.seen  # something to remember
    span = churn_memory_span_s(SETTINGS)
    assert span == 3600.0
    assert len(tail(hist, span)) < len(hist)
    assert replay_placements(tail(hist, span), SETTINGS) == full
    # a shorter replay misses moves still inside the hour: the span matters
    assert replay_placements(tail(hist, span / 2), SETTINGS) != full


def test_no_history_is_an_empty_memory() -> None:
    assert replay_placements([], SETTINGS) == ChurnMemory()


def test_a_window_longer_than_an_hour_sets_the_span() -> None:
    long = KoiSettings(churn=ChurnSettings(scale_down_window_s=7200.0))
    assert churn_memory_span_s(long) == 7200.0
