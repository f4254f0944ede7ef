"""Explanations: why each job is where it is, in data and in plain words.

Every decision carries the numbers that drove it — the chosen configuration's predicted
and robust p95 TTFT/TPOT and sustainable rate, the belief multipliers and DRO radius
that separate the two, the hypothesis the proposer had, and the playbook mechanisms
whose scope covers it — so that ``koi explain``, the gRPC ``Explain`` call and the event
log can all say the same thing. No decisions here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from koi.catalog import Catalog
from koi.causal.scope import scope_of
from koi.causal.store import BeliefStore
from koi.compose import ComposePlan
from koi.dro import HIGHER_BETTER, DroCalibrator
from koi.planner.evaluate import Evaluated, JobLoad
from koi.planner.robust import Robustness, RobustnessFn, robust_rows
from koi.predictor.api import evaluate_matrix
from koi.predictor.calibration import Calibration
from koi.predictor.types import LoadMode, Workload


@dataclass(frozen=True, slots=True)
class Explanation:
    job_id: str
    decision: str
    reason: str
    config_label: str = ""
    offering: str = ""
    replicas: int = 0
    hypothesis: str = ""
    scope: str = ""
    ttft_p95_ms_robust: float = 0.0
    tpot_p95_ms_robust: float = 0.0
    max_rate_rps_nominal: float = 0.0
    max_rate_rps_robust: float = 0.0
    multipliers: tuple[tuple[str, float], ...] = ()   # belief corrections by outcome
    radii: tuple[tuple[str, float], ...] = ()         # DRO radii (log space) by outcome
    mechanisms: tuple[str, ...] = ()                  # operator lines of applicable ones
    mechanism_ids: tuple[str, ...] = ()
    goodput_tok_s: float = 0.0
    usd_per_hour: float = 0.0
    planned_rate_rps: float = 0.0   # per replica: the job's rate (with headroom) ÷ replicas

    def _passes(self) -> str:
        """The clause that says an online replica was predicted on learnt pass times."""
        slow = dict(self.multipliers).get("pass", 1.0)
        if self.planned_rate_rps <= 0 or abs(math.log(slow)) <= 0.005:
            return ""
        return f"; robustly on passes learnt ×{slow:.2f} as long"

    def text(self) -> str:
        """The decision in plain words, as an operator reads it."""
        if self.decision != "place":
            return f"{self.job_id}: {self.decision} — {self.reason}"
        lines = [f"{self.job_id}: {self.replicas}× {self.config_label} on {self.offering}"
                 f" — {self.reason}",
                 f"  serves {self.goodput_tok_s:,.0f} tok/s within SLO for "
                 f"${self.usd_per_hour:,.2f}/h",
                 f"  per replica: up to {self.max_rate_rps_robust:.2f} req/s robustly "
                 f"({self.max_rate_rps_nominal:.2f} as predicted{self._passes()})"]
        if self.planned_rate_rps > 0:
            lines.append(f"  at the planned {self.planned_rate_rps:.2f} req/s per replica: p95"
                         f" TTFT {self.ttft_p95_ms_robust:,.0f} ms, TPOT"
                         f" {self.tpot_p95_ms_robust:.1f} ms in the worst case inside the"
                         " radius")
        corrections = ", ".join(f"{o} ×{m:.2f}" for o, m in self.multipliers
                                if abs(math.log(m)) > 0.01)
        lines.append(f"  beliefs on {self.scope}: {corrections or 'prior (no correction)'}")
        if self.radii:
            # one-sided: the worst case is a latency e^r higher, a throughput e^r lower
            lines.append("  DRO radius (worst case): " + ", ".join(
                f"{o} −{100 * (1 - math.exp(-r)):.0f}%" if o in HIGHER_BETTER
                else f"{o} +{100 * (math.exp(r) - 1):.0f}%" for o, r in self.radii))
        lines.append(f"  considered because: {self.hypothesis}")
        lines += [f"  mechanism: {m}" for m in self.mechanisms]
        return "\n".join(lines)


def explain_choices(plan: ComposePlan, ev: Evaluated, beliefs: BeliefStore,
                    calibrator: DroCalibrator, catalog: Catalog, loads: Mapping[str, JobLoad],
                    robustness: RobustnessFn, *,
                    use_beliefs: bool = True, calibration: Calibration | None = None,
                    backend: str = "numba") -> tuple[Explanation, ...]:
    """One explanation per choice of ``plan``; an online job's robust p95s are predicted
    afresh at the load each of its replicas is planned to carry (``ev`` holds them at
    the job's whole load on one replica), with the same ``robustness`` and the same
    robust prediction (``koi.planner.robust.robust_rows``) as the evaluator."""
    radii = calibrator.radii()
    at_plan = _robust_p95_at_plan(plan, ev, loads, robustness, catalog, calibration, backend)
    out = []
    for c in plan.choices:
        if c.candidate_id is None or c.config is None:
            out.append(Explanation(c.job_id, c.decision.value, c.reason))
            continue
        i = _proposal_index(c.candidate_id)
        p = ev.proposals[i]
        scope = scope_of(p.config, catalog)
        # a batch candidate's corrections are those of its saturated regime (evaluate)
        regime = ev.mediators(i) if loads[c.job_id].batch else None
        mult = beliefs.candidate_correction(scope, regime) if use_beliefs else {}
        rate, ttft, tpot = at_plan.get(c.job_id, (0.0, 0.0, 0.0))
        mechs = beliefs.applicable_mechanisms([scope]) if use_beliefs else ()
        out.append(Explanation(
            job_id=c.job_id, decision=c.decision.value, reason=c.reason,
            config_label=_label(p.config), offering=c.offering, replicas=c.replicas,
            hypothesis=p.hypothesis, scope=scope.label(),
            ttft_p95_ms_robust=ttft, tpot_p95_ms_robust=tpot, planned_rate_rps=rate,
            max_rate_rps_nominal=float(ev.nominal_max_rate_rps[i]),
            max_rate_rps_robust=float(ev.max_rate_rps[i]),
            multipliers=tuple(sorted(mult.items())), radii=_row_radii(radii, ev, i),
            mechanisms=tuple(m.line() for m in mechs[:3]),
            mechanism_ids=tuple(m.id for m in mechs[:3]) + p.mechanism_ids,
            goodput_tok_s=c.goodput_tok_s, usd_per_hour=c.usd_per_hour))
    return tuple(out)


def _row_radii(radii: Mapping[str, float], ev: Evaluated, i: int
               ) -> tuple[tuple[str, float], ...]:
    """The calibrator's radii with the SLO radii of row ``i``'s margin (its risk level)."""
    row = {**radii, "ttft_p95": float(ev.radius_ttft[i]), "tpot_p95": float(ev.radius_tpot[i])}
    return tuple(sorted(row.items()))


def _at_row(r: Robustness, ev: Evaluated, i: int) -> Robustness:
    return replace(r, radius_ttft=float(ev.radius_ttft[i]), radius_tpot=float(ev.radius_tpot[i]))


def _proposal_index(candidate_id: object) -> int:
    """The proposal a composed row came from (row ids are ``"<index>@<offering>"``)."""
    return int(str(candidate_id).split("@", 1)[0])


def _robust_p95_at_plan(plan: ComposePlan, ev: Evaluated, loads: Mapping[str, JobLoad],
                        robustness: RobustnessFn, catalog: Catalog,
                        calibration: Calibration | None, backend: str
                        ) -> dict[str, tuple[float, float, float]]:
    """job → (planned req/s per replica, robust p95 TTFT ms, robust p95 TPOT ms) for
    every placed online job, in one predictor call."""
    jobs, pairs, robust = [], [], []
    for c in plan.choices:
        load = loads.get(c.job_id)
        if c.candidate_id is None or c.config is None or c.replicas < 1 or load is None \
                or load.batch or load.rate_rps <= 0:
            continue
        i = _proposal_index(c.candidate_id)
        p = ev.proposals[i]
        rate = load.rate_rps / c.replicas
        jobs.append((c.job_id, rate))
        robust.append(_at_row(robustness(p.config), ev, i))
        pairs.append((p.config, Workload(input_len=max(load.input_len, 1.0),
                                         output_len=max(load.output_len, 1.0),
                                         mode=LoadMode.RATE, load=rate)))
    if not pairs:
        return {}
    rows = robust_rows(pairs, robust, regime=None, catalog=catalog, calibration=calibration,
                       run=lambda X: evaluate_matrix(X, backend=backend))
    ttft, tpot = rows.ttft_p95_ms, rows.tpot_p95_ms
    return {job: (rate, float(ttft[j]), float(tpot[j])) for j, (job, rate) in enumerate(jobs)}


def _label(cfg) -> str:
    parts = [cfg.accelerator, f"tp{cfg.tp}"]
    if cfg.pp > 1:
        parts.append(f"pp{cfg.pp}")
    parts += [str(cfg.weight_precision), cfg.engine]
    if cfg.kv_dtype.value == "fp8":
        parts.append("fp8-kv")
    parts.append(f"seqs{cfg.max_num_seqs}")
    return " ".join(parts)
