"""The Koi planner's settings (``KoiSettings``) and its named variants.

``VARIANTS`` maps each planner variant's name (what ``KOI_POLICY`` names on the bus and
the benchmark registers as a policy) to its settings; ``settings_for`` looks one up.
The policies (``koi.policies.koi``) and the services take their settings from here.
Settings only: no planning logic, no I/O. ``KoiSettings`` is a pydantic dataclass (bounds
checked at construction, ``dataclasses.replace`` included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, InstanceOf, field_validator
from pydantic.dataclasses import dataclass

from koi.compose import ComposeWeights
from koi.planner.churn_settings import ChurnSettings
from koi.planner.propose import ProposerLimits
from koi.predictor.calibration import Calibration, load_calibration

# (evaluated row, offering id) → (req/s, output tok/s) one replica was measured to serve
# there (online: within the job's SLO; batch: saturated); pairs left out are not offered.
# ``candidates.Measure`` is the measuring function's full type (it takes the evaluated
# rows and the snapshot); the settings, a leaf, only need to know it is callable.
Measured = Mapping[tuple[int, str], tuple[float, float]]

# the outcomes whose DRO radius the evaluator applies (``Robustness``'s three radii)
ROBUST_OUTCOMES: tuple[str, ...] = ("ttft_p95", "tpot_p95", "throughput")


@dataclass(frozen=True, config=ConfigDict(arbitrary_types_allowed=True))
class KoiSettings:
    """Planner knobs (the ablations switch parts off).

    A pydantic dataclass: every field has a default, a description and its bounds, and a
    bad value fails at construction (``dataclasses.replace`` included) with a
    ``ValidationError`` that names the field. The comments keep the measurements behind
    the defaults; ``koi settings --markdown`` writes the table in docs/SETTINGS.md.
    """

    use_beliefs: bool = Field(
        default=True,
        description="Correct predictions with the learnt causal beliefs and mechanisms "
                    "(koi-no-causal: off).")
    learn: bool = Field(
        default=True,
        description="Learn from telemetry; off freezes the beliefs and the radius at the "
                    "prior (koi-no-learning).")
    use_dro: bool = Field(
        default=True,
        description="Plan on the robust prediction inside the DRO radius; off plans on the "
                    "nominal one (koi-no-dro: radius 0).")
    # The SLOs are p95s already. Before tail beliefs the p95 residuals carried a
    # +0.2..+0.6 (log) bias and 0.5 planned it away (0.7 / 0.9 over-provisioned:
    # BENCHMARKS (o)); with tail beliefs learning that bias per scope, 0.5 still beats
    # 0.8: 3-seed means hetero-3h / real-104 / hetero-12h 83.8 / 83.7 / 78.0 against
    # 84.1 / 83.2 / 74.1 (BENCHMARKS (p))
    coverage: float = Field(
        default=0.5, gt=0.0, lt=1.0,
        description="The DRO calibrator's target: the share of observed outcomes no worse "
                    "than the robust prediction (one-sided).")
    # without "ttft_p95" hetero-12h gained 4.1 and hetero-3h / real-104 lost 1.1 / 0.6 at
    # coverage 0.9 (BENCHMARKS (m))
    dro_outcomes: tuple[str, ...] = Field(
        default=ROBUST_OUTCOMES,
        description="Outcomes whose DRO radius tightens the plan (the calibrator reports "
                    "every outcome's radius either way): a subset of "
                    + ", ".join(ROBUST_OUTCOMES) + ".")
    # Off: up to 16 guided candidates on top of the capped set lost 1.1-1.2 on hetero-12h
    # (every seed lower) and tied on hetero-3h and real-104 (BENCHMARKS (q))
    mediator_guidance: bool = Field(
        default=False,
        description="Guide the proposer by the running deployments' mediators (KV-bound: "
                    "more TP or fp8 KV; comm-bound: fewer ranks).")
    # so a job buys margin where capacity is spare and plans at the calibrated radius
    # where it is short
    risk_coverages: tuple[Annotated[float, Field(gt=0.0, lt=1.0)], ...] = Field(
        default=(0.8, 0.95),
        description="Each online candidate is also offered at the radii of these (each in "
                    "(0, 1)) "
                    "coverages, its SLO risk at each margin priced by the composer; () = "
                    "one row at the calibrated radius (its risk still priced).")
    migration_budget: int = Field(
        default=4, ge=0, le=1000,
        description="Moves (swaps, relaunches) the placer may start per tick.")
    # Off: 3 seeds on hetero-12h 80.47 against 81.93 (koi-no-dro 83.53 against 84.41),
    # hetero-3h and real-104 within 0.2 (BENCHMARKS (t)); place._relaunchable
    reshard_batch: bool = Field(
        default=False,
        description="A batch job may be relaunched in place with another number of GPUs "
                    "per replica (tp2 ×32 → tp1 ×64 on the same GPUs).")
    compose_time_limit_s: float = Field(
        default=5.0, gt=0.0, le=3600.0,
        description="The composer's wall-clock limit: a safety net, since HiGHS stops at "
                    "its node limit first.")
    top_k: int = Field(
        default=40, ge=1, le=100_000,
        description="Candidates per job the composer chooses among.")
    proposer: InstanceOf[ProposerLimits] = Field(
        default_factory=lambda: ProposerLimits(max_per_job=120),
        description="The proposer's grid and its per-job cap (ProposerLimits; 120 a job).")
    weights: InstanceOf[ComposeWeights] = Field(
        default_factory=ComposeWeights,
        description="Weights of the composer's objective (ComposeWeights).")
    churn_hours: float = Field(
        default=1.0, ge=0.0, le=1000.0,
        description="A move costs this many hours of the new replicas' price.")
    churn: InstanceOf[ChurnSettings] = Field(
        default_factory=ChurnSettings.from_env,
        description="Plan stability: make-before-break for online shape changes, the "
                    "scale-down window and band, the cool-down, the move price and the "
                    "per-job limits (KOI_CHURN_*; koi.planner.churn_settings).")
    rate_headroom: float = Field(
        default=1.1, gt=0.0, le=10.0,
        description="Plan each online job for this multiple of its observed rate.")
    # 3.0 scored 63.6 against 70.1 at 1.0 on hetero-12h seed 1 (BENCHMARKS (m)), so it is off
    batch_pace: float = Field(
        default=1.0, ge=1.0, le=100.0,
        description="Batch work up to this multiple of its deadline's pace is worth running "
                    "on spare capacity (at ComposeWeights.ahead of a token beyond the pace).")
    backend: Literal["numba", "numpy"] = Field(
        default="numba",
        description="The predictor kernel: numba, or the plain-numpy reference.")
    calibration: InstanceOf[Calibration] | None = Field(
        default=None,
        description="The predictor's efficiency table; None = the fitted one (oracle-fit "
                    "passes the world's).")
    measure: Callable[..., Measured] | None = Field(
        default=None,
        description="Per-replica rates measured in the world, replacing the predicted ones "
                    "in the composer's table (candidates.Measure): only the true oracle has "
                    "one.")

    @field_validator("dro_outcomes")
    @classmethod
    def _robust_outcomes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(ROBUST_OUTCOMES))
        if unknown:
            raise ValueError(f"dro_outcomes: {', '.join(unknown)} not among"
                             f" {', '.join(ROBUST_OUTCOMES)}")
        return value


VARIANTS: dict[str, KoiSettings] = {
    "koi": KoiSettings(),
    "koi-no-causal": replace(KoiSettings(), use_beliefs=False),
    # beliefs and radius frozen at the prior
    "koi-no-learning": replace(KoiSettings(), learn=False),
    "koi-no-dro": replace(KoiSettings(), use_dro=False),
    # TTFT p95 planned on the beliefs' correction alone (no radius); the TPOT and
    # throughput radii stay. A variant, not an ablation: BENCHMARKS (m)
    "koi-ttft-nominal": replace(KoiSettings(), dro_outcomes=("tpot_p95", "throughput")),
    # the prior from measured kernel tables where they cover a shard, with the table
    # fitted for them (Calibration.kernels); off by default: docs/PREDICTOR.md
    "koi-kernels": replace(KoiSettings(), calibration=load_calibration(kernels=True)),
}


def settings_for(variant: str) -> KoiSettings:
    """The planner settings of a Koi variant (what the services run with KOI_POLICY)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown planner variant {variant!r}; known: "
                         f"{', '.join(VARIANTS)}")
    return VARIANTS[variant]
