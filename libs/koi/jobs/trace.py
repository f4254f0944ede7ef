"""Request traces: loading ``ts_s,input_tokens,output_tokens`` CSV files, and finding them.

``load_trace`` validates every row and names the file and line of the first bad one,
never quoting the file's contents (a trace path once read ``/etc/passwd`` and echoed it).
``resolve_trace_path`` turns a reference written in a job into a file, confined to the
traces directory (``KOI_TRACES_DIR``, default the shared data's ``traces/``) or, for
``shared:<name>``, the shared data directory: anything resolving elsewhere (absolute
paths, ``..``, symlinks out) is refused before it is looked at, with the same answer
whether or not it exists. Only file reading here: no arrival logic, no YAML, no transport.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from koi.errors import InvalidSpecError
from koi.jobs.bounds import MAX_REQUEST_TOKENS, MAX_TRACE_BYTES, MAX_TRACE_ROWS
from koi.paths import SHARED_DATA_ENV, TRACES_ENV, find_shared_data_dir, traces_dir

TRACE_HEADER = ("ts_s", "input_tokens", "output_tokens")
SHARED_PREFIX = "shared:"


@dataclass(frozen=True, eq=False)
class Trace:
    """One trace file's rows as read-only arrays (sorted by ``ts_s``)."""

    path: str
    ts_s: np.ndarray  # float64 seconds, non-decreasing, >= 0
    input_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (self.path == other.path and np.array_equal(self.ts_s, other.ts_s)
                and np.array_equal(self.input_tokens, other.input_tokens)
                and np.array_equal(self.output_tokens, other.output_tokens))

    def __hash__(self) -> int:
        return hash((self.path, len(self)))

    def __repr__(self) -> str:
        return f"Trace(path={self.path!r}, rows={len(self)}, duration_s={self.duration_s:.1f})"

    def __len__(self) -> int:
        return int(self.ts_s.size)

    @property
    def duration_s(self) -> float:
        """Span from the first to the last arrival."""
        return float(self.ts_s[-1] - self.ts_s[0])

    @property
    def mean_rate(self) -> float:
        """Rows ÷ span (req/s), the definition in shared/data/traces/README.md."""
        return len(self) / (self.duration_s if self.duration_s > 0 else self.loop_period_s)

    @property
    def loop_period_s(self) -> float:
        """Time after which a looping replay starts over: span plus one mean gap, so the
        last request of one pass and the first of the next don't coincide."""
        n = len(self)
        if n < 2 or self.duration_s <= 0:
            return 1.0
        return self.duration_s * n / (n - 1)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace CSV; errors name the file, line and column."""
    p = Path(path)
    stat = _stat(p)
    return _load_cached(str(p), stat.st_mtime_ns, stat.st_size)


def _stat(p: Path) -> os.stat_result:
    try:
        stat = p.stat()
    except FileNotFoundError:
        raise InvalidSpecError("trace", f"file not found: {p}", source=str(p)) from None
    except OSError as e:
        raise InvalidSpecError("trace", f"cannot read {p}: {e.strerror}", source=str(p)) from None
    if not p.is_file():
        raise InvalidSpecError("trace", f"{p} is not a file", source=str(p))
    if stat.st_size > MAX_TRACE_BYTES:
        raise InvalidSpecError("trace", f"{stat.st_size} bytes; a trace may hold at most"
                                        f" {MAX_TRACE_BYTES}", source=str(p))
    return stat


# Keyed by (path, mtime, size) so an edited file is re-read; arrays are read-only, so
# sharing one Trace between jobs and callers is safe.
@lru_cache(maxsize=32)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> Trace:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or tuple(c.strip() for c in header) != TRACE_HEADER:
                got = "an empty file" if not header else "another header"
                raise InvalidSpecError("header", f"must be exactly '{','.join(TRACE_HEADER)}'"
                                                 f" (got {got})", source=f"{path} line 1")
            ts, inp, out = _read_rows(reader, path)
    except UnicodeDecodeError:
        raise InvalidSpecError("trace", "is not UTF-8 text (a binary file?)",
                               source=path) from None
    except csv.Error as e:  # e.g. a NUL byte or an over-long field
        raise InvalidSpecError("trace", f"is not a CSV file ({type(e).__name__})",
                               source=path) from None
    if not ts:
        raise InvalidSpecError("rows", "the trace has a header but no rows", source=path)
    arrays = [np.asarray(ts, dtype=np.float64), np.asarray(inp, dtype=np.int64),
              np.asarray(out, dtype=np.int64)]
    for a in arrays:
        a.setflags(write=False)
    return Trace(path, *arrays)


def _read_rows(reader: Any, path: str) -> tuple[list[float], list[int], list[int]]:
    ts: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    prev = 0.0
    for row in reader:
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # tolerate blank lines (e.g. a trailing newline pair)
        where = f"{path} line {line}"
        if len(ts) >= MAX_TRACE_ROWS:
            raise InvalidSpecError("rows", f"a trace may hold at most {MAX_TRACE_ROWS} rows",
                                   source=where)
        if len(row) != 3:
            raise InvalidSpecError("row", f"expected 3 columns, got {len(row)}", source=where)
        t = _parse_ts(row[0], prev, where)
        ts.append(t)
        inp.append(_parse_tokens("input_tokens", row[1], where))
        out.append(_parse_tokens("output_tokens", row[2], where))
        prev = t
    return ts, inp, out


def _parse_ts(text: str, prev: float, where: str) -> float:
    try:
        t = float(text)
    except ValueError:
        raise InvalidSpecError("ts_s", "not a number", source=where) from None
    if not math.isfinite(t) or t < 0:
        raise InvalidSpecError("ts_s", "must be a finite number >= 0", source=where)
    if t < prev:
        raise InvalidSpecError("ts_s", "is before the previous row's; timestamps must be"
                                       " non-decreasing", source=where)
    return t


def _parse_tokens(column: str, text: str, where: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise InvalidSpecError(column, "not an integer", source=where) from None
    if not 1 <= n <= MAX_REQUEST_TOKENS:
        raise InvalidSpecError(column, f"must be an integer in [1, {MAX_REQUEST_TOKENS}]",
                               source=where)
    return n


# --- finding trace files ---------------------------------------------------------------

def shared_data_dir() -> Path | None:
    """``$KOI_SHARED_DATA``, else the first ``shared/data`` found walking up from the repo root."""
    return find_shared_data_dir()


def resolve_trace_path(ref: str) -> Path:
    """The file a job's ``trace:`` reference names, inside the traces directory (a name or
    a path under it) or, for ``shared:<name>``, the shared data directory.

    ``InvalidSpecError`` otherwise; a reference outside those directories is refused
    before the file system is asked about it, so the answer tells nothing of what exists
    there, and no message holds the directories' own paths.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise InvalidSpecError("trace", "must name a trace file")
    shown = _show_ref(ref)
    if ref.startswith(SHARED_PREFIX):
        root, name = shared_data_dir(), ref[len(SHARED_PREFIX):]
        if root is None:
            raise InvalidSpecError("trace", f"{shown}: no shared data directory here;"
                                            f" set {SHARED_DATA_ENV}")
        where = "the shared data directory"
    else:
        root, name = traces_dir(), ref
        if root is None:
            raise InvalidSpecError("trace", f"{shown}: no traces directory here;"
                                            f" set {TRACES_ENV}")
        where = f"the traces directory (${TRACES_ENV})"
    base = root.resolve()
    try:
        candidate = (base / name).resolve()  # follows symlinks and '..' before the check
    except (OSError, RuntimeError, ValueError):
        candidate = None
    if candidate is None or not candidate.is_relative_to(base) or "\x00" in name:
        raise InvalidSpecError("trace", f"{shown} is outside {where}: give a file name in"
                                        " it, or shared:<name>")
    if not candidate.is_file():
        raise InvalidSpecError("trace", f"{shown}: no such trace file in {where}")
    return candidate


def _show_ref(ref: str) -> str:
    """A reference as it may appear in a message: escaped, and cut short."""
    text = ref.encode("unicode_escape").decode("ascii")
    return repr(text if len(text) <= 120 else text[:117] + "...")
