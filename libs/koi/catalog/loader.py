"""Load and validate the catalog YAML files into typed, read-only records.

``load_catalog()`` reads ``accelerators.yaml``, ``offerings.yaml``, ``models.yaml`` and
``engines.yaml`` from ``catalog/data/`` (or a directory you name), checks every record and
returns a ``Catalog``: the records by id plus lookups that fail with a ``CatalogError``
naming what is wrong and the closest known ids.

Every load error names the file, the record id and the field. This module holds loading
and lookup only: no pricing policy, no prediction, and no transport imports.
"""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from koi.catalog.types import Accelerator, Engine, Market, Model, Offering
from koi.errors import KoiError

DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "data"

FILES = {
    "accelerator": "accelerators.yaml",
    "offering": "offerings.yaml",
    "model": "models.yaml",
    "engine": "engines.yaml",
}

KNOWN_VENDORS = frozenset({"nvidia", "amd", "intel"})
WEIGHT_PRECISIONS = frozenset({"bf16", "fp16", "fp8", "int8", "int4", "fp4"})
KV_DTYPES = frozenset({"auto", "bf16", "fp16", "fp8"})

R = TypeVar("R")


class CatalogError(KoiError, KeyError):
    """An unknown catalog id, or a catalog file that does not validate.

    A ``KeyError`` so that lookups can be caught like a dict miss; ``str()`` gives the
    plain message (``KeyError`` would otherwise quote it).
    """

    def __init__(self, message: str, *, kind: str = "", key: str = "", file: str = "",
                 field: str = "", suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.key = key
        self.file = file
        self.field = field
        self.suggestions = suggestions

    def __str__(self) -> str:
        return self.message


def _unknown(kind: str, key: str, known: Iterable[str]) -> CatalogError:
    known = sorted(known)
    close = tuple(difflib.get_close_matches(key, known, n=3, cutoff=0.5))
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    sample = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return CatalogError(f"unknown {kind} {key!r}{hint} (known: {sample})",
                        kind=kind, key=key, suggestions=close)


@dataclass(frozen=True, eq=False)
class Catalog:
    """All catalog records, by id. Read-only mappings; use the lookup methods for errors."""

    accelerators: Mapping[str, Accelerator]
    offerings: Mapping[str, Offering]
    models: Mapping[str, Model]
    engines: Mapping[str, Engine]
    data_dir: Path = DEFAULT_DATA_DIR

    def accelerator(self, id: str) -> Accelerator:
        return self._get("accelerator", self.accelerators, id)

    def model(self, id: str) -> Model:
        return self._get("model", self.models, id)

    def engine(self, id: str) -> Engine:
        return self._get("engine", self.engines, id)

    def offering(self, id: str) -> Offering:
        return self._get("offering", self.offerings, id)

    @property
    def clouds(self) -> tuple[str, ...]:
        return tuple(sorted({o.cloud for o in self.offerings.values()}))

    @property
    def regions(self) -> tuple[str, ...]:
        """Distinct ``cloud/region`` pairs."""
        return tuple(sorted({f"{o.cloud}/{o.region}" for o in self.offerings.values()}))

    def offerings_for(self, accelerator_id: str | None = None, cloud: str | None = None,
                      market: Market | str | None = None) -> list[Offering]:
        """Offerings matching every filter given, cheapest first (ties by id).

        An accelerator or cloud that the catalog does not know raises ``CatalogError``
        (a typo should not read as "nothing on sale"); a known accelerator that no cloud
        sells gives ``[]``.
        """
        if accelerator_id is not None and accelerator_id not in self.accelerators:
            raise _unknown("accelerator", accelerator_id, self.accelerators)
        if cloud is not None and cloud not in self.clouds:
            raise _unknown("cloud", cloud, self.clouds)
        want_market: Market | None = None
        if market is not None:
            try:
                want_market = Market(market)
            except ValueError:
                raise _unknown("market", str(market), (m.value for m in Market)) from None
        out = [
            o for o in self.offerings.values()
            if (accelerator_id is None or o.accelerator == accelerator_id)
            and (cloud is None or o.cloud == cloud)
            and (want_market is None or o.market == want_market)
        ]
        return sorted(out, key=lambda o: (o.usd_per_gpu_hour, o.id))

    @staticmethod
    def _get(kind: str, table: Mapping[str, R], key: str) -> R:
        try:
            return table[key]
        except (KeyError, TypeError):
            raise _unknown(kind, str(key), table) from None


def load_catalog(data_dir: Path | str | None = None) -> Catalog:
    """Load and validate the catalog. The default directory is read once and cached."""
    if data_dir is None:
        return _load_default()
    return _load(Path(data_dir))


@functools.lru_cache(maxsize=1)
def _load_default() -> Catalog:
    return _load(DEFAULT_DATA_DIR)


# --------------------------------------------------------------------------- loading


def _load(data_dir: Path) -> Catalog:
    accelerators = _load_records(data_dir, "accelerator", Accelerator, _check_accelerator)
    models = _load_records(data_dir, "model", Model, _check_model)
    engines = _load_records(data_dir, "engine", Engine, _check_engine)
    offerings = _load_records(
        data_dir, "offering", Offering,
        functools.partial(_check_offering, accelerators=accelerators),
    )
    return Catalog(
        accelerators=types.MappingProxyType(accelerators),
        offerings=types.MappingProxyType(offerings),
        models=types.MappingProxyType(models),
        engines=types.MappingProxyType(engines),
        data_dir=data_dir,
    )


class _Problem(Exception):
    """Raised by the per-field checks; turned into a CatalogError with file + id."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _load_records(data_dir: Path, kind: str, cls: type[R],
                  check: Callable[[Any], None]) -> dict[str, R]:
    path = data_dir / FILES[kind]
    fname = path.name

    def err(record_id: str, field: str, reason: str) -> CatalogError:
        where = f"record {record_id!r}" if record_id else "file"
        return CatalogError(f"{fname}: {where}: field {field!r}: {reason}", kind=kind,
                            key=record_id, file=fname, field=field)

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise err("", "-", f"missing catalog file {path}") from None
    except yaml.YAMLError as e:
        raise err("", "-", f"invalid YAML: {e}") from None
    if not isinstance(raw, list):
        raise err("", "-", f"expected a list of {kind} records, got {type(raw).__name__}")

    spec = _field_spec(cls)
    out: dict[str, R] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise err(f"#{i}", "-", f"expected a mapping, got {type(item).__name__}")
        rid = item.get("id")
        if not isinstance(rid, str) or not rid.strip():
            raise err(f"#{i}", "id", "missing or empty id")
        unknown = sorted(set(item) - set(spec))
        if unknown:
            names = ", ".join(map(str, unknown))
            close = difflib.get_close_matches(str(unknown[0]), list(spec), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise err(rid, str(unknown[0]), f"unknown field(s) {names}{hint}")
        missing = [n for n, (_, required) in spec.items() if required and n not in item]
        if missing:
            raise err(rid, missing[0], f"missing required field(s) {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name, value in item.items():
            try:
                values[name] = _convert(name, value, spec[name][0])
            except _Problem as p:
                raise err(rid, p.field, p.reason) from None
        record = cls(**values)
        try:
            check(record)
        except _Problem as p:
            raise err(rid, p.field, p.reason) from None
        if rid in out:
            raise err(rid, "id", f"duplicate id (record #{i})")
        out[rid] = record
    return out


def _field_spec(cls: type) -> dict[str, tuple[Any, bool]]:
    """name -> (resolved type, required?) for a record dataclass."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: (hints[f.name], f.default is MISSING and f.default_factory is MISSING)
        for f in fields(cls)
    }


