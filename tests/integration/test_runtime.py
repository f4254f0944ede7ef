"""The services' runtime against real servers: streams and KV, de-duplicated publishes,
last-value reads, at-least-once consumers with a dead-letter path, request/reply, the
placer lease, the Redis cache surviving a dead Redis, and the embedded servers."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping

import pytest
from nats.js import api
from nats.js.errors import ServerError

from koi import subjects
from koi.subjects import stream_of, subject_matches
from koi.v1 import events_pb2
from services.runtime import embedded
from services.runtime.bus import (
    HEADER_ERROR,
    HEADER_ORIGINAL_SUBJECT,
    MAX_MSG_BYTES,
    Bus,
    RemoteError,
)
from services.runtime.cache import PredictionCache, prediction_key
from services.runtime.connection import connect, delete_koi_state
from services.runtime.consumer import Undecodable
from services.runtime.lease import Lease

pytestmark = pytest.mark.timeout(30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def _eventually(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# --- pure helpers ---------------------------------------------------------------------
def test_subject_matching_and_stream_resolution() -> None:
    assert subject_matches("koi.tick.>", "koi.tick.3.plan")
    assert not subject_matches("koi.tick.>", "koi.tick")
    assert subject_matches("koi.tick.*.plan", "koi.tick.3.plan")
    assert not subject_matches("koi.tick.*.plan", "koi.tick.3.actions")
    assert stream_of(subjects.tick_subject(4, "plan")) == subjects.STREAM_TICKS
    assert stream_of(subjects.dlq_subject("placer")) == subjects.STREAM_DLQ
    with pytest.raises(KeyError):
        stream_of("koi.work.evaluate")


# --- streams and KV -----------------------------------------------------------------------
@pytest.mark.asyncio
async def test_streams_and_buckets_are_created_idempotently_even_when_racing(
        bus: Bus, nats_url: str) -> None:
    others = [await connect(nats_url, f"racer-{i}") for i in range(3)]
    try:
        await asyncio.gather(*(b.ensure_streams() for b in [bus, *others]))
        await asyncio.gather(*(b.ensure_kv() for b in [bus, *others]))
        # a stream someone changed converges back to Koi's configuration
        info = await bus.js.stream_info(subjects.STREAM_EVENTS)
        await bus.js.update_stream(info.config, max_age=3600.0)
        await bus.ensure_streams()
    finally:
        for other in others:
            await other.close()
    for name, patterns in subjects.STREAMS.items():
        config = (await bus.js.stream_info(name)).config
        assert config.subjects == list(patterns)
        assert config.storage == api.StorageType.FILE
        assert config.retention == api.RetentionPolicy.LIMITS
        assert config.max_age == 24 * 3600
        assert config.duplicate_window == 120
        assert config.max_msg_size == MAX_MSG_BYTES
    for bucket in subjects.KV_BUCKETS:
        status = await (await bus.js.key_value(bucket)).status()
        assert status.history == 1


@pytest.mark.asyncio
async def test_a_store_creation_racing_the_servers_cleanup_is_retried(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    # nats-server removes an account's empty stream directory after its last stream is
    # deleted; a creation racing that fails once with err_code 10049 (a real run: the
    # CI failure of 2026-12-01). Inject that failure into the first two creations.
    await delete_koi_state(bus.js)
    failures = {"stream": 1, "bucket": 1}
    real_add_stream = bus.js.add_stream

    async def flaky_add_stream(config=None, **params):  # type: ignore[no-untyped-def]
        kind = "bucket" if config.name.startswith("KV_") else "stream"
        if failures[kind]:
            failures[kind] -= 1
            raise ServerError(code=500, err_code=10049,
                              description="error creating store for stream")
        return await real_add_stream(config, **params)

    monkeypatch.setattr(bus.js, "add_stream", flaky_add_stream)
    await bus.ensure_streams()
    await bus.ensure_kv()
    assert failures == {"stream": 0, "bucket": 0}
    for name in subjects.STREAMS:
        assert (await bus.js.stream_info(name)).config.name == name
    for bucket in subjects.KV_BUCKETS:
        assert (await (await bus.js.key_value(bucket)).status()).history == 1


@pytest.mark.asyncio
async def test_a_store_error_that_persists_is_raised(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    await delete_koi_state(bus.js)
    calls = 0

    async def broken_add_stream(config=None, **params):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        raise ServerError(code=500, err_code=10049, description="error creating store")

    monkeypatch.setattr(bus.js, "add_stream", broken_add_stream)
    with pytest.raises(ServerError):
        await bus.ensure_streams()
    assert calls == 6  # _STORE_ATTEMPTS, then the error surfaces


@pytest.mark.asyncio
async def test_kv_helpers_check_revisions(bus: Bus) -> None:
    bucket = subjects.KV_PLAN
    assert await bus.kv_get(bucket, "latest") is None
    first = await bus.kv_create(bucket, "latest", b"plan-1")
    assert first is not None
    assert await bus.kv_create(bucket, "latest", b"plan-x") is None
    assert await bus.kv_get(bucket, "latest") == (b"plan-1", first)
    second = await bus.kv_update(bucket, "latest", b"plan-2", first)
    assert second is not None and second > first
    assert await bus.kv_update(bucket, "latest", b"stale", first) is None
    third = await bus.kv_put(bucket, "latest", b"plan-3")
    assert await bus.kv_get(bucket, "latest") == (b"plan-3", third)


# --- publishing and reading -----------------------------------------------------------
@pytest.mark.asyncio
async def test_republishing_the_same_msg_id_stores_one_message(bus: Bus) -> None:
    subject = subjects.tick_subject(1, "plan")
    first = await bus.publish(subject, b"plan", msg_id="tick-1-plan")
    again = await bus.publish(subject, b"plan", msg_id="tick-1-plan")
    assert not first.duplicate and again.duplicate
    assert again.seq == first.seq
    assert (await bus.js.stream_info(subjects.STREAM_TICKS)).state.messages == 1


@pytest.mark.asyncio
async def test_messages_up_to_the_raised_payload_limit_pass(bus: Bus) -> None:
    big = os.urandom(5 * 1024 * 1024)
    await bus.publish(subjects.tick_subject(2, "candidates"), big, msg_id="big")
    assert await bus.get_last(subjects.tick_subject(2, "candidates")) == big


@pytest.mark.asyncio
async def test_get_last_and_wait_for(bus: Bus) -> None:
    subject = subjects.tick_subject(5, "plan")
    assert await bus.get_last(subject) is None
    await bus.publish(subject, b"old")
    await bus.publish(subject, b"new")
    await bus.publish(subjects.tick_subject(6, "plan"), b"other tick")
    assert await bus.get_last(subject) == b"new"
    assert await bus.wait_for(subject, 1.0) == b"new"

    later = subjects.tick_subject(7, "plan")

    async def publish_soon() -> None:
        await asyncio.sleep(0.3)
        await bus.publish(later, b"arrived")

    started = time.monotonic()
    publisher = asyncio.create_task(publish_soon())
    assert await bus.wait_for(later, 5.0) == b"arrived"
    await publisher
    assert time.monotonic() - started < 2.0

    started = time.monotonic()
    assert await bus.wait_for(subjects.tick_subject(8, "plan"), 0.3) is None
    assert time.monotonic() - started < 1.5


@pytest.mark.asyncio
async def test_emit_publishes_on_severity_and_kind(bus: Bus) -> None:
    event = events_pb2.OperatorEvent(
        tick=50, severity=events_pb2.SEVERITY_WARNING, kind=events_pb2.EVENT_KIND_DEGRADED_TICK,
        message="proposer missed its 2 s deadline; kept plan of tick 49")
    await bus.emit(event)
    await bus.emit(event)  # same event_id: stored once
    raw = await bus.get_last("koi.events.warning.degraded_tick")
    assert raw is not None
    got = events_pb2.OperatorEvent.FromString(raw)
    assert got.tick == 50 and got.event_id and got.service == "test" and got.HasField("time")
    assert (await bus.js.stream_info(subjects.STREAM_EVENTS)).state.messages == 1
    with pytest.raises(ValueError, match="severity"):
        await bus.emit(events_pb2.OperatorEvent(kind=events_pb2.EVENT_KIND_LAUNCH))


# --- consumers ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_consume_acks_after_the_handler_and_redelivers_after_a_failure(bus: Bus) -> None:
    seen: list[tuple[bytes, int]] = []
    release = asyncio.Event()
    failed_once: set[bytes] = set()

    async def handler(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        seen.append((data, subjects.tick_of(subject)))
        if data == b"a":
            await release.wait()
        if data == b"b" and data not in failed_once:
            failed_once.add(data)
            raise RuntimeError("transient failure")

    consumer = await bus.consume(subjects.STREAM_TICKS, "test-plans", subjects.tick_filter("plan"),
                                 handler, service="test", nak_delay_s=0.2)
    for tick, data in enumerate([b"a", b"b", b"c"]):
        await bus.publish(subjects.tick_subject(tick, "plan"), data)
    await bus.publish(subjects.tick_subject(9, "actions"), b"not for this consumer")

    async def holding_a() -> bool:
        return seen == [(b"a", 0)]

    await _eventually(holding_a)
    info = await bus.js.consumer_info(subjects.STREAM_TICKS, "test-plans")
    assert info.num_ack_pending == 1 and info.ack_floor.consumer_seq == 0  # not acked yet
    release.set()

    async def all_done() -> bool:
        info = await bus.js.consumer_info(subjects.STREAM_TICKS, "test-plans")
        return info.num_ack_pending == 0 and info.num_pending == 0 and len(seen) == 4

    await _eventually(all_done)
    # one at a time, in order; the failed message comes back before the next one
    assert [d for d, _ in seen] == [b"a", b"b", b"b", b"c"]
    assert consumer.processed == 3 and consumer.failed == 1
    await consumer.stop()


@pytest.mark.asyncio
async def test_undecodable_goes_to_the_dead_letter_subject_and_the_consumer_carries_on(
        bus: Bus) -> None:
    decoded: list[events_pb2.OperatorEvent] = []

    def decode(raw: bytes) -> events_pb2.OperatorEvent:
        if raw.startswith(b"\xff"):
            raise ValueError("not a protobuf")
        return events_pb2.OperatorEvent.FromString(raw)

    async def handler(subject: str, event: events_pb2.OperatorEvent,
                      headers: Mapping[str, str] | None) -> None:
        if event.message == "explicitly undecodable":
            raise Undecodable("field semantics broken")
        decoded.append(event)

    consumer = await bus.consume(subjects.STREAM_TICKS, "test-obs",
                                 subjects.tick_filter("observations"), handler,
                                 service="causal-store", decode=decode)
    subject = subjects.tick_subject(3, "observations")
    await bus.publish(subject, b"\xff\xfegarbage", msg_id="obs-bad")
    await bus.publish(subject, events_pb2.OperatorEvent(message="explicitly undecodable")
                      .SerializeToString(), msg_id="obs-bad-2")
    await bus.publish(subject, events_pb2.OperatorEvent(message="fine").SerializeToString(),
                      msg_id="obs-good")

    async def good_one_handled() -> bool:
        return len(decoded) == 1

    await _eventually(good_one_handled)
    assert decoded[0].message == "fine"
    dlq = subjects.dlq_subject("causal-store")
    letters = (await bus.js.stream_info(subjects.STREAM_DLQ)).state.messages
    assert letters == 2
    first = await bus.js.get_msg(subjects.STREAM_DLQ, seq=1)
    assert first.subject == dlq and first.data == b"\xff\xfegarbage"
    assert first.headers[HEADER_ORIGINAL_SUBJECT] == subject
    assert "not a protobuf" in first.headers[HEADER_ERROR]

    raw = await bus.get_last("koi.events.error.dlq")
    assert raw is not None
    event = events_pb2.OperatorEvent.FromString(raw)
    assert event.kind == events_pb2.EVENT_KIND_DLQ and event.severity == events_pb2.SEVERITY_ERROR
    assert event.service == "causal-store" and event.tick == 3
    assert event.attributes["subject"] == subject
    info = await bus.js.consumer_info(subjects.STREAM_TICKS, "test-obs")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0  # termed, not retried
    assert consumer.dead_lettered == 2
    await consumer.stop()


# --- request/reply ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_request_reply_in_a_queue_group(bus: Bus) -> None:
    answered: dict[str, int] = {"r1": 0, "r2": 0}

    def responder(name: str):
        async def respond(subject: str, data: bytes, headers: Mapping[str, str] | None) -> bytes:
            answered[name] += 1
            if data == b"boom":
                raise ValueError("bad shard")
            return data.upper()
        return respond

    subs = [await bus.subscribe(subjects.WORK_EVALUATE, responder(n), queue=subjects.QUEUE_EVALUATOR)
            for n in answered]
    replies = [await bus.request(subjects.WORK_EVALUATE, f"shard-{i}".encode(), 2.0)
               for i in range(20)]
    assert replies == [f"SHARD-{i}".encode() for i in range(20)]
    assert sum(answered.values()) == 20  # each request answered once, by one member
    with pytest.raises(RemoteError, match="bad shard"):
        await bus.request(subjects.WORK_EVALUATE, b"boom", 2.0)
    for sub in subs:
        await sub.stop()


# --- leader lease ------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_standby_takes_the_lease_only_after_the_leader_stops_renewing(bus: Bus) -> None:
    ttl = 0.8
    leader = Lease(bus, subjects.KEY_PLACER_LEASE, "placer-0", ttl)
    standby = Lease(bus, subjects.KEY_PLACER_LEASE, "placer-1", ttl)
    assert await leader.acquire() and leader.is_leader
    assert not await standby.acquire()

    # the leader renews every ttl/4 for 2 ttl; the standby never gets in
    until = time.monotonic() + 2 * ttl
    while time.monotonic() < until:
        assert await leader.renew()
        last_renewal = time.monotonic()
        assert not await standby.acquire() and not standby.is_leader
        await asyncio.sleep(ttl / 4)

    # the leader stops renewing (as if it crashed): the standby gets in about ttl later
    while not await standby.acquire():
        await asyncio.sleep(0.05)
    took_over = time.monotonic() - last_renewal
    assert ttl * 0.9 < took_over < ttl + 0.5
    assert standby.is_leader
    assert not await leader.renew() and not leader.is_leader  # the old leader steps down

    # a clean release hands over at once
    await standby.release()
    assert not standby.is_leader
    assert await leader.acquire()


# --- the prediction cache ---------------------------------------------------------------
def test_cache_hits_and_misses(redis_url: str) -> None:
    cache = PredictionCache(redis_url, ttl_s=60, namespace=f"koi:test:{os.getpid()}")
    keys = [prediction_key(f"cfg{i}", "chat-eu/b3", 7) for i in range(3)]
    assert keys[0] == "cfg0:chat-eu/b3:v7"
    assert cache.get_many(keys) == [None, None, None]
    cache.set_many({keys[0]: b"p0", keys[2]: b"p2"})
    assert cache.get_many(keys) == [b"p0", None, b"p2"]
    assert prediction_key("cfg0", "chat-eu/b3", 8) != keys[0]  # new beliefs miss
    assert (cache.hits, cache.misses, cache.errors) == (2, 4, 0)
    assert cache.hit_rate == pytest.approx(2 / 6)
    assert cache.stats()["writes"] == 2


def test_cache_without_redis_always_misses_quietly() -> None:
    for url in (None, ""):
        cache = PredictionCache(url)
        cache.set_many({"k": b"v"})
        assert cache.get_many(["k"]) == [None]
        assert cache.errors == 0 and not cache.enabled


def test_cache_survives_redis_dying_mid_use(own_valkey) -> None:
    server = own_valkey()
    cache = PredictionCache(server.url, retry_after_s=0.5)
    cache.set_many({"a": b"1"})
    assert cache.get_many(["a"]) == [b"1"]
    assert cache.health_change() is None  # answering, as it was

    server.kill()
    started = time.monotonic()
    assert cache.get_many(["a", "b"]) == [None, None]
    assert cache.health_change() == "down"   # told once (the evaluator's event) ...
    cache.set_many({"c": b"3"})           # silently skipped
    for _ in range(200):                   # back-off: a dead Redis is not hammered
        assert cache.get_many(["a"]) == [None]
    assert time.monotonic() - started < 1.0
    assert cache.errors == 1
    assert cache.stats()["skipped_writes"] == 1
    assert cache.health_change() is None     # ... not while it stays down, nor ...
    assert cache.health_change() is None     # ... when nothing was tried

    server.restart()
    time.sleep(0.6)                        # past the back-off: it is tried again
    cache.set_many({"a": b"again"})
    assert cache.get_many(["a"]) == [b"again"]
    assert cache.errors == 1
    assert cache.health_change() == "up" and cache.health_change() is None


# --- embedded servers -----------------------------------------------------------------
@pytest.mark.asyncio
async def test_embedded_nats_serves_jetstream_and_stops_cleanly(own_nats) -> None:
    server = own_nats()
    pid, workdir = server.pid, server.workdir
    assert server.url.startswith("nats://127.0.0.1:") and _alive(pid)
    own = await connect(server.url, "own")
    await own.ensure_streams()
    assert own.nc.max_payload == 8 * 1024 * 1024
    await own.close()
    server.stop()
    assert not _alive(pid) and not workdir.exists() and not server.running
    server.stop()  # twice is fine


def test_embedded_valkey_stops_cleanly_and_kill_is_immediate(own_valkey) -> None:
    with own_valkey() as server:
        pid = server.pid
        assert server.url.startswith("redis://127.0.0.1:") and _alive(pid)
        server.kill()
        assert not _alive(pid)
    assert not server.workdir.exists()


@pytest.mark.asyncio
async def test_connect_gives_up_after_wait_s_when_nothing_listens() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="could not connect"):
        await connect(f"nats://127.0.0.1:{embedded.free_port()}", "nobody", wait_s=0.5)
    assert time.monotonic() - started < 3.0


def test_a_taken_port_fails_start_up_with_the_server_log() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(embedded.EmbeddedServerError, match=r"(?i)address already in use"):
            embedded.start_nats(port=port)


@pytest.mark.asyncio
async def test_a_consumer_carries_on_across_a_nats_restart(own_nats) -> None:
    server = own_nats()
    own = await connect(server.url, "restarts")
    await own.ensure_streams()
    got: list[bytes] = []

    async def handler(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        got.append(data)

    await own.consume(subjects.STREAM_TICKS, "survivor", subjects.tick_filter("plan"), handler,
                      service="test")
    await own.publish(subjects.tick_subject(1, "plan"), b"before")

    def received(n: int):
        async def check() -> bool:
            return len(got) == n
        return check

    await _eventually(received(1))
    server.restart()  # same port, same store: streams and the durable consumer survive

    async def published() -> bool:
        try:
            await own.publish(subjects.tick_subject(2, "plan"), b"after", msg_id="after",
                              timeout_s=0.5)
        except Exception:
            return False
        return True

    await _eventually(published, timeout_s=10)
    await _eventually(received(2), timeout_s=10)
    assert got == [b"before", b"after"]
    await own.close()
