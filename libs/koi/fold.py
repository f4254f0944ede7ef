"""Folding a condition that repeats tick after tick into events an operator can follow.

A deferred job is deferred again every tick until GPUs free up; printing the same line
each tick buries everything else in the event log. ``Folder`` turns each tick's set of
conditions (a key, e.g. the job id, and the tick's message) into at most three kinds of
event per condition:

* ``start`` — the tick it first holds (the message as it is);
* ``still`` — every ``every`` ticks while it lasts: how long it has held, with the
  latest message (``"still deferred: 10 ticks"``);
* ``end`` — the first tick it no longer holds: how long it lasted.

Pure: no clock, no I/O; the caller says which tick it is and emits what comes back.
A folder starts empty, so a process that takes over (a new placer leader) reports a
condition still holding as a fresh ``start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STILL_EVERY = 10  # ticks between two "still …" events of one condition


@dataclass(frozen=True, slots=True)
class Folded:
    """One event to emit: ``phase`` is ``start``, ``still`` or ``end``."""

    key: str
    phase: str
    ticks: int          # how many ticks the condition has held (1 at its start)
    since_tick: int     # the tick it started
    message: str        # the latest message of the condition


@dataclass
class Folder:
    """The conditions of one kind (e.g. deferrals) and since when each holds."""

    every: int = STILL_EVERY
    _since: dict[str, int] = field(default_factory=dict)
    _last: dict[str, str] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)
    _tick: int | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1 (got {self.every})")

    def tick(self, tick: int, holding: Mapping[str, str]) -> list[Folded]:
        """The events of ``tick``, given the conditions that hold at it (key → message).

        A tick seen again (a redelivered message) or an older one yields nothing and
        changes nothing, so folding is idempotent under at-least-once delivery."""
        if self._tick is not None and tick <= self._tick:
            return []
        self._tick = tick
        out: list[Folded] = []
        for key in sorted(set(self._since) - set(holding)):
            since = self._since.pop(key)
            self._held.pop(key)
            out.append(Folded(key, "end", tick - since, since, self._last.pop(key)))
        for key in sorted(holding):
            message = holding[key]
            if key not in self._since:
                self._since[key], held = tick, 1
                out.append(Folded(key, "start", 1, tick, message))
            else:  # ticks may be skipped (a degraded tick): count crossings of ``every``
                held = tick - self._since[key] + 1
                if held // self.every > self._held[key] // self.every:
                    out.append(Folded(key, "still", held, self._since[key], message))
            self._held[key] = held
            self._last[key] = message
        return out

    @property
    def holding(self) -> dict[str, int]:
        """Each condition holding now, and the tick it started."""
        return dict(self._since)
