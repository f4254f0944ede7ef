"""A service that crashes, or comes back after an unclean stop, says so on the event log
(``run_service`` against a real NATS): an ERROR ``service`` event naming the service,
the replica and the exception type (never its message), then a WARNING from the next
process of the same replica; a clean stop leaves no warning behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterator

import pytest
import structlog

from koi import subjects
from koi.v1 import events_pb2
from services.runtime.app import ServiceContext, process_key, run_service
from services.runtime.bus import Bus
from services.runtime.settings import ServiceSettings

NAME = "crashy"
SECRET = "hunter2-token"


class BodyFailed(RuntimeError):
    pass


async def _crash(ctx: ServiceContext) -> None:
    raise BodyFailed(f"password={SECRET}\nforged line")


async def _finish(ctx: ServiceContext) -> None:
    return None


@pytest.fixture
def settings(nats_url: str) -> Iterator[ServiceSettings]:
    base = ServiceSettings.from_env({"KOI_NATS_URL": nats_url})
    yield dataclasses.replace(base, nats_url=nats_url, replica=1, log_level="warning")
    structlog.reset_defaults()  # run_service configured logging for the process
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_koi", False)]:
        root.removeHandler(handler)


async def _service_events(bus: Bus) -> list[events_pb2.OperatorEvent]:
    state = (await bus.js.stream_info(subjects.STREAM_EVENTS)).state
    seqs = range(state.first_seq, state.last_seq + 1) if state.messages else range(0)
    events = [events_pb2.OperatorEvent.FromString(
        (await bus.js.get_msg(subjects.STREAM_EVENTS, seq)).data or b"") for seq in seqs]
    return [ev for ev in events if ev.kind == events_pb2.EVENT_KIND_SERVICE]


async def _marker(bus: Bus) -> bytes | None:
    got = await bus.kv_get(subjects.KV_SIM, process_key(NAME, 1))
    return None if got is None else got[0]


@pytest.mark.asyncio
async def test_a_crash_and_the_restart_after_it_are_events(bus: Bus, settings):
    with pytest.raises(BodyFailed):  # still raised: the process exits non-zero
        await asyncio.wait_for(run_service(NAME, _crash, settings), 30)
    (crash,) = await _service_events(bus)
    assert crash.severity == events_pb2.SEVERITY_ERROR and crash.service == NAME
    assert "crashy replica 1 crashed (BodyFailed)" in crash.message
    assert crash.attributes["exception"] == "BodyFailed" and crash.attributes["replica"] == "1"
    assert SECRET not in str(crash) and "forged" not in str(crash)
    assert await _marker(bus) == b"running"

    await asyncio.wait_for(run_service(NAME, _finish, settings), 30)  # the restart
    crash_, restart = await _service_events(bus)
    assert crash_ == crash and restart.severity == events_pb2.SEVERITY_WARNING
    assert "restarted after an unclean stop" in restart.message
    assert await _marker(bus) == b"stopped"

    await asyncio.wait_for(run_service(NAME, _finish, settings), 30)  # after a clean stop
    assert len(await _service_events(bus)) == 2


@pytest.mark.asyncio
async def test_replicas_are_told_apart(bus: Bus, settings):
    with pytest.raises(BodyFailed):
        await asyncio.wait_for(run_service(NAME, _crash, settings), 30)
    other = dataclasses.replace(settings, replica=2)
    await asyncio.wait_for(run_service(NAME, _finish, other), 30)  # replica 2: a first start
    (only,) = await _service_events(bus)
    assert only.attributes["phase"] == "crashed"


@pytest.mark.asyncio
async def test_a_service_event_carries_the_tick_it_interrupted(bus: Bus, settings):
    # the clock is the latest snapshot's tick: an event at tick 0 would sort before the
    # run it interrupted (and the fault suite looks for causes after the fault's tick)
    await bus.js.publish(subjects.tick_subject(7, "snapshot"), b"snapshot bytes")
    with pytest.raises(BodyFailed):
        await asyncio.wait_for(run_service(NAME, _crash, settings), 30)
    await asyncio.wait_for(run_service(NAME, _finish, settings), 30)
    crash, restart = await _service_events(bus)
    assert (crash.tick, restart.tick) == (7, 7)


async def _wait_forever(ctx: ServiceContext) -> None:
    await ctx.stopping.wait()


@pytest.mark.asyncio
async def test_a_lost_nats_connection_is_an_event_once_it_is_back(own_nats, settings):
    # kill -9 of NATS says nothing while it is down; every service says, once back, how
    # long it was cut off (the fault suite's kill-nats case looks for these)
    server = own_nats()
    mine = dataclasses.replace(settings, nats_url=server.url)
    service = asyncio.create_task(run_service(NAME, _wait_forever, mine))
    from services.runtime.connection import connect

    watcher = await connect(server.url, "test-watcher", wait_s=10)
    for _ in range(100):  # the service is up once it has said so
        with contextlib.suppress(Exception):  # (no bucket until the service makes it)
            if await watcher.kv_get(subjects.KV_SIM, f"ready.{NAME}") is not None:
                break
        await asyncio.sleep(0.1)
    server.kill()
    await asyncio.sleep(1.5)
    server.restart()
    events: list[events_pb2.OperatorEvent] = []
    for _ in range(100):
        events = [ev for ev in await _all_events(watcher)
                  if ev.kind == events_pb2.EVENT_KIND_BUS_ERROR]
        if events:
            break
        await asyncio.sleep(0.1)
    service.cancel()
    await asyncio.gather(service, return_exceptions=True)
    await watcher.close()
    (ev,) = events
    assert ev.service == NAME and ev.severity == events_pb2.SEVERITY_WARNING
    assert ev.attributes["phase"] == "reconnected" and float(ev.attributes["down_s"]) >= 1.0
    assert "lost its NATS connection for" in ev.message


async def _all_events(bus: Bus) -> list[events_pb2.OperatorEvent]:
    try:
        state = (await bus.js.stream_info(subjects.STREAM_EVENTS)).state
    except Exception:  # JetStream still recovering after the restart
        return []
    seqs = range(state.first_seq, state.last_seq + 1) if state.messages else range(0)
    return [events_pb2.OperatorEvent.FromString(
        (await bus.js.get_msg(subjects.STREAM_EVENTS, seq)).data or b"") for seq in seqs]
