"""Durations in scenario files: seconds as a number, or strings such as "3h", "90m", "1h30m".

``parse_duration`` turns either form into seconds (a float) and raises ``ValueError``
with a readable reason; ``format_duration`` is the short human form used in messages.
Pure string handling: no YAML, no field paths (the loader adds those).
"""

from __future__ import annotations

import math
import re

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|d|h|m|s)")
_WHOLE = re.compile(r"\s*([+-]?)\s*((?:(?:\d+(?:\.\d*)?|\.\d+)\s*(?:ms|d|h|m|s)\s*)+)")


def parse_duration(value: object) -> float:
    """Seconds from a number (already seconds) or a string like "3h", "90m", "1h30m", "45s"."""
    if isinstance(value, bool):
        raise ValueError(f"must be seconds or a duration such as '3h' (got {value!r})")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value)
    else:
        raise ValueError(f"must be seconds or a duration such as '3h', '90m' (got {value!r})")
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration (got {value!r})")
    return seconds


def _parse_text(text: str) -> float:
    match = _WHOLE.fullmatch(text)
    if match is None:
        try:
            return float(text)  # "3600" written as a string: still seconds
        except ValueError:
            raise ValueError(f"{text!r} is not a duration; write seconds or a number with a"
                             " unit: '3h', '90m', '45s', '1h30m'") from None
    sign = -1.0 if match.group(1) == "-" else 1.0
    total = sum(float(num) * _UNITS[unit] for num, unit in _PART.findall(match.group(2)))
    return sign * total


def format_duration(seconds: float) -> str:
    """Short form for messages: 10800 → '3h', 5400 → '1h30m', 45 → '45s', 2.5 → '2.5s'."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    s = int(seconds)
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts)
