"""The policy interface and registry: every planner Koi is compared with is a Policy.

A policy is a pure decision function with its state kept on the object between ticks:
``decide(snapshot, telemetry) -> PlanDecision``. It never advances time, reads clocks or
touches I/O; the cluster (simulator or real) applies what it returns. Policies register
under a name so the benchmark picks them by that name. No policy logic lives here.
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

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        self.catalog = catalog or load_catalog()
        self.seed = seed

    def prepare(self, scenario: Scenario, seed: int) -> None:  # noqa: B027 - optional hook
        """Called once before a run; most policies need nothing from the scenario."""

    @abstractmethod
    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        """The actions for this tick, each with its reason."""


REGISTRY: dict[str, type[Policy]] = {}


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: make a policy available to ``koi bench --policy NAME``."""

    def wrap(cls: type[Policy]) -> type[Policy]:
        if name in REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return wrap


def make_policy(name: str, catalog: Catalog | None = None, seed: int = 0) -> Policy:
    """Instantiate a registered policy; unknown names list the known ones."""
    _load_builtin_policies()
    try:
        cls = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown policy {name!r}; known policies: {known}") from None
    return cls(catalog=catalog, seed=seed)


def policy_names() -> list[str]:
    _load_builtin_policies()
    return sorted(REGISTRY)


def _load_builtin_policies() -> None:
    """Import the modules whose classes register themselves."""
    from koi.policies import baselines, koi, oracle, practitioners  # noqa: F401
