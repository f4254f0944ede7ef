"""Where Koi's files live: the repository root and the shared public-data directory.

The shared data (``perf_measurements.csv``, traces, hardware notes) sits beside the
repository as ``../shared/data``; ``KOI_SHARED_DATA`` overrides it. No other logic here.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """The shared public-data directory (raises FileNotFoundError naming where it looked)."""
    env = os.environ.get("KOI_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [parent / "shared" / "data" for parent in REPO_ROOT.parents]
    candidates.append(REPO_ROOT / "shared" / "data")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in candidates[:4])
    raise FileNotFoundError(f"shared data directory not found (looked in {looked}); "
                            "set KOI_SHARED_DATA")
