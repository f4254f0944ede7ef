"""Consumers refuse messages whose tick cannot be true, against a real NATS.

One ``ObservationBatch`` claiming tick 10**9 used to become the causal store's "last
tick learnt", so every later, genuine tick was dropped as stale — for good, since that
tick is kept in KV. A forged telemetry batch for a tick with no snapshot held
telemetry-ingest's one-at-a-time consumer for ever (wait a stage deadline, nak, again).
Now both are parked on ``koi.dlq.<service>`` with an ``implausible`` event, and the
genuine tick that follows is processed. The pure check is tested here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from koi import subjects
from koi.catalog import load_catalog
from koi.causal.observe import OutcomeObservation
from koi.causal.scope import Scope
from koi.cluster import ClusterSnapshot
from koi.v1 import events_pb2
from koi.wire import planning
from services.causal_store import main as causal_store
from services.runtime.app import ServiceContext
from services.runtime.bus import HEADER_ERROR, HEADER_ORIGINAL_SUBJECT, Bus
from services.runtime.connection import connect
from services.runtime.plausible import check_tick
from services.runtime.settings import ServiceSettings
from services.runtime.ticks import subject_tick
from services.telemetry_ingest import main as telemetry_ingest

pytestmark = pytest.mark.timeout(60)

FORGED = 10**9
Body = Callable[[ServiceContext], Awaitable[None]]


def _snapshot(tick: int) -> bytes:
    return planning.encode_snapshot(ClusterSnapshot(
        tick=tick, time_s=60.0 * tick, tick_s=60.0, horizon_s=3600.0, capacity=(),
        deployments=(), jobs=()))


def _observations(tick: int) -> bytes:
    scope = Scope(accelerator="h100-sxm", engine="vllm", size_class="70b",
                  parallelism="tp4", family="hopper")
    obs = OutcomeObservation(
        deployment_id="d-1", job_id="chat", tick=tick, scope=scope, weight=50.0,
        predicted={"ttft_ms": 100.0, "tpot_ms": 20.0, "ttft_p95_ms": 200.0,
                   "tpot_p95_ms": 30.0},
        observed={"ttft_ms": 150.0, "tpot_ms": 25.0, "ttft_p95_ms": 260.0,
                  "tpot_p95_ms": 40.0})
    return planning.encode_observations(tick, [obs])


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def start(bus: Bus, nats_url: str) -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """Run a service's ``run`` in this loop on its own connection (stopped afterwards)."""
    running: list[tuple[ServiceContext, asyncio.Task[None]]] = []

    async def go(name: str, body: Body, **env: str) -> None:
        settings = ServiceSettings.from_env({"KOI_NATS_URL": nats_url, **env})
        own = await connect(nats_url, f"test-{name}", wait_s=10)
        ctx = ServiceContext(name, settings, own, load_catalog())
        running.append((ctx, asyncio.create_task(body(ctx))))

    yield go
    for ctx, task in running:
        ctx.stopping.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        await ctx.bus.close()


async def _letters(bus: Bus, service: str) -> list[tuple[str, str]]:
    """(original subject, error) of every letter on ``koi.dlq.<service>``."""
    info = await bus.js.stream_info(subjects.STREAM_DLQ)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(Exception):
            msg = await bus.js.get_msg(subjects.STREAM_DLQ, seq)
            if msg.subject == subjects.dlq_subject(service) and msg.headers:
                out.append((msg.headers[HEADER_ORIGINAL_SUBJECT], msg.headers[HEADER_ERROR]))
    return out