def _convert(name: str, value: Any, tp: Any) -> Any:
    """Check one YAML value against the field's type and convert it."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            raise _Problem(name, f"{value!r} is not one of {allowed}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise _Problem(name, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Problem(name, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Problem(name, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise _Problem(name, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _Problem(name, f"expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Problem(name, f"expected a list of strings, got {value!r}")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise _Problem(name, f"expected a mapping of strings to strings, got {value!r}")
        return dict(value)
    raise _Problem(name, f"unsupported field type {tp!r}")  # pragma: no cover


# --------------------------------------------------------------------------- checks


def _positive(record: Any, *names: str) -> None:
    for n in names:
        if getattr(record, n) <= 0:
            raise _Problem(n, f"must be > 0, got {getattr(record, n)}")


def _non_negative(record: Any, *names: str) -> None:
    for n in names:
        if getattr(record, n) < 0:
            raise _Problem(n, f"must be >= 0, got {getattr(record, n)}")


def _non_empty(record: Any, *names: str) -> None:
    for n in names:
        if not str(getattr(record, n)).strip():
            raise _Problem(n, "must not be empty")


def _check_accelerator(a: Accelerator) -> None:
    _non_empty(a, "source", "vendor", "family")
    if a.vendor not in KNOWN_VENDORS:
        raise _Problem("vendor", f"{a.vendor!r} is not one of {', '.join(sorted(KNOWN_VENDORS))}")
    _positive(a, "memory_gb", "hbm_bandwidth_tb_s", "bf16_tflops", "interconnect_gb_s",
              "interconnect_latency_us", "gpus_per_node", "max_nodes_nvlink_domain")
    _non_negative(a, "fp8_tflops", "fp4_tflops", "int8_tops")


def _check_offering(o: Offering, *, accelerators: Mapping[str, Accelerator]) -> None:
    _non_empty(o, "source", "cloud", "region")
    if o.accelerator not in accelerators:
        close = difflib.get_close_matches(o.accelerator, list(accelerators), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _Problem("accelerator", f"unknown accelerator {o.accelerator!r}{hint}")
    expected = f"{o.cloud}/{o.region}/{o.accelerator}/{o.market.value}"
    if o.id != expected:
        raise _Problem("id", f"must be cloud/region/accelerator/market = {expected!r}")
    _positive(o, "usd_per_gpu_hour", "gpus_per_instance")
    _non_negative(o, "preemption_rate_per_hour", "preemption_notice_s")
    if o.market != Market.SPOT and o.preemption_rate_per_hour != 0:
        raise _Problem("preemption_rate_per_hour", f"must be 0 for a {o.market.value} "
                                                   f"offering, got {o.preemption_rate_per_hour}")


def _check_model(m: Model) -> None:
    _non_empty(m, "source", "hf_repo")
    _positive(m, "params_b", "active_params_b", "num_layers", "hidden_size",
              "intermediate_size", "num_attention_heads", "num_kv_heads", "head_dim",
              "vocab_size", "max_context")
    _non_negative(m, "num_experts", "experts_per_token", "num_shared_experts",
                  "moe_intermediate_size", "first_dense_layers", "mla_kv_lora_rank",
                  "mla_rope_head_dim")
    if m.active_params_b > m.params_b:
        raise _Problem("active_params_b",
                       f"{m.active_params_b} exceeds the total params_b {m.params_b}")
    if m.num_attention_heads % m.num_kv_heads:
        raise _Problem("num_kv_heads", f"{m.num_kv_heads} does not divide "
                                       f"{m.num_attention_heads} attention heads")
    if m.is_moe:
        for n in ("experts_per_token", "moe_intermediate_size"):
            _positive(m, n)
        if m.experts_per_token > m.num_experts:
            raise _Problem("experts_per_token",
                           f"{m.experts_per_token} exceeds num_experts {m.num_experts}")
        if m.first_dense_layers >= m.num_layers:
            raise _Problem("first_dense_layers", "leaves no MoE layer")
    else:
        for n in ("experts_per_token", "num_shared_experts", "moe_intermediate_size",
                  "first_dense_layers"):
            if getattr(m, n):
                raise _Problem(n, "set on a dense model (num_experts is 0)")
        if m.active_params_b != m.params_b:
            raise _Problem("active_params_b", "a dense model's active params equal params_b")
    if (m.mla_kv_lora_rank > 0) != (m.mla_rope_head_dim > 0):
        raise _Problem("mla_rope_head_dim", "MLA needs both mla_kv_lora_rank and "
                                            "mla_rope_head_dim, or neither")


def _check_engine(e: Engine) -> None:
    _non_empty(e, "source", "name")
    _positive(e, "default_max_num_seqs", "default_max_batched_tokens")
    if not 0 < e.default_gpu_mem_fraction <= 1:
        raise _Problem("default_gpu_mem_fraction",
                       f"must be in (0, 1], got {e.default_gpu_mem_fraction}")
    for name, allowed in (("weight_precisions", WEIGHT_PRECISIONS), ("kv_dtypes", KV_DTYPES),
                          ("accelerator_vendors", KNOWN_VENDORS)):
        values = getattr(e, name)
        if not values:
            raise _Problem(name, "must not be empty")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise _Problem(name, f"{', '.join(bad)} not in {', '.join(sorted(allowed))}")
