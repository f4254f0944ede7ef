"""Leader election on a KV bucket: one holder at a time per key (the placer's lease,
the language-model rounds' ``proposer-rlm``)."""

from __future__ import annotations

import contextlib
import json
import time

import nats.errors
import structlog

from koi import subjects
from services.runtime.bus import Bus

log = structlog.get_logger(__name__)


class Lease:
    """Leader election on the ``koi_leases`` bucket: one holder at a time per key.

    The value is JSON ``{"holder", "expires_at"}`` (wall-clock seconds). ``acquire()``
    creates the key if absent, or takes it over with a revision-checked update when it
    has expired or is already ours, so two candidates cannot both win. The leader calls
    ``renew()`` well within ``ttl_s``; a standby calling ``acquire()`` in a loop takes
    over within about ``ttl_s`` after renewals stop. Clocks are assumed in step to well
    under ``ttl_s`` (NTP).
    """

    def __init__(self, bus: Bus, key: str, holder: str, ttl_s: float,
                 bucket: str = subjects.KV_LEASES) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        self._bus = bus
        self.key = key
        self.holder = holder
        self.ttl_s = ttl_s
        self.bucket = bucket
        self._expires_at = 0.0  # our own lease's expiry (wall clock), 0 when not leading

    @property
    def is_leader(self) -> bool:
        """True while we hold an unexpired lease (false once renewals have lapsed)."""
        return time.time() < self._expires_at

    async def acquire(self) -> bool:
        """Become (or stay) the leader if the lease is free, expired or ours."""
        now = time.time()
        value = json.dumps({"holder": self.holder, "expires_at": now + self.ttl_s}).encode()
        try:
            current = await self._bus.kv_get(self.bucket, self.key)
            if current is None:
                revision = await self._bus.kv_create(self.bucket, self.key, value)
            else:
                holder, expires_at = _parse_lease(current[0])
                if holder != self.holder and expires_at > now:
                    self._expires_at = 0.0
                    return False
                revision = await self._bus.kv_update(self.bucket, self.key, value, current[1])
        except (TimeoutError, nats.errors.Error) as err:
            log.warning("lease_unreachable", key=self.key, holder=self.holder, error=str(err))
            return self.is_leader
        was_leader = self.is_leader
        self._expires_at = now + self.ttl_s if revision is not None else 0.0
        if self.is_leader and not was_leader:
            log.info("lease_acquired", key=self.key, holder=self.holder, ttl_s=self.ttl_s)
        return self.is_leader

    async def renew(self) -> bool:
        return await self.acquire()

    async def release(self) -> None:
        """Give the lease up now (expired in place), so a standby need not wait."""
        if not self.is_leader:
            return
        self._expires_at = 0.0
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            current = await self._bus.kv_get(self.bucket, self.key)
            if current is not None and _parse_lease(current[0])[0] == self.holder:
                value = json.dumps({"holder": self.holder, "expires_at": 0.0}).encode()
                await self._bus.kv_update(self.bucket, self.key, value, current[1])
        log.info("lease_released", key=self.key, holder=self.holder)


def _parse_lease(raw: bytes) -> tuple[str, float]:
    try:
        doc = json.loads(raw)
        return str(doc["holder"]), float(doc["expires_at"])
    except (ValueError, KeyError, TypeError):
        return "", 0.0  # garbage in the lease: treat it as expired
