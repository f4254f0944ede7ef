"""One WatchPlans subscriber's queue of plans, fed by the read model's thread and read
by a blocking iterator or, without holding a thread, by an asyncio reader woken through
``notify``.

No gRPC or NATS code here.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator

from koi.v1 import plan_pb2

_CLOSED = object()


class PlanWatch:
    """One WatchPlans subscriber: iterate for plans; the iteration ends on ``close``.

    Plans are queued as they arrive (up to ``max_queued``); a subscriber that falls
    further behind is closed with ``lagged`` set rather than letting memory grow.
    ``notify`` is called (on the feeding thread) after every push and on close, so an
    asyncio reader can ``drain`` without holding a thread.
    """

    def __init__(self, max_queued: int, notify: Callable[[], None] | None = None) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._max = max_queued
        self._closed = threading.Event()
        self._notify = notify
        self.lagged = False

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def push(self, plan: plan_pb2.ClusterPlan) -> None:
        if self.closed:
            return
        if self._queue.qsize() >= self._max:
            self.lagged = True
            self.close()
            return
        self._queue.put(plan)
        self._wake()

    def close(self) -> None:
        """End the iteration after the plans already queued (idempotent)."""
        if not self._closed.is_set():
            self._closed.set()
            self._queue.put(_CLOSED)
            self._wake()

    def _wake(self) -> None:
        if self._notify is not None:
            with contextlib.suppress(RuntimeError):  # the reader's loop is gone
                self._notify()

    def drain(self) -> tuple[list[plan_pb2.ClusterPlan], bool]:
        """(the plans queued now, whether the watch has ended after them); never blocks."""
        plans: list[plan_pb2.ClusterPlan] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return plans, False
            if item is _CLOSED:
                self._queue.put(_CLOSED)
                return plans, True
            assert isinstance(item, plan_pb2.ClusterPlan)
            plans.append(item)

    def get(self, timeout: float | None = None) -> plan_pb2.ClusterPlan | None:
        """The next plan; None when closed (or nothing came within ``timeout``)."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            self._queue.put(_CLOSED)  # keep later calls returning None
            return None
        assert isinstance(item, plan_pb2.ClusterPlan)
        return item

    def __iter__(self) -> Iterator[plan_pb2.ClusterPlan]:
        while (plan := self.get()) is not None:
            yield plan
