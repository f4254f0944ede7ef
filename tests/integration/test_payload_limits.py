"""Messages larger than the NATS server's ``max_payload`` (issue 25, defect 1).

A private server with the default 1 MiB limit (what compose runs); every reading and
writing path of ``Bus`` carries a 3 MB payload whole (stream reads, a durable consumer,
KV values, request/reply, the work sharing of proposer and evaluator), and a payload that
cannot be carried is refused with an operator event that names the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import nats.errors
import pytest
import pytest_asyncio
from nats.js.errors import NotFoundError

from koi import subjects
from koi.v1 import events_pb2
from services.runtime import work
from services.runtime.bus import Bus
from services.runtime.connection import connect, delete_koi_state
from services.runtime.embedded import EmbeddedServer, start_nats

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

MIB = 1024 * 1024
BIG = 3 * 1000 * 1000  # the brief's "3 MB": three times the server's limit


@pytest.fixture(scope="module")
def small_server() -> Iterator[EmbeddedServer]:
    server = start_nats(max_payload_mb=1)
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def small_bus(small_server: EmbeddedServer) -> AsyncIterator[Bus]:
    bus = await connect(small_server.url, "payload-test", wait_s=10)
    await delete_koi_state(bus.js)
    await bus.ensure_streams()
    await bus.ensure_kv()
    try:
        yield bus
    finally:
        await bus.close()


def _payload(seed: int, size: int = BIG) -> bytes:
    # random bytes: nothing compresses or coincides by accident
    return seed.to_bytes(4, "big") + os.urandom(size - 4)


async def test_the_server_limit_is_the_default_1_mib(small_bus: Bus) -> None:
    assert small_bus.nc.max_payload == 1 * MIB


async def test_a_large_tick_message_reads_back_whole_on_every_path(small_bus: Bus) -> None:
    bus = small_bus
    data = _payload(1)
    subject = subjects.tick_subject(1, "candidates")
    ack = await asyncio.wait_for(bus.publish(subject, data, msg_id="candidates-1"), 10)
    assert not ack.duplicate

    assert await asyncio.wait_for(bus.get_last(subject), 10) == data
    assert await bus.has(subject) and not await bus.has(subjects.tick_subject(1, "plan"))
    assert await asyncio.wait_for(bus.wait_for(subject, 5), 10) == data

    # wait_for on a message that arrives while waiting
    later, later_data = subjects.tick_subject(2, "candidates"), _payload(2)
    waiting = asyncio.create_task(bus.wait_for(later, 10))
    await asyncio.sleep(0.2)
    await bus.publish(later, later_data, msg_id="candidates-2")
    assert await asyncio.wait_for(waiting, 15) == later_data

    got: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def handler(subj: str, payload: bytes, headers) -> None:
        await got.put((subj, payload))

    consumer = await bus.consume(subjects.STREAM_TICKS, "payload-test",
                                 subjects.tick_filter("candidates"), handler,
                                 service="payload-test")
    try:
        first = await asyncio.wait_for(got.get(), 15)
        second = await asyncio.wait_for(got.get(), 15)
    finally:
        await consumer.stop()
    assert first == (subject, data) and second == (later, later_data)
    assert consumer.dead_lettered == 0 and consumer.failed == 0


async def test_a_republished_large_stage_output_is_still_deduplicated(small_bus: Bus) -> None:
    subject = subjects.tick_subject(3, "plan")
    first = await asyncio.wait_for(small_bus.publish(subject, _payload(3), msg_id="plan-3"), 10)
    again = await asyncio.wait_for(small_bus.publish(subject, _payload(4), msg_id="plan-3"), 10)
    assert again.duplicate and again.seq == first.seq
    assert (await small_bus.get_last(subject) or b"")[:4] == (3).to_bytes(4, "big")


async def test_a_large_kv_value_round_trips_and_updates(small_bus: Bus) -> None:
    bus, bucket, key = small_bus, subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE
    value = _payload(5)
    revision = await asyncio.wait_for(bus.kv_put(bucket, key, value), 10)
    assert await asyncio.wait_for(bus.kv_get(bucket, key), 10) == (value, revision)

    newer = _payload(6)
    updated = await asyncio.wait_for(bus.kv_update(bucket, key, newer, revision), 10)
    assert updated is not None and updated > revision
    assert await asyncio.wait_for(bus.kv_update(bucket, key, _payload(7), revision), 10) is None
    assert await bus.kv_create(bucket, key, _payload(8)) is None

    # the refused writes' blobs and the superseded value's are deleted: one object left
    kv_objects = await bus.js.stream_info(f"OBJ_{subjects.OBJ_KV_BLOBS}",
                                          subjects_filter=f"$O.{subjects.OBJ_KV_BLOBS}.M.>")
    assert len(kv_objects.state.subjects or {}) == 1

    # a second process reads what the first wrote
    other = await connect(bus.nc.connected_url.geturl(), "payload-reader", wait_s=10)
    try:
        assert await asyncio.wait_for(other.kv_get(bucket, key), 10) == (newer, updated)
    finally:
        await other.close()


async def test_a_work_item_and_its_large_answer_go_through_the_queue_group(
        small_bus: Bus, small_server: EmbeddedServer) -> None:
    worker = await connect(small_server.url, "payload-worker", wait_s=10)
    served: list[int] = []

    async def remote(item: bytes) -> bytes:
        served.append(len(item))
        return item[:4] + _payload(9)[4:]

    async def local(item: bytes) -> bytes:
        raise AssertionError("the item was not answered by the queue group")

    sub = await work.serve_work(worker, subjects.WORK_PROPOSE, subjects.QUEUE_PROPOSER,
                                remote)
    try:
        items = [_payload(10), b"\x00\x00\x00\x0bsmall"]
        answers = await asyncio.wait_for(
            work.share(small_bus, subjects.WORK_PROPOSE, items, local, timeout_s=30), 60)
    finally:
        await sub.unsubscribe()
        await worker.close()
    assert sorted(served) == sorted(len(i) for i in items)
    assert [a[:4] for a in answers] == [i[:4] for i in items]
    assert all(len(a) == BIG for a in answers)


async def test_a_large_request_and_reply_through_bus_subscribe(small_bus: Bus) -> None:
    async def echo_twice(subject: str, data: bytes, headers) -> bytes:
        return data + data

    sub = await small_bus.subscribe("koi.test.echo", echo_twice)
    try:
        data = _payload(12)
        assert await asyncio.wait_for(small_bus.request("koi.test.echo", data, 10), 30) \
            == data + data
    finally:
        await sub.stop()


async def _bus_error_events(bus: Bus) -> list[events_pb2.OperatorEvent]:
    subject = subjects.event_subject("error", "bus_error")
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    with contextlib.suppress(TimeoutError):
        while True:
            msg = await sub.next_msg(timeout=0.5)
            out.append(events_pb2.OperatorEvent.FromString(msg.data))
    await sub.unsubscribe()
    return out


async def test_a_refused_message_becomes_an_operator_event_naming_the_cause(
        small_bus: Bus) -> None:
    bus = small_bus
    with contextlib.suppress(NotFoundError):  # nowhere to put a large payload
        await bus.js.delete_object_store(subjects.OBJ_BLOBS)
    subject = subjects.tick_subject(7, "candidates")
    with pytest.raises(nats.errors.MaxPayloadError):  # Koi's PayloadRefused is one
        await asyncio.wait_for(bus.publish(subject, _payload(13), msg_id="candidates-7"), 10)
    # the retry a redelivery makes is announced once, not once per attempt
    with pytest.raises(nats.errors.MaxPayloadError):
        await asyncio.wait_for(bus.publish(subject, _payload(13), msg_id="candidates-7"), 10)

    events = await asyncio.wait_for(_bus_error_events(bus), 10)
    assert len(events) == 1
    ev = events[0]
    assert ev.severity == events_pb2.SEVERITY_ERROR
    assert ev.kind == events_pb2.EVENT_KIND_BUS_ERROR and ev.tick == 7
    assert subject in ev.message and str(BIG) in ev.message
    assert str(MIB) in ev.message  # the server's limit
    assert "blob store" in ev.message  # and why the usual way round it failed
    assert ev.attributes["subject"] == subject and ev.attributes["bytes"] == str(BIG)
    assert await bus.get_last(subject) is None  # nothing half-published


async def test_a_reference_whose_blob_is_gone_is_dead_lettered_not_retried(
        small_bus: Bus) -> None:
    bus = small_bus
    subject = subjects.tick_subject(8, "candidates")
    await asyncio.wait_for(bus.publish(subject, _payload(14), msg_id="candidates-8"), 10)
    await bus.js.delete_object_store(subjects.OBJ_BLOBS)  # e.g. aged out

    async def handler(subj: str, payload: bytes, headers) -> None:
        raise AssertionError("a message without its payload reached the handler")

    consumer = await bus.consume(subjects.STREAM_TICKS, "payload-gone",
                                 subjects.tick_filter("candidates"), handler,
                                 service="payload-test")
    try:
        async def settled() -> None:
            while consumer.dead_lettered + consumer.failed == 0:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(settled(), 15)
    finally:
        await consumer.stop()
    assert (consumer.dead_lettered, consumer.failed) == (1, 0)
