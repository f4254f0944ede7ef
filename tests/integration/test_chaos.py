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


@pytest.mark.timeout(420)
def test_killing_the_placer_leader_among_replicas_loses_no_tick(tmp_path: Path) -> None:
    """Two replicas each of proposer, evaluator and placer; the lease holder is killed
    mid-tick: the standby takes the lease, every tick is simulated, none is applied
    twice (8 ticks here, 15 in ``make chaos``)."""
    case = next(c for c in chaos.CASES if c.name == "replicas-kill-placer-leader")
    out = chaos.run_case(case, tmp_path, timeout_s=360, ticks=8)
    assert not out.error, out.error
    assert out.notes and "the leader" in out.notes[0], out
    assert out.completed and out.ticks == 8, chaos._summary(out)
    assert out.ticks_with_actions >= 7 and not out.applied_twice, chaos._summary(out)
    assert out.job_kept, chaos._summary(out)
    assert out.kept, chaos._summary(out)
