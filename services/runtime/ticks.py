"""Reading a tick's artefacts back from the tick stream, decoded once per process.

Each stage publishes its output on ``koi.tick.<n>.<stage>``; a later stage (or a worker
replica) reads the ones it needs with ``await ticks.snapshot(n)`` and so on, waiting up
to the stage deadline for one not yet published. The small LRU keeps the last few
ticks, so a tick's shards decode the snapshot and candidates once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from koi import subjects
from koi.wire import planning
from services.runtime.bus import Bus


class StageMissing(TimeoutError):
    """A tick's artefact did not appear within the deadline."""


class TickReader:
    def __init__(self, bus: Bus, deadline_s: float, keep: int = 8) -> None:
        self.bus = bus
        self.deadline_s = deadline_s
        self.keep = keep
        self._cache: OrderedDict[tuple[int, str], Any] = OrderedDict()

    async def raw(self, tick: int, stage: str, *, wait: bool = True) -> bytes | None:
        subject = subjects.tick_subject(tick, stage)
        data = await (self.bus.wait_for(subject, self.deadline_s) if wait
                      else self.bus.get_last(subject))
        if data is None and wait:
            raise StageMissing(f"no {stage} for tick {tick} within {self.deadline_s:g} s")
        return data

    async def _decoded(self, tick: int, stage: str, decode: Callable[[bytes], Any],
                       wait: bool = True) -> Any:
        key = (tick, stage)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        data = await self.raw(tick, stage, wait=wait)
        if data is None:
            return None
        value = decode(data)
        self._cache[key] = value
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return value

    async def snapshot(self, tick: int, *, wait: bool = True):
        return await self._decoded(tick, "snapshot", planning.decode_snapshot, wait)

    async def causal(self, tick: int):
        """(beliefs, calibrator, tick) after learning tick ``tick``."""
        return await self._decoded(tick, "causal", planning.decode_causal_state)

    async def candidates(self, tick: int):
        """(tick, causal version, proposals)."""
        return await self._decoded(tick, "candidates", planning.decode_candidates)
