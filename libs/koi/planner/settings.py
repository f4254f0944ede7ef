"""The Koi planner's settings (``KoiSettings``) and its named variants.

``VARIANTS`` maps each planner variant's name (what ``KOI_POLICY`` names on the bus and
the benchmark registers as a policy) to its settings; ``settings_for`` looks one up.
The policies (``koi.policies.koi``) and the services take their settings from here.
Settings only: no planning logic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from koi.compose import ComposeWeights
from koi.planner.candidates import Measure
from koi.planner.propose import ProposerLimits
from koi.predictor.calibration import Calibration

# the outcomes whose DRO radius the evaluator applies (``Robustness``'s three radii)
ROBUST_OUTCOMES: tuple[str, ...] = ("ttft_p95", "tpot_p95", "throughput")


@dataclass(frozen=True)
class KoiSettings:
    """Planner knobs (the ablations switch parts off)."""

    use_beliefs: bool = True        # koi-no-causal: False
    learn: bool = True              # koi-no-learning: beliefs and radius frozen at the prior
    use_dro: bool = True            # koi-no-dro: radius 0
    # the calibrator's target: the share of observed outcomes no worse than the robust
    # prediction (one-sided). The SLOs are p95s already. Before tail beliefs the p95
    # residuals carried a +0.2..+0.6 (log) bias and 0.5 planned it away (0.7 / 0.9
    # over-provisioned: BENCHMARKS (o)); with tail beliefs learning that bias per scope,
    # 0.5 still beats 0.8: 3-seed means hetero-3h / real-104 / hetero-12h 83.8 / 83.7 /
    # 78.0 against 84.1 / 83.2 / 74.1 (BENCHMARKS (p))
    coverage: float = 0.5
    # the outcomes whose DRO radius tightens the plan (the calibrator reports every
    # outcome's radius and coverage either way); without "ttft_p95" hetero-12h gained
    # 4.1 and hetero-3h / real-104 lost 1.1 / 0.6 at coverage 0.9 (BENCHMARKS (m))
    dro_outcomes: tuple[str, ...] = ROBUST_OUTCOMES
    # the proposer's mediator guidance (KV-bound -> more TP / fp8 KV, comm-bound -> fewer
    # ranks) from the running deployments' last tick. Off: up to 16 guided candidates on
    # top of the capped set lost 1.1-1.2 on hetero-12h (every seed lower) and tied on
    # hetero-3h and real-104 (BENCHMARKS (q))
    mediator_guidance: bool = False
    # each online candidate is also offered at the radii of these coverages (its SLO
    # risk at each margin priced by the composer), so a job buys margin where capacity
    # is spare and plans at the calibrated radius where it is short; () = one row at
    # the calibrated radius (its risk still priced)
    risk_coverages: tuple[float, ...] = (0.8, 0.95)
    migration_budget: int = 4
    # a batch job may be relaunched in place with another number of GPUs per replica
    # (tp2 ×32 → tp1 ×64 on the same GPUs; place._relaunchable). Off: 3 seeds on
    # hetero-12h 80.47 against 81.93 (koi-no-dro 83.53 against 84.41), hetero-3h and
    # real-104 within 0.2 (BENCHMARKS (t))
    reshard_batch: bool = False
    compose_time_limit_s: float = 5.0   # a safety net: HiGHS stops at its node limit first
    top_k: int = 40
    proposer: ProposerLimits = field(default_factory=lambda: ProposerLimits(max_per_job=120))
    weights: ComposeWeights = field(default_factory=ComposeWeights)
    churn_hours: float = 1.0        # a move costs this many hours of the new replicas' price
    rate_headroom: float = 1.1      # plan for this much more than the observed rate
    # batch work up to this multiple of the deadline's pace is worth running on spare
    # capacity (at ComposeWeights.ahead of a token's value beyond the pace); 3.0 scored
    # 63.6 against 70.1 at 1.0 on hetero-12h seed 1 (BENCHMARKS (m)), so it is off
    batch_pace: float = 1.0
    backend: str = "numba"
    # the predictor's efficiency table; None = the fitted one (oracle-fit passes the world's)
    calibration: Calibration | None = None
    # per-replica rates measured in the world, replacing the predicted ones in the
    # composer's table (``candidates.Measure``): only the true oracle has one
    measure: Measure | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.dro_outcomes) - set(ROBUST_OUTCOMES))
        if unknown:
            raise ValueError(f"dro_outcomes: {', '.join(unknown)} not among"
                             f" {', '.join(ROBUST_OUTCOMES)}")


VARIANTS: dict[str, KoiSettings] = {
    "koi": KoiSettings(),
    "koi-no-causal": replace(KoiSettings(), use_beliefs=False),
    # beliefs and radius frozen at the prior
    "koi-no-learning": replace(KoiSettings(), learn=False),
    "koi-no-dro": replace(KoiSettings(), use_dro=False),
    # TTFT p95 planned on the beliefs' correction alone (no radius); the TPOT and
    # throughput radii stay. A variant, not an ablation: BENCHMARKS (m)
    "koi-ttft-nominal": replace(KoiSettings(), dro_outcomes=("tpot_p95", "throughput")),
}


def settings_for(variant: str) -> KoiSettings:
    """The planner settings of a Koi variant (what the services run with KOI_POLICY)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown planner variant {variant!r}; known: "
                         f"{', '.join(VARIANTS)}")
    return VARIANTS[variant]
