"""Text that is safe to print on one line: control characters escaped, length capped.

Operator events and log lines carry text that came from outside (job ids, reasons that
quote user input, exception messages). Printed raw, a CR or LF in it forges a second
line, an ESC starts an ANSI sequence that rewrites the terminal, and a 10,000-character
id makes a 20,000-character line. ``printable`` is what every line renderer puts such
text through (``koi.wire.planning.event_line``, ``services.runtime.logs``).

Pure string handling: no I/O, no logging.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (NEL U+0085 among them), the Unicode line and paragraph
# separators (str.splitlines breaks on them) and the bidirectional overrides and
# isolates, which reorder what a terminal shows ("Trojan source").
_CONTROL = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_CONTROL}]")
# one unsafe character, or a run of safe ones: what printable() walks through
_PIECES = re.compile(f"[{_CONTROL}]|[^{_CONTROL}]+")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

DEFAULT_LIMIT = 1000


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` on one line: control characters shown as ``\\n``, ``\\x1b``, ``\\u2028``
    …, and at most ``limit`` characters of it (escapes counted as they are shown), then
    ``…[N chars]`` saying how long the original was. An escape is never cut in half."""
    if len(text) <= limit and _UNSAFE.search(text) is None:
        return text  # the common case, and the cheap one
    out: list[str] = []
    used = 0
    for match in _PIECES.finditer(text):  # lazy: a 10 MB string is read only this far
        piece = match.group()
        unsafe = _UNSAFE.match(piece) is not None  # a safe run never starts with one
        shown = _escape(piece) if unsafe else piece
        if used + len(shown) > limit:
            if not unsafe:
                out.append(shown[:limit - used])
            out.append(f"…[{len(text):,} chars]")
            break
        out.append(shown)
        used += len(shown)
    return "".join(out)
