"""The non-learning baselines Koi is compared with: FCFS/EDF first-fit and best-fixed.

Deliberately naive practitioner policies, as in the preprint's tables:

- ``fcfs-first-fit`` — pending jobs in submission order; each goes to the first offering
  (snapshot capacity order) with room for one replica of the smallest-TP bf16 vLLM-default
  config of its model on that offering's accelerator. Online replicas: one per
  ``RPS_PER_REPLICA`` req/s of the declared mean rate (at least 1); batch: as many as
  fit, up to ``MAX_BATCH_REPLICAS``. Fewer replicas are launched when fewer fit. Nothing
  fits → DEFER ("no capacity"). No head-of-line blocking: a job that does not fit does not
  stop later jobs from being placed. Never swaps or rescales; a deployment that lost every
  replica (preemption, stock-out) is stopped and the job placed again by the same rule.
  Finished batch jobs (and online jobs past ``end_s``) have their deployments stopped.
  Ignores SLOs and prices.
- ``edf-first-fit`` — the same placement, jobs ordered earliest deadline first: a batch
  job's deadline is ``submit_s + deadline_s``; an online job's is ``submit_s +
  ONLINE_DEADLINE_S``, so a service goes ahead of batch work due later than a minute
  after the service arrived. Ties fall back to submission order.
- ``best-fixed`` — one configuration per model chosen once, offline, with the predictor
  (see ``BestFixed``), then applied to every job of that model, FCFS.

Pure decision code: state lives on the policy object, no clocks, no randomness, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from koi.catalog import Catalog, Offering
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    DeploymentTelemetry,
    JobStatus,
    PlanDecision,
)
from koi.jobs import OnlineJob
from koi.lifecycle import job_rate_rps
from koi.policies.base import Policy, register
from koi.policies.bookkeeping import (
    CapacityLedger,
    housekeeping_stops,
    needs_placement,
    replicas_for_rate,
    submit_order,
)
from koi.predictor.api import predict_many
from koi.predictor.types import LoadMode, Workload
from koi.shapes import shape_label, smallest_fitting_config, valid_default_configs
from koi.space import DeploymentConfig

RPS_PER_REPLICA = 4.0
"""First-fit's rule of thumb: one replica per 4 req/s of declared load, whatever the model."""

MAX_BATCH_REPLICAS = 8
"""Batch deployments take as many replicas as fit, up to this many."""

ONLINE_DEADLINE_S = 60.0
"""EDF's deadline for an online job: submit_s + this (services are urgent)."""

PREDICTOR_BACKEND = "numpy"
"""Best-fixed scores ~100 candidates once per model: the numpy reference is milliseconds
and avoids the numba compile."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and how one job is launched: the config (offering and replicas set)."""

    config: DeploymentConfig
    offering: Offering

    @property
    def gpus(self) -> int:
        return self.config.gpus_per_replica * self.config.replicas


