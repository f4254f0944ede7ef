"""The policy interface: every planner Koi is compared with is a Policy.

A policy is a pure decision function with its state kept on the object between ticks:
``decide(snapshot, telemetry) -> PlanDecision``. It never advances time, reads clocks or
touches I/O; the cluster (simulator or real) applies what it returns. Policies register
under a name (``register``); ``registry`` lists them. No policy logic lives here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from koi.catalog import Catalog, load_catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.scenario.types import Scenario


class Policy(ABC):
    """Base class of planning policies."""

    name: ClassVar[str] = ""
    # True: it asks a language model (KOI_RLM_BASE_URL, KOI_RLM_MODEL) and refuses
    # to start without one; left out of the default set then (``default_policy_names``)
    needs_model: ClassVar[bool] = False

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        self.catalog = catalog or load_catalog()
        self.seed = seed

    def prepare(self, scenario: Scenario, seed: int) -> None:  # noqa: B027 - optional hook
        """Called once before a run; most policies need nothing from the scenario."""

    @abstractmethod
    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        """The actions for this tick, each with its reason."""


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: the name ``koi bench --policy NAME`` knows the policy by. The
    policy becomes choosable by its line in ``koi.policies.registry``."""

    def wrap(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        return cls

    return wrap
