"""Koi and its ablations as registered policies.

A thin shell around ``koi.planner.tick.plan_tick``: it keeps the planner state (beliefs,
DRO calibrator) between ticks and the per-tick reports (for the learning curves and
explanations). ``koi-no-causal`` drops beliefs and mechanisms, ``koi-no-learning``
freezes them (and the radius) at the prior, ``koi-no-dro`` plans on the nominal
prediction; ``koi-ttft-nominal`` (a variant) keeps every radius but TTFT p95's. No
planning logic here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.planner.tick import KoiSettings, KoiState, TickReport, plan_tick
from koi.policies.base import Policy, register


class _KoiBase(Policy):
    settings = KoiSettings()

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog, seed)
        self.state = KoiState.initial(self.settings)
        self.reports: list[TickReport] = []

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        decision, report, self.state = plan_tick(snapshot, telemetry, self.state,
                                                 self.settings, self.catalog)
        self.reports.append(report)
        return decision


@register("koi")
class Koi(_KoiBase):
    settings = KoiSettings()


@register("koi-no-causal")
class KoiNoCausal(_KoiBase):
    settings = replace(KoiSettings(), use_beliefs=False)


@register("koi-no-learning")
class KoiNoLearning(_KoiBase):
    settings = replace(KoiSettings(), learn=False)


@register("koi-no-dro")
class KoiNoDro(_KoiBase):
    settings = replace(KoiSettings(), use_dro=False)


@register("koi-ttft-nominal")
class KoiTtftNominal(_KoiBase):
    """Koi with TTFT p95 planned on the beliefs' correction alone (no radius); the TPOT
    and throughput radii stay. A variant, not an ablation: BENCHMARKS (m)."""

    settings = replace(KoiSettings(), dro_outcomes=("tpot_p95", "throughput"))


PLANNER_VARIANTS: dict[str, type[_KoiBase]] = {
    "koi": Koi, "koi-no-causal": KoiNoCausal, "koi-no-learning": KoiNoLearning,
    "koi-no-dro": KoiNoDro, "koi-ttft-nominal": KoiTtftNominal,
}


def settings_for(variant: str) -> KoiSettings:
    """The planner settings of a Koi variant (what the services run with KOI_POLICY)."""
    if variant not in PLANNER_VARIANTS:
        raise ValueError(f"unknown planner variant {variant!r}; known: "
                         f"{', '.join(PLANNER_VARIANTS)}")
    return PLANNER_VARIANTS[variant].settings
