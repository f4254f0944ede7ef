"""Request traces: loading ``ts_s,input_tokens,output_tokens`` CSV files, and finding them.

``load_trace`` validates every row and names the file and line of the first bad one;
``resolve_trace_path`` turns a path written in a job file into a file on disk (relative
to the job file, then the repo root; ``shared:`` prefixes the shared data directory).
Only file reading here: no arrival logic, no YAML, no transport.
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
from koi.paths import REPO_ROOT, SHARED_DATA_ENV, find_shared_data_dir

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
    return stat


# Keyed by (path, mtime, size) so an edited file is re-read; arrays are read-only, so
# sharing one Trace between jobs and callers is safe.
@lru_cache(maxsize=32)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> Trace:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(c.strip() for c in header) != TRACE_HEADER:
            got = ",".join(header) if header else "an empty file"
            raise InvalidSpecError("header", f"must be exactly '{','.join(TRACE_HEADER)}'"
                                             f" (got '{got}')", source=f"{path} line 1")
        ts, inp, out = _read_rows(reader, path)
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
        if len(row) != 3:
            raise InvalidSpecError("row", f"expected 3 columns, got {len(row)}: {','.join(row)!r}",
                                   source=where)
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
        raise InvalidSpecError("ts_s", f"{text!r} is not a number", source=where) from None
    if not math.isfinite(t) or t < 0:
        raise InvalidSpecError("ts_s", f"must be a finite number >= 0 (got {text.strip()})",
                               source=where)
    if t < prev:
        raise InvalidSpecError("ts_s", f"{t:g} is before the previous row's {prev:g};"
                                       " timestamps must be non-decreasing", source=where)
    return t


def _parse_tokens(column: str, text: str, where: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise InvalidSpecError(column, f"{text!r} is not an integer", source=where) from None
    if n < 1:
        raise InvalidSpecError(column, f"must be >= 1 (got {n})", source=where)
    return n


# --- finding trace files ---------------------------------------------------------------

def repo_root() -> Path:
    """The repository root (one definition: ``koi.paths``)."""
    return REPO_ROOT


def shared_data_dir() -> Path | None:
    """``$KOI_SHARED_DATA``, else the first ``shared/data`` found walking up from the repo root."""
    return find_shared_data_dir()


def resolve_trace_path(ref: str, base_dir: Path | None = None) -> Path:
    """The file a job's ``trace:`` reference names; ``InvalidSpecError`` lists where it looked."""
    tried: list[Path] = []
    if ref.startswith(SHARED_PREFIX):
        shared = shared_data_dir()
        if shared is None:
            raise InvalidSpecError("trace", f"{ref!r}: no shared/data directory found above"
                                            f" {repo_root()}; set {SHARED_DATA_ENV}")
        tried.append(shared / ref[len(SHARED_PREFIX):])
    elif Path(ref).is_absolute():
        tried.append(Path(ref))
    else:
        if base_dir is not None:
            tried.append(Path(base_dir) / ref)
        tried.append(repo_root() / ref)
    for candidate in tried:
        if candidate.is_file():
            return candidate.resolve()
    looked = ", ".join(str(c) for c in tried)
    raise InvalidSpecError("trace", f"trace file {ref!r} not found (looked in: {looked})")
