"""Per-submitter rate limits on job submissions: a token bucket per user, and the
"this user is being limited" condition folded into a few events.

Each user submits on its own subject, ``koi.jobs.submit.<user>`` (``koi.subjects``), and
its NATS user may publish on no other submitter's, so the subject's last token says
whose budget a submission spends. A user's bucket holds at most ``burst`` tokens and
gains ``rate_per_s`` a second; a submission takes one. With none left, the placer
answers busy with the time until the next token, and stores nothing.

**One budget across replicas.** Every placer replica answers submissions (a queue
group), each with its own buckets. So that N replicas allow a user ``rate_per_s`` and not
N times it, each replica tells the others what it took (``unshared``, sent every
``SHARE_EVERY_S`` on ``koi.placer.spent``) and takes what they took from its own buckets
(``spent_elsewhere``); a bucket may go below zero, down to ``-burst``, so an overspend
is paid back by waiting. Over a long spell the user gets ``rate_per_s`` whatever N is;
what the replicas have not yet heard of can get past once: at most (N − 1) × ``burst``
at the start of a spell and N × ``rate_per_s`` × ``SHARE_EVERY_S`` after it. A lost
report (core NATS: at most once) lets its tokens through once more; nothing is refused
that the limit allows.

Pure: time is passed in (seconds on one monotonic clock), nothing here knows about NATS
(the placer's ``services/placer/admission.py`` applies this to messages and emits the
events). A bucket nobody has used for a while is full, which is what a bucket never
seen is: full buckets are forgotten, so the map holds only users active lately.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from koi.fold import Folder

HOLD_S = 5.0            # a user refused within this long is "being limited"
STILL_EVERY_S = 60.0    # one "still limited" event per user per this, while it lasts
FOLD_STEP_S = 0.1       # the folder's tick: conditions are timed to this resolution
MAX_USERS = 100_000     # buckets kept at most (a forgotten one refills: a fresh burst)
SHARE_EVERY_S = 0.05    # how often a replica tells the others what it took
_EPS = 1e-9             # a token short by rounding is a token: waiting exactly the time
                        # a refusal named must be enough


@dataclass(frozen=True, slots=True)
class RateLimit:
    """How fast one user may submit: ``burst`` at once, then ``rate_per_s`` a second;
    a rate of 0 turns the limit off."""

    rate_per_s: float
    burst: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.rate_per_s) or self.rate_per_s < 0:
            raise ValueError(f"rate_per_s must be finite and >= 0 (got {self.rate_per_s})")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1 (got {self.burst})")

    @property
    def off(self) -> bool:
        return self.rate_per_s == 0

    def describe(self) -> str:
        return f"{self.burst} at once, then {self.rate_per_s:g}/s"


@dataclass(frozen=True, slots=True)
class Bucket:
    """A user's tokens as of time ``at``."""

    tokens: float
    at: float


def refill(limit: RateLimit, bucket: Bucket | None, now: float) -> Bucket:
    """``bucket`` as of ``now``: full when never seen; a clock that steps back adds
    nothing and takes nothing."""
    if bucket is None:
        return Bucket(float(limit.burst), now)
    gained = max(now - bucket.at, 0.0) * limit.rate_per_s
    return Bucket(min(float(limit.burst), bucket.tokens + gained), max(now, bucket.at))


def wait_s(limit: RateLimit, bucket: Bucket | None, now: float) -> float:
    """Seconds from ``now`` until the bucket holds a token; 0 when it holds one now."""
    if limit.off:
        return 0.0
    tokens = refill(limit, bucket, now).tokens
    return 0.0 if tokens >= 1.0 - _EPS else (1.0 - tokens) / limit.rate_per_s


def take(limit: RateLimit, bucket: Bucket | None, now: float) -> Bucket:
    """The bucket after one submission at ``now``; ``ValueError`` when it is empty
    (ask ``wait_s`` first)."""
    b = refill(limit, bucket, now)
    if b.tokens < 1.0 - _EPS:
        raise ValueError(f"no token until {wait_s(limit, bucket, now):.3f} s from now")
    return Bucket(max(b.tokens - 1.0, 0.0), b.at)


