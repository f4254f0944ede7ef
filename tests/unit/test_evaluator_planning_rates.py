"""The bus evaluator plans the rates the in-process planner plans: its history is the
snapshots of the window read back from the tick stream (a fake reader here), so any
replica, on any tick, gets what ``stability.planning_view`` over the planner's memory
gives."""

from __future__ import annotations

import asyncio

import pytest

from koi.cluster import ClusterSnapshot, JobStatus
from koi.jobs import parse_job
from koi.planner.churn_settings import ChurnSettings
from koi.planner.stability import ChurnMemory, planning_view, remember
from services.evaluator.main import planning_snapshot

pytestmark = pytest.mark.timeout(30)
RATES = ChurnSettings(rate_window_s=300.0, rate_rise_s=120.0)
OBSERVED = (0.0, 2.0, 2.0, 3.0, 1.0, 1.0, 6.0, 1.0, 1.0, 1.0)


def snapshot(tick: int) -> ClusterSnapshot:
    spec = parse_job({"kind": "online", "id": "a", "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": 1000, "tpot_ms": 50}})
    job = JobStatus(spec, True, False, observed_rate_rps=OBSERVED[tick])
    return ClusterSnapshot(tick, 60.0 * tick, 60.0, 3600.0, (), (), (job,))


class Reader:
    """The part of ``services.runtime.ticks.TickReader`` the evaluator reads."""

    def __init__(self, missing: frozenset[int] = frozenset()) -> None:
        self.missing, self.held = missing, {}

    async def snapshot(self, tick: int, *, wait: bool = True):
        return None if tick in self.missing else snapshot(tick)

    def cached(self, tick: int, name: str):
        return self.held.get((tick, name))

    def put(self, tick: int, stage: str, value) -> None:
        self.held[(tick, stage)] = value


def test_every_tick_plans_the_rate_the_in_process_memory_plans():
    memory = ChurnMemory()
    for tick in range(len(OBSERVED)):
        memory = remember(memory, snapshot(tick))
        expected = planning_view(snapshot(tick), memory, RATES).jobs[0].observed_rate_rps
        got = asyncio.run(planning_snapshot(Reader(), tick, RATES))
        assert got.jobs[0].observed_rate_rps == pytest.approx(expected), tick
    assert expected == pytest.approx((1.0 + 6.0 + 1.0 + 1.0 + 1.0) / 5)   # the window, 5 ticks


def test_the_view_is_read_once_a_tick_and_the_plain_snapshot_without_a_window():
    reader = Reader(missing=frozenset({5}))         # a snapshot the stream no longer has
    view = asyncio.run(planning_snapshot(reader, 7, RATES))
    assert view.jobs[0].observed_rate_rps == pytest.approx((6.0 + 1.0) / 2)
    assert reader.cached(7, "planning") is view
    off = asyncio.run(planning_snapshot(Reader(), 7, ChurnSettings.off()))
    assert off.jobs[0].observed_rate_rps == 1.0
