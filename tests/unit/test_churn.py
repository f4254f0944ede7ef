"""koi.churn on hand-built action sequences: moves by kind, flaps, per-hour rates."""

from __future__ import annotations

import pytest

from koi.churn import FLAP_WINDOW_S, flaps, job_hours, moves_of, run_churn
from koi.records import EventRecord, JobOutcome, RunRecord, TickRecord


def ev(t: float, kind: str, job: str = "a", before: str = "", after: str = "",
       detail: str = "") -> EventRecord:
    return EventRecord(t, int(t // 120), kind, job, detail, "", before, after)


def record(events, *, jobs=("a",), gpus=None, horizon=3600.0, tick=120.0, **outcome):
    n = int(horizon // tick)
    timeline = tuple(TickRecord(i, i * tick, 0.0, gpus_by_job=gpus or {j: {"h100": 1}
                                                                     for j in jobs})
                     for i in range(n))
    outs = tuple(JobOutcome(j, "online", "m", True, True, False, **outcome) for j in jobs)
    return RunRecord("s", "p", 1, horizon, tick, 0.0, outs, timeline, tuple(events))


def test_scale_moves_by_direction_and_repairs_left_out():
    moves = moves_of([ev(0, "scale", before="4", after="3"),
                      ev(120, "scale", before="3", after="3"),   # repair: same count
                      ev(240, "scale", before="3", after="5"),
                      ev(360, "launch", after="x"), ev(480, "drain"), ev(500, "stop")])
    assert [m.kind for m in moves] == ["scale_down", "scale_up"]


def test_scale_read_from_detail_when_records_have_no_ends():
    moves = moves_of([ev(0, "scale", detail="2 → 4 replicas: because")])
    assert [(m.kind, m.before, m.after) for m in moves] == [("scale_up", "2", "4")]


def test_scale_flap_within_the_window_only():
    seq = [ev(0, "scale", before="4", after="3"), ev(120, "scale", before="3", after="4"),
           ev(240, "scale", before="4", after="3")]
    assert len(flaps(moves_of(seq))) == 2          # 4→3→4→3 in ticks 11–13: two undone
    slow = [ev(0, "scale", before="4", after="3"),
            ev(FLAP_WINDOW_S, "scale", before="3", after="4")]
    assert flaps(moves_of(slow)) == []             # 10 minutes apart: not a flap
    same_way = [ev(0, "scale", before="2", after="3"), ev(60, "scale", before="3", after="4")]
    assert flaps(moves_of(same_way)) == []


def test_placement_flap_is_a_return_to_where_the_job_was():
    aba = [ev(0, "swap", before="A", after="B"), ev(300, "relaunch", before="B", after="A")]
    assert [m.time_s for m in flaps(moves_of(aba))] == [300]
    abc = [ev(0, "swap", before="A", after="B"), ev(300, "swap", before="B", after="C")]
    assert flaps(moves_of(abc)) == []


def test_flaps_are_per_job_and_counted_once():
    seq = [ev(0, "scale", "a", "4", "3"), ev(60, "scale", "b", "3", "4"),
           ev(120, "scale", "a", "3", "4")]
    assert [m.job_id for m in flaps(moves_of(seq))] == ["a"]
    rc = run_churn(record(seq, jobs=("a", "b")))
    assert rc.flaps == 1 and rc.jobs_with_flaps == 1


def test_moves_per_job_hour_and_median():
    seq = [ev(0, "swap", "a", "A", "B"), ev(1000, "scale", "a", "1", "2"),
           ev(0, "scale", "b", "1", "2")]
    gpus = {"a": {"h100": 2}, "b": {"l4": 1}}
    rc = run_churn(record(seq, jobs=("a", "b", "c"), gpus=gpus, horizon=7200.0))
    by = {j.job_id: j for j in rc.jobs}
    assert by["a"].hours == pytest.approx(2.0) and by["c"].hours == 0.0
    assert by["a"].moves == {"scale_up": 1, "scale_down": 0, "swap": 1, "relaunch": 0}
    assert by["a"].moves_per_hour == pytest.approx(1.0)
    assert rc.median_moves_per_job_hour == pytest.approx(0.75)   # c held nothing
    assert rc.moves_per_job_hour == pytest.approx(3 / 4.0)
    assert rc.total_moves == 3 and rc.moves["swap"] == 1


def test_costs_come_from_the_outcomes():
    rc = run_churn(record([], startup_gpu_s=600.0, drain_gpu_s=120.0,
                          disrupted_requests=10.0, dropped_by_move=4.0))
    d = rc.to_dict(jobs=True)
    assert d["startup_gpu_min"] == pytest.approx(10.0) and d["drain_gpu_min"] == 2.0
    assert d["disrupted_requests"] == 10.0 and d["dropped_by_move"] == 4.0
    assert d["jobs"][0]["moves_per_hour"] == 0.0


def test_job_hours_counts_ticks_holding_gpus():
    rec = record([], gpus={"a": {"h100": 0}}, horizon=600.0)
    assert job_hours(rec) == {}


def test_churn_markdown_from_run_records_and_older_runs_without_churn():
    from koi.bench.report import churn_markdown

    rec = {"scenario": "s", "policy": "koi", "seed": 1,
           "churn": run_churn(record([ev(0, "scale", before="4", after="3"),
                                      ev(120, "scale", before="3", after="4")])).to_dict()}
    old = {"scenario": "s", "policy": "melange", "seed": 1}
    text = churn_markdown([rec, old])
    koi_row = next(line for line in text.splitlines() if "| koi |" in line)
    assert "| 1 | 1 |" in koi_row.replace(".0 |", " |") and "1/1/0/0" in koi_row
    old_row = next(line for line in text.splitlines() if "| melange |" in line)
    assert "—" in old_row and "nan" not in old_row and "not recorded" in old_row


def test_online_relaunches_and_those_capacity_forced():
    from koi.planner.place import FORCED_RELAUNCH as PLACER_SAYS

    seq = [ev(0, "relaunch", "a", "A", "B", detail="tp1 pp1 vllm, down 60s: plan"),
           ev(300, "relaunch", "a", "B", "C", detail=f"down 60s: {PLACER_SAYS}: needs 8")]
    rc = run_churn(record(seq))
    assert (rc.online_relaunches, rc.forced_relaunches) == (2, 1)
