"""Engine-default replica shapes that validate, and the price to judge them by.

"Which engine-default configurations of a model fit an accelerator" (at the
tensor-parallel degrees and weight precisions the offline searches consider) and "the
cheapest on-demand offering of an accelerator": the baselines ask these to choose, and
the metrics ask them to set the reference $/token, so both get the same answers. Pure
functions over the catalog and ``koi.space`` (validation results are cached per
catalog); no policy decisions, no clocks or randomness.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from koi.catalog import Catalog, Market, Offering
from koi.space import DeploymentConfig, engine_default_config, validate

TP_LADDER: tuple[int, ...] = (1, 2, 4, 8)
"""Tensor-parallel degrees the baselines consider (single node, powers of two)."""

PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
"""Weight precisions the offline searches consider; validation drops fp8 where unsupported."""

_CONFIG_CACHE: weakref.WeakKeyDictionary[Catalog, dict[tuple, DeploymentConfig | None]] = (
    weakref.WeakKeyDictionary())


# --- configurations ---------------------------------------------------------------------

def default_config(model: str, accelerator: str, catalog: Catalog, *, tp: int,
                   precision: str = "bf16", engine: str = "vllm") -> DeploymentConfig | None:
    """The engine-default config at this TP and precision, or None if it does not validate.

    Cached per catalog: validation is pure, and the baselines ask the same question for
    every job of a model on every tick.
    """
    cache = _CONFIG_CACHE.setdefault(catalog, {})
    key = (model, accelerator, tp, precision, engine)
    if key not in cache:
        cfg = engine_default_config(model, accelerator, engine, catalog=catalog, tp=tp,
                                    weight_precision=precision)
        cache[key] = None if validate(cfg, catalog) else cfg
    return cache[key]


def smallest_fitting_config(model: str, accelerator: str, catalog: Catalog, *,
                            precision: str = "bf16",
                            engine: str = "vllm") -> DeploymentConfig | None:
    """The engine-default config at the smallest TP in ``TP_LADDER`` that validates."""
    for tp in TP_LADDER:
        cfg = default_config(model, accelerator, catalog, tp=tp, precision=precision,
                             engine=engine)
        if cfg is not None:
            return cfg
    return None


def valid_default_configs(model: str, accelerator: str, catalog: Catalog, *,
                          tps: Sequence[int] = TP_LADDER,
                          precisions: Sequence[str] = PRECISIONS,
                          engine: str = "vllm") -> list[DeploymentConfig]:
    """Every engine-default config over ``tps`` × ``precisions`` that validates."""
    out = []
    for tp in tps:
        for precision in precisions:
            cfg = default_config(model, accelerator, catalog, tp=tp, precision=precision,
                                 engine=engine)
            if cfg is not None:
                out.append(cfg)
    return out


def shape_label(cfg: DeploymentConfig) -> str:
    """"h100-sxm tp2 fp8" for reasons, with the engine named when it is not vLLM (the
    default, and the only engine the predictor-profiled baselines consider)."""
    engine = "" if cfg.engine == "vllm" else f" {cfg.engine}"
    return f"{cfg.accelerator} tp{cfg.tp} {cfg.weight_precision}{engine}"


def cheapest_on_demand(accelerator: str, catalog: Catalog) -> Offering | None:
    """The catalog's cheapest on-demand offering of an accelerator (None if none sells it)."""
    offers = catalog.offerings_for(accelerator_id=accelerator, market=Market.ON_DEMAND)
    return offers[0] if offers else None
