"""Reading a tick's artefacts back from the tick stream, decoded once per process.

Each stage publishes its output on ``koi.tick.<n>.<stage>``; a later stage (or a worker
replica) reads the ones it needs with ``await ticks.snapshot(n)`` and so on, waiting up
to the stage deadline for one not yet published. The small LRU keeps the last few
ticks, so a tick's shards decode the snapshot and candidates once. ``prefetch`` decodes
artefacts as they are published, so that a replica's first work item of a tick finds
them ready instead of reading the stream. ``subject_tick`` and ``clock_tick`` say which
tick a subject names and which tick the stream is at.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from nats.js.errors import NotFoundError

from koi import subjects
from koi.v1 import causal_pb2
from koi.wire import codec, planning
from services.runtime.bus import Bus


def subject_tick(subject: str) -> int | None:
    """The tick a subject names, or None unless its tick token is a plain decimal
    (``int`` would also take ``+3``, ``03`` or ``٣``: other subjects for the same tick)."""
    try:
        tick = subjects.tick_of(subject)
    except ValueError:
        return None
    return tick if subject.split(".")[2] == str(tick) else None


async def clock_tick(bus: Bus) -> int | None:
    """The tick of the latest snapshot on the tick stream (None: no snapshot yet)."""
    try:
        last = await bus.js.get_last_msg(subjects.STREAM_TICKS,
                                         subjects.tick_filter("snapshot"))
    except NotFoundError:
        return None
    return subject_tick(last.subject or "")


def _mechanisms_view(data: bytes):
    """(belief version, active mechanisms) off a causal message's readable list (no
    belief store to decode)."""
    msg = codec.decode(data, causal_pb2.CausalState)
    return msg.version, planning.mechanisms_from_proto(msg)


# what a reader decodes: name → (the stage whose message it is read from, the decoder)
VIEWS: dict[str, tuple[str, Callable[[bytes], Any]]] = {
    "snapshot": ("snapshot", planning.decode_snapshot),
    "observations": ("observations", planning.decode_observations),
    "causal": ("causal", planning.decode_causal_state),
    "causal-mechanisms": ("causal", _mechanisms_view),
    "candidates": ("candidates", planning.decode_candidates),
}


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

    async def _decoded(self, tick: int, name: str, wait: bool = True) -> Any:
        key = (tick, name)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        stage, decode = VIEWS[name]
        data = await self.raw(tick, stage, wait=wait)
        if data is None:
            return None
        value = decode(data)
        self._cache[key] = value
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return value

    def cached(self, tick: int, name: str) -> Any:
        """What ``put`` holds for (tick, name), or None."""
        return self._cache.get((tick, name))

    def put(self, tick: int, name: str, value: Any) -> None:
        """Hold an artefact this process decoded itself (its own work items hit it)."""
        self._cache[(tick, name)] = value
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)

    async def snapshot(self, tick: int, *, wait: bool = True):
        return await self._decoded(tick, "snapshot", wait)

    async def observations(self, tick: int):
        """(tick, observations) telemetry-ingest published for tick ``tick``."""
        return await self._decoded(tick, "observations")

    async def causal(self, tick: int):
        """(beliefs, calibrator, tick) after learning tick ``tick``."""
        return await self._decoded(tick, "causal")

    async def mechanisms(self, tick: int):
        """(belief version, active mechanisms) after learning tick ``tick``, read off the
        message's readable list (no belief store to decode)."""
        return await self._decoded(tick, "causal-mechanisms")

    async def candidates(self, tick: int):
        """(tick, causal version, proposals)."""
        return await self._decoded(tick, "candidates")

    async def prefetch(self, names: Iterable[str], log: Any) -> list:
        """Decode each of ``names`` (``VIEWS``) as its tick's message is published, and
        hold it; the subscriptions, for the caller to unsubscribe. A message that does
        not decode is left for the reader (which dead-letters it) and logged at debug."""
        by_stage: dict[str, list[str]] = {}
        for name in names:
            by_stage.setdefault(VIEWS[name][0], []).append(name)

        async def decode(msg) -> None:
            try:
                tick = subjects.tick_of(msg.subject)
                data = await self.bus.resolve(msg)  # may be a blob
                for name in by_stage[msg.subject.rsplit(".", 1)[1]]:
                    self.put(tick, name, VIEWS[name][1](data))
            except Exception as exc:
                log.debug("prefetch_skipped", subject=msg.subject, error=repr(exc))

        return [await self.bus.nc.subscribe(subjects.tick_filter(stage), cb=decode)
                for stage in by_stage]
