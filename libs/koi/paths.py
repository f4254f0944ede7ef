"""Where Koi's files live: the repository root and the shared public-data directory.

The shared data (``perf_measurements.csv``, traces, hardware notes) sits beside the
repository as ``../shared/data``; ``KOI_SHARED_DATA`` overrides it. Job trace files are
read only from the traces directory (``KOI_TRACES_DIR``, else the shared data's
``traces/``) and, by ``shared:`` name, from the shared data directory. No other logic here.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


SHARED_DATA_ENV = "KOI_SHARED_DATA"
TRACES_ENV = "KOI_TRACES_DIR"


def _candidates() -> list[Path]:
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return [Path(env)]
    return [d / "shared" / "data" for d in (REPO_ROOT, *REPO_ROOT.parents)]


def find_shared_data_dir() -> Path | None:
    """The shared public-data directory, or None when there is none."""
    return next((c for c in _candidates() if c.is_dir()), None)


def shared_data_dir() -> Path:
    """The shared public-data directory (raises FileNotFoundError naming where it looked)."""
    found = find_shared_data_dir()
    if found is None:
        looked = ", ".join(str(c) for c in _candidates()[:4])
        raise FileNotFoundError(f"shared data directory not found (looked in {looked}); "
                                f"set {SHARED_DATA_ENV}")
    return found


def traces_dir() -> Path | None:
    """The directory job traces are read from: ``$KOI_TRACES_DIR``, else the shared data
    directory's ``traces/``; None when there is neither."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    shared = find_shared_data_dir()
    return shared / "traces" if shared is not None else None
