"""The per-submitter token bucket and its folded events (``koi.jobs.rate_limit``), driven
with an explicit clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from koi.jobs.rate_limit import (
    FOLD_STEP_S,
    HOLD_S,
    SHARE_EVERY_S,
    STILL_EVERY_S,
    Bucket,
    RateLimit,
    SubmitterLimits,
    take,
    wait_s,
)

LIMIT = RateLimit(rate_per_s=2.0, burst=3)


def test_a_new_user_has_its_burst_then_waits_for_each_token() -> None:
    bucket = None
    for _ in range(3):
        assert wait_s(LIMIT, bucket, 100.0) == 0.0
        bucket = take(LIMIT, bucket, 100.0)
    assert wait_s(LIMIT, bucket, 100.0) == pytest.approx(0.5)   # one token per 1/2 s
    assert wait_s(LIMIT, bucket, 100.2) == pytest.approx(0.3)
    assert wait_s(LIMIT, bucket, 100.5) == 0.0
    with pytest.raises(ValueError):
        take(LIMIT, bucket, 100.1)


def test_the_bucket_never_holds_more_than_its_burst() -> None:
    bucket = take(LIMIT, None, 0.0)
    refilled = take(LIMIT, bucket, 3600.0)   # an hour idle: full (3), less one
    assert refilled.tokens == pytest.approx(2.0)


def test_a_clock_stepping_back_adds_nothing() -> None:
    bucket = Bucket(tokens=0.0, at=10.0)
    assert wait_s(LIMIT, bucket, 9.0) == pytest.approx(0.5)
    assert wait_s(LIMIT, bucket, 10.25) == pytest.approx(0.25)


def test_a_rate_of_zero_is_no_limit_and_bad_limits_are_refused() -> None:
    off = SubmitterLimits(RateLimit(0.0, 1))
    for i in range(1000):
        assert off.wait_s("u", float(i) * 1e-6) == 0.0
        off.take("u", float(i) * 1e-6)
    assert off.buckets == {}
    for rate, burst in ((-1.0, 1), (math.inf, 1), (math.nan, 1), (1.0, 0)):
        with pytest.raises(ValueError):
            RateLimit(rate, burst)


def test_users_have_buckets_of_their_own() -> None:
    limits = SubmitterLimits(LIMIT)
    for _ in range(3):
        limits.take("flood", 0.0)
    assert limits.wait_s("flood", 0.0) == pytest.approx(0.5)
    assert limits.wait_s("alice", 0.0) == 0.0


@given(st.lists(st.floats(0.0, 0.05), min_size=1, max_size=200),
       st.floats(0.1, 50.0), st.integers(1, 20))
def test_admissions_never_exceed_burst_plus_rate_times_time(gaps, rate, burst) -> None:
    limit, bucket, now, admitted = RateLimit(rate, burst), None, 0.0, 0
    for gap in gaps:
        now += gap
        if wait_s(limit, bucket, now) == 0.0:
            bucket = take(limit, bucket, now)
            admitted += 1
        else:  # told the truth: a token is there after the wait, not before
            w = wait_s(limit, bucket, now)
            assert wait_s(limit, bucket, now + w) == 0.0
            assert wait_s(limit, bucket, now + 0.9 * w) > 0.0
    assert admitted <= burst + rate * now + 1e-9


# --- one budget across replicas ---------------------------------------------------------------

def test_what_another_replica_took_is_taken_here_and_an_overspend_is_waited_off() -> None:
    here = SubmitterLimits(LIMIT)                  # 3 at once, then 2/s
    here.spent_elsewhere({"flood": 2}, 0.0)
    assert here.wait_s("flood", 0.0) == 0.0        # one of three left
    here.take("flood", 0.0)
    assert here.wait_s("flood", 0.0) == pytest.approx(0.5)
    here.spent_elsewhere({"flood": 10}, 0.0)       # far past the burst: down to -3, no lower
    assert here.wait_s("flood", 0.0) == pytest.approx((1 + 3) / 2.0)
    assert here.wait_s("alice", 0.0) == 0.0        # nobody else pays


def test_a_replica_reports_what_it_took_once() -> None:
    here = SubmitterLimits(LIMIT)
    here.take("flood", 0.0)
    here.take("flood", 0.1)
    here.take("alice", 0.1)
    assert here.unshared() == {"flood": 2, "alice": 1}
    assert here.unshared() == {}
    off = SubmitterLimits(RateLimit(0.0, 1))
    off.take("flood", 0.0)
    off.spent_elsewhere({"flood": 5}, 0.0)
    assert off.unshared() == {} and off.wait_s("flood", 0.0) == 0.0


@given(st.integers(2, 4), st.floats(0.5, 20.0), st.integers(1, 10),
       st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(0, 3)), min_size=1,
                max_size=400))
# two replicas taking turns for 5 s at 2/s, burst 3: unshared they would admit 2 × 13
@example(2, 2.0, 3, [(0.01, i) for i in range(500)])
def test_replicas_sharing_what_they_took_admit_one_budget_not_n(n, rate, burst, flood
                                                                ) -> None:
    """N replicas each answering part of one user's flood, each telling the others what
    it took every ``SHARE_EVERY_S``: together they admit at most one bucket's worth, plus
    what the others had not yet heard of (the burst once per other replica, and a share
    interval's rate per replica), where N unshared buckets would admit N times it."""
    limit = RateLimit(rate, burst)
    replicas = [SubmitterLimits(limit) for _ in range(n)]
    now, shared_at, admitted = 0.0, 0.0, 0
    for gap, which in flood:
        now += gap
        if now - shared_at >= SHARE_EVERY_S:
            reports = [r.unshared() for r in replicas]
            for i, r in enumerate(replicas):
                for j, spent in enumerate(reports):
                    if i != j:
                        r.spent_elsewhere(spent, now)
            shared_at = now
        r = replicas[which % n]
        if r.wait_s("flood", now) == 0.0:
            r.take("flood", now)
            admitted += 1
    unheard = (n - 1) * burst + n * rate * SHARE_EVERY_S
    assert admitted <= burst + rate * now + unheard + n


def _flood(limits: SubmitterLimits, user: str, start: float, until: float, every: float
           ) -> list:
    """A refusal of ``user`` every ``every`` s over [start, until), folding each second."""
    events, now, next_fold = [], start, start + 1.0
    while now < until:
        events += limits.refused(user, now)
        now += every
        if now >= next_fold:
            events += limits.fold(next_fold)
            next_fold += 1.0
    return events


def test_a_spell_of_refusals_is_one_start_a_still_a_minute_and_one_end() -> None:
    limits = SubmitterLimits(LIMIT)
    events = _flood(limits, "flood", 0.0, 130.0, 0.01)   # 13,000 refusals
    assert [(e.user, e.phase) for e in events] == [("flood", "start"), ("flood", "still"),
                                                   ("flood", "still")]
    assert events[1].held_s == pytest.approx(STILL_EVERY_S, abs=1.0)
    assert limits.limited() == ["flood"]
    assert limits.fold(130.0 + HOLD_S / 2) == []           # quiet, but not long enough
    (end,) = limits.fold(130.0 + HOLD_S + 1.0)
    assert end.phase == "end" and end.refused == 13_000
    assert end.held_s == pytest.approx(130.0 + HOLD_S + 1.0, abs=2 * FOLD_STEP_S)
    assert limits.limited() == [] and "still" in events[1].message(LIMIT)
    assert "no longer rate limited" in end.message(LIMIT)
    # a new spell later is a new start, its count from zero
    (again,) = limits.refused("flood", 500.0)
    assert again.phase == "start" and again.refused == 1


def test_the_start_comes_with_the_first_refusal_even_within_one_fold_step() -> None:
    limits = SubmitterLimits(LIMIT)
    (first,) = limits.refused("a", 10.0)
    (second,) = limits.refused("b", 10.0 + FOLD_STEP_S / 10)   # same step: not lost
    assert (first.user, first.phase, second.user, second.phase) == ("a", "start", "b",
                                                                      "start")
    assert limits.refused("a", 10.02) == [] and limits.limited() == ["a", "b"]


def test_full_buckets_are_forgotten_and_the_map_is_bounded() -> None:
    limits = SubmitterLimits(LIMIT, max_users=100)
    for i in range(250):
        limits.take(f"u{i}", 0.0)
    assert len(limits.buckets) == 100
    assert "u249" in limits.buckets and "u0" not in limits.buckets   # the oldest went
    limits.take("u249", 0.0)
    limits.take("u249", 0.0)   # empty: full again 1.5 s later, the others 0.5 s later
    limits.fold(1.0)
    assert list(limits.buckets) == ["u249"]
    limits.fold(10.0)
    assert limits.buckets == {}
