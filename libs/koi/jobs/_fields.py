"""Field metadata and bound checks shared by the job dataclasses.

Every job field carries its default, a description and its bounds in one place
(``spec_field``), so validation, the YAML parser and docs/JOBS.md agree. No I/O here.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import MISSING, field, fields
from typing import Any

from koi.errors import InvalidSpecError

_BOUND_OPS = {
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "lt": (operator.lt, "<"),
    "le": (operator.le, "<="),
}


def spec_field(default: Any = MISSING, help: str = "", *, compare: bool = True,
               repr: bool = True, **bounds: Any) -> Any:
    """A dataclass field with its description and bounds (gt/ge/lt/le/choices) as metadata."""
    meta = {"help": help, **bounds}
    if default is MISSING:
        return field(metadata=meta, compare=compare, repr=repr)
    return field(default=default, metadata=meta, compare=compare, repr=repr)


def meta(help: str, **bounds: Any) -> dict[str, Any]:
    """Field metadata for fields declared with ``dataclasses.field`` directly."""
    return {"help": help, **bounds}


def check_bounds(obj: Any, names: Iterable[str] | None = None) -> None:
    """Raise ``InvalidSpecError`` naming the first field of ``obj`` outside its bounds."""
    wanted = set(names) if names is not None else None
    for f in fields(obj):
        if wanted is not None and f.name not in wanted:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        meta = f.metadata
        choices = meta.get("choices")
        if choices and value not in choices:
            raise InvalidSpecError(f.name, f"{value!r} is not one of {', '.join(choices)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidSpecError(f.name, f"must be a finite number (got {value})")
        for key, (op, sym) in _BOUND_OPS.items():
            if key in meta and not op(value, meta[key]):
                raise InvalidSpecError(f.name, f"must be {sym} {meta[key]} (got {fmt(value)})")


def describe_bounds(meta: dict[str, Any]) -> str:
    """Human-readable bounds of one field, e.g. '> 0, <= 9' (used by error hints and docs)."""
    parts = [f"{sym} {meta[key]}" for key, (_, sym) in _BOUND_OPS.items() if key in meta]
    return ", ".join(parts)


def fmt(value: Any) -> str:
    """A number as a user wrote it: -5.0 reads back as -5."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)
