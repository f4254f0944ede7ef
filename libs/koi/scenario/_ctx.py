"""Error context for scenario files: field paths, and "file line N" in every message.

``ScenarioCtx`` is ``koi.jobs``' parse context with one change: the source reads
``hetero-3h.yaml line 42`` (the form trace errors already use) instead of
``hetero-3h.yaml:42``, so that job errors raised inside a scenario read the same as the
scenario's own. ``bounded`` keeps any error one line of bounded length. Field helpers
for durations and counts live here too. No YAML reading.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from koi.errors import InvalidSpecError
from koi.jobs.parse import Ctx
from koi.scenario.durations import parse_duration

_MISSING = object()


@dataclass(frozen=True)
class ScenarioCtx(Ctx):
    def error(self, key: str, reason: str) -> InvalidSpecError:
        e = super().error(key, reason)
        return InvalidSpecError(e.field, e.reason, source=relined(e.source, self.source))


def relined(where: str, source: str) -> str:
    """``file:42`` → ``file line 42`` (anything else is returned unchanged)."""
    prefix = f"{source}:"
    if where.startswith(prefix) and where[len(prefix):].isdigit():
        return f"{source} line {where[len(prefix):]}"
    return where


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def duration(ctx: Ctx, data: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    """Seconds from ``3h``/``90m``/``45s`` or a number; the caller checks the bounds."""
    if key not in data or data[key] is None:
        if default is _MISSING:
            raise ctx.error(key, "missing (required); seconds or a duration such as '3h'")
        return default
    try:
        return parse_duration(data[key])
    except ValueError as e:
        raise ctx.error(key, str(e)) from None


def integer(ctx: Ctx, data: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    if key not in data:
        if default is _MISSING:
            raise ctx.error(key, "missing (required)")
        return default
    value = data[key]
    # int() of NaN or inf raises (ValueError, OverflowError): test finiteness first
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value != int(value)):
        raise ctx.error(key, f"must be an integer (got {show(value)})")
    return int(value)


def text(ctx: Ctx, data: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    if key not in data or data[key] is None:
        if default is _MISSING:
            raise ctx.error(key, "missing (required)")
        return default
    value = data[key]
    if not isinstance(value, str):
        raise ctx.error(key, f"must be a string (got {show(value)})")
    return value


def unknown(what: str, value: str, known: Iterable[str]) -> str:
    """``unknown accelerator 'h100'; did you mean h100-sxm?`` (or the known ids)."""
    known = sorted(known)
    close = difflib.get_close_matches(value, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
    return f"unknown {what} {value!r}; {hint}"
