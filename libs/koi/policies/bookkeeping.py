"""What every baseline does each tick besides choosing: which jobs need a deployment, in
what order, how many replicas a rate needs, the GPUs still free, and the housekeeping
stops.

``CapacityLedger`` is the one small mutable object: a policy creates it afresh each
tick and debits it as it decides launches, so no tick over-commits GPUs. Job state
("finished", "lost") comes from ``koi.lifecycle`` and fitting shapes from
``koi.shapes``, which the planner and the metrics share. No policy decisions
(ordering beyond submit time, sizing, choice of accelerator) live here, and nothing
here reads clocks or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from koi.catalog import Catalog, CatalogError, Offering
from koi.cluster import Action, ActionKind, ClusterSnapshot, JobStatus
from koi.lifecycle import is_lost, job_finished, live_deployments


def needs_placement(job: JobStatus, snapshot: ClusterSnapshot) -> bool:
    """Not rejected, not finished, and no deployment with a replica left."""
    if job.rejected or job_finished(job, snapshot.time_s):
        return False
    return not any(not is_lost(d) for d in live_deployments(snapshot, job.id))


def submit_order(jobs: Iterable[JobStatus]) -> list[JobStatus]:
    """Jobs by submit time; ties keep the snapshot's order (a stable sort)."""
    return sorted(jobs, key=lambda j: j.spec.submit_s)


def replicas_for_rate(rate_rps: float, rps_per_replica: float, *, at_least: int = 1) -> int:
    """ceil(rate ÷ per-replica rate), at least ``at_least``; a zero capacity gives the floor."""
    if rps_per_replica <= 0 or not math.isfinite(rps_per_replica):
        return at_least
    return max(at_least, math.ceil(rate_rps / rps_per_replica - 1e-9))


# --- GPU accounting within one tick -----------------------------------------------------

@dataclass(slots=True)
class _Slot:
    offering: Offering
    free: int


class CapacityLedger:
    """Free GPUs per offering for one tick, debited as the policy decides launches.

    Starts from the snapshot's free GPUs of every offering the catalog knows, in the
    snapshot's capacity order. ``take`` refuses to over-commit, so two launches in one
    tick can never claim the same GPUs. GPUs that a STOP in the same tick will free are
    not credited: the cluster frees them when it applies the stop, and the next tick's
    snapshot shows them.
    """

    def __init__(self, snapshot: ClusterSnapshot, catalog: Catalog) -> None:
        self._slots: dict[str, _Slot] = {}
        for cap in snapshot.capacity:
            try:
                offering = catalog.offering(cap.offering)
            except CatalogError:
                continue  # an offering the catalog does not know cannot be configured
            self._slots[cap.offering] = _Slot(offering, cap.free_gpus)

    def free(self, offering: str) -> int:
        slot = self._slots.get(offering)
        return slot.free if slot else 0

    def offerings(self, accelerator: str | None = None) -> list[Offering]:
        """Offerings with any free GPU, in capacity order, optionally of one accelerator."""
        return [s.offering for s in self._slots.values()
                if s.free > 0 and (accelerator is None or s.offering.accelerator == accelerator)]

    def known_offerings(self) -> list[Offering]:
        """Every offering in the snapshot's capacity, free or not, in capacity order."""
        return [s.offering for s in self._slots.values()]

    def max_replicas(self, offering: str, gpus_per_replica: int, cap: int) -> int:
        """How many replicas of that size fit in what is left, at most ``cap``."""
        if gpus_per_replica <= 0:
            raise ValueError("gpus_per_replica must be positive")
        return max(0, min(cap, self.free(offering) // gpus_per_replica))

    def take(self, offering: str, gpus: int) -> None:
        slot = self._slots.get(offering)
        if slot is None or gpus < 0 or gpus > slot.free:
            raise ValueError(f"cannot take {gpus} GPUs from {offering}: {self.free(offering)}"
                             " free")
        slot.free -= gpus


def housekeeping_stops(job: JobStatus, snapshot: ClusterSnapshot) -> list[Action]:
    """STOP the deployments of a finished job, and any deployment that lost every replica."""
    finished = job_finished(job, snapshot.time_s)
    out = []
    for dep in live_deployments(snapshot, job.id):
        if finished:
            why = "batch job done" if job.is_batch else "online job ended"
        elif is_lost(dep):
            why = "all replicas lost (preemption or stock-out); placing the job again"
        else:
            continue
        out.append(Action(ActionKind.STOP, job.id, why, deployment_id=dep.id))
    return out