@dataclass(frozen=True, slots=True)
class Limited:
    """One event to emit about a limited user: ``phase`` is ``start`` (its first refusal),
    ``still`` (every ``STILL_EVERY_S`` while it lasts) or ``end`` (``HOLD_S`` after its
    last refusal); ``refused`` counts its refusals since the start."""

    user: str
    phase: str
    held_s: float
    refused: int

    def message(self, limit: RateLimit) -> str:
        """The event's text, e.g. "user 'alice' is rate limited (100 at once, …)"."""
        if self.phase == "start":
            return (f"user {self.user!r} is rate limited ({limit.describe()}): its "
                    "submissions are answered busy")
        if self.phase == "still":
            return (f"user {self.user!r} still rate limited: {self.refused} submissions "
                    f"answered busy over {self.held_s:.0f} s")
        return (f"user {self.user!r} no longer rate limited, after {self.held_s:.0f} s and "
                f"{self.refused} submissions answered busy")


@dataclass
class SubmitterLimits:
    """Every recent submitter's bucket, and which of them are being limited."""

    limit: RateLimit
    hold_s: float = HOLD_S
    max_users: int = MAX_USERS
    buckets: dict[str, Bucket] = field(default_factory=dict)
    _last_refused: dict[str, float] = field(default_factory=dict)
    _refused: dict[str, int] = field(default_factory=dict)
    _folder: Folder = field(default_factory=lambda: Folder(
        every=round(STILL_EVERY_S / FOLD_STEP_S)))
    _step: int = -1
    _unshared: dict[str, int] = field(default_factory=dict)  # taken, not yet told

    def wait_s(self, user: str, now: float) -> float:
        """Seconds until ``user`` may submit again; 0 when it may now."""
        return wait_s(self.limit, self.buckets.get(user), now)

    def take(self, user: str, now: float) -> None:
        """Spend one of ``user``'s tokens (a submission queued at ``now``)."""
        if self.limit.off:
            return
        self._put(user, take(self.limit, self.buckets.get(user), now))
        if user in self._unshared or len(self._unshared) < self.max_users:
            self._unshared[user] = self._unshared.get(user, 0) + 1

    def unshared(self) -> dict[str, int]:
        """What this replica took per user since it last asked, for the other replicas'
        ``spent_elsewhere``; the count starts again from nothing."""
        out, self._unshared = self._unshared, {}
        return out

    def spent_elsewhere(self, spent: dict[str, int], now: float) -> None:
        """Another replica took ``spent[user]`` of each user's tokens: take them here too.
        A bucket goes down to ``-burst`` at most, so an overspend costs the user a wait
        but never locks it out for longer than a full refill."""
        if self.limit.off:
            return
        floor = -float(self.limit.burst)
        for user, n in spent.items():
            if n > 0:
                b = refill(self.limit, self.buckets.get(user), now)
                self._put(user, Bucket(max(b.tokens - n, floor), b.at))

    def _put(self, user: str, bucket: Bucket) -> None:
        self.buckets.pop(user, None)  # re-inserted: the map's order is least recent first
        self.buckets[user] = bucket
        while len(self.buckets) > self.max_users:
            del self.buckets[next(iter(self.buckets))]

    def refused(self, user: str, now: float) -> list[Limited]:
        """Record a refusal of ``user`` at ``now``; the ``start`` event when it is the
        first of a spell (folded at once), else nothing."""
        self._last_refused[user] = now
        self._refused[user] = self._refused.get(user, 0) + 1
        if user in self._folder.holding:
            return []
        return self.fold(now)

    def fold(self, now: float) -> list[Limited]:
        """The events due at ``now`` (call it every second or so: a spell ends only when
        this is called), and forget the buckets that are full again."""
        # the folder's tick must move on at each call, even twice within one step
        self._step = max(int(now / FOLD_STEP_S), self._step + 1)
        for user in [u for u, at in self._last_refused.items() if now - at > self.hold_s]:
            del self._last_refused[user]
        out = [Limited(f.key, f.phase, self._held_s(f.ticks), self._refused.get(f.key, 0))
               for f in self._folder.tick(self._step, dict.fromkeys(self._last_refused, ""))]
        for event in out:
            if event.phase == "end":
                self._refused.pop(event.user, None)
        for user in list(self._full(now)):
            del self.buckets[user]
        return out

    def limited(self) -> list[str]:
        """The users being limited now."""
        return sorted(self._folder.holding)

    def _full(self, now: float) -> Iterator[str]:
        for user, bucket in self.buckets.items():
            if refill(self.limit, bucket, now).tokens >= self.limit.burst:
                yield user

    @staticmethod
    def _held_s(ticks: int) -> float:
        return ticks * FOLD_STEP_S
