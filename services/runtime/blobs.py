"""Payloads larger than the connected NATS server accepts, kept in JetStream object stores.

A NATS server refuses any message over its ``max_payload`` (1 MiB unless configured), and
a JetStream stream any over its ``max_msg_size``. Koi's stage outputs (candidate
batches, plans, causal states) outgrow that as the fleet grows, so ``Bus`` hands every
payload that does not fit to ``BlobStore.put`` (chunked below the server's limit) and
sends a small reference instead: a message with an empty body and the headers
``Koi-Blob`` (the object's name) and ``Koi-Blob-Size``; a KV value that does not fit
becomes ``KV_REF`` followed by the same two facts in JSON. Readers resolve references
through ``BlobStore.get``.

Two buckets, because the two kinds of reference live differently: ``koi_blobs`` holds
messages' payloads and ages out after 24 h as the streams' messages do (names are unique
per put, so a redelivered stage that publishes again leaves at most an orphan, which
ages out too); ``koi_kv_blobs`` holds KV values' payloads, which must last as long as
their key does however long Koi is stopped, so it has no age limit and ``Bus`` deletes
the object a key held once a new value has replaced it.

Plumbing only: no decisions, no protobuf.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Mapping

import nats.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError
from nats.js.object_store import ObjectStore

log = structlog.get_logger(__name__)

HEADER_BLOB = "Koi-Blob"             # the object that holds this message's payload
HEADER_BLOB_SIZE = "Koi-Blob-Size"   # its size in bytes (for operators and measurements)
# A KV value that starts with this is a reference. No Koi value can: protobuf has no
# field number 0 (a first byte of 0x00 does not parse) and JSON does not start with NUL.
KV_REF = b"\x00koi-blob\x00"
# What a message may need beside its payload (headers, protocol line): the server counts
# headers against max_payload, the client does not, so a payload this close to the limit
# is stored as a blob rather than risk a refusal that the client cannot foresee.
HEADER_ROOM = 4096
_ERR_STREAM_NAME_IN_USE = 10058
GET_TIMEOUT_S = 30.0    # a blob of tens of MB reads in well under a second locally


class PayloadRefused(nats.errors.MaxPayloadError):
    """A message could not be carried: too large for the server and not storable as a
    blob (or refused by the server even so). ``Bus`` has emitted an operator event.
    A ``MaxPayloadError``, so code that caught the client's refusal still catches it."""

    def __init__(self, subject: str, size: int, limit: int, cause: str) -> None:
        self.message = (f"{size}-byte message on {subject} refused (server limit "
                        f"{limit} bytes): {cause}")
        super().__init__(self.message)
        self.subject = subject
        self.size = size
        self.limit = limit
        self.cause = cause

    def __str__(self) -> str:
        return self.message


def headers_size(headers: Mapping[str, str] | None) -> int:
    """Bytes ``headers`` take on the wire (``NATS/1.0`` line, ``key: value\\r\\n`` each)."""
    return 12 + sum(len(k) + len(v) + 4 for k, v in (headers or {}).items())


def blob_of(headers: Mapping[str, str] | None) -> str | None:
    """The object name a message refers to, or None for a message that carries its own."""
    return (headers or {}).get(HEADER_BLOB) or None


def kv_reference(name: str, size: int) -> bytes:
    return KV_REF + json.dumps({"blob": name, "size": size}).encode()


def kv_blob_of(value: bytes) -> str | None:
    """The object name a KV value refers to, or None for a value stored inline."""
    if not value.startswith(KV_REF):
        return None
    return str(json.loads(value[len(KV_REF):])["blob"])


class BlobStore:
    """One object store bucket of one connection (``koi_blobs`` for messages, which age
    out with the streams; ``koi_kv_blobs`` for KV values, which live as long as their
    key does and are deleted by the writer that supersedes them)."""

    def __init__(self, nc: Client, js: JetStreamContext, bucket: str,
                 max_msg_bytes: int) -> None:
        self._nc = nc
        self._js = js
        self.bucket = bucket
        self._max_msg_bytes = max_msg_bytes
        self._store: ObjectStore | None = None
        self.puts = 0
        self.gets = 0

    @property
    def limit(self) -> int:
        """The largest message (payload and headers) the server and Koi's streams take;
        read at each call since a reconnect may land on a server with another limit."""
        return min(self._nc.max_payload, self._max_msg_bytes)

    def fits(self, data: bytes, headers: Mapping[str, str] | None = None) -> bool:
        return len(data) + headers_size(headers) + HEADER_ROOM <= self.limit

    async def ensure(self, *, replicas: int = 1, max_age_s: float | None) -> None:
        """Create the bucket if missing (idempotent, safe when services race)."""
        config = api.ObjectStoreConfig(
            description="Koi payloads too large for one NATS message", ttl=max_age_s,
            storage=api.StorageType.FILE, replicas=replicas)
        try:
            self._store = await self._js.create_object_store(self.bucket, config)
        except BadRequestError as err:
            if err.err_code != _ERR_STREAM_NAME_IN_USE:
                raise
            self._store = await self._js.object_store(self.bucket)

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._js.object_store(self.bucket)
        return self._store

    async def put(self, data: bytes) -> str:
        """Store ``data`` under a new unique name and return the name."""
        name = uuid.uuid4().hex
        chunk = max(64 * 1024, self._nc.max_payload - HEADER_ROOM)  # fewer, larger acks
        meta = api.ObjectMeta(name=name, options=api.ObjectMetaOptions(max_chunk_size=chunk))
        await (await self._bucket()).put(name, data, meta=meta)
        self.puts += 1
        log.debug("blob_stored", bucket=self.bucket, blob=name, bytes=len(data))
        return name

    async def get(self, name: str, timeout_s: float = GET_TIMEOUT_S) -> bytes:
        """The payload stored under ``name``; nats' ``ObjectNotFoundError`` if it is gone
        (aged out, superseded, or the bucket was deleted). The timeout guards the one
        way a read can hang: chunks purged between reading the object's info and
        subscribing to them."""
        result = await asyncio.wait_for((await self._bucket()).get(name), timeout_s)
        self.gets += 1
        return result.data or b""

    async def delete(self, name: str) -> None:
        """Remove the object, its chunks and its info (``ObjectStore.delete`` would keep
        a tombstone per object, forever in a bucket without an age limit)."""
        store = await self._bucket()
        info = await store.get_info(name)
        stream = f"OBJ_{self.bucket}"
        await self._js.purge_stream(stream, subject=f"$O.{self.bucket}.C.{info.nuid}")
        encoded = base64.urlsafe_b64encode(name.encode()).decode()
        await self._js.purge_stream(stream, subject=f"$O.{self.bucket}.M.{encoded}")
