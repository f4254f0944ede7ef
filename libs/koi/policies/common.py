"""Helpers every placement policy needs: fitting configs, job state, GPU accounting.

The baselines and Koi's own planner share these so that "does the model fit", "which
jobs need a deployment" and "how many GPUs are still free this tick" mean the same
thing everywhere. Pure functions over ``koi.cluster`` types plus one small mutable
ledger that a policy creates afresh each tick. No policy decisions (ordering, sizing,
choice of accelerator) live here, and nothing here reads clocks or randomness.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from koi.catalog import Catalog, CatalogError, Market, Offering
from koi.cluster import Action, ActionKind, ClusterSnapshot, Deployment, DeploymentState, JobStatus
from koi.jobs import BatchJob, OnlineJob
from koi.space import DeploymentConfig, engine_default_config, validate

TP_LADDER: tuple[int, ...] = (1, 2, 4, 8)
"""Tensor-parallel degrees the baselines consider (single node, powers of two)."""

PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
"""Weight precisions the offline searches consider; validation drops fp8 where unsupported."""

_CONFIG_CACHE: weakref.WeakKeyDictionary[Catalog, dict[tuple, DeploymentConfig | None]] = (
    weakref.WeakKeyDictionary())


# --- configurations ---------------------------------------------------------------------

def default_config(model: str, accelerator: str, catalog: Catalog, *, tp: int,
                   precision: str = "bf16", engine: str = "vllm") -> DeploymentConfig | None:
    """The engine-default config at this TP and precision, or None if it does not validate.

    Cached per catalog: validation is pure, and the baselines ask the same question for
    every job of a model on every tick.
    """
    cache = _CONFIG_CACHE.setdefault(catalog, {})
    key = (model, accelerator, tp, precision, engine)
    if key not in cache:
        cfg = engine_default_config(model, accelerator, engine, catalog=catalog, tp=tp,
                                    weight_precision=precision)
        cache[key] = None if validate(cfg, catalog) else cfg
    return cache[key]


def smallest_fitting_config(model: str, accelerator: str, catalog: Catalog, *,
                            precision: str = "bf16",
                            engine: str = "vllm") -> DeploymentConfig | None:
    """The engine-default config at the smallest TP in ``TP_LADDER`` that validates."""
    for tp in TP_LADDER:
        cfg = default_config(model, accelerator, catalog, tp=tp, precision=precision,
                             engine=engine)
        if cfg is not None:
            return cfg
    return None


def valid_default_configs(model: str, accelerator: str, catalog: Catalog, *,
                          tps: Sequence[int] = TP_LADDER,
                          precisions: Sequence[str] = PRECISIONS,
                          engine: str = "vllm") -> list[DeploymentConfig]:
    """Every engine-default config over ``tps`` × ``precisions`` that validates."""
    out = []
    for tp in tps:
        for precision in precisions:
            cfg = default_config(model, accelerator, catalog, tp=tp, precision=precision,
                                 engine=engine)
            if cfg is not None:
                out.append(cfg)
    return out


def shape_label(cfg: DeploymentConfig) -> str:
    """"h100-sxm tp2 fp8" for reasons, with the engine named when it is not vLLM (the
    default, and the only engine the predictor-profiled baselines consider)."""
    engine = "" if cfg.engine == "vllm" else f" {cfg.engine}"
    return f"{cfg.accelerator} tp{cfg.tp} {cfg.weight_precision}{engine}"


def cheapest_on_demand(accelerator: str, catalog: Catalog) -> Offering | None:
    """The catalog's cheapest on-demand offering of an accelerator (None if none sells it)."""
    offers = catalog.offerings_for(accelerator_id=accelerator, market=Market.ON_DEMAND)
    return offers[0] if offers else None


# --- jobs and deployments ---------------------------------------------------------------

def live_deployments(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    """The job's deployments that hold or will hold GPUs (anything but stopped)."""
    return [d for d in snapshot.deployments_of(job_id) if d.state != DeploymentState.STOPPED]


def is_lost(dep: Deployment) -> bool:
    """A starting/running deployment with no replica left (preempted or stocked out)."""
    active = dep.state in (DeploymentState.STARTING, DeploymentState.RUNNING)
    return active and dep.replicas_ready + dep.replicas_starting == 0


def batch_done(job: JobStatus) -> bool:
    """A batch job all of whose requests have finished (``JobStatus.requests_done``).

    Not "its output tokens reached the spec's total": that total is the expected one
    (requests × mean output length), and the sampled outputs land a few percent either
    side of it. Below it, a job judged by tokens never finished and kept its replicas
    idle after its last request (hetero-12h seed 4: 680-2,000 GPU-hours; NOTES); above
    it, requests were left unserved.
    """
    spec = job.spec
    return isinstance(spec, BatchJob) and job.requests_done >= spec.num_requests - 1e-6


def batch_tokens_left(job: JobStatus) -> float:
    """Output tokens a batch job still has to produce, expected: its unfinished requests
    × the mean output length (0 when done, and for online jobs)."""
    spec = job.spec
    if not isinstance(spec, BatchJob):
        return 0.0
    return max(spec.num_requests - job.requests_done, 0.0) * spec.output_len.mean_value()


def online_ended(job: JobStatus, now_s: float) -> bool:
    """An online job past its ``end_s``: no more requests will arrive."""
    spec = job.spec
    return isinstance(spec, OnlineJob) and spec.end_s is not None and now_s >= spec.end_s


def job_finished(job: JobStatus, now_s: float) -> bool:
    return batch_done(job) or online_ended(job, now_s)


def job_rate_rps(job: JobStatus) -> float:
    """The declared mean request rate of an online job (0 for batch)."""
    spec = job.spec
    return spec.arrival.mean_rate() if isinstance(spec, OnlineJob) else 0.0


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
