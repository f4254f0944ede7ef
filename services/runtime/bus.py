"""The ``Bus``: one connected NATS client with Koi's streams, KV buckets and conventions
(DESIGN §2). Every service has one; the pieces around it each have their own file:

* ``connection.py`` — ``connect`` (reconnecting forever, credentials and TLS) and
  ``delete_koi_state``;
* ``bus.py`` (here) — streams and KV buckets (idempotent set-up, safe when services
  race), de-duplicated JetStream publishes (``Nats-Msg-Id``), last-value reads, dead
  letters on ``koi.dlq.<service>`` with an operator event, core request/reply in queue
  groups, KV helpers with revision checks;
* ``consumer.py`` — durable at-least-once consumers that ack only after the handler
  returns, and ``Undecodable``;
* ``lease.py`` — the KV lease that elects a single leader (placer, RLM rounds);
* ``blobs.py`` — the object store: every payload larger than the connected server
  accepts travels as a reference to a blob, and every reading path here resolves
  references, so callers never see the server's ``max_payload``; a payload that cannot
  be carried raises ``PayloadRefused`` after an ``EVENT_KIND_BUS_ERROR`` operator event.

No decisions and no protobuf ⇄ domain conversion here: handlers get bytes (or what the
caller's ``decode`` returns); the only message type this module builds is the
``OperatorEvent`` of a dead letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ObjectNotFoundError,
    ServerError,
)
from nats.js.kv import KeyValue

from koi import subjects
from koi.v1 import events_pb2
from services.runtime.blobs import (
    HEADER_BLOB,
    HEADER_BLOB_SIZE,
    BlobStore,
    PayloadRefused,
    blob_of,
    kv_blob_of,
    kv_reference,
)
from services.runtime.consumer import Consumer, Handler, Subscription, Undecodable, tick_or_zero

log = structlog.get_logger(__name__)

# largest message a stream or KV value accepts; a larger payload (or one larger than
# the server's max_payload, 1 MiB by default) is sent as a blob reference instead
MAX_MSG_BYTES = 8 * 1024 * 1024
STREAM_MAX_AGE_S = 24 * 3600.0       # limits retention: a day of ticks, events, letters
DUPLICATE_WINDOW_S = 120.0           # Nats-Msg-Id de-duplication horizon
HEADER_ORIGINAL_SUBJECT = "Koi-Original-Subject"
HEADER_ERROR = "Koi-Error"
_ERR_STREAM_NAME_IN_USE = 10058      # "stream name already in use with a different config"
_ERR_STREAM_STORE_FAILED = 10049     # "error creating store for stream": see _create_store
_STORE_ATTEMPTS = 6                  # 0.05 + 0.1 + … + 0.8 s of waiting, 1.55 s at most

# (subject, payload, headers) → reply payload (None: an empty reply)
Responder = Callable[[str, bytes, Mapping[str, str] | None], Awaitable[bytes | None]]


class RemoteError(Exception):
    """A request/reply responder failed; its error text travels in ``Koi-Error``."""


def _header_safe(text: str, limit: int = 500) -> str:
    return " ".join(text.split())[:limit]  # header values may not hold CR/LF


def _enum_token(enum: Any, value: int, prefix: str) -> str:
    name: str = enum.Name(value)
    return name.removeprefix(prefix).lower()


async def _create_store(create: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``create`` (a stream or bucket creation), retrying the server's transient
    "error creating store for stream". nats-server removes an account's empty stream
    directory when its last stream is deleted, and a creation racing that removal fails
    with "mkdir …/$G/streams: no such file or directory" (5 times in 1,400 delete-all /
    create-all cycles). Any other error, or this one on the last attempt, is raised."""
    for attempt in range(_STORE_ATTEMPTS - 1):
        try:
            return await create()
        except ServerError as err:
            if err.err_code != _ERR_STREAM_STORE_FAILED:
                raise
            log.info("stream_store_retry", attempt=attempt + 1, error=err.description)
            await asyncio.sleep(0.05 * 2 ** attempt)
    return await create()


