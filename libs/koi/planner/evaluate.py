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
(``robustness(proposal, mediators)``): learning files a saturated replica's throughput
error under the edge its mediators pick (above the KV cliff, kv_pressure → throughput),
and a correction looked up in the base regime would never see it.

Outputs are per replica, structure-of-arrays, ready for the composer. No composition,
no placement, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.planner.propose import Proposal
from koi.predictor.api import evaluate_matrix
from koi.predictor.calibration import Calibration, load_calibration
from koi.predictor.columns import OUT
from koi.predictor.features import build_inputs
from koi.predictor.passes import scale_passes
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
class Robustness:
    """Belief corrections (multipliers on the prediction) and DRO radii (log space)."""

    ttft_mult: float = 1.0
    tpot_mult: float = 1.0
    tput_mult: float = 1.0
    radius_ttft: float = 0.0
    radius_tpot: float = 0.0
    radius_tput: float = 0.0
    # the multiplier on the kernel's forward pass (koi.predictor.passes): an online
    # candidate is predicted with passes ``pass_mult``× as long in every part, so that
    # the queueing model runs on the learnt pass — a slower pass lowers the rate a
    # replica serves and queues it sooner, a faster one raises it (its tpot multiplier
    # is then the p95 tail factor only, its ttft one TTFT's error beyond the pass).
    # Before, a slower pass only divided the rate (BENCHMARKS (u)) and a faster one
    # did nothing. Batch candidates keep 1 and take outcome multipliers of their regime
    pass_mult: float = 1.0

    @property
    def ttft_factor(self) -> float:
        """Robust p95 TTFT ÷ raw prediction: the correction, then the worst case."""
        return self.ttft_mult * math.exp(self.radius_ttft)

    @property
    def tpot_factor(self) -> float:
        return self.tpot_mult * math.exp(self.radius_tpot)


NOMINAL = Robustness()


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


def graph_mediators(kv_pressure: float, comm_overhead_frac: float,
                    queue_util: float) -> dict[str, float]:
    """Predicted mediators under the causal graph's names (``BeliefStore.correction``)."""
    return {"kv_pressure": float(kv_pressure), "comm_overhead": float(comm_overhead_frac),
            "queue_util": float(queue_util)}


def _effective_slo(slo_ms: float, mult: float, radius: float) -> float:
    return slo_ms / (mult * math.exp(radius)) if slo_ms > 0 else 0.0


# (N_IN, n) kernel inputs → (N_OUT, n) outputs, column by column (a column depends on
# its own inputs only, so a cache may answer some columns and compute the rest)
Kernel = Callable[[np.ndarray], np.ndarray]


