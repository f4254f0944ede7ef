"""Koi and its ablations as registered policies.

A thin shell around ``koi.planner.tick.plan_tick``: it keeps the planner state (beliefs,
DRO calibrator) between ticks and the per-tick reports (for the learning curves and
explanations). ``koi-no-causal`` drops beliefs and mechanisms, ``koi-no-learning``
freezes them (and the radius) at the prior, ``koi-no-dro`` plans on the nominal
prediction; ``koi-ttft-nominal`` (a variant) keeps every radius but TTFT p95's, and
``koi-kernels`` (a variant) times its prior from the measured kernel tables. No
planning logic here; the variants' settings are
``koi.planner.settings.VARIANTS`` (the services run the same ones).
"""

from __future__ import annotations

from collections.abc import Sequence

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.planner.settings import VARIANTS, KoiSettings
from koi.planner.tick import KoiState, TickReport, plan_tick
from koi.policies.base import Policy, register


class _KoiBase(Policy):
    settings: KoiSettings = VARIANTS["koi"]

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
    settings = VARIANTS["koi"]


@register("koi-no-causal")
class KoiNoCausal(_KoiBase):
    settings = VARIANTS["koi-no-causal"]


@register("koi-no-learning")
class KoiNoLearning(_KoiBase):
    settings = VARIANTS["koi-no-learning"]


@register("koi-no-dro")
class KoiNoDro(_KoiBase):
    settings = VARIANTS["koi-no-dro"]


@register("koi-ttft-nominal")
class KoiTtftNominal(_KoiBase):
    """Koi with TTFT p95 planned on the beliefs' correction alone (no radius); the TPOT
    and throughput radii stay. A variant, not an ablation: BENCHMARKS (m)."""

    settings = VARIANTS["koi-ttft-nominal"]


@register("koi-kernels")
class KoiKernels(_KoiBase):
    """Koi with the prior timed from measured kernel tables where they cover a shard
    (issue 31; not the default: docs/PREDICTOR.md)."""

    settings = VARIANTS["koi-kernels"]