async def _implausible_events(bus: Bus, service: str) -> list[events_pb2.OperatorEvent]:
    subject = subjects.event_subject("error", "implausible")
    info = await bus.js.stream_info(subjects.STREAM_EVENTS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(Exception):
            msg = await bus.js.get_msg(subjects.STREAM_EVENTS, seq)
            if msg.subject == subject:
                ev = events_pb2.OperatorEvent.FromString(msg.data)
                if ev.service == service:
                    out.append(ev)
    return out


@pytest.mark.asyncio
async def test_forged_observation_ticks_are_dead_lettered_and_learning_goes_on(
        bus: Bus, start: Callable[..., Awaitable[None]]) -> None:
    for n in range(4):
        await bus.publish(subjects.tick_subject(n, "snapshot"), _snapshot(n))
    await start(causal_store.NAME, causal_store.run)
    # a body that lies about its tick, and a subject far ahead of the clock (tick 3)
    await bus.publish(subjects.tick_subject(3, "observations"), _observations(FORGED))
    await bus.publish(subjects.tick_subject(FORGED, "observations"), _observations(FORGED))
    # then the sim and telemetry-ingest move on to tick 4, genuinely
    await bus.publish(subjects.tick_subject(4, "snapshot"), _snapshot(4))
    await bus.publish(subjects.tick_subject(4, "observations"), _observations(4))

    async def learnt() -> bool:
        return await bus.get_last(subjects.tick_subject(4, "causal")) is not None

    await asyncio.wait_for(_eventually(learnt), 20)
    got = await bus.kv_get(subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE)
    assert got is not None
    beliefs, _, state_tick = planning.decode_causal_state(got[0])
    assert state_tick == 4 and beliefs.tick == 4
    assert beliefs.version == 1  # tick 4's observation, and nothing forged, was learnt
    assert await bus.get_last(subjects.tick_subject(FORGED, "causal")) is None
    letters = await _letters(bus, causal_store.NAME)
    assert sorted(s for s, _ in letters) == sorted(
        [subjects.tick_subject(3, "observations"), subjects.tick_subject(FORGED, "observations")])
    assert all(e.startswith("implausible: ") for _, e in letters)
    events = await _implausible_events(bus, causal_store.NAME)
    assert len(events) == 2
    assert all(e.kind == events_pb2.EVENT_KIND_IMPLAUSIBLE for e in events)
    assert any("differs from the subject's tick 3" in e.message for e in events)
    assert any("is ahead of the clock (the clock is at " in e.message for e in events)


@pytest.mark.asyncio
async def test_forged_telemetry_tick_is_dead_lettered_and_does_not_hold_the_consumer(
        bus: Bus, start: Callable[..., Awaitable[None]]) -> None:
    await bus.publish(subjects.tick_subject(0, "snapshot"), _snapshot(0))
    # a short deadline: before the check, the forged tick waited this long for its
    # snapshot, was nak'd and redelivered, and tick 0 behind it never got a turn
    await start(telemetry_ingest.NAME, telemetry_ingest.run, KOI_STAGE_DEADLINE_S="1")
    await bus.publish(subjects.telemetry_subject(FORGED),
                      planning.encode_telemetry(FORGED, []))
    await bus.publish(subjects.telemetry_subject(0), planning.encode_telemetry(0, []))

    async def observed() -> bool:
        return await bus.get_last(subjects.tick_subject(0, "observations")) is not None

    await asyncio.wait_for(_eventually(observed), 20)
    assert await _letters(bus, telemetry_ingest.NAME) == [
        (subjects.telemetry_subject(FORGED),
         "implausible: tick 1000000000 is ahead of the clock (the clock is at 0;"
         " 1 tick(s) allowed)")]
    events = await _implausible_events(bus, telemetry_ingest.NAME)
    assert [e.attributes["subject"] for e in events] == [subjects.telemetry_subject(FORGED)]


def test_check_tick_rules() -> None:
    assert check_tick(4, 4, 4) is None
    assert check_tick(5, 5, 4, ahead=1) is None
    assert "ahead of the clock" in (check_tick(5, 5, 4) or "")
    assert "no snapshot yet" in (check_tick(0, 0, None) or "")
    assert check_tick(0, 0, None, ahead=1) is None
    assert "differs" in (check_tick(3, FORGED, 10) or "")
    assert "negative" in (check_tick(-1, -1, 3) or "")
    assert "not a plain decimal" in (check_tick(None, 3, 3) or "")
    assert subject_tick("koi.tick.12.observations") == 12
    assert subject_tick("koi.telemetry.7") == 7
    for odd in ("koi.tick.+3.observations", "koi.tick.03.observations",
                "koi.tick.x.observations", "koi.events.error.dlq"):
        assert subject_tick(odd) is None


def _sim_ticks(n_max: int = 12) -> list[tuple[ClusterSnapshot, list]]:
    """(snapshot n, the telemetry batch n) as the sim service publishes them, from a
    short in-process run with an online and a batch job on H100s."""
    from koi.sim import Simulator
    from koi.sim.testing import FixedPolicy, batch_job, online_job, tiny_scenario

    sc = tiny_scenario([online_job("chat", rate=20), batch_job("bulk", 200_000)],
                       horizon_s=60.0 * n_max)
    sim = Simulator(sc, seed=1, catalog=load_catalog())
    policy = FixedPolicy(["aws/us-east-1/h100-sxm/on_demand"])
    out, telemetry = [], []
    while not sim.done:
        snap = sim.snapshot()
        out.append((snap, list(telemetry)))
        sim.apply(policy.decide(snap, telemetry))
        telemetry = sim.advance()
    return out


@pytest.mark.timeout(150)  # the first observation compiles the predictor's kernels
@pytest.mark.asyncio
async def test_telemetry_above_the_roofline_is_refused_with_an_event_and_observes_nothing(
        bus: Bus, start: Callable[..., Awaitable[None]]) -> None:
    """Two steady deployments; one's window claims a million times its output. That
    window is refused (an ``implausible`` event naming it) and only the other one is
    observed: nothing the causal store learns from comes from the lie."""
    import dataclasses

    from koi.planner.tick import steady_deployments

    ticks = _sim_ticks()
    n = next(i for i in range(2, len(ticks))
             if len({t.deployment_id for t in ticks[i][1] if t.requests_finished > 0}
                    & steady_deployments(ticks[i - 1][0], ticks[i - 2][0])) >= 2)
    telemetry = ticks[n][1]
    liar, honest = telemetry[0], telemetry[1]
    forged = dataclasses.replace(liar, generation_tokens=liar.generation_tokens * 1e6,
                                 output_tok_s=liar.output_tok_s * 1e6)
    for s, _ in ticks[:n + 1]:
        await bus.publish(subjects.tick_subject(s.tick, "snapshot"),
                          planning.encode_snapshot(s))
    await start(telemetry_ingest.NAME, telemetry_ingest.run)
    await bus.publish(subjects.telemetry_subject(n),
                      planning.encode_telemetry(n, [forged, honest, *telemetry[2:]]))

    async def observed() -> bool:
        return await bus.get_last(subjects.tick_subject(n, "observations")) is not None

    await asyncio.wait_for(_eventually(observed, 120), 120)
    raw = await bus.get_last(subjects.tick_subject(n, "observations"))
    assert raw is not None
    _, observations = planning.decode_observations(raw)
    seen = {o.deployment_id for o in observations}
    assert honest.deployment_id in seen and liar.deployment_id not in seen, seen
    events = await _implausible_events(bus, telemetry_ingest.NAME)
    assert [e.deployment_id for e in events] == [liar.deployment_id]
    assert "above the roofline" in events[0].message, events[0].message
