"""From jobs and evaluated proposals to the composer's inputs.

* ``job_loads`` — what each job asks of a deployment this tick (observed rate with
  headroom, mean lengths, p95 SLOs; batch: its lengths);
* ``scored_candidates`` — every evaluated configuration priced on every offering of its
  accelerator (structure of arrays), with preemption exposure, whether it is the job's
  running deployment and what moving to it would cost;
* ``job_demands`` — each job's demand and value for the composer.

Pure functions; no prediction (that is the evaluator's), no solving.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TypedDict

import numpy as np

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentState, JobStatus
from koi.compose import CandidateTable, JobDemand
from koi.jobs import BatchJob, OnlineJob
from koi.lifecycle import batch_tokens_left, job_finished
from koi.planner.evaluate import Evaluated, JobLoad
from koi.planner.place import in_place, reshardable
from koi.planner.settings import Measured
from koi.space import DeploymentConfig

# a replica lost to a spot reclaim costs about this long before its successor serves
RECLAIM_LOSS_H = 0.15
MAX_REPLICAS = 64
VALUE_PER_TOK = 1e-4  # objective units ($) per served token at priority 5

# measured per-replica rates replacing the predicted ones (the oracle's; settings.Measured)
Measure = Callable[[Evaluated, ClusterSnapshot], Measured]


class _DemandFields(TypedDict):
    """The ``JobDemand`` fields ``job_demands`` sets alike for online and batch jobs."""

    priority: int
    value_per_tok: float
    max_replicas: int
    currently_placed: bool
    best_infeasible_reason: str
    held_gpus: Mapping[str, int]
    keeps_gpus_unplaced: bool


def job_loads(jobs: Sequence[JobStatus], snapshot: ClusterSnapshot,
              headroom: float) -> dict[str, JobLoad]:
    out = {}
    for job in jobs:
        spec = job.spec
        i_len, o_len = spec.input_len.mean_value(), spec.output_len.mean_value()
        if isinstance(spec, OnlineJob):
            rate = job.observed_rate_rps or spec.arrival.mean_rate()
            out[job.id] = JobLoad(job.id, i_len, o_len, rate * headroom,
                                  slo_ttft_ms=spec.slo.ttft_ms, slo_tpot_ms=spec.slo.tpot_ms)
        else:
            out[job.id] = JobLoad(job.id, i_len, o_len, 0.0, batch=True)
    return out


def _live_by_job(snapshot: ClusterSnapshot) -> dict[str, list]:
    live: dict[str, list] = defaultdict(list)
    for d in snapshot.deployments:
        if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING):
            live[d.job_id].append(d)
    return live


def _running(deployments: list, reshard: bool, relaunch: bool = True
             ) -> tuple[list, int, Callable]:
    """A job's live (configuration, offering) pairs, the replicas it holds and which
    (configuration, offering) keep its GPUs (``place.in_place``; with ``reshard`` a
    re-shard on them does too; without ``relaunch`` — an online job changing shape
    make-before-break — no relaunch does)."""
    return ([(d.config.with_(offering="", replicas=1), d.offering) for d in deployments],
            sum(d.replicas_ready + d.replicas_starting for d in deployments),
            in_place(deployments, reshard=reshard, relaunch=relaunch))


def scored_candidates(ev: Evaluated, snapshot: ClusterSnapshot, catalog: Catalog,
                      churn_hours: float, *, reshard_batch: bool = False,
                      measured: Measured | None = None, make_before_break: bool = True,
                      held: frozenset[str] = frozenset(),
                      estimate_sd: Callable[[DeploymentConfig], float] | None = None,
                      uncertainty_z: float = 0.0
                      ) -> tuple[CandidateTable, dict[str, int]]:
    """(candidates × offerings table, free GPUs per offering).

    The GPUs a job holds are its demand's ``held_gpus``, not free ones; a row that keeps
    them (its running deployment, a relaunch in place; with ``reshard_batch`` a batch
    job's re-shard there) is ``in_place``. With ``measured`` (the true oracle's), each
    row's rate on each offering is the measured one, and unmeasured pairs are left out.
    With ``make_before_break`` an online job's change of shape on its offering holds both
    ends (the placer swaps it there), so it is not ``in_place``. A running job in
    ``held`` (``stability.held_jobs``) is offered its current placement only. With
    ``estimate_sd`` and ``uncertainty_z`` a running job's other options keep
    exp(−z·(sd − sd of what runs)) of their rate and goodput when their estimate is the
    more uncertain (``stability.estimate_sd``).
    """
    offers_by_accel: dict[str, list] = defaultdict(list)
    for cap in snapshot.capacity:
        if cap.total_gpus > 0:
            off = catalog.offering(cap.offering)
            offers_by_accel[off.accelerator].append(off)
    live = _live_by_job(snapshot)
    admitted = {j.id for j in snapshot.jobs if j.admitted}
    reshard = reshardable(snapshot, reshard_batch)
    online = {j.id for j in snapshot.jobs if not j.is_batch}
    feasible_jobs = {p.job_id for p, ok in zip(ev.proposals, ev.slo_feasible, strict=True)
                     if ok}
    # per proposal row: its numbers after the checks below; per table row: the proposal
    # row, the offering, and what the offering is to the job
    n = len(ev.proposals)
    goodput_of, rate_of = ev.goodput_tok_s.copy(), ev.max_rate_rps.copy()
    feasible_of = ev.slo_feasible.astype(bool).copy()
    shrink_of = np.ones(n)
    moves_of: list[bool] = []     # per proposal row: whether the job runs anywhere now
    churn_of: list[int] = []      # and the replicas a move re-provisions
    at: list[int] = []
    off_at: list[int] = []
    keeps_at: list[bool] = []
    current_at: list[bool] = []
    configs: list[DeploymentConfig] = []
    measured_at: list[tuple[float, float]] = []
    off_index: dict[str, int] = {}
    offerings: list = []
    running: dict[str, tuple] = {}  # per job: (config, offering) pairs, replicas, in_place
    last: object = None
    # the last proposal's offerings: their indices, its config on each, whether each
    # keeps the job's GPUs, whether each is what runs
    ks: list[int] = []
    on: list[DeploymentConfig] = []
    keeping: list[bool] = []
    runs_there: list[bool] = []
    for i, p in enumerate(ev.proposals):
        if p.job_id in admitted and p.job_id not in feasible_jobs:
            # an admitted job nothing serves robustly is held as it runs, not rejected:
            # no value is planned for it (so it is not grown, moved or started), and
            # an online one keeps serving on the GPUs it holds. Only when even the
            # nominal prediction misses its SLO everywhere is it rejected (and stopped).
            # Planning such jobs on the nominal prediction instead was measured and lost
            # (hetero-12h 71.1 / 71.7 against 73.9 / 74.8 on seeds 1-2; NOTES)
            goodput_of[i], rate_of[i] = 0.0, 0.0
            feasible_of[i] = ev.nominal_max_rate_rps[i] > 0
        if p.job_id not in running:
            running[p.job_id] = _running(live.get(p.job_id, []), p.job_id in reshard,
                                         not (make_before_break and p.job_id in online))
        current, held_replicas, keeps = running[p.job_id]
        if p is not last:
            # an online proposal comes once per risk level, as consecutive rows: its
            # offerings' configs and their relation to what runs are the same each time
            last = p
            ks, on, keeping, runs_there = [], [], [], []
            for off in offers_by_accel.get(p.config.accelerator, []):
                if off.id not in off_index:
                    off_index[off.id] = len(offerings)
                    offerings.append(off)
                ks.append(off_index[off.id])
                on.append(_on_offering(p.config, off.id))
                keeping.append(keeps(p.config, off.id))
                runs_there.append((p.config, off.id) in current)
        if estimate_sd is not None and uncertainty_z > 0 and current:
            tried = live[p.job_id][0].config
            shrink_of[i] = math.exp(-uncertainty_z * max(estimate_sd(p.config)
                                                         - estimate_sd(tried), 0.0))
        moves_of.append(bool(current))
        churn_of.append(max(held_replicas, 1))
        if measured is None and not (current and p.job_id in held):
            # every offering of the part (the common case, taken whole)
            at.extend([i] * len(ks))
            off_at.extend(ks)
            keeps_at.extend(keeping)
            current_at.extend(runs_there)
            configs.extend(on)
            continue
        for k, config, keeps_gpus, is_current in zip(ks, on, keeping, runs_there,
                                                     strict=True):
            if current and not is_current and p.job_id in held:
                continue
            if measured is not None:
                pair = (i, offerings[k].id)
                if pair not in measured:
                    continue
                measured_at.append(measured[pair])
            at.append(i)
            off_at.append(k)
            keeps_at.append(keeps_gpus)
            current_at.append(is_current)
            configs.append(config)
    rows = np.array(at, dtype=np.int64)
    offs = np.array(off_at, dtype=np.int64)
    current_rows = np.array(current_at, dtype=bool)
    goodput, rate, feasible = goodput_of[rows], rate_of[rows], feasible_of[rows]
    if measured is not None:  # the oracle's measured rates replace the predicted ones
        rate = np.array([r for r, _ in measured_at], dtype=np.float64)
        goodput = np.array([g for _, g in measured_at], dtype=np.float64)
        feasible = rate > 0
    margin = np.where(current_rows, 1.0, shrink_of[rows])
    gpus = np.array([p.config.gpus_per_replica for p in ev.proposals], dtype=np.int64)[rows]
    usd = np.array([o.usd_per_gpu_hour for o in offerings], dtype=np.float64)[offs] * gpus
    preempt = np.array([o.preemption_rate_per_hour for o in offerings], dtype=np.float64)
    # moving re-provisions every replica the job holds now
    churn = np.where(current_rows | ~np.array(moves_of, dtype=bool)[rows], 0.0,
                     churn_hours * usd * np.array(churn_of, dtype=np.float64)[rows])
    job_ids = np.array([p.job_id for p in ev.proposals], dtype=object)[rows]
    off_ids = np.array([o.id for o in offerings], dtype=object)[offs]
    table = CandidateTable(
        job_id=job_ids,
        candidate_id=np.array([f"{i}@{o}" for i, o in zip(at, off_ids, strict=True)],
                              dtype=object),
        offering=off_ids, gpus_per_replica=gpus, goodput_tok_s=goodput * margin,
        usd_per_hour=usd, max_rate_rps=rate * margin,
        slo_risk=np.clip(ev.slo_risk[rows].astype(np.float64), 0.0, 1.0),
        preemption_exposure=np.minimum(preempt[offs] * RECLAIM_LOSS_H, 1.0),
        is_current=current_rows, migration_cost=churn, feasible_slo=feasible.astype(bool),
        in_place=np.array(keeps_at, dtype=bool), configs=tuple(configs))
    return table, _capacity(snapshot)


@lru_cache(maxsize=1 << 17)
def _on_offering(config: DeploymentConfig, offering: str) -> DeploymentConfig:
    """``config`` on ``offering`` (cached: a fleet's proposals and offerings recur every
    tick, and a 29-knob config takes microseconds to copy)."""
    return config.with_(offering=offering)


def _capacity(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Free GPUs, plus those of finished jobs' deployments (the placer stops them first,
    which frees their GPUs at once)."""
    cap = {c.offering: c.free_gpus for c in snapshot.capacity}
    finished = {j.id for j in snapshot.jobs if job_finished(j, snapshot.time_s)}
    for d in snapshot.deployments:
        if d.job_id in finished and d.state in (DeploymentState.RUNNING,
                                                DeploymentState.STARTING):
            cap[d.offering] = cap.get(d.offering, 0) + d.gpus
    return cap