class _FirstFitBase(Policy):
    """Shared tick loop: stop finished/lost deployments, then place pending jobs in order."""

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self._launches = 0

    # --- hooks ---------------------------------------------------------------------------

    def order(self, jobs: list[JobStatus]) -> list[JobStatus]:
        return submit_order(jobs)

    def place(self, job: JobStatus, ledger: CapacityLedger,
              snapshot: ClusterSnapshot) -> Placement | None:
        """First offering in capacity order that fits one replica of the default config."""
        for offering in ledger.offerings():
            cfg = smallest_fitting_config(job.spec.model, offering.accelerator, self.catalog)
            if cfg is None:
                continue
            replicas = ledger.max_replicas(offering.id, cfg.gpus_per_replica,
                                           self.wanted_replicas(job, cfg))
            if replicas >= 1:
                return Placement(cfg.with_(offering=offering.id, replicas=replicas), offering)
        return None

    def wanted_replicas(self, job: JobStatus, cfg: DeploymentConfig) -> int:
        if isinstance(job.spec, OnlineJob):
            return replicas_for_rate(job_rate_rps(job), RPS_PER_REPLICA)
        return MAX_BATCH_REPLICAS

    def launch_reason(self, job: JobStatus, placement: Placement) -> str:
        cfg = placement.config
        return (f"{self.name}: first offering with room for {cfg.model} on"
                f" {cfg.accelerator} tp{cfg.tp} {cfg.weight_precision}"
                f" × {cfg.replicas} ({self._sizing(job)})")

    def no_capacity_reason(self, job: JobStatus) -> str:
        return "no capacity"

    # --- the tick ------------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        actions: list[Action] = []
        for job in snapshot.jobs:
            actions.extend(housekeeping_stops(job, snapshot))
        ledger = CapacityLedger(snapshot, self.catalog)
        return self.place_pending(snapshot, ledger, actions)

    def place_pending(self, snapshot: ClusterSnapshot, ledger: CapacityLedger,
                      actions: list[Action]) -> PlanDecision:
        """LAUNCH every job that needs a deployment (in this policy's order), or DEFER it."""
        pending = [j for j in snapshot.jobs if needs_placement(j, snapshot)]
        for job in self.order(pending):
            placement = self.place(job, ledger, snapshot)
            if placement is None:
                actions.append(Action(ActionKind.DEFER, job.id, self.no_capacity_reason(job)))
                continue
            ledger.take(placement.offering.id, placement.gpus)
            self._launches += 1
            actions.append(Action(
                ActionKind.LAUNCH, job.id, self.launch_reason(job, placement),
                deployment_id=f"{job.id}.{self.name}.{self._launches}",
                config=placement.config, offering=placement.offering.id,
                replicas=placement.config.replicas))
        return PlanDecision(tick=snapshot.tick, actions=tuple(actions),
                            notes={"policy": self.name, "pending": str(len(pending))})

    @staticmethod
    def _sizing(job: JobStatus) -> str:
        if isinstance(job.spec, OnlineJob):
            return (f"1 replica per {RPS_PER_REPLICA:g} req/s of {job_rate_rps(job):.3g}"
                    " req/s declared")
        return f"batch: as many replicas as fit, up to {MAX_BATCH_REPLICAS}"


@register("fcfs-first-fit")
class FcfsFirstFit(_FirstFitBase):
    """Jobs in submission order, each on the first offering with room (see module doc)."""


def edf_deadline_s(job: JobStatus) -> float:
    """EDF's deadline: the batch due time, or submit + ``ONLINE_DEADLINE_S`` for online."""
    spec = job.spec
    if isinstance(spec, OnlineJob):
        return spec.submit_s + ONLINE_DEADLINE_S
    return spec.due_s


@register("edf-first-fit")
class EdfFirstFit(_FirstFitBase):
    """Earliest deadline first, same first-fit placement as FCFS (see module doc)."""

    def order(self, jobs: list[JobStatus]) -> list[JobStatus]:
        return sorted(submit_order(jobs), key=edf_deadline_s)


@dataclass(frozen=True, slots=True)
class FixedChoice:
    """best-fixed's offline choice for one model."""

    config: DeploymentConfig         # offering '' and replicas 1: the per-replica shape
    rps_per_replica: float           # predicted max rate under the SLO (or saturated rate)
    goodput_per_usd_hour: float      # output tok/s meeting the SLO per $/hour
    usd_per_hour: float              # one replica at the reference offering's price
    basis: str                       # what was optimised, for reasons


