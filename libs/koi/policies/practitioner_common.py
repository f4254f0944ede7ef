"""What the practitioner policies (bandit, evolve, melange-ilp, regress-autoscale) share.

Per-job demand (online req/s, batch tok/s to finish by the deadline), per-job "profiles"
over candidate replica shapes (predicted: one batched ``predict_many`` for all shapes not
yet profiled; or measured in the world, ``koi.policies.profiled``; cached on the book),
the finished/lost housekeeping stops, and
``reconcile``: turning one job's target deployments into LAUNCH/SCALE/SWAP/DRAIN actions
against a ``CapacityLedger`` so that no tick over-commits GPUs. No choice of *what* to
run lives here (that is each policy's business), and nothing reads clocks or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from koi.catalog import Catalog, Market, Offering
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
)
from koi.jobs import BatchJob, OnlineJob
from koi.lifecycle import batch_tokens_left, is_lost, job_finished, job_rate_rps, live_deployments
from koi.policies.common import CapacityLedger, housekeeping_stops  # noqa: F401 - re-exported
from koi.predictor.api import predict_many
from koi.predictor.types import LoadMode, Workload
from koi.shapes import shape_label, valid_default_configs
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


# --- housekeeping ---------------------------------------------------------------------------

def active_jobs(snapshot: ClusterSnapshot) -> list[JobStatus]:
    """Jobs that should be served this tick: submitted, not rejected, not finished."""
    return [j for j in snapshot.jobs
            if not j.rejected and not job_finished(j, snapshot.time_s)]


def serving_deployments(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    """The job's live deployments that still hold a replica and are not draining."""
    return [d for d in live_deployments(snapshot, job_id)
            if not is_lost(d) and d.state != DeploymentState.DRAINING]


# --- reconciling one job's target with what runs ----------------------------------------

@dataclass(frozen=True, slots=True)
class Target:
    """One deployment a policy wants for a job: shape, offering, replicas and why."""

    shape: DeploymentConfig
    offering: str
    replicas: int
    reason: str


@dataclass(slots=True)
class Budget:
    """Swaps left this tick (make-before-break moves are the expensive kind)."""

    swaps: int


def offers_for(ledger: CapacityLedger, accelerator: str, preferred: str) -> list[Offering]:
    """The preferred offering first, then that accelerator's others, cheapest first."""
    offers = sorted(ledger.known_offerings(), key=lambda o: (o.id != preferred,
                                                              o.usd_per_gpu_hour,
                                                              o.market != Market.ON_DEMAND))
    return [o for o in offers if o.accelerator == accelerator]


def reconcile(job: JobStatus, targets: Sequence[Target], snapshot: ClusterSnapshot,
              ledger: CapacityLedger, budget: Budget, tag: str) -> list[Action]:
    """Actions that move the job's deployments towards ``targets``, within the ledger.

    A target matched by (shape, offering) to a serving deployment is a SCALE (growth
    shrunk to what is free). One target against one different deployment is a SWAP,
    make-before-break, if the budget and the ledger allow it. Other unmatched targets are
    LAUNCHed (on the preferred offering, else the same part's cheapest with room, fewer
    replicas if fewer fit); unmatched deployments are DRAINed once every target is served.
    A job mid-swap (more than one deployment while one target is wanted) is left alone.
    """
    deps = serving_deployments(snapshot, job.id)
    if len(targets) == 1 and len(deps) > 1:
        return []  # a swap is in flight: let it finish
    matched: dict[str, Target] = {}
    unmatched: list[Target] = []
    for t in targets:
        dep = next((d for d in deps if d.id not in matched and d.offering == t.offering
                    and shape_key(d.config) == shape_key(t.shape)), None)
        if dep is None:
            unmatched.append(t)
        else:
            matched[dep.id] = t
    leftovers = [d for d in deps if d.id not in matched]
    actions = [a for d in deps if d.id in matched
               if (a := _scale(job, d, matched[d.id], ledger)) is not None]
    if len(unmatched) == 1 and len(leftovers) == 1 and len(targets) == 1:
        swap = _swap(job, leftovers[0], unmatched[0], ledger, budget)
        return actions + ([swap] if swap is not None else [])
    launched_all = True
    for t in unmatched:
        launch = _launch(job, t, ledger, tag)
        launched_all &= launch is not None
        if launch is not None:
            actions.append(launch)
    if not unmatched and all(d.state == DeploymentState.RUNNING for d in deps
                             if d.id in matched):
        actions += [Action(ActionKind.DRAIN, job.id, f"{tag}: no longer in the plan",
                           deployment_id=d.id) for d in leftovers]
    if not targets and not deps:
        actions.append(Action(ActionKind.DEFER, job.id, f"{tag}: no capacity in the plan"))
    elif unmatched and not launched_all and not deps:
        actions.append(Action(ActionKind.DEFER, job.id, f"{tag}: no capacity for its target"))
    return actions


def _scale(job: JobStatus, dep: Deployment, t: Target, ledger: CapacityLedger) -> Action | None:
    current = dep.config.replicas
    want = t.replicas
    if want > current:
        want = current + ledger.max_replicas(dep.offering, dep.config.gpus_per_replica,
                                             want - current)
        ledger.take(dep.offering, (want - current) * dep.config.gpus_per_replica)
    if want == current or want < 1:
        return None
    return Action(ActionKind.SCALE, job.id, f"{t.reason}; {current} → {want} replicas",
                  deployment_id=dep.id, replicas=want)


def _swap(job: JobStatus, dep: Deployment, t: Target, ledger: CapacityLedger,
          budget: Budget) -> Action | None:
    if budget.swaps <= 0:
        return None
    gpus = t.shape.gpus_per_replica
    n = ledger.max_replicas(t.offering, gpus, t.replicas)
    if n < max(1, math.ceil(t.replicas / 2)):
        return None  # not enough room to move without gutting the service
    ledger.take(t.offering, n * gpus)
    budget.swaps -= 1
    cfg = t.shape.with_(offering=t.offering, replicas=n)
    return Action(ActionKind.SWAP, job.id, f"{t.reason}; swap from {shape_label(dep.config)}"
                  f" on {dep.offering}",
                  deployment_id=dep.id, config=cfg, offering=t.offering, replicas=n)


def _launch(job: JobStatus, t: Target, ledger: CapacityLedger, tag: str) -> Action | None:
    gpus = t.shape.gpus_per_replica
    for off in offers_for(ledger, t.shape.accelerator, t.offering):
        n = ledger.max_replicas(off.id, gpus, t.replicas)
        if n >= 1:
            ledger.take(off.id, n * gpus)
            cfg = t.shape.with_(offering=off.id, replicas=n)
            where = "" if off.id == t.offering else f" (wanted {t.offering}, full)"
            return Action(ActionKind.LAUNCH, job.id, f"{t.reason}; × {n} on {off.id}{where}",
                          deployment_id=f"{job.id}.{tag}", config=cfg, offering=off.id,
                          replicas=n)
    return None
