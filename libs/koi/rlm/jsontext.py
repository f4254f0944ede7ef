"""JSON at the boundary with a language model: quoting data in, reading answers out.

``quote_data(obj)`` is the only way fleet data enters a prompt: compact JSON whose
``<``, ``>`` and ``&`` are escaped (``\\u003c``…), so no string in it — a job id, a model
name, an event line — can close the ``<fleet_data>`` block it sits in or open another.
``extract_json(text)`` is the tolerant reader of a model's answer: the first JSON object
(or array) in the text, after code fences, with trailing commas dropped; ``None`` when
there is none. Size and nesting are bounded; NaN and Infinity are refused. Pure string
handling: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_ANSWER_CHARS = 200_000   # a longer answer is hostile or broken: not parsed
MAX_NESTING = 32
MAX_SPANS = 16            # opening brackets tried as the start of the answer

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_HTML_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def quote_data(obj: Any) -> str:
    """``obj`` as compact, sorted-key JSON that cannot break out of a delimited block."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    # the three characters only ever occur inside JSON strings, where \\uXXXX is the same
    for ch, esc in _HTML_UNSAFE.items():
        text = text.replace(ch, esc)
    # U+2028/9 are legal in JSON strings but break lines in some readers (and prompts)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def canonical(obj: Any) -> str:
    """Sorted-key compact JSON: what request hashes are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      default=str)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse_constant)


def _depth(obj: Any, level: int = 0) -> int:
    if level > MAX_NESTING:
        return level
    if isinstance(obj, dict):
        return max((_depth(v, level + 1) for v in obj.values()), default=level + 1)
    if isinstance(obj, list):
        return max((_depth(v, level + 1) for v in obj), default=level + 1)
    return level


def _span(text: str, start: int) -> str | None:
    """The balanced ``{…}``/``[…]`` starting at ``start`` (strings respected), or None."""
    stack: list[str] = []
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return text[start:i + 1]
    return None


def drop_trailing_commas(text: str) -> str:
    """``text`` without commas that stand right before a ``}`` or ``]`` (outside strings)."""
    out: list[str] = []
    in_string = escaped = False
    pending = -1  # index in out of a comma that may be trailing
    for ch in text:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in "}]" and pending >= 0:
            del out[pending]
            pending = -1
        if ch == ",":
            pending = len(out)
        elif not ch.isspace():
            pending = -1
        if ch == '"':
            in_string = True
        out.append(ch)
    return "".join(out)


def extract_json(text: str) -> Any | None:
    """The first JSON object or array in a model's answer, read tolerantly; None if none.

    Tries, in order: the whole text; each fenced code block; the balanced ``{…}``/``[…]``
    span from each of the first ``MAX_SPANS`` opening brackets — each as is, then
    without trailing commas. An answer over ``MAX_ANSWER_CHARS`` or nested deeper than
    ``MAX_NESTING`` is not read at all.
    """
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    candidates = [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for piece in candidates:
        found = _try(piece)
        if found is not None:
            return found
    tries = 0
    for start, ch in enumerate(text):
        if ch in "{[":
            tries += 1
            if tries > MAX_SPANS:  # each try may scan the rest: bound the work
                return None
            span = _span(text, start)
            if span is not None:
                found = _try(span)
                if found is not None:
                    return found
    return None


def _try(piece: str) -> Any | None:
    if not piece or piece[0] not in "{[":
        return None
    for attempt in (piece, drop_trailing_commas(piece)):
        try:
            value = _loads(attempt)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict | list) and _depth(value) <= MAX_NESTING:
            return value
        return None
    return None
