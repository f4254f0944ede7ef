"""What the practitioner policies (bandit, evolve, melange-ilp, regress-autoscale) know of
each job: its demand and the profiles of its candidate replica shapes.

Per-job demand (online req/s, batch tok/s to finish by the deadline) and per-job
"profiles" over candidate replica shapes (predicted: one batched ``predict_many`` for
all shapes not yet profiled; or measured in the world, ``koi.policies.profiled``; cached
on the book). Turning a policy's choice into actions is ``koi.policies.reconcile``. No
choice of *what* to run lives here (that is each policy's business), and nothing reads
clocks or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from koi.catalog import Catalog
from koi.cluster import (
    ClusterSnapshot,
    JobStatus,
)
from koi.jobs import BatchJob, OnlineJob
from koi.lifecycle import batch_tokens_left, job_rate_rps
from koi.predictor.api import predict_many
from koi.predictor.types import LoadMode, Workload
from koi.shapes import valid_default_configs
from koi.space import DeploymentConfig

PREDICTOR_BACKEND = "numpy"
"""Profiles are computed once per job: the numpy reference avoids the numba compile."""

BATCH_HEADROOM = 1.15
"""Batch jobs are sized for this multiple of the token rate their deadline requires."""

MIN_BATCH_WINDOW_S = 600.0
"""A batch job at or past its deadline is sized as if it had this long left."""


# --- demand -------------------------------------------------------------------------------

def online_demand_rps(job: JobStatus) -> float:
    """The larger of the declared mean rate and last tick's observed rate."""
    return max(job_rate_rps(job), job.observed_rate_rps)


def batch_demand_tok_s(job: JobStatus, now_s: float) -> float:
    """Output tok/s needed to finish the remaining tokens by the deadline (with headroom)."""
    spec = job.spec
    assert isinstance(spec, BatchJob)
    left = batch_tokens_left(job)
    window = max(spec.due_s - now_s, MIN_BATCH_WINDOW_S)
    return BATCH_HEADROOM * left / window


def demand(job: JobStatus, now_s: float) -> float:
    """Online: req/s; batch: output tok/s (the unit of the job's profile rate)."""
    return online_demand_rps(job) if job.is_online else batch_demand_tok_s(job, now_s)


def slo_of(job: JobStatus) -> tuple[float, float]:
    """(TTFT, TPOT) SLO in seconds; infinite for batch jobs."""
    spec = job.spec
    if isinstance(spec, OnlineJob):
        return spec.slo.ttft_ms / 1e3, spec.slo.tpot_ms / 1e3
    return math.inf, math.inf


def workload_of(job: JobStatus) -> Workload:
    """The job's per-deployment workload: the declared rate and SLO (saturated for batch)."""
    spec = job.spec
    inp, out = max(1.0, spec.input_len.mean_value()), max(1.0, spec.output_len.mean_value())
    if isinstance(spec, OnlineJob):
        return Workload(inp, out, mode=LoadMode.RATE, load=max(job_rate_rps(job), 1e-3),
                        slo_ttft_ms=spec.slo.ttft_ms, slo_tpot_ms=spec.slo.tpot_ms)
    return Workload(inp, out, mode=LoadMode.SATURATED)


# --- candidate shapes and their profiles ------------------------------------------------

def shape_key(cfg: DeploymentConfig) -> tuple[str, int, str, str]:
    """What identifies a replica shape for these policies: (accelerator, tp, precision,
    engine)."""
    return (cfg.accelerator, cfg.tp, str(cfg.weight_precision), cfg.engine)


def fleet_accelerators(snapshot: ClusterSnapshot, catalog: Catalog) -> dict[str, tuple[float, int]]:
    """accelerator → (cheapest $/GPU-hour, largest offering's total GPUs) in the snapshot."""
    return accelerator_summary(((c.offering, c.total_gpus) for c in snapshot.capacity), catalog)


def accelerator_summary(offerings: Iterable[tuple[str, int]],
                        catalog: Catalog) -> dict[str, tuple[float, int]]:
    """accelerator → (cheapest $/GPU-hour, largest GPU count) over (offering id, GPUs)
    pairs; offerings not in the catalog are skipped."""
    out: dict[str, tuple[float, int]] = {}
    for offering, gpus in offerings:
        if offering not in catalog.offerings:
            continue
        off = catalog.offering(offering)
        price, size = out.get(off.accelerator, (math.inf, 0))
        out[off.accelerator] = (min(price, off.usd_per_gpu_hour), max(size, gpus))
    return out