@register("best-fixed")
class BestFixed(_FirstFitBase):
    """One predictor-chosen config per model, applied to all its jobs.

    The first tick on which a model appears, its representative workload is built from
    that model's jobs in the snapshot: mean input and output lengths over the jobs, the
    mean of the online jobs' declared rates, and the *tightest* TTFT and TPOT SLO among
    them (so the chosen shape serves every job of the model). Candidates: every
    accelerator in the snapshot's capacity with an offering large enough for one replica,
    × TP in (1, 2, 4, 8) × bf16/fp8, vLLM defaults, that validate. Each is scored by
    predicted goodput per dollar = min(rate, max_rate_under_slo) × output length ÷
    (cheapest snapshot price of that accelerator × GPUs per replica); models with only
    batch jobs, or whose SLO no candidate can meet, use saturated output tok/s per dollar
    instead. Ties break by fewer GPUs then catalog order. The choice is kept for the rest
    of the run (later jobs of the model do not change it); only a model for which nothing
    in the fleet fitted is searched again on the next tick.

    Placement: the cheapest offering of that accelerator with room for one replica
    (falling back to dearer markets and clouds of the same part), replicas =
    ceil(job rate ÷ predicted max rate under the SLO) for online jobs (as many as fit if
    fewer), as many as fit up to ``MAX_BATCH_REPLICAS`` for batch. Never another part.
    """

    engines: ClassVar[tuple[str, ...]] = ("vllm",)

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog=catalog, seed=seed)
        self.choices: dict[str, FixedChoice | None] = {}
        self.rates: FixedRates | None = None   # None: the predictor's (``PredictedRates``)

    def choice_for(self, model: str, snapshot: ClusterSnapshot) -> FixedChoice | None:
        if self.choices.get(model) is None:  # nothing fitted yet: the fleet may have grown
            jobs = [j for j in snapshot.jobs if j.spec.model == model]
            self.choices[model] = choose_fixed_config(model, jobs, snapshot, self.catalog,
                                                      engines=self.engines, rates=self.rates)
        return self.choices[model]

    def place(self, job: JobStatus, ledger: CapacityLedger,
              snapshot: ClusterSnapshot) -> Placement | None:
        choice = self.choice_for(job.spec.model, snapshot)
        if choice is None:
            return None
        cfg = choice.config
        offers = sorted(ledger.offerings(cfg.accelerator), key=lambda o: o.usd_per_gpu_hour)
        want = (replicas_for_rate(job_rate_rps(job), choice.rps_per_replica)
                if job.is_online else MAX_BATCH_REPLICAS)
        for offering in offers:
            replicas = ledger.max_replicas(offering.id, cfg.gpus_per_replica, want)
            if replicas >= 1:
                return Placement(cfg.with_(offering=offering.id, replicas=replicas), offering)
        return None

    def launch_reason(self, job: JobStatus, placement: Placement) -> str:
        cfg = placement.config
        choice = self.choices[job.spec.model]
        assert choice is not None
        sizing = (f"{choice.rps_per_replica:.3g} req/s per replica for"
                  f" {job_rate_rps(job):.3g} req/s" if job.is_online
                  else f"batch: as many replicas as fit, up to {MAX_BATCH_REPLICAS}")
        return (f"best-fixed: {cfg.model} always on {shape_label(cfg)}"
                f" ({choice.basis}: {choice.goodput_per_usd_hour:.4g}"
                f" tok/s per $/h); cheapest offering with room; × {cfg.replicas} ({sizing})")

    def no_capacity_reason(self, job: JobStatus) -> str:
        choice = self.choices.get(job.spec.model)
        if choice is None:
            return f"no capacity: no configuration of {job.spec.model} fits this fleet"
        cfg = choice.config
        return f"no capacity: no free {cfg.accelerator} for tp{cfg.tp}"


def _representative_workload(jobs: list[JobStatus]) -> tuple[Workload, float, bool]:
    """(workload, rate, has_slo) built from one model's jobs, as ``BestFixed`` documents."""
    ins = [j.spec.input_len.mean_value() for j in jobs]
    outs = [j.spec.output_len.mean_value() for j in jobs]
    in_len, out_len = max(1.0, sum(ins) / len(ins)), max(1.0, sum(outs) / len(outs))
    online = [j.spec for j in jobs if isinstance(j.spec, OnlineJob)]
    if not online:
        return Workload(in_len, out_len, mode=LoadMode.SATURATED), 0.0, False
    rate = sum(s.arrival.mean_rate() for s in online) / len(online)
    return Workload(in_len, out_len, mode=LoadMode.RATE, load=rate,
                    slo_ttft_ms=min(s.slo.ttft_ms for s in online),
                    slo_tpot_ms=min(s.slo.tpot_ms for s in online)), rate, True


