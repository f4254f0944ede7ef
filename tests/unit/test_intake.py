"""Submission intake policy (koi.jobs.intake): the deadline budget and the rate limit."""

from __future__ import annotations

import pytest

from koi import subjects
from koi.jobs.intake import ANSWER_SHARE, MAX_BUDGET_S, budget_s, deadline_header, late_by


@pytest.mark.parametrize(("header", "expected"), [
    (None, 1.0), ("", 1.0), ("soon", 1.0), ("1.5", 1.0),   # absent or unreadable: default
    ("250", 0.25 * ANSWER_SHARE), (" 2000 ", 2.0 * ANSWER_SHARE), ("0", 0.0), ("-5", 0.0),
    (str(10**12), MAX_BUDGET_S),
])
def test_the_budget_is_read_from_the_header_or_defaults(header, expected) -> None:
    assert budget_s(header, 1.0) == pytest.approx(expected)


def test_the_header_round_trips_through_the_budget() -> None:
    header = deadline_header(1.234)
    assert set(header) == {subjects.HEADER_DEADLINE_MS}
    assert budget_s(header[subjects.HEADER_DEADLINE_MS], 9.0) == \
        pytest.approx(1.234 * ANSWER_SHARE)
    assert deadline_header(-1.0)[subjects.HEADER_DEADLINE_MS] == "0"


def test_late_by_counts_the_margin_before_the_deadline() -> None:
    assert late_by(10.0, 11.0, 0.5, margin_s=0.1) == pytest.approx(-0.4)   # in time
    assert late_by(10.0, 11.0, 0.95, margin_s=0.1) == pytest.approx(0.05)  # too late