def job_demands(jobs: Sequence[JobStatus], loads: Mapping[str, JobLoad],
                snapshot: ClusterSnapshot, ev: Evaluated, *,
                batch_pace: float = 1.0) -> list[JobDemand]:
    live = _live_by_job(snapshot)
    reasons = _infeasible_reasons(ev)
    out = []
    for job in jobs:
        spec, load = job.spec, loads[job.id]
        held: dict[str, int] = defaultdict(int)
        for d in live.get(job.id, []):
            held[d.offering] += d.gpus
        common: _DemandFields = {
            "priority": spec.priority, "value_per_tok": VALUE_PER_TOK,
            "max_replicas": MAX_REPLICAS, "currently_placed": bool(live.get(job.id)),
            "best_infeasible_reason": reasons.get(job.id, ""),
            # the placer leaves a deferred online job serving and drains a batch one
            "held_gpus": dict(held), "keeps_gpus_unplaced": isinstance(spec, OnlineJob)}
        if isinstance(spec, BatchJob):
            remaining = batch_tokens_left(job)
            time_left = spec.submit_s + spec.deadline_s - snapshot.time_s
            # late tokens still count as processed: finish a late job, on spare capacity
            out.append(JobDemand.batch(job.id, remaining, time_left, pace=batch_pace,
                                       late_s=snapshot.tick_s, **common))
        else:
            out.append(JobDemand(job_id=job.id, demand_rate_rps=load.rate_rps,
                                 output_tok_per_request=load.output_len, **common))
    return out


