"""The evaluator: predict every proposal with the numba kernel and score it robustly.

For each candidate configuration of each job it asks the predictor two things, in one
kernel call over all candidates: how the configuration serves the job's load, and the
largest rate one replica sustains while p95 TTFT/TPOT meet the job's SLO *in the worst
case inside the DRO radius*. Robustness enters the kernel as tightened SLOs: an SLO of
S with a learned correction m (the causal beliefs' multiplier for that scope) and a
radius r is met robustly when the nominal prediction meets S / (m·e^r).

An online candidate's learnt pass time enters the kernel as a multiplier on its passes
(``Robustness.pass_mult``; ``koi.predictor.passes``): the queueing model then runs on
the pass the fleet showed, so capacity and queueing delay move with it.

A batch job's replicas run saturated, so its candidates are predicted saturated, and
their throughput correction is the belief of the regime that prediction puts them in
(``robustness(config, mediators)``): learning files a saturated replica's throughput
error under the edge its mediators pick (above the KV cliff, kv_pressure → throughput),
and a correction looked up in the base regime would never see it.

The robust prediction itself is ``koi.planner.robust``'s (``robust_rows``), the one the
explanation and the planner-api use too; this module adds the risk levels, the nominal
fallback and the per-replica scores.

Outputs are per replica, structure-of-arrays, ready for the composer. No composition,
no placement, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.planner.propose import Proposal
from koi.planner.robust import (
    NOMINAL,
    Kernel,
    Robustness,
    RobustnessFn,
    RobustRows,
    graph_mediators,
    robust_rows,
)
from koi.predictor.api import evaluate_matrix
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import OUT
from koi.predictor.features import build_inputs
from koi.predictor.types import LoadMode, Workload


@dataclass(frozen=True, slots=True)
class JobLoad:
    """What a job asks of one deployment this tick."""

    job_id: str
    input_len: float
    output_len: float
    rate_rps: float           # online: offered req/s (0 for batch)
    slo_ttft_ms: float = 0.0  # p95 targets (0 = none, e.g. batch)
    slo_tpot_ms: float = 0.0
    batch: bool = False


@dataclass(frozen=True, slots=True)
class RiskLevel:
    """One margin an online candidate is offered at: the radii (log) that tighten its
    p95 SLOs and the expected share of its requests that still miss one (``slo_risk``;
    the composer prices it). Level 0 is the calibrated radius; the others wider."""

    radius_ttft: float = 0.0
    radius_tpot: float = 0.0
    slo_risk: float = 0.0


@dataclass(frozen=True)
class Evaluated:
    """Per-candidate, per-replica scores (arrays aligned with ``proposals``)."""

    proposals: tuple[Proposal, ...]
    max_rate_rps: np.ndarray        # robust: req/s one replica serves within SLO
    nominal_max_rate_rps: np.ndarray
    goodput_tok_s: np.ndarray       # robust SLO-meeting output tok/s per replica
    # robust p95s and nominal mediators with the job's whole rate on one replica (batch:
    # saturated): how hard a single replica would be pushed, not the plan's per-replica
    # load (the composer plans at most ``max_rate_rps`` per replica)
    ttft_p95_ms: np.ndarray
    tpot_p95_ms: np.ndarray
    kv_pressure: np.ndarray
    comm_overhead_frac: np.ndarray
    queue_util: np.ndarray
    gpus: np.ndarray
    # the row's margin: an online proposal has one row per ``RiskLevel`` (its radii and
    # the expected share of requests missing an SLO); batch rows have one, at risk 0
    radius_ttft: np.ndarray
    radius_tpot: np.ndarray
    slo_risk: np.ndarray
    slo_feasible: np.ndarray        # bool: some load meets the SLO robustly

    def __len__(self) -> int:
        return len(self.proposals)

    def mediators(self, i: int) -> dict[str, float]:
        """Proposal ``i``'s nominal mediators by graph name (the regime they put it in
        picks its belief corrections)."""
        return graph_mediators(self.kv_pressure[i], self.comm_overhead_frac[i],
                               self.queue_util[i])

    @staticmethod
    def empty() -> Evaluated:
        arrays = {f.name: np.zeros(0, dtype=bool if f.name == "slo_feasible" else float)
                  for f in fields(Evaluated) if f.name != "proposals"}
        return Evaluated(proposals=(), **arrays)

    @staticmethod
    def concat(parts: Sequence[Evaluated]) -> Evaluated:
        """Shards evaluated separately, as one (in the order given)."""
        if not parts:
            return Evaluated.empty()
        arrays = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
                  for f in fields(Evaluated) if f.name != "proposals"}
        return Evaluated(proposals=tuple(x for p in parts for x in p.proposals), **arrays)


def evaluate(proposals: Sequence[Proposal], loads: Mapping[str, JobLoad], *,
             robustness: RobustnessFn | None = None,
             levels: Callable[[str], Sequence[RiskLevel]] | None = None,
             catalog: Catalog | None = None, calibration: Calibration | None = None,
             backend: str = "numba", kernel: Kernel | None = None) -> Evaluated:
    """Predict and robustly score every proposal (one kernel call; ``kernel`` replaces
    ``evaluate_matrix``, e.g. with a cached one). With ``levels`` (job id → its risk
    levels), a proposal of a job with an SLO is scored once per level (its radii replace
    the latency radii of ``robustness``), in level order, as consecutive rows."""
    cat = catalog or load_catalog()
    cal = calibration or load_calibration()
    rows: list[Proposal] = []
    rob: list[Robustness] = []
    risk: list[float] = []
    # (id(robustness), id(level)) → (that robustness at that level's radii, the two
    # objects, kept alive so that their ids stay theirs)
    at_level: dict[tuple[int, int], tuple[Robustness, Robustness, RiskLevel]] = {}
    for p in proposals:
        r = robustness(p.config) if robustness else NOMINAL
        load = loads[p.job_id]
        if levels is not None and (load.slo_ttft_ms > 0 or load.slo_tpot_ms > 0):
            for lv in levels(p.job_id):
                known = at_level.get((id(r), id(lv)))
                if known is None:
                    known = at_level[(id(r), id(lv))] = (
                        replace(r, radius_ttft=lv.radius_ttft, radius_tpot=lv.radius_tpot),
                        r, lv)
                rows.append(p)
                rob.append(known[0])
                risk.append(lv.slo_risk)
        else:
            rows.append(p)
            rob.append(r)
            risk.append(0.0)
    proposals = rows
    # where the job's load would put one replica: online at its rate, batch saturated
    workloads = {job_id: _workload(load) for job_id, load in loads.items()}
    pairs = [(p.config, workloads[p.job_id]) for p in proposals]
    if not pairs:
        return Evaluated.empty()
    run = kernel or (lambda X: evaluate_matrix(X, backend=backend))
    robust = robust_rows(pairs, rob, regime=robustness, catalog=cat, calibration=cal,
                         run=run)
    ev = _score(tuple(proposals), pairs, robust, np.array(risk), loads)
    # jobs no candidate serves robustly: also the nominal answer, for best-effort service
    lost = {p.job_id for p in proposals} - {p.job_id for p, ok in
                                             zip(proposals, ev.slo_feasible, strict=True) if ok}
    idx = [i for i, p in enumerate(proposals) if p.job_id in lost]
    if idx and any(r != NOMINAL for r in robust.robustness):
        Yn = run(build_inputs([pairs[i] for i in idx], cat, cal))
        ev.nominal_max_rate_rps[idx] = Yn[OUT["max_rate_slo"]]
    return ev


def _workload(load: JobLoad) -> Workload:
    """What one replica of a job is predicted under: online at the job's whole rate (at
    least 0.1 req/s) with its SLOs, batch saturated."""
    mode, rate = ((LoadMode.SATURATED, 0.0) if load.batch else
                  (LoadMode.RATE, load.rate_rps if load.rate_rps > 0 else 0.1))
    return Workload(input_len=max(load.input_len, 1.0), output_len=max(load.output_len, 1.0),
                    mode=mode, load=rate, slo_ttft_ms=load.slo_ttft_ms,
                    slo_tpot_ms=load.slo_tpot_ms)


def _score(proposals: tuple[Proposal, ...], pairs: list[tuple], robust: RobustRows,
           risk: np.ndarray, loads: Mapping[str, JobLoad]) -> Evaluated:
    Y, rob = robust.Y, robust.robustness
    out_len = np.array([wl.output_len for _, wl in pairs])
    has_slo = np.array([loads[p.job_id].slo_ttft_ms > 0 or loads[p.job_id].slo_tpot_ms > 0
                        for p in proposals])
    # max_rate_slo already meets the tightened SLOs on the learnt passes; the throughput
    # side of robustness scales the rate a replica can sustain at all
    robust_rate = robust.max_rate_rps
    return Evaluated(
        proposals=proposals,
        max_rate_rps=robust_rate,
        nominal_max_rate_rps=Y[OUT["max_rate_slo"]].copy(),
        goodput_tok_s=robust_rate * out_len,
        ttft_p95_ms=robust.ttft_p95_ms,
        tpot_p95_ms=robust.tpot_p95_ms,
        kv_pressure=Y[OUT["kv_pressure"]].copy(),
        comm_overhead_frac=Y[OUT["comm_frac"]].copy(),
        queue_util=Y[OUT["queue_util"]].copy(),
        gpus=np.array([p.config.gpus_per_replica for p in proposals], dtype=float),
        radius_ttft=np.array([r.radius_ttft for r in rob]),
        radius_tpot=np.array([r.radius_tpot for r in rob]), slo_risk=risk,
        slo_feasible=(robust_rate > 0) | ~has_slo,
    )
