"""The model of a fanned-out stage on N machines (``koi.bench.fanout``), and how
``koi bench bus --proposers`` reads the proposers' logs into it and prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koi.bench.fanout import FanOutTick, makespan, predicted_stage_s
from services.bench import ScaleOutResult, evaluate_seconds, propose_ticks, scale_out_lines


def test_makespan_is_greedy_longest_first():
    assert makespan([0.2, 0.1, 0.3], 1) == pytest.approx(0.6)
    assert makespan([0.2, 0.1, 0.3], 8) == pytest.approx(0.3)
    assert makespan([0.1] * 8, 4) == pytest.approx(0.2)
    # greedy, not the best split: {3, 3} {2, 2, 2} would be 6
    assert makespan([3, 3, 2, 2, 2], 2) == pytest.approx(7)
    assert makespan([], 2) == 0.0


def test_the_model_gives_back_a_one_replica_tick_and_splits_its_items():
    tick = FanOutTick(tick=4, stage_s=0.130, before_s=0.010, item_s=(0.03, 0.03, 0.02, 0.02),
                      busy_s=(0.10,))
    assert tick.fan_in_s == pytest.approx(0.020)
    assert tick.predicted_s(1) == pytest.approx(0.130)   # the measured stage
    assert tick.predicted_s(2) == pytest.approx(0.010 + 0.05 + 0.020)
    assert tick.predicted_s(8) == pytest.approx(0.010 + 0.03 + 0.020)
    other = FanOutTick(5, 0.230, 0.010, (0.2,), (0.2,))
    model = predicted_stage_s([tick, other, tick], (1, 2))
    assert model == pytest.approx({1: 0.130, 2: 0.080})


def _log(path: Path, *records: dict) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records)
                    + "not json\n" + '{"event": "proposed", "tick": 9}\n')


def test_the_proposers_logs_become_ticks_with_items_by_replica(tmp_path):
    _log(tmp_path / "proposer-0.log",
         {"event": "propose_item", "replica": 0, "tick": 1, "item_s": 0.02},
         {"event": "propose_item", "replica": 0, "tick": 1, "item_s": 0.03},
         {"event": "proposed", "replica": 0, "tick": 1, "propose_s": 0.1, "before_s": 0.01},
         {"event": "propose_item", "replica": 0, "tick": 0, "item_s": 0.05})
    _log(tmp_path / "proposer-1.log",
         {"event": "propose_item", "replica": 1, "tick": 1, "item_s": 0.04},
         {"event": "proposed", "replica": 1, "tick": 0, "propose_s": 0.2, "before_s": 0.02})
    _log(tmp_path / "evaluator-0.log", {"event": "evaluated", "evaluate_s": 0.5},
         {"event": "proposed", "evaluate_s": 0.7})
    ticks = propose_ticks(tmp_path)
    assert [t.tick for t in ticks] == [0, 1]   # tick 9's line lacks its seconds
    assert ticks[0] == FanOutTick(0, 0.2, 0.02, (0.05,), (0.05,))
    assert sorted(ticks[1].item_s) == [0.02, 0.03, 0.04]
    assert sorted(ticks[1].busy_s) == pytest.approx([0.04, 0.05])
    assert ticks[1].fan_in_s == pytest.approx(0.1 - 0.01 - 0.05)
    assert evaluate_seconds(tmp_path) == [0.5]


def test_the_bench_prints_each_count_the_speed_up_and_the_model():
    one = tuple(FanOutTick(t, 0.13, 0.01, (0.03, 0.03, 0.02, 0.02), (0.10,)) for t in range(3))
    two = tuple(FanOutTick(t, 0.09, 0.01, (0.03, 0.03, 0.02, 0.02), (0.05, 0.05))
                for t in range(3))
    result = ScaleOutResult("proposer", "hetero-12h", 1200.0,
                            {1: tuple(t.stage_s for t in one), 2: tuple(t.stage_s for t in two)},
                            {1: 60.0, 2: 58.0}, {1: (20, 20), 2: (20, 20)}, {1: one, 2: two})
    assert result.speed_up(2) == pytest.approx(0.13 / 0.09)
    lines = scale_out_lines(result)
    assert len(lines) == 3
    assert "2 proposer(s): propose stage median 90 ms, p90 90 ms" in lines[1]
    assert "speed-up 1.44×" in lines[1] and "on 20/20 ticks" in lines[1]
    assert "4 items a tick" in lines[0] and "fan-in 20 ms" in lines[0]
    assert "busiest replica 50%" in lines[1]
    assert lines[2].startswith("model from the 1-proposer run")
    assert "N=1 130 ms, N=2 80 ms, N=4 60 ms, N=8 60 ms" in lines[2]
