"""Submission intake policy: the sender's deadline (per-submitter rate limits are
``koi.jobs.rate_limit``).

Pure functions; time is passed in, never read here, and nothing here knows about NATS
(the placer's ``services/placer/admission.py`` applies these to messages and their
headers).

The deadline travels as a *remaining budget* in milliseconds (``Koi-Deadline-Ms``,
``koi.subjects.HEADER_DEADLINE_MS``), not as an absolute time: the sender's and the
placer's clocks need not agree, and a budget stamped on receipt with the placer's own
monotonic clock compares only times from one clock. What it cannot see is the time the
message spent between the sender stamping it and the placer reading it; that is why
an answer is promised ``ANSWER_MARGIN_S`` before the deadline, not at it.
"""

from __future__ import annotations

from koi.subjects import HEADER_DEADLINE_MS

ANSWER_MARGIN_S = 0.05      # an answer is sent at least this long before the deadline
ANSWER_SHARE = 0.5          # ... and planned within this share of the sender's budget: the
                            # rest covers transit, a sender's own lagging event loop and a
                            # store slower than its average (at the full budget, a loaded
                            # sender read 55 % of its answers too late: docs/RELIABILITY.md)
MAX_BUDGET_S = 60.0         # a longer budget is held to this (nobody waits a minute)


def deadline_header(budget_s: float) -> dict[str, str]:
    """The header that tells the placer how long this request's sender will listen."""
    return {HEADER_DEADLINE_MS: str(max(int(budget_s * 1000), 0))}


def budget_s(header: str | None, default_s: float) -> float:
    """The time the placer plans to answer in, from the sender's header value:
    ``default_s`` when absent or unreadable, else ``ANSWER_SHARE`` of the budget, held
    to [0, ``MAX_BUDGET_S``] (a zero or negative budget has already run out)."""
    if header is None:
        return default_s
    try:
        ms = int(header.strip())
    except ValueError:
        return default_s
    return min(max(ms, 0) / 1000.0 * ANSWER_SHARE, MAX_BUDGET_S)


def late_by(now: float, deadline: float, expected_s: float,
            margin_s: float = ANSWER_MARGIN_S) -> float:
    """How many seconds after ``deadline - margin_s`` an answer would come if the work
    still to do (``expected_s``) started ``now``; > 0 means answer busy instead."""
    return now + expected_s - (deadline - margin_s)
