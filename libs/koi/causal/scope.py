"""Scopes: where a belief applies, and the back-off lattice from specific to general.

A ``Scope`` is (accelerator, family, engine, model-size class, parallelism bucket), each
either a value or ``"*"``. ``scope_of`` derives the most specific scope of a deployment;
``generalisations`` lists every scope that contains it, most specific first, in a fixed
order (the back-off order of lookups); ``contains`` is the partial order.

The accelerator dimension has three levels — part (``l4``), family (``ada``), any — so
that what is learnt on an H100 can reach an H200 before the H200 has its own evidence.
No beliefs and no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from koi.catalog import Catalog
from koi.space import DeploymentConfig

ANY = "*"

SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (10.0, "≤10B"), (40.0, "10–40B"), (100.0, "40–100B"), (float("inf"), ">100B"))


@dataclass(frozen=True, slots=True, order=True)
class Scope:
    """Where a belief applies; ``"*"`` is a wildcard.

    Build deployment scopes with ``scope_of`` so that ``family`` is filled in: an
    accelerator-specific scope with ``family="*"`` is valid but will not meet the
    evidence filed under the same part with its family.
    """

    accelerator: str = ANY
    engine: str = ANY
    size_class: str = ANY
    parallelism: str = ANY
    family: str = ANY

    def key(self) -> str:
        """Canonical text key (stable across versions; used in hashes and JSON)."""
        return "|".join((self.accelerator, self.family, self.engine, self.size_class,
                         self.parallelism))

    @staticmethod
    def from_key(key: str) -> Scope:
        acc, fam, eng, size, par = key.split("|")
        return Scope(accelerator=acc, engine=eng, size_class=size, parallelism=par, family=fam)

    @property
    def specificity(self) -> int:
        """0 for ``*``; the accelerator part counts 2, its family 1, others 1 each."""
        acc = 2 if self.accelerator != ANY else (1 if self.family != ANY else 0)
        return acc + sum(v != ANY for v in (self.engine, self.size_class, self.parallelism))

    def label(self) -> str:
        """Operator form: ``{l4, vllm, ≤10B, tp1}``; wildcards left out; ``{*}`` for all."""
        acc = self.accelerator if self.accelerator != ANY else self.family
        parts = [v for v in (acc, self.engine, self.size_class, self.parallelism) if v != ANY]
        return "{" + (", ".join(parts) if parts else "*") + "}"

    def __str__(self) -> str:
        return self.label()


GLOBAL = Scope()


def size_class(params_b: float) -> str:
    """Model-size class from total parameters (billions)."""
    for bound, name in SIZE_CLASSES:
        if params_b <= bound:
            return name
    return SIZE_CLASSES[-1][1]


def parallelism_bucket(config: DeploymentConfig) -> str:
    """``pp>1`` for any pipeline split, ``ep>1`` for expert parallel, else by TP degree."""
    if config.pp > 1:
        return "pp>1"
    if config.ep > 1:
        return "ep>1"
    if config.tp <= 1:
        return "tp1"
    if config.tp <= 2:
        return "tp2"
    if config.tp <= 4:
        return "tp4"
    return "tp8+"


def scope_of(config: DeploymentConfig, catalog: Catalog) -> Scope:
    """The most specific scope of a deployment."""
    acc = catalog.accelerator(config.accelerator)
    model = catalog.model(config.model)
    return Scope(accelerator=config.accelerator, engine=config.engine,
                 size_class=size_class(model.params_b), parallelism=parallelism_bucket(config),
                 family=acc.family)


def _accelerator_levels(scope: Scope) -> list[tuple[str, str, int]]:
    """(accelerator, family, level) from most to least specific."""
    levels: list[tuple[str, str, int]] = []
    if scope.accelerator != ANY:
        levels.append((scope.accelerator, scope.family, 2))
    if scope.family != ANY:
        levels.append((ANY, scope.family, 1))
    levels.append((ANY, ANY, 0))
    return levels


@lru_cache(maxsize=4096)
def generalisations(scope: Scope) -> tuple[Scope, ...]:
    """Every scope containing ``scope`` (itself first, ``*`` last), deterministic order.

    Sorted by specificity, most specific first; among equally specific scopes the one
    keeping the more important dimensions wins, in the order accelerator > size class >
    parallelism > engine (the hardware and the model size move serving numbers most).
    """
    out: list[tuple[tuple[int, ...], Scope]] = []
    for acc, fam, acc_level in _accelerator_levels(scope):
        for size in {scope.size_class, ANY}:
            for par in {scope.parallelism, ANY}:
                for eng in {scope.engine, ANY}:
                    levels = (acc_level, int(size != ANY), int(par != ANY), int(eng != ANY))
                    s = Scope(accelerator=acc, engine=eng, size_class=size, parallelism=par,
                              family=fam)
                    out.append(((-sum(levels), *(-v for v in levels)), s))
    out.sort(key=lambda item: item[0])
    return tuple(s for _, s in out)


def contains(general: Scope, specific: Scope) -> bool:
    """Whether every deployment in ``specific`` is also in ``general``."""
    return all(g in (ANY, s) for g, s in (
        (general.accelerator, specific.accelerator), (general.family, specific.family),
        (general.engine, specific.engine), (general.size_class, specific.size_class),
        (general.parallelism, specific.parallelism)))


def join(scopes: Iterable[Scope]) -> Scope:
    """The most specific scope containing all of ``scopes`` (``*`` where they differ)."""
    items = list(scopes)
    if not items:
        return GLOBAL

    def common(values: list[str]) -> str:
        return values[0] if all(v == values[0] for v in values) else ANY

    return Scope(accelerator=common([s.accelerator for s in items]),
                 engine=common([s.engine for s in items]),
                 size_class=common([s.size_class for s in items]),
                 parallelism=common([s.parallelism for s in items]),
                 family=common([s.family for s in items]))
