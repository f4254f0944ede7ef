"""No admitted job can take the sim service down (real NATS, the sim's ``run`` in-process).

Two accepted jobs whose handling raises: one when it is submitted to the simulator, one
when the simulator steps it (both provoked by monkeypatching, as a bug or a resource
failure would). The sim must carry on ticking, emit an ERROR ``quarantine`` event naming
each job and the exception type, show the stepped one rejected ``quarantined: <type>`` in
the next snapshot, ack both job messages, and, restarted, replay the run without meeting
either failure again (before, the first one crashed the sim, and its replay re-injected
the job and crashed it again, for good).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from koi import subjects
from koi.catalog import load_catalog
from koi.cluster import PlanDecision
from koi.sim.jobstate import JobState
from koi.sim.simulator import Simulator
from koi.sim.testing import online_job
from koi.v1 import events_pb2
from koi.wire import codec, planning
from services.runtime.app import ServiceContext
from services.runtime.bus import Bus
from services.runtime.connection import connect
from services.runtime.settings import ServiceSettings
from services.sim import main as sim_service

pytestmark = pytest.mark.timeout(120)

SCENARIO = """\
name: quarantine
horizon: 20m
tick: 60s
seed: 7
fleet:
  - {offering: aws/us-east-1/h100-sxm/on_demand, gpus: 8}
jobs:
  - id: steady
    model: llama-3.1-8b
    arrival: {rate_rps: 1}
    input_len: 200
    output_len: 50
    slo: {ttft_ms: 1000, tpot_ms: 50}
"""
BAD_SUBMIT, BAD_STEP = "bad-submit", "bad-step"


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make one job raise in ``Simulator.submit`` and another in its arrivals; count."""
    calls = {BAD_SUBMIT: 0, BAD_STEP: 0}
    submit, arrivals = Simulator.submit, JobState.arrivals

    def failing_submit(self, job):  # type: ignore[no-untyped-def]
        if job.id == BAD_SUBMIT:
            calls[BAD_SUBMIT] += 1
            raise RuntimeError("simulated failure (must not be echoed)")
        return submit(self, job)

    def failing_arrivals(self, t0, t1, fraction):  # type: ignore[no-untyped-def]
        if self.spec.id == BAD_STEP:
            calls[BAD_STEP] += 1
            raise ZeroDivisionError("simulated failure")
        return arrivals(self, t0, t1, fraction)

    monkeypatch.setattr(Simulator, "submit", failing_submit)
    monkeypatch.setattr(JobState, "arrivals", failing_arrivals)
    return calls


@pytest_asyncio.fixture
async def sim(bus: Bus, nats_url: str, tmp_path: Path
              ) -> AsyncIterator[Callable[[], Awaitable[tuple[ServiceContext, asyncio.Task]]]]:
    """Start the sim service's ``run`` in this loop (as often as asked); stopped after."""
    path = tmp_path / "quarantine.yaml"
    path.write_text(SCENARIO)
    running: list[tuple[ServiceContext, asyncio.Task]] = []

    async def go() -> tuple[ServiceContext, asyncio.Task]:
        settings = ServiceSettings.from_env({"KOI_NATS_URL": nats_url, "KOI_SCENARIO": str(path),
                                             "KOI_STAGE_DEADLINE_S": "2",
                                             "KOI_SAMPLE_FRACTION": "1"})
        own = await connect(nats_url, "test-sim", wait_s=10)
        ctx = ServiceContext(sim_service.NAME, settings, own, load_catalog())
        running.append((ctx, asyncio.create_task(sim_service.run(ctx))))
        return running[-1]

    yield go
    for ctx, task in running:
        await _stop(ctx, task)


async def _stop(ctx: ServiceContext, task: asyncio.Task) -> None:
    ctx.stopping.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 15)
    with contextlib.suppress(Exception):
        await ctx.bus.close()


async def _place(bus: Bus, task: asyncio.Task, upto: int) -> None:
    """Play the placer: answer ticks' snapshots with no actions, through tick ``upto``."""
    for n in range(upto + 1):
        raw = await bus.wait_for(subjects.tick_subject(n, "snapshot"), 20)
        assert raw is not None, f"no snapshot for tick {n}; sim task: {task}"
        assert not task.done(), task.exception()
        if await bus.get_last(subjects.tick_subject(n, "actions")) is None:
            await bus.publish(subjects.tick_subject(n, "actions"),
                              planning.encode_actions(PlanDecision(tick=n), n),
                              msg_id=f"actions-{n}")


async def _quarantine_events(bus: Bus) -> list[events_pb2.OperatorEvent]:
    info = await bus.js.stream_info(subjects.STREAM_EVENTS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(Exception):
            msg = await bus.js.get_msg(subjects.STREAM_EVENTS, seq)
            if msg.subject == subjects.event_subject("error", "quarantine"):
                out.append(events_pb2.OperatorEvent.FromString(msg.data))
    return out


async def _accept(bus: Bus, job_id: str) -> None:
    """What admission does for an accepted job: store it on ``koi.jobs.accepted.<id>``."""
    await bus.publish(subjects.job_accepted_subject(job_id),
                      codec.encode_job(online_job(job_id, rate=2.0)), msg_id=f"job-{job_id}")


@pytest.mark.asyncio
async def test_jobs_whose_handling_raises_are_quarantined_and_the_sim_goes_on(
        bus: Bus, sim, failures: dict[str, int]) -> None:
    ctx, task = await sim()
    await _place(bus, task, 1)
    await _accept(bus, BAD_SUBMIT)
    await _accept(bus, BAD_STEP)
    await _place(bus, task, 5)
    snap = planning.decode_snapshot(
        await bus.get_last(subjects.tick_subject(5, "snapshot")))  # type: ignore[arg-type]
    status = {s.id: s for s in snap.jobs}
    assert BAD_SUBMIT not in status  # never added
    assert status[BAD_STEP].rejected and status[BAD_STEP].reason == \
        "quarantined: ZeroDivisionError"
    assert failures == {BAD_SUBMIT: 1, BAD_STEP: 1}  # taken out at the first failure

    events = {e.job_id: e for e in await _quarantine_events(bus)}
    assert set(events) == {BAD_SUBMIT, BAD_STEP}
    assert "RuntimeError" in events[BAD_SUBMIT].message
    assert "ZeroDivisionError" in events[BAD_STEP].message
    assert all("Traceback" not in e.message and "simulated failure" not in e.message
               for e in events.values())
    consumer = await bus.js.consumer_info(subjects.STREAM_JOBS, sim_service.JOBS_DURABLE)
    assert consumer.num_ack_pending == 0 and consumer.num_pending == 0  # both acked

    # a restart replays the stored ticks: neither failure is met again
    await _stop(ctx, task)
    _, task = await sim()
    await _place(bus, task, 7)
    assert failures == {BAD_SUBMIT: 1, BAD_STEP: 1}
    again = planning.decode_snapshot(
        await bus.get_last(subjects.tick_subject(7, "snapshot")))  # type: ignore[arg-type]
    assert {s.id: s.reason for s in again.jobs if s.rejected} == {
        BAD_STEP: "quarantined: ZeroDivisionError"}
    assert len(await _quarantine_events(bus)) == 2
    assert not task.done()
