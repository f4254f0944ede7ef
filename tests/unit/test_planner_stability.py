"""Plan stability holds, tick by tick with an explicit clock: the scale-down window,
the cool-down after a move, pinned jobs and the per-job move limit; KOI_CHURN_*."""

from __future__ import annotations

import pytest

from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus
from koi.jobs import parse_job
from koi.planner.stability import (
    ChurnMemory,
    ChurnSettings,
    held_jobs,
    remember,
    stabilised,
)
from koi.space import engine_default_config

OFF = "aws/us-east-1/h100-sxm/on_demand"
S = ChurnSettings(scale_down_window_s=300.0, cooldown_s=900.0)


def job(rate: float = 2.0, **extra) -> JobStatus:
    spec = parse_job({"kind": "online", "id": "a", "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": 1000, "tpot_ms": 50}, **extra})
    return JobStatus(spec=spec, admitted=True, rejected=False, observed_rate_rps=rate)


def dep(did: str = "d1", replicas: int = 2, **knobs) -> Deployment:
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", **knobs)
    return Deployment(did, "a", cfg.with_(offering=OFF, replicas=replicas), OFF,
                      DeploymentState.RUNNING, replicas, 0, 0.0)


def snap(t: float, deps=(), jobs=()) -> ClusterSnapshot:
    return ClusterSnapshot(int(t // 120), t, 120.0, 36000.0, (), tuple(deps), tuple(jobs))


def run(ticks, settings=S, memory=None):
    memory = memory or ChurnMemory()
    for s in ticks:
        memory = remember(memory, s, settings)
    return memory


def test_scale_down_waits_for_the_window_growth_does_not():
    ticks = [snap(0, [dep()], [job(4.0)]), snap(120, [dep()], [job(1.0)])]
    m = run(ticks)
    assert stabilised(ticks[1], m, S).jobs[0].observed_rate_rps == 4.0  # the peak holds
    later = snap(420, [dep()], [job(1.0)])
    m = remember(m, later, S)
    assert stabilised(later, m, S).jobs[0].observed_rate_rps == 1.0     # window passed
    up = snap(540, [dep()], [job(9.0)])
    assert stabilised(up, remember(m, up, S), S).jobs[0].observed_rate_rps == 9.0


def test_no_window_leaves_the_snapshot_alone():
    off = ChurnSettings.off()
    s = snap(0, [dep()], [job(4.0)])
    assert stabilised(s, remember(ChurnMemory(), s, off), off) is s


def test_a_swap_starts_the_cool_down_and_it_ends():
    m = run([snap(0, [dep("d1")], [job()]), snap(120, [dep("d1"), dep("d2")], [job()])])
    why = held_jobs(snap(240, jobs=[job()]), m, S)["a"]
    assert why.startswith("held back: cooling down, moved 120 s ago")
    assert held_jobs(snap(1020, jobs=[job()]), m, S) == {}


def test_a_relaunch_is_a_move_a_repair_is_not():
    m = run([snap(0, [dep(replicas=2)], [job()]), snap(120, [dep(replicas=2)], [job()])])
    assert m.moves == {} and m.placed_at == {}
    m = remember(m, snap(240, [dep(replicas=2, max_num_seqs=64)], [job()]), S)
    assert m.placed_at == {"a": 240} and m.moves["a"] == (240,)
    m = remember(m, snap(360, [dep(replicas=3, max_num_seqs=64)], [job()]), S)
    assert m.moves["a"] == (240, 360) and m.placed_at == {"a": 240}


def test_pinned_and_move_limit_from_the_spec():
    assert "pinned" in held_jobs(snap(0, jobs=[job(pinned=True)]), ChurnMemory(), S)["a"]
    m = ChurnMemory(moves={"a": (0.0, 100.0)})
    limited = job(max_moves_per_hour=2)
    assert "2 moves in the last hour" in held_jobs(snap(200, jobs=[limited]), m, S)["a"]
    assert held_jobs(snap(3700, jobs=[limited]), m, S) == {}
    fleet = ChurnSettings(default_max_moves_per_hour=1.0, cooldown_s=0.0)
    assert "its limit is 1 per hour" in held_jobs(snap(200, jobs=[job()]), m, fleet)["a"]


def test_settings_from_the_environment_name_the_bad_variable():
    s = ChurnSettings.from_env({"KOI_CHURN_COOLDOWN_S": "60",
                                "KOI_CHURN_MAKE_BEFORE_BREAK": "false"})
    assert s.cooldown_s == 60.0 and not s.make_before_break
    with pytest.raises(ValueError, match="KOI_CHURN_SCALE_DOWN_WINDOW_S"):
        ChurnSettings.from_env({"KOI_CHURN_SCALE_DOWN_WINDOW_S": "-1"})
