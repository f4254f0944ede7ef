"""``koi.space.DeploymentConfig`` ⇄ ``koi.v1.DeploymentConfig``.

Proto field names are the knob names, so the conversion walks the dataclass fields:
enums through ``EnumCodec``, scalars as they are. Encoding sets every knob explicitly;
decoding takes an absent ``optional`` knob as the dataclass default, rejects an
UNSPECIFIED enum, an empty model/accelerator/engine, a knob outside its bounds and ids
the catalog does not know, each as an ``InvalidConfigError`` naming the knob.
Cross-knob feasibility (memory fit, engine support) is ``koi.space.validate``'s job;
pass ``strict=True`` to run it too. No bytes handling and no transport here.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from koi.catalog import Catalog, load_catalog
from koi.errors import InvalidConfigError
from koi.space import (
    DeploymentConfig,
    KvDtype,
    Precision,
    PreemptionMode,
    SchedulingPolicy,
    SpecDecode,
    check,
)
from koi.v1 import config_pb2
from koi.wire._enums import EnumCodec, has_field

KNOB_ENUMS: dict[str, EnumCodec[Any]] = {
    "weight_precision": EnumCodec(Precision, config_pb2.Precision),
    "kv_dtype": EnumCodec(KvDtype, config_pb2.KvDtype),
    "spec_decode": EnumCodec(SpecDecode, config_pb2.SpecDecode),
    "scheduling_policy": EnumCodec(SchedulingPolicy, config_pb2.SchedulingPolicy),
    "preemption_mode": EnumCodec(PreemptionMode, config_pb2.PreemptionMode),
}
REQUIRED_IDS = ("model", "accelerator", "engine")
_PROTO_FIELDS = config_pb2.DeploymentConfig.DESCRIPTOR.fields_by_name


# The planner sends the same few thousand configurations tick after tick: both directions
# are memoised (configs are frozen; a decoded one is keyed by its bytes and the catalog it
# was checked against, so a hit is exactly what decoding again would return).
_CACHE_MAX = 50_000
_ENCODED: dict[DeploymentConfig, bytes] = {}
_DECODED: dict[tuple[bytes, int, bool], tuple[Catalog | None, DeploymentConfig]] = {}


def config_to_proto(cfg: DeploymentConfig) -> config_pb2.DeploymentConfig:
    """Every knob of ``cfg``, set explicitly (so other languages see the values)."""
    data = _ENCODED.get(cfg)
    if data is not None:
        return config_pb2.DeploymentConfig.FromString(data)
    msg = _config_to_proto(cfg)
    if len(_ENCODED) >= _CACHE_MAX:
        _ENCODED.clear()
    _ENCODED[cfg] = msg.SerializeToString(deterministic=True)
    return msg


def _config_to_proto(cfg: DeploymentConfig) -> config_pb2.DeploymentConfig:
    msg = config_pb2.DeploymentConfig()
    for f in fields(DeploymentConfig):
        value = getattr(cfg, f.name)
        codec = KNOB_ENUMS.get(f.name)
        try:
            setattr(msg, f.name, codec.to_proto(value) if codec else value)
        except (TypeError, ValueError, KeyError) as e:
            raise InvalidConfigError(f.name, f"cannot encode {value!r}: {e}") from None
    return msg


def config_from_proto(msg: config_pb2.DeploymentConfig, *, catalog: Catalog | None = None,
                      strict: bool = False) -> DeploymentConfig:
    """Decode and check a config; ``strict`` also runs ``koi.space.check``."""
    key = (msg.SerializeToString(deterministic=True), id(catalog), strict)
    hit = _DECODED.get(key)
    if hit is not None and hit[0] is catalog:
        return hit[1]
    cfg = _config_from_proto(msg, catalog=catalog, strict=strict)
    if len(_DECODED) >= _CACHE_MAX:
        _DECODED.clear()
    _DECODED[key] = (catalog, cfg)
    return cfg


def _config_from_proto(msg: config_pb2.DeploymentConfig, *, catalog: Catalog | None,
                       strict: bool) -> DeploymentConfig:
    kwargs: dict[str, Any] = {}
    for f in fields(DeploymentConfig):
        name = f.name
        codec = KNOB_ENUMS.get(name)
        if codec is not None:
            kwargs[name] = codec.from_proto(getattr(msg, name), name, InvalidConfigError)
        elif not _PROTO_FIELDS[name].has_presence or has_field(msg, name):
            kwargs[name] = getattr(msg, name)
    for name in REQUIRED_IDS:
        if not kwargs[name]:
            raise InvalidConfigError(name, "missing (required): an id from the catalog")
    cfg = DeploymentConfig(**kwargs)
    check_knob_bounds(cfg)
    cat = catalog if catalog is not None else load_catalog()
    check_catalog_ids(cfg, cat)
    return check(cfg, cat) if strict else cfg


def check_knob_bounds(cfg: DeploymentConfig) -> None:
    """Raise for the first knob outside its own min/max/choices (field metadata)."""
    for f in fields(DeploymentConfig):
        value, meta = getattr(cfg, f.name), f.metadata
        if "min" in meta and value < meta["min"]:
            raise InvalidConfigError(f.name, f"{value} is below the minimum {meta['min']}")
        if "max" in meta and value > meta["max"]:
            raise InvalidConfigError(f.name, f"{value} is above the maximum {meta['max']}")
        choices = meta.get("choices")
        if choices and value not in choices:
            allowed = ", ".join(str(getattr(c, "value", c)) for c in choices)
            raise InvalidConfigError(f.name, f"{value!r} is not one of {allowed}")
        if isinstance(value, float) and value != value:  # NaN passes both bounds
            raise InvalidConfigError(f.name, "must be a number (got NaN)")


def check_catalog_ids(cfg: DeploymentConfig, catalog: Catalog) -> None:
    """Raise for the first id (model, accelerator, engine, offering...) the catalog lacks."""
    lookups = (("model", catalog.model), ("accelerator", catalog.accelerator),
               ("engine", catalog.engine), ("offering", catalog.offering),
               ("prefill_accelerator", catalog.accelerator))
    for name, lookup in lookups:
        value = getattr(cfg, name)
        if not value:
            continue  # offering and prefill_accelerator may be '' (any / same)
        try:
            lookup(value)
        except KeyError as e:
            raise InvalidConfigError(name, str(e.args[0]) if e.args else repr(value)) from None
