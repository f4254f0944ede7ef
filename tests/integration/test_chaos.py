"""The fault suite's machinery stays working (``make chaos`` runs every case; the suite
runs one): the forged-messages case on a secure NATS with every service a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from services import chaos

pytestmark = pytest.mark.timeout(300)


def test_the_forged_messages_case_keeps_its_promises(tmp_path: Path) -> None:
    case = next(c for c in chaos.CASES if c.name == "forged-messages")
    out = chaos.run_case(case, tmp_path, timeout_s=240)
    assert out.forged_refused == {"actions": True, "placer-lease": True,
                                  "accepted-job": True, "observations": True}, out
    assert out.cause_events.get("implausible", 0) >= 1, out
    assert out.completed and out.job_acked and out.job_kept and not out.over_capacity_ticks
    assert out.kept, chaos._summary(out)


def test_recovery_counts_ticks_from_the_fault_clearing() -> None:
    assert chaos.recovery([4, 5], cleared=5, ticks=15, allowed=3) == 1
    assert chaos.recovery([], cleared=4, ticks=15, allowed=0) == 0
    assert chaos.recovery([4, 5, 6, 7, 8], cleared=4, ticks=15, allowed=3) is None
    assert chaos.recovery(list(range(4, 15)), cleared=4, ticks=15, allowed=20) is None
