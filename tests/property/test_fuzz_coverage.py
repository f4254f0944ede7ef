"""Coverage-guided fuzzing of every bus decoder and the YAML loaders, bounded in time.

libFuzzer (through atheris) runs ``tests/support/fuzz_coverage.py`` in its own process for
``KOI_FUZZ_COVERAGE_S`` seconds (30 by default; ``make fuzz`` runs 30 minutes). It keeps
the inputs that reach new branches of ``koi`` and mutates them, so it finds what random
examples rarely reach (its first two minutes found a scenario file with a non-UTF-8 byte
crashing the loader). A crash fails this test with the traceback and the input's path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris (coverage-guided fuzzing) is not installed")

REPO = Path(__file__).resolve().parents[2]
SECONDS = int(os.environ.get("KOI_FUZZ_COVERAGE_S", "30"))

pytestmark = pytest.mark.timeout(SECONDS + 300)


def test_coverage_guided_fuzzing_finds_no_crash(tmp_path: Path) -> None:
    corpus, artifacts = tmp_path / "corpus", tmp_path / "crashes"
    artifacts.mkdir()
    cmd = [sys.executable, "-m", "tests.support.fuzz_coverage", str(corpus),
           f"-max_total_time={SECONDS}", "-timeout=20", "-rss_limit_mb=2048",
           f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          timeout=SECONDS + 240)
    log = done.stdout + done.stderr
    crashes = sorted(p.name for p in artifacts.iterdir())
    assert done.returncode == 0 and not crashes, (
        f"libFuzzer exited {done.returncode}; inputs kept in {artifacts}: {crashes}\n"
        f"{log[-6000:]}")
    assert "coverage fuzz:" in log and "Done " in log, log[-2000:]
