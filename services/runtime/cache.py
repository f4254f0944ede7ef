"""The Redis prediction cache: a speed-up that can never cost correctness (DESIGN §2).

Predictions are keyed by (config hash, workload bucket, belief version), so a cached
value is exact for its key and a new belief version simply misses. Every Redis failure
(not configured, refused, down, slow) reads as a miss and a skipped write; after one,
the cache stays quiet for ``retry_after_s`` so a dead Redis costs one short timeout every
few seconds, not one per call. Counters are plain attributes for the caller to export.

Synchronous on purpose: the evaluator calls it from its numeric loop, and a 0.2 s socket
timeout bounds the worst case. No prediction logic and no encoding here: values are
bytes the caller produced.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

log = structlog.get_logger(__name__)


def prediction_key(config_hash: str, workload_key: str, belief_version: int) -> str:
    """The cache key of one prediction: exact for this config, workload and beliefs."""
    return f"{config_hash}:{workload_key}:v{int(belief_version)}"


class PredictionCache:
    """Pipelined MGET / SET EX over redis-py; misses instead of errors, always."""

    def __init__(self, url: str | None, *, ttl_s: int = 3600, namespace: str = "koi:pred",
                 timeout_s: float = 0.2, retry_after_s: float = 2.0) -> None:
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be >= 1 (got {ttl_s})")
        self.url = url or ""
        self.ttl_s = int(ttl_s)
        self.namespace = namespace
        self.retry_after_s = retry_after_s
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.writes = 0
        self.skipped_writes = 0
        self.answered = 0        # round trips Redis answered
        self._quiet_until = 0.0  # monotonic time before which Redis is not tried again
        self._seen = (0, 0)      # (errors, answered) at the last health_change()
        self._down = False
        self._client: Any = None
        if self.url:
            # no client-side retries: one failed attempt is the whole cost of a miss
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                health_check_interval=0)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0

    def stats(self) -> dict[str, float | int | bool]:
        return {"enabled": self.enabled, "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hit_rate, "errors": self.errors, "writes": self.writes,
                "skipped_writes": self.skipped_writes}

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The cached values of ``keys`` in order; None for each miss (or if Redis fails)."""
        if not keys:
            return []
        values: list[bytes | None] = [None] * len(keys)
        if self._usable():
            try:
                got = self._client.mget([self._full(k) for k in keys])
                values = [v if isinstance(v, bytes) else None for v in got]
                self.answered += 1
            except (redis.RedisError, OSError) as err:
                self._failed("cache_get_failed", err)
        found = sum(v is not None for v in values)
        self.hits += found
        self.misses += len(keys) - found
        return values

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Store ``items`` with the TTL in one round trip; silently skipped if Redis fails."""
        if not items:
            return
        if not self._usable():
            self.skipped_writes += len(items)
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(self._full(key), value, ex=self.ttl_s)
            pipe.execute()
            self.writes += len(items)
            self.answered += 1
        except (redis.RedisError, OSError) as err:
            self.skipped_writes += len(items)
            self._failed("cache_set_failed", err)

    def health_change(self) -> str | None:
        """Since the last call: ``"down"`` when Redis failed and had been answering (or
        never failed before), ``"up"`` when it answered again without failing after being
        down, else None. The evaluator asks once per tick and tells the operator."""
        errors, answered = self.errors - self._seen[0], self.answered - self._seen[1]
        self._seen = (self.errors, self.answered)
        if errors and not self._down:
            self._down = True
            return "down"
        if self._down and answered and not errors:
            self._down = False
            return "up"
        return None

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._client.close()

    def _full(self, key: str) -> str:
        return f"{self.namespace}:{key}"

    def _usable(self) -> bool:
        return self._client is not None and time.monotonic() >= self._quiet_until

    def _failed(self, event: str, err: Exception) -> None:
        self.errors += 1
        self._quiet_until = time.monotonic() + self.retry_after_s
        # the pool may hold a half-dead socket: start the next try from a fresh one
        with contextlib.suppress(redis.RedisError, OSError):
            self._client.connection_pool.disconnect()
        log.warning(event, error=str(err), errors=self.errors, retry_after_s=self.retry_after_s)