def _infeasible_reasons(ev: Evaluated) -> dict[str, str]:
    """Per job with no robustly SLO-feasible candidate: the closest miss, in words."""
    best: dict[str, tuple[float, int]] = {}
    feasible_jobs = {p.job_id for p, ok in zip(ev.proposals, ev.slo_feasible, strict=True) if ok}
    for i, p in enumerate(ev.proposals):
        if p.job_id in feasible_jobs:
            continue
        score = float(ev.ttft_p95_ms[i] + 20.0 * ev.tpot_p95_ms[i])
        if p.job_id not in best or score < best[p.job_id][0]:
            best[p.job_id] = (score, i)
    out = {}
    for job_id, (_, i) in best.items():
        cfg = ev.proposals[i].config
        # the evaluator's p95s are with the job's whole rate on one replica (Evaluated)
        out[job_id] = (f"no configuration meets the SLO robustly at any load; closest is"
                       f" {cfg.accelerator} tp{cfg.tp} {cfg.weight_precision} {cfg.engine}"
                       f" (one replica at the job's whole load: TTFT p95"
                       f" {_ms(ev.ttft_p95_ms[i])}, TPOT p95 {_ms(ev.tpot_p95_ms[i])})")
    return out


def _ms(x: float) -> str:
    return f"{x:,.0f} ms" if math.isfinite(x) else "unbounded"
