"""Session-wide test fixtures.

Generated protobuf modules (``libs/koi/v1``) are built at set-up and never committed;
``generated_protos`` builds them when missing so a bare ``pytest`` works. Test modules
import ``koi.wire`` at collection time, before any fixture runs, so the same check also
runs from ``pytest_sessionstart``. Shared fakes and service fixtures go here too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ensure_protos() -> None:
    if (REPO / "libs" / "koi" / "v1" / "config_pb2.py").exists():
        return
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_protos.py")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.exit(f"scripts/gen_protos.py failed:\n{done.stderr}", returncode=1)


def pytest_sessionstart(session: pytest.Session) -> None:
    _ensure_protos()


@pytest.fixture(scope="session", autouse=True)
def generated_protos() -> None:
    """The generated ``koi.v1`` modules exist (built by scripts/gen_protos.py if not)."""
    _ensure_protos()
