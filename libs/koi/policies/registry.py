"""Every policy Koi is compared with, by name: the one list ``koi bench --policy NAME``
chooses from.

A policy is a class in its own module that names itself with ``@register("name")``
(``base``); it becomes choosable by one line in ``_classes`` below. Nothing registers by
being imported. The modules are imported on first use, so ``import koi.policies`` stays
cheap for commands that never build a policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

from koi.catalog import Catalog
from koi.policies.base import Policy


def _classes() -> tuple[type[Policy], ...]:
    from koi.policies import (
        autoscale,
        bandit,
        baselines,
        evolve,
        koi,
        llm,
        melange,
        oracle,
    )

    return (
        # what runs without Koi: first fit in arrival or deadline order, one fixed config
        baselines.FcfsFirstFit, baselines.EdfFirstFit, baselines.BestFixed,
        # Koi and its ablations (docs/PLANNER.md)
        koi.Koi, koi.KoiNoCausal, koi.KoiNoLearning, koi.KoiNoDro, koi.KoiTtftNominal,
        koi.KoiKernels,
        # the hidden world's planner, the reference every "% of oracle" divides by
        oracle.Oracle, oracle.OracleFit,
        # what practitioners run, profiled in the run's world and from the predictor
        bandit.ProfiledBandit, bandit.Bandit,
        evolve.ProfiledEvolve, evolve.Evolve,
        melange.ProfiledMelangeIlp, melange.MelangeIlp,
        autoscale.ProfiledRegressAutoscale, autoscale.RegressAutoscale,
        # the language-model layer (needs an endpoint: docs/RLM.md)
        llm.KoiRlm, llm.LlmOnly, llm.LlmTools,
    )


@cache
def _by_name() -> Mapping[str, type[Policy]]:
    by_name: dict[str, type[Policy]] = {}
    for cls in _classes():
        if not cls.name:
            raise TypeError(f"{cls.__qualname__} has no @register(name)")
        if cls.name in by_name:
            raise ValueError(f"policy {cls.name!r} listed twice "
                             f"({by_name[cls.name].__qualname__}, {cls.__qualname__})")
        by_name[cls.name] = cls
    return by_name


def policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``; unknown names list the known ones."""
    try:
        return _by_name()[name]
    except KeyError:
        known = ", ".join(policy_names())
        raise ValueError(f"unknown policy {name!r}; known policies: {known}") from None


def make_policy(name: str, catalog: Catalog | None = None, seed: int = 0) -> Policy:
    """Instantiate a registered policy; unknown names list the known ones."""
    return policy_class(name)(catalog=catalog, seed=seed)


def policy_names() -> list[str]:
    return sorted(_by_name())


def default_policy_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The policies a run without ``--policy`` takes: every registered one, less those
    that need a language model when no endpoint is configured."""
    from koi.rlm.settings import endpoint_configured

    names = policy_names()
    if endpoint_configured(environ):
        return names
    return [n for n in names if not _by_name()[n].needs_model]


def model_endpoint_problem(names: Sequence[str],
                           environ: Mapping[str, str] | None = None) -> str | None:
    """Why the policies ``names`` cannot run here (one needs a model and none is
    configured), or None."""
    from koi.rlm.settings import ModelEndpointMissing, require_endpoint

    wanting = [n for n in names if n in _by_name() and _by_name()[n].needs_model]
    if not wanting:
        return None
    try:
        require_endpoint(f"policy {', '.join(wanting)}", environ)
    except ModelEndpointMissing as err:
        return str(err)
    except ValueError as err:  # a bad KOI_RLM_* value
        return f"policy {', '.join(wanting)}: {err}"
    return None
