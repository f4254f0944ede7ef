"""SLO-breach aggregation (``services.telemetry_ingest.breaches``), driven tick by tick.

A breach is told once when it is confirmed (a second window over the SLO: WARNING), once
when it persists past ``escalate_after`` windows (ERROR), at most once per
``summary_every`` ticks while it lasts, and once when it is over; a single window over
the SLO is one ``blip`` event. The events of a tick depend only on the telemetry of the
lookback, so a replay (restart, redelivery) gives the same events.
"""

from __future__ import annotations

import pytest

from koi.cluster import DeploymentTelemetry
from koi.jobs import Slo
from services.telemetry_ingest.breaches import (
    BreachPolicy,
    JobWindow,
    breach_events,
    job_windows,
)

SLO = Slo(ttft_ms=500.0, tpot_ms=50.0)
SLOS = {"chat": SLO}
POLICY = BreachPolicy(confirm_windows=2, summary_every=10, escalate_after=5, recover_after=3,
                      lookback=60)
OK = JobWindow("chat-d1", ttft_ms=300.0, tpot_ms=30.0, window_s=60.0)
BAD = JobWindow("chat-d1", ttft_ms=900.0, tpot_ms=40.0, window_s=60.0)
WORSE = JobWindow("chat-d2", ttft_ms=1_400.0, tpot_ms=70.0, window_s=60.0)


def _drive(windows: list[JobWindow | None], policy: BreachPolicy = POLICY
           ) -> list[tuple[int, str, str]]:
    """Feed one window per tick (None: no window); (tick, phase, severity) of each event."""
    history: dict[int, dict[str, JobWindow]] = {}
    told = []
    for tick, w in enumerate(windows):
        history[tick] = {} if w is None else {"chat": w}
        told += [(tick, e.phase, e.severity) for e in breach_events(tick, history, SLOS, policy)]
    return told


def test_a_breach_is_told_when_it_starts_persists_continues_and_ends():
    told = _drive([OK] * 3 + [BAD] * 12 + [OK] * 6)
    assert told == [(4, "started", "warning"), (7, "escalated", "error"),
                    (10, "continuing", "error"), (17, "recovered", "info")]


def test_a_short_breach_stays_a_warning():
    told = _drive([OK, BAD, BAD, OK, OK, OK, OK])
    assert told == [(2, "started", "warning"), (5, "recovered", "info")]


def test_one_window_over_the_slo_is_one_blip_when_it_is_over():
    assert _drive([OK, BAD, OK, OK, OK, OK]) == [(4, "blip", "warning")]


def test_a_long_breach_is_summarised_at_most_once_per_summary_period():
    told = _drive([BAD] * 45)
    assert told[:2] == [(1, "started", "warning"), (4, "escalated", "error")]
    assert told[2:] == [(t, "continuing", "error") for t in (10, 20, 30, 40)]


def test_a_flapping_p95_is_one_episode_not_one_event_per_tick():
    told = _drive([BAD, OK] * 10 + [OK] * 3)
    assert told == [(2, "started", "warning"), (8, "escalated", "error"),
                    (10, "continuing", "error"), (20, "continuing", "error"),
                    (21, "recovered", "info")]  # 23 events before: one per breached window


def test_ticks_without_a_window_neither_break_nor_mend_the_streak():
    told = _drive([BAD, None, BAD, None, None, BAD, BAD, BAD, OK, OK, OK])
    assert told == [(2, "started", "warning"), (7, "escalated", "error"),
                    (10, "recovered", "info")]


def test_a_breach_longer_than_the_lookback_is_told_as_at_least():
    policy = BreachPolicy(summary_every=10, escalate_after=5, recover_after=3, lookback=20)
    history = {t: {"chat": BAD} for t in range(101)}
    (event,) = breach_events(100, history, SLOS, policy)
    assert event.phase == "continuing" and "(≥20 windows" in event.message
    assert event.attributes["windows_breached"] == "20"


def test_the_events_of_a_tick_depend_only_on_the_lookback():
    """What a restarted process derives (only the lookback read back from the stream)
    equals what the long-lived one derives (with older ticks too), id-relevant fields
    and text included, and a redelivered tick gives the same events again."""
    seq = [OK, BAD, BAD, OK] * 30 + [BAD] * 40
    full = {t: {"chat": w} for t, w in enumerate(seq)}
    for tick in range(len(seq)):
        old = breach_events(tick, {t: full[t] for t in range(tick + 1)}, SLOS, POLICY)
        fresh = breach_events(tick, {t: full[t] for t in range(max(0, tick - 59), tick + 1)},
                              SLOS, POLICY)
        assert old == fresh == breach_events(tick, full, SLOS, POLICY)


def test_the_figures_name_the_worst_window_and_the_slo():
    told = breach_events(2, {0: {"chat": BAD}, 1: {"chat": BAD}, 2: {"chat": WORSE}}, SLOS,
                         BreachPolicy(summary_every=1))
    (event,) = told
    assert event.phase == "continuing" and event.deployment_id == "chat-d2"
    assert "worst p95 TTFT 1,400 ms (SLO 500), TPOT 70.0 ms (SLO 50.0)" in event.message
    assert event.attributes["since_tick"] == "0"


def _telemetry(deployment: str, job: str, ttft_s: float, tpot_s: float,
               finished: float = 100.0) -> DeploymentTelemetry:
    return DeploymentTelemetry(
        tick=0, deployment_id=deployment, job_id=job, window_s=60.0, requests_arrived=finished,
        requests_finished=finished, requests_dropped=0.0, prompt_tokens=1.0,
        generation_tokens=1.0, ttft_bucket_bounds_s=(), ttft_bucket_counts=(0.0,),
        tpot_bucket_bounds_s=(), tpot_bucket_counts=(0.0,), ttft_mean_s=ttft_s,
        ttft_p95_s=ttft_s, tpot_mean_s=tpot_s, tpot_p95_s=tpot_s, kv_cache_usage=0.0,
        num_running=0.0, num_waiting=0.0, num_preemptions=0.0, replica_preemptions=0,
        output_tok_s=1.0, gpu_seconds=1.0, cost_usd=1.0)


def test_job_windows_keep_each_jobs_worst_deployment_with_enough_requests():
    windows = job_windows([_telemetry("d1", "chat", 0.7, 0.01),  # 1.4x its TTFT
                           _telemetry("d2", "chat", 0.2, 0.08),   # 1.6x its TPOT: worse
                           _telemetry("d3", "chat", 9.0, 9.0, finished=5),  # too few
                           _telemetry("b1", "batch", 9.0, 9.0)], SLOS)
    assert set(windows) == {"chat"} and windows["chat"].deployment_id == "d2"


def test_the_policy_refuses_bounds_it_cannot_honour():
    with pytest.raises(ValueError, match="lookback"):
        BreachPolicy(escalate_after=10, lookback=10)
    with pytest.raises(ValueError, match="≥ 1"):
        BreachPolicy(summary_every=0)
    with pytest.raises(ValueError, match="exceed confirm_windows"):
        BreachPolicy(escalate_after=2)
