"""What N machines would give a stage that fans a tick's work out to its replicas
(``koi bench bus --proposers``): a model fitted on one measured bus run.

A tick of the proposer, as its logs tell it, is three parts:

* ``before_s`` — the coordinator's own work before it sends the items (read the tick's
  snapshot and causal state, cut the jobs into items);
* the items, each timed on the replica that ran it (``item_s``); a replica runs its
  items one after another, so the items' part of the tick is the busiest replica's sum;
* the fan-in — what the stage's wall time holds beyond those two: requests and answers
  over NATS, waiting for the last answer, the join.

With N machines, one replica on each::

    stage(N) = before_s + makespan(item_s over N) + fan_in_s

The makespan is greedy list scheduling, longest item first, each to the least loaded
machine (within 4/3 of the best split). The fan-in is taken as measured, the same for
every N (the coordinator sends and joins as many items whatever N is). For the run it
was measured on, with one replica, the model gives back the measured stage exactly.

It is optimistic in two ways: a NATS queue group hands each item to a member at
random, not to the least loaded one, and it leaves out what N machines would add
(each reads the tick's inputs back from the stream once). It is pessimistic in one: on
a shared machine the measured items are slowed by the other services.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MACHINES = (1, 2, 4, 8)


def makespan(item_s: Iterable[float], machines: int) -> float:
    """Seconds until the last of ``item_s`` is done on ``machines`` workers, each item
    in turn (longest first) given to the worker that is free first."""
    loads = [0.0] * max(1, machines)
    for s in sorted(item_s, reverse=True):
        k = loads.index(min(loads))
        loads[k] += s
    return max(loads)


@dataclass(frozen=True)
class FanOutTick:
    """One tick of a fanned-out stage, from the coordinator's line and the items' lines."""

    tick: int
    stage_s: float             # the tick's message to the joined answers (coordinator)
    before_s: float            # the part of it before the items are sent
    item_s: tuple[float, ...]  # each item's seconds on the replica that ran it
    busy_s: tuple[float, ...]  # each replica's seconds on the tick's items

    @property
    def fan_in_s(self) -> float:
        return max(0.0, self.stage_s - self.before_s - max(self.busy_s, default=0.0))

    def predicted_s(self, machines: int) -> float:
        return self.before_s + makespan(self.item_s, machines) + self.fan_in_s


def predicted_stage_s(ticks: Sequence[FanOutTick], machines: Iterable[int] = MACHINES
                      ) -> dict[int, float]:
    """Machines → the median over ``ticks`` of the stage the model predicts."""
    return {n: statistics.median(t.predicted_s(n) for t in ticks) for n in machines
            if ticks}