@dataclass(slots=True)
class Profile:
    """One job's candidate shapes (replicas 1, no offering) and per-replica numbers.

    ``rate`` is in the job's demand unit: max req/s under the SLO (online) or saturated
    output tok/s (batch). ``value`` = rate × output length ÷ $/hour at the cheapest price
    of the accelerator: goodput per dollar, for ranking.
    """

    shapes: list[DeploymentConfig]
    rate: np.ndarray
    tok_per_req: float
    usd_h: np.ndarray
    gpus: np.ndarray
    ttft_p95_s: np.ndarray
    tpot_p95_s: np.ndarray

    @property
    def value(self) -> np.ndarray:
        per = self.tok_per_req if self.tok_per_req > 0 else 1.0
        return self.rate * per / np.maximum(self.usd_h, 1e-9)

    def best(self, k: int) -> list[int]:
        """The ``k`` best-value shapes that can serve at all (fewer GPUs first on ties)."""
        order = sorted(range(len(self.shapes)), key=lambda i: (-self.value[i], self.gpus[i], i))
        return [i for i in order if self.rate[i] > 0][:k]


@dataclass(frozen=True, slots=True)
class PerShape:
    """One job's numbers per candidate shape, in ``Profile``'s units."""

    rate: list[float]
    ttft_p95_s: list[float]
    tpot_p95_s: list[float]


ProfileSource = Callable[[Sequence[tuple[JobStatus, list[DeploymentConfig]]]], list[PerShape]]
"""Where profiles come from: each (job, candidate shapes) → its ``PerShape``."""


@dataclass(frozen=True, slots=True)
class Predicted:
    """The predictor's profiles: one batched ``predict_many`` for every job asked at once
    (max rate under the SLO at the job's declared rate; batch: saturated tok/s)."""

    catalog: Catalog

    def __call__(self, todo: Sequence[tuple[JobStatus, list[DeploymentConfig]]]
                 ) -> list[PerShape]:
        pairs = [(c, workload_of(job)) for job, shapes in todo for c in shapes]
        preds = (predict_many(pairs, catalog=self.catalog, backend=PREDICTOR_BACKEND,
                              validate=False) if pairs else [])
        out, i = [], 0
        for job, shapes in todo:
            ps = preds[i:i + len(shapes)]
            i += len(shapes)
            out.append(PerShape(
                [p.max_rate_under_slo_rps if job.is_online else p.output_throughput_tok_s
                 for p in ps],
                [p.ttft_p95_ms / 1e3 for p in ps], [p.tpot_p95_ms / 1e3 for p in ps]))
        return out


def candidate_shapes(model: str, accels: dict[str, tuple[float, int]], catalog: Catalog,
                     tps: Sequence[int], engines: Sequence[str]) -> list[DeploymentConfig]:
    """Every engine-default config of the model on each accelerator (``fleet_accelerators``'
    form) that validates and fits its largest offering: accelerator, engine, TP, precision."""
    return [c for a in sorted(accels) for e in engines
            for c in valid_default_configs(model, a, catalog, tps=tps, engine=e)
            if c.gpus_per_replica <= accels[a][1]]


@dataclass(slots=True)
class ProfileBook:
    """Per-job profiles, computed once per job (and fleet), from ``source``: the
    predictor's (``Predicted``, the default) or one measured in the world."""

    catalog: Catalog
    tps: Sequence[int] = (1, 2, 4, 8)
    engines: Sequence[str] = ("vllm",)
    source: ProfileSource | None = None
    _book: dict[tuple[str, frozenset[str]], Profile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source is None:
            self.source = Predicted(self.catalog)

    def get(self, jobs: Sequence[JobStatus], snapshot: ClusterSnapshot) -> dict[str, Profile]:
        return self.profiles(jobs, fleet_accelerators(snapshot, self.catalog))

    def profiles(self, jobs: Sequence[JobStatus],
                 accels: dict[str, tuple[float, int]]) -> dict[str, Profile]:
        """The jobs' profiles on a fleet of ``accels`` (``fleet_accelerators``' form)."""
        fleet = frozenset(accels)
        todo = [(job, candidate_shapes(job.spec.model, accels, self.catalog, self.tps,
                                       self.engines))
                for job in jobs if (job.id, fleet) not in self._book]
        assert self.source is not None
        for (job, shapes), m in zip(todo, self.source(todo) if todo else [], strict=True):
            self._book[(job.id, fleet)] = Profile(
                shapes=shapes, rate=np.nan_to_num(np.array(m.rate, dtype=float)),
                tok_per_req=max(1.0, job.spec.output_len.mean_value()) if job.is_online else 1.0,
                usd_h=np.array([accels[c.accelerator][0] * c.gpus_per_replica for c in shapes]),
                gpus=np.array([c.gpus_per_replica for c in shapes], dtype=int),
                ttft_p95_s=np.array(m.ttft_p95_s, dtype=float),
                tpot_p95_s=np.array(m.tpot_p95_s, dtype=float))
        return {j.id: self._book[(j.id, fleet)] for j in jobs}