class Bus:
    """A connected NATS client with Koi's streams, KV buckets and conventions."""

    def __init__(self, nc: Client, name: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.name = name
        self._kv: dict[str, KeyValue] = {}
        self._consumers: list[Consumer] = []
        self._subscriptions: list[Subscription] = []
        self.blobs = BlobStore(nc, self.js, subjects.OBJ_BLOBS, MAX_MSG_BYTES)
        self.kv_blobs = BlobStore(nc, self.js, subjects.OBJ_KV_BLOBS, MAX_MSG_BYTES)
        self._kv_refs: dict[tuple[str, str], str] = {}  # the blob each key last held
        # called (in the background) with the seconds the connection was down, each time
        # it comes back: run_service turns it into an operator event
        self.on_reconnected: Callable[[float], Awaitable[None]] | None = None

    # -- set-up -------------------------------------------------------------------------
    async def ensure_streams(self, *, replicas: int = 1) -> None:
        """Create (or bring up to date) every stream in ``koi.subjects.STREAMS``."""
        for name, patterns in subjects.STREAMS.items():
            config = api.StreamConfig(
                name=name, subjects=list(patterns), retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE, discard=api.DiscardPolicy.OLD,
                max_age=STREAM_MAX_AGE_S, duplicate_window=DUPLICATE_WINDOW_S,
                max_msg_size=MAX_MSG_BYTES, num_replicas=replicas)
            try:
                # identical config: the server says OK
                await _create_store(functools.partial(self.js.add_stream, config))
            except BadRequestError as err:
                if err.err_code != _ERR_STREAM_NAME_IN_USE:
                    raise
                # another version (or another service) made it differently: converge
                await self.js.update_stream(config)
                log.info("stream_updated", stream=name)

    async def ensure_kv(self, *, replicas: int = 1) -> None:
        """Create every bucket in ``koi.subjects.KV_BUCKETS`` (history 1) if missing,
        and the object stores for payloads too large for a message."""
        await _create_store(functools.partial(
            self.blobs.ensure, replicas=replicas, max_age_s=STREAM_MAX_AGE_S))
        await _create_store(functools.partial(
            self.kv_blobs.ensure, replicas=replicas, max_age_s=None))
        for bucket in subjects.KV_BUCKETS:
            config = api.KeyValueConfig(bucket=bucket, history=1, replicas=replicas,
                                        storage=api.StorageType.FILE,
                                        max_value_size=MAX_MSG_BYTES)
            try:
                self._kv[bucket] = await _create_store(
                    functools.partial(self.js.create_key_value, config))
            except BadRequestError as err:
                if err.err_code != _ERR_STREAM_NAME_IN_USE:
                    raise
                # exists with another configuration: use it as it is, values are values
                self._kv[bucket] = await self.js.key_value(bucket)

    # -- publishing and reading -----------------------------------------------------------
    async def publish(self, subject: str, data: bytes, *, msg_id: str | None = None,
                      headers: Mapping[str, str] | None = None,
                      timeout_s: float = 5.0) -> api.PubAck:
        """Store ``data`` on a stream; republishing the same ``msg_id`` within the
        duplicate window is a no-op (the ack then says ``duplicate=True``)."""
        hdrs = dict(headers or {})
        if msg_id:
            hdrs[api.Header.MSG_ID] = msg_id
        size = len(data)
        data, hdrs = await self._outgoing(subject, data, hdrs, key=msg_id)
        try:
            return await self.js.publish(subject, data, timeout=timeout_s,
                                         headers=hdrs or None)
        except (nats.errors.MaxPayloadError, BadRequestError) as err:
            # the client's own check, or the stream's max_msg_size (err 10054)
            cause = f"{type(err).__name__}: {err}"
            raise await self._refused(subject, size, cause, key=msg_id) from err

    async def _outgoing(self, subject: str, data: bytes, headers: dict[str, str], *,
                        key: str | None = None) -> tuple[bytes, dict[str, str]]:
        """``(data, headers)`` as they can be sent: unchanged if they fit the server,
        else an empty body and a reference to a blob holding ``data``."""
        if self.blobs.fits(data, headers):
            return data, headers
        try:
            name = await self.blobs.put(data)
        except Exception as err:
            cause = f"too large, and the blob store failed: {type(err).__name__}: {err}"
            raise await self._refused(subject, len(data), cause, key=key) from err
        return b"", {**headers, HEADER_BLOB: name, HEADER_BLOB_SIZE: str(len(data))}

    async def _refused(self, subject: str, size: int, cause: str, *,
                       key: str | None) -> PayloadRefused:
        """Tell the operators why a message could not be sent; the exception to raise.
        The event id is stable per message, so a retry loop re-announces it once per
        duplicate window, not once per attempt."""
        refused = PayloadRefused(subject, size, self.blobs.limit, _header_safe(cause))
        log.error("payload_refused", subject=subject, bytes=size, limit=refused.limit,
                  cause=refused.cause)
        with contextlib.suppress(Exception):  # an event lost must not hide the refusal
            await self.emit(events_pb2.OperatorEvent(
                tick=tick_or_zero(subject), severity=events_pb2.SEVERITY_ERROR,
                kind=events_pb2.EVENT_KIND_BUS_ERROR, message=str(refused),
                attributes={"subject": subject, "bytes": str(size),
                            "limit": str(refused.limit), "cause": refused.cause},
                event_id=f"refused.{self.name}.{key or subject}.{size}"))
        return refused

    async def resolve(self, msg: Any) -> bytes:
        """A received message's payload as it was sent: its own bytes, or those of the
        blob it refers to (``msg``: a core, JetStream or stream-read message)."""
        name = blob_of(msg.headers)
        if name is None:
            return msg.data or b""
        return await self.blobs.get(name)

    async def get_last(self, subject: str) -> bytes | None:
        """The last message stored on exactly ``subject``, or None if there is none."""
        try:
            raw = await self.js.get_last_msg(subjects.stream_of(subject), subject)
        except NotFoundError:
            return None
        return await self.resolve(raw)

    async def has(self, subject: str) -> bool:
        """Whether a message is stored on exactly ``subject`` (a blob is not fetched)."""
        try:
            await self.js.get_last_msg(subjects.stream_of(subject), subject)
        except NotFoundError:
            return False
        return True

    async def wait_for(self, subject: str, timeout_s: float) -> bytes | None:
        """The last message on ``subject``, else the next one within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        arrived: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            if not arrived.done():
                arrived.set_result(msg)

        # subscribe *before* reading, so a message stored in between is not missed
        sub = await self.nc.subscribe(subject, cb=on_msg)
        try:
            await self.nc.flush()
            last = await self.get_last(subject)
            if last is not None:
                return last
            try:
                msg = await asyncio.wait_for(arrived, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return None
            return await self.resolve(msg)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def emit(self, event: events_pb2.OperatorEvent) -> api.PubAck:
        """Publish an operator event on ``koi.events.<severity>.<kind>``; fills in an
        empty ``event_id``, ``time`` and ``service``; de-duplicated by ``event_id``."""
        if event.severity == events_pb2.SEVERITY_UNSPECIFIED:
            raise ValueError("an operator event needs a severity")
        if event.kind == events_pb2.EVENT_KIND_UNSPECIFIED:
            raise ValueError("an operator event needs a kind")
        if not event.event_id:
            event.event_id = uuid.uuid4().hex
        if not event.HasField("time"):
            event.time.GetCurrentTime()
        if not event.service:
            event.service = self.name
        subject = subjects.event_subject(
            _enum_token(events_pb2.Severity, event.severity, "SEVERITY_"),
            _enum_token(events_pb2.EventKind, event.kind, "EVENT_KIND_"))
        return await self.publish(subject, event.SerializeToString(), msg_id=event.event_id)

    async def dead_letter(self, service: str, subject: str, data: bytes, error: str, *,
                          msg_id: str | None = None, tick: int = 0,
                          headers: Mapping[str, str] | None = None) -> None:
        """Park an undecodable payload on ``koi.dlq.<service>`` and tell the operators
        (``headers``: the original message's, kept when they refer to a blob)."""
        error = _header_safe(error)
        kept = {k: v for k, v in (headers or {}).items() if k in (HEADER_BLOB, HEADER_BLOB_SIZE)}
        await self.publish(subjects.dlq_subject(service), data, msg_id=msg_id,
                           headers={**kept, HEADER_ORIGINAL_SUBJECT: subject,
                                    HEADER_ERROR: error})
        await self.emit(events_pb2.OperatorEvent(
            tick=tick, severity=events_pb2.SEVERITY_ERROR, kind=events_pb2.EVENT_KIND_DLQ,
            service=service, message=f"undecodable message on {subject}: {error}",
            attributes={"subject": subject, "error": error, "bytes": str(len(data))},
            event_id=f"{msg_id}.event" if msg_id else ""))
        log.error("dead_lettered", service=service, subject=subject, error=error)

    # -- durable consumers ----------------------------------------------------------------
    async def consume(self, stream: str, durable: str, filter_subject: str, handler: Handler,
                      *, service: str, decode: Callable[[bytes], Any] | None = None,
                      ack_wait_s: float = 10.0, max_deliver: int = -1,
                      nak_delay_s: float = 1.0, max_ack_pending: int = 1) -> Consumer:
        """Run ``handler`` on every message of a durable pull consumer, one at a time.

        Ack after the handler returns (at-least-once: handlers must be idempotent);
        ``Undecodable`` (or ``decode`` failing) → dead letter, then term; any other
        exception → logged, nak'd and redelivered after ``nak_delay_s``.
        ``max_ack_pending=1`` keeps strict order across the consumer's replicas: a
        message is redelivered before any later one is delivered.
        """
        config = api.ConsumerConfig(
            durable_name=durable, name=durable, filter_subject=filter_subject,
            deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s, max_deliver=max_deliver, max_ack_pending=max_ack_pending)
        sub = await self.js.pull_subscribe(filter_subject, durable=durable, stream=stream,
                                           config=config)
        consumer = Consumer(self, sub, durable=durable, service=service, handler=handler,
                            decode=decode, ack_wait_s=ack_wait_s, nak_delay_s=nak_delay_s)
        self._consumers.append(consumer)
        return consumer

    # -- core request/reply ---------------------------------------------------------------
    async def subscribe(self, subject: str, handler: Responder, queue: str = "") -> Subscription:
        """Answer requests on ``subject`` (in queue group ``queue``, if given), one at a
        time per subscription; a failing handler answers with a ``Koi-Error`` header."""

        async def on_msg(msg: Msg) -> None:
            try:
                reply = await handler(msg.subject, await self.resolve_or_undecodable(msg),
                                      msg.headers)
            except Undecodable as err:
                await self.dead_letter(self.name, msg.subject, msg.data, str(err),
                                       headers=msg.headers)
                await self._reply_error(msg, f"undecodable: {err}")
            except Exception as err:
                log.exception("responder_failed", subject=msg.subject)
                await self._reply_error(msg, f"{type(err).__name__}: {err}")
            else:
                with contextlib.suppress(PayloadRefused):  # announced; the asker times out
                    await self.respond(msg, reply or b"")

        sub = Subscription(await self.nc.subscribe(subject, queue=queue, cb=on_msg))
        self._subscriptions.append(sub)
        return sub

    async def resolve_or_undecodable(self, msg: Msg) -> bytes:
        """``resolve``, with a reference whose blob is gone as ``Undecodable``: it will
        never resolve, so retrying it would only hold the consumer."""
        try:
            return await self.resolve(msg)
        except ObjectNotFoundError as err:
            raise Undecodable(f"blob {blob_of(msg.headers)} of this message is gone "
                              f"(aged out or deleted): {type(err).__name__}") from err

    async def respond(self, msg: Msg, data: bytes) -> None:
        """Answer a core request (a blob reference if ``data`` is too large)."""
        if msg.reply:
            data, hdrs = await self._outgoing(msg.subject, data, {})
            await self.nc.publish(msg.reply, data, headers=hdrs or None)

    async def _reply_error(self, msg: Msg, error: str) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, b"", headers={HEADER_ERROR: _header_safe(error)})

    async def request(self, subject: str, data: bytes, timeout_s: float) -> bytes:
        """Ask whoever answers ``subject``; raises ``RemoteError`` if the responder
        failed, nats' ``TimeoutError`` / ``NoRespondersError`` if nobody answered."""
        data, hdrs = await self._outgoing(subject, data, {})
        msg = await self.nc.request(subject, data, timeout=timeout_s, headers=hdrs or None)
        if msg.headers and HEADER_ERROR in msg.headers:
            raise RemoteError(msg.headers[HEADER_ERROR])
        return await self.resolve(msg)

    # -- key/value --------------------------------------------------------------------------
    async def _bucket(self, bucket: str) -> KeyValue:
        kv = self._kv.get(bucket)
        if kv is None:
            kv = self._kv[bucket] = await self.js.key_value(bucket)
        return kv

    async def _kv_raw(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        try:
            entry = await (await self._bucket(bucket)).get(key)
        except KeyNotFoundError:
            return None
        return entry.value or b"", int(entry.revision or 0)

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        """(value, revision), or None when the key is absent or deleted."""
        for _ in range(3):
            got = await self._kv_raw(bucket, key)
            name = kv_blob_of(got[0]) if got is not None else None
            if got is None or name is None:
                return got
            self._kv_refs[(bucket, key)] = name
            try:
                return await self.kv_blobs.get(name), got[1]
            except ObjectNotFoundError:
                # superseded (and deleted) between reading the key and its blob: read again
                if (await self._kv_raw(bucket, key) or (b"", -1))[1] == got[1]:
                    raise
        raise ObjectNotFoundError

    async def _kv_write(self, bucket: str, key: str, value: bytes,
                        write: Callable[[bytes], Awaitable[int | None]]) -> int | None:
        """``write`` ``value``, or a reference to it when it is too large; then delete the
        blob the key held before (known from this process's reads and writes, or read
        back when the new value is a blob too: the old one usually was)."""
        stored = value
        if not self.kv_blobs.fits(value):
            old = self._kv_refs.get((bucket, key))
            if old is None and (raw := await self._kv_raw(bucket, key)) is not None:
                old = kv_blob_of(raw[0])
                if old:
                    self._kv_refs[(bucket, key)] = old
            try:
                stored = kv_reference(await self.kv_blobs.put(value), len(value))
            except Exception as err:
                cause = f"too large, and the blob store failed: {type(err).__name__}: {err}"
                raise await self._refused(f"$KV.{bucket}.{key}", len(value), cause,
                                          key=None) from err
        written = kv_blob_of(stored)
        revision = await write(stored)
        if revision is None:  # someone else's value won: our blob is nobody's
            doomed = written
        else:
            doomed = self._kv_refs.pop((bucket, key), None)
            if written:
                self._kv_refs[(bucket, key)] = written
        if doomed and (revision is None or doomed != written):
            with contextlib.suppress(Exception):  # an orphan costs space, not correctness
                await self.kv_blobs.delete(doomed)
        return revision

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        kv = await self._bucket(bucket)
        return int(await self._kv_write(bucket, key, value, functools.partial(kv.put, key))
                   or 0)  # a put always writes: never None

    async def kv_update(self, bucket: str, key: str, value: bytes,
                        last_revision: int) -> int | None:
        """Write only if the key is still at ``last_revision``; None if someone else won."""
        kv = await self._bucket(bucket)

        async def update(stored: bytes) -> int | None:
            try:
                return int(await kv.update(key, stored, last_revision))
            except KeyWrongLastSequenceError:
                return None
        return await self._kv_write(bucket, key, value, update)

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        """Write only if the key does not exist; None if it does."""
        kv = await self._bucket(bucket)

        async def create(stored: bytes) -> int | None:
            try:
                return int(await kv.create(key, stored))
            except KeyWrongLastSequenceError:
                return None
        return await self._kv_write(bucket, key, value, create)

    # -- shutdown ---------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop consumers (letting a running handler finish), then drain the connection."""
        await asyncio.gather(*(consumer.stop() for consumer in self._consumers))
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (TimeoutError, nats.errors.Error):
                await self.nc.close()