# robustness(proposal) in the base regime, or robustness(proposal, mediators) in the
# regime the candidate's predicted mediators (graph names) put it in
RobustnessFn = Callable[..., Robustness]


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
    for p in proposals:
        r = robustness(p) if robustness else NOMINAL
        load = loads[p.job_id]
        if levels is not None and (load.slo_ttft_ms > 0 or load.slo_tpot_ms > 0):
            for lv in levels(p.job_id):
                rows.append(p)
                rob.append(replace(r, radius_ttft=lv.radius_ttft, radius_tpot=lv.radius_tpot))
                risk.append(lv.slo_risk)
        else:
            rows.append(p)
            rob.append(r)
            risk.append(0.0)
    proposals = rows
    pairs = []
    for p, r in zip(proposals, rob, strict=True):
        load = loads[p.job_id]
        # where the job's load would put one replica: online at its rate, batch saturated
        mode, rate = ((LoadMode.SATURATED, 0.0) if load.batch else
                      (LoadMode.RATE, load.rate_rps if load.rate_rps > 0 else 0.1))
        pairs.append((p.config, Workload(
            input_len=max(load.input_len, 1.0), output_len=max(load.output_len, 1.0),
            mode=mode, load=rate,
            slo_ttft_ms=_effective_slo(load.slo_ttft_ms, r.ttft_mult, r.radius_ttft),
            slo_tpot_ms=_effective_slo(load.slo_tpot_ms, r.tpot_mult, r.radius_tpot))))
    if not pairs:
        return Evaluated.empty()
    run = kernel or (lambda X: evaluate_matrix(X, backend=backend))
    # batch rows are corrected after the kernel, in their saturated regime (below)
    online = np.array([not loads[p.job_id].batch for p in proposals])
    Y = run(learnt_inputs(pairs, np.where(online, [r.pass_mult for r in rob], 1.0), cat, cal))
    if robustness is not None:
        # batch: no SLO to tighten, so the regime's throughput correction can come after
        for i, p in enumerate(proposals):
            if loads[p.job_id].batch:
                rob[i] = robustness(p, graph_mediators(Y[OUT["kv_pressure"], i],
                                                       Y[OUT["comm_frac"], i],
                                                       Y[OUT["queue_util"], i]))
    ev = _score(tuple(proposals), pairs, rob, np.array(risk), loads, Y)
    # jobs no candidate serves robustly: also the nominal answer, for best-effort service
    lost = {p.job_id for p in proposals} - {p.job_id for p, ok in
                                             zip(proposals, ev.slo_feasible, strict=True) if ok}
    idx = [i for i, p in enumerate(proposals) if p.job_id in lost]
    if idx and any(r != NOMINAL for r in rob):
        nominal = [(pairs[i][0], replace(pairs[i][1], slo_ttft_ms=loads[proposals[i].job_id]
                                         .slo_ttft_ms, slo_tpot_ms=loads[proposals[i].job_id]
                                         .slo_tpot_ms)) for i in idx]
        Yn = run(build_inputs(nominal, cat, cal))
        ev.nominal_max_rate_rps[idx] = Yn[OUT["max_rate_slo"]]
    return ev


def learnt_inputs(pairs: Sequence[tuple], pass_mult: np.ndarray, catalog: Catalog,
                  calibration: Calibration | None) -> np.ndarray:
    """Kernel inputs of (config, workload) ``pairs`` on their learnt passes (``pass_mult``
    per pair; 1 = as the model has them), as online candidates are predicted."""
    X = build_inputs(pairs, catalog, calibration)
    return scale_passes(X, pass_mult) if np.any(pass_mult != 1.0) else X


def _score(proposals: tuple[Proposal, ...], pairs: list[tuple], rob: list[Robustness],
           risk: np.ndarray, loads: Mapping[str, JobLoad], Y: np.ndarray) -> Evaluated:
    tput_mult = np.array([r.tput_mult * math.exp(-r.radius_tput) for r in rob])
    out_len = np.array([wl.output_len for _, wl in pairs])
    has_slo = np.array([loads[p.job_id].slo_ttft_ms > 0 or loads[p.job_id].slo_tpot_ms > 0
                        for p in proposals])
    # max_rate_slo already meets the tightened SLOs on the learnt passes; the throughput
    # side of robustness scales the rate a replica can sustain at all
    robust_rate = Y[OUT["max_rate_slo"]] * np.minimum(tput_mult, 1.0)
    ttft_mult = np.array([r.ttft_factor for r in rob])
    tpot_mult = np.array([r.tpot_factor for r in rob])
    return Evaluated(
        proposals=proposals,
        max_rate_rps=robust_rate,
        nominal_max_rate_rps=Y[OUT["max_rate_slo"]].copy(),
        goodput_tok_s=robust_rate * out_len,
        ttft_p95_ms=Y[OUT["ttft_p95"]] * 1e3 * ttft_mult,
        tpot_p95_ms=Y[OUT["tpot_p95"]] * 1e3 * tpot_mult,
        kv_pressure=Y[OUT["kv_pressure"]].copy(),
        comm_overhead_frac=Y[OUT["comm_frac"]].copy(),
        queue_util=Y[OUT["queue_util"]].copy(),
        gpus=np.array([p.config.gpus_per_replica for p in proposals], dtype=float),
        radius_ttft=np.array([r.radius_ttft for r in rob]),
        radius_tpot=np.array([r.radius_tpot for r in rob]), slo_risk=risk,
        slo_feasible=(robust_rate > 0) | ~has_slo,
    )
