"""The policy interface and registry: every planner Koi is compared with is a Policy.

A policy is a pure decision function with its state kept on the object between ticks:
``decide(snapshot, telemetry) -> PlanDecision``. It never advances time, reads clocks or
touches I/O; the cluster (simulator or real) applies what it returns. Policies register
under a name so the benchmark picks them by that name. No policy logic lives here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
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


def default_policy_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The policies a run without ``--policy`` takes: every registered one, less those
    that need a language model when no endpoint is configured."""
    from koi.rlm.settings import endpoint_configured

    names = policy_names()
    if endpoint_configured(environ):
        return names
    return [n for n in names if not REGISTRY[n].needs_model]


def model_endpoint_problem(names: Sequence[str],
                           environ: Mapping[str, str] | None = None) -> str | None:
    """Why the policies ``names`` cannot run here (one needs a model and none is
    configured), or None."""
    from koi.rlm.settings import ModelEndpointMissing, require_endpoint

    _load_builtin_policies()
    wanting = [n for n in names if n in REGISTRY and REGISTRY[n].needs_model]
    if not wanting:
        return None
    try:
        require_endpoint(f"policy {', '.join(wanting)}", environ)
    except ModelEndpointMissing as err:
        return str(err)
    except ValueError as err:  # a bad KOI_RLM_* value
        return f"policy {', '.join(wanting)}: {err}"
    return None


def _load_builtin_policies() -> None:
    """Import the modules whose classes register themselves."""
    from koi.policies import baselines, koi, llm, oracle, practitioners  # noqa: F401