FixedRates = Callable[[list[DeploymentConfig], Workload, bool], list[tuple[float, float, float]]]
"""best-fixed's numbers per candidate: (saturated output tok/s, saturated req/s, max req/s
under the workload's SLO, 0 when it has none), given the candidates, the representative
workload and whether it has an SLO."""


@dataclass(frozen=True, slots=True)
class PredictedRates:
    """``FixedRates`` from the predictor (two batched ``predict_many`` calls)."""

    catalog: Catalog

    def __call__(self, candidates: list[DeploymentConfig], workload: Workload,
                 has_slo: bool) -> list[tuple[float, float, float]]:
        saturated = Workload(workload.input_len, workload.output_len, mode=LoadMode.SATURATED)
        sat = predict_many([(c, saturated) for c in candidates], catalog=self.catalog,
                           backend=PREDICTOR_BACKEND, validate=False)
        slo = (predict_many([(c, workload) for c in candidates], catalog=self.catalog,
                            backend=PREDICTOR_BACKEND, validate=False) if has_slo else sat)
        return [(s.output_throughput_tok_s, s.request_rate_rps,
                 q.max_rate_under_slo_rps if has_slo else 0.0)
                for s, q in zip(sat, slo, strict=True)]


def choose_fixed_config(model: str, jobs: list[JobStatus], snapshot: ClusterSnapshot,
                        catalog: Catalog, *, engines: Sequence[str] = ("vllm",),
                        rates: FixedRates | None = None) -> FixedChoice | None:
    """best-fixed's offline search for one model (see ``BestFixed``); None if nothing fits.

    ``engines`` widens the candidates (vLLM defaults only for best-fixed itself);
    ``rates`` replaces the predictor's numbers (a profile measured in the world).
    """
    if not jobs:
        return None
    prices: dict[str, float] = {}
    largest: dict[str, int] = {}
    for cap in snapshot.capacity:
        if cap.offering not in catalog.offerings:
            continue
        off = catalog.offering(cap.offering)
        prices[off.accelerator] = min(prices.get(off.accelerator, math.inf), off.usd_per_gpu_hour)
        largest[off.accelerator] = max(largest.get(off.accelerator, 0), cap.total_gpus)
    candidates = [cfg for accel in sorted(prices) for engine in engines
                  for cfg in valid_default_configs(model, accel, catalog, engine=engine)
                  if cfg.gpus_per_replica <= largest[accel]]
    if not candidates:
        return None
    workload, rate, has_slo = _representative_workload(jobs)
    measured = (rates or PredictedRates(catalog))(candidates, workload, has_slo)
    rows = []
    for cfg, (tput, sat_rps, max_rps) in zip(candidates, measured, strict=True):
        usd_h = prices[cfg.accelerator] * cfg.gpus_per_replica
        good = min(rate, max_rps) * workload.output_len if has_slo else 0.0
        rows.append((cfg, usd_h, good, tput, sat_rps, max_rps))
    use_slo = has_slo and any(r[2] > 0 for r in rows)
    basis = "goodput under the SLO per $" if use_slo else "saturated throughput per $"

    def score(row: tuple) -> tuple[float, int]:
        cfg, usd_h, good, tput = row[0], row[1], row[2], row[3]
        value = (good if use_slo else tput) / usd_h if usd_h > 0 else 0.0
        return (-value, cfg.gpus_per_replica)

    best = min(rows, key=score)  # min() keeps the first of equals: catalog order
    cfg, usd_h, good, tput, sat_rps, max_rps = best
    value = (good if use_slo else tput) / usd_h if usd_h > 0 else 0.0
    return FixedChoice(config=cfg, rps_per_replica=max_rps if use_slo else sat_rps,
                       goodput_per_usd_hour=value, usd_per_hour=usd_h, basis=basis)
