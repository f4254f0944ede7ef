"""SLO-breach events, aggregated per job: a start, an escalation, sparse summaries, a
recovery — instead of one ERROR per deployment per tick (37 % of all events).

The state of a job's breach is never kept: it is a function of the last ``lookback``
ticks of telemetry (``job_windows`` of each), so a restarted or redelivered
telemetry-ingest derives the same events with the same ids. A job is *in breach* at a
window when any of its last ``recover_after`` observed windows broke the SLO (ticks where
it had no window are skipped): that hysteresis keeps a flapping p95 from opening and
closing an episode every tick. An episode is told as started (WARNING) at its
``confirm_windows``-th window over the SLO, as escalated (ERROR) at its
``escalate_after``-th, summarised on ticks that are multiples of ``summary_every``, and
told as recovered when it ends; one that ends before it was confirmed (a single slow
window, common while deployments warm up) is one ``blip`` event, when it is over.

Pure: no I/O, no clock; ``breach_events(tick, history, slos, policy)`` returns data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koi.cluster import DeploymentTelemetry
from koi.jobs import Slo


@dataclass(frozen=True)
class BreachPolicy:
    """How breaches are told. Bounds: every field ≥ 1, ``lookback`` > the others."""

    confirm_windows: int = 2
    """Windows over the SLO before a breach is told as started; an episode that ends
    with fewer is told once, as a blip, when it is over."""
    summary_every: int = 10
    """A continuing breach is summarised on ticks that are multiples of this (at most
    one summary per job per ``summary_every`` ticks)."""
    escalate_after: int = 5
    """Windows over the SLO in one episode before it is an ERROR (WARNING until then)."""
    recover_after: int = 3
    """Observed windows in a row within the SLO before the episode is over."""
    lookback: int = 60
    """Ticks of telemetry looked back at; an episode longer than this is told as ≥."""
    min_requests: float = 20.0
    """A window with fewer finished requests says nothing about a p95."""

    def __post_init__(self) -> None:
        if min(self.confirm_windows, self.summary_every, self.recover_after) < 1:
            raise ValueError("confirm_windows, summary_every, recover_after must be ≥ 1")
        if self.escalate_after <= self.confirm_windows:
            raise ValueError("escalate_after must exceed confirm_windows")
        if self.lookback <= max(self.escalate_after, self.recover_after):
            raise ValueError("lookback must exceed escalate_after and recover_after")


@dataclass(frozen=True)
class JobWindow:
    """A job's worst deployment in one tick's telemetry (the one furthest over its SLO)."""

    deployment_id: str
    ttft_ms: float
    tpot_ms: float
    window_s: float

    def breaks(self, slo: Slo) -> bool:
        return self.ttft_ms > slo.ttft_ms or self.tpot_ms > slo.tpot_ms


@dataclass(frozen=True)
class BreachEvent:
    """One event to emit; ``phase`` (started, escalated, continuing, recovered) makes its
    id unique within the job and tick."""

    job_id: str
    deployment_id: str
    phase: str
    severity: str
    message: str
    attributes: dict[str, str]


def job_windows(telemetry: Iterable[DeploymentTelemetry], slos: Mapping[str, Slo],
                min_requests: float = BreachPolicy.min_requests) -> dict[str, JobWindow]:
    """Each online job's worst window among its deployments with enough requests."""
    worst: dict[str, tuple[float, JobWindow]] = {}
    for t in telemetry:
        slo = slos.get(t.job_id)
        if slo is None or t.requests_finished < min_requests:
            continue
        w = JobWindow(t.deployment_id, t.ttft_p95_s * 1e3, t.tpot_p95_s * 1e3, t.window_s)
        over = max(w.ttft_ms / slo.ttft_ms, w.tpot_ms / slo.tpot_ms)
        if t.job_id not in worst or over > worst[t.job_id][0]:
            worst[t.job_id] = (over, w)
    return {job: w for job, (_, w) in worst.items()}


@dataclass(frozen=True)
class _Episode:
    since_tick: int
    last_tick: int         # of its last window over the SLO
    breached: int          # windows over the SLO in it
    complete: bool         # its start lies inside the lookback
    worst_ttft_ms: float
    worst_tpot_ms: float


def _in_breach(flags: list[bool], i: int, recover_after: int) -> bool:
    """In breach at observation ``i``: one of the last ``recover_after`` broke the SLO."""
    return any(flags[max(0, i - recover_after + 1):i + 1])


def _episode(obs: list[tuple[int, JobWindow]], flags: list[bool], end: int,
             recover_after: int) -> _Episode:
    """The breach episode that is running at observation ``end``."""
    start = end
    while start > 0 and _in_breach(flags, start - 1, recover_after):
        start -= 1
    inside = [w for (_, w), bad in zip(obs[start:end + 1], flags[start:end + 1], strict=True)
              if bad]
    first = next(i for i in range(start, end + 1) if flags[i])
    last = next(i for i in range(end, start - 1, -1) if flags[i])
    return _Episode(since_tick=obs[first][0], last_tick=obs[last][0], breached=len(inside),
                    complete=start > 0,
                    worst_ttft_ms=max(w.ttft_ms for w in inside),
                    worst_tpot_ms=max(w.tpot_ms for w in inside))


def _figures(w: JobWindow, slo: Slo) -> str:
    return (f"p95 TTFT {w.ttft_ms:,.0f} ms (SLO {slo.ttft_ms:,.0f}), TPOT {w.tpot_ms:.1f} ms"
            f" (SLO {slo.tpot_ms:.1f})")


def _worst(e: _Episode, slo: Slo) -> str:
    return (f"worst p95 TTFT {e.worst_ttft_ms:,.0f} ms (SLO {slo.ttft_ms:,.0f}), TPOT "
            f"{e.worst_tpot_ms:.1f} ms (SLO {slo.tpot_ms:.1f})")


def _attributes(phase: str, w: JobWindow, slo: Slo, e: _Episode) -> dict[str, str]:
    return {"phase": phase, "ttft_p95_ms": f"{w.ttft_ms:.1f}", "tpot_p95_ms": f"{w.tpot_ms:.2f}",
            "slo_ttft_ms": f"{slo.ttft_ms:g}", "slo_tpot_ms": f"{slo.tpot_ms:g}",
            "since_tick": str(e.since_tick), "windows_breached": str(e.breached),
            "worst_ttft_p95_ms": f"{e.worst_ttft_ms:.1f}",
            "worst_tpot_p95_ms": f"{e.worst_tpot_ms:.2f}"}


def _over(e: _Episode, known: str, slo: Slo) -> tuple[str, str, str]:
    """(phase, severity, message) of an episode that has just ended."""
    if e.breached == 1 and known == "1":  # never told as started: this is its only event
        return ("blip", "warning",
                f"SLO broken in one window (tick {e.since_tick}), within it since: "
                f"{_worst(e, slo).removeprefix('worst ')}")
    span = e.last_tick - e.since_tick + 1
    return ("recovered", "info",
            f"SLO met again after {span} ticks in breach since tick {e.since_tick} "
            f"({known} windows over the SLO; {_worst(e, slo)})")


def _job_event(tick: int, job: str, obs: list[tuple[int, JobWindow]], slo: Slo,
               policy: BreachPolicy, whole_run: bool) -> BreachEvent | None:
    """The event (if any) for one job whose last observation is at ``tick``."""
    flags = [w.breaks(slo) for _, w in obs]
    now, w = len(obs) - 1, obs[-1][1]
    was = now > 0 and _in_breach(flags, now - 1, policy.recover_after)
    is_ = _in_breach(flags, now, policy.recover_after)
    if not (was or is_):
        return None
    e = _episode(obs, flags, now if is_ else now - 1, policy.recover_after)
    exact = e.complete or whole_run
    known = f"{e.breached}" if exact else f"≥{e.breached}"
    span = tick - e.since_tick + 1
    if not is_:
        phase, severity, message = _over(e, known, slo)
    elif exact and e.breached < policy.confirm_windows:
        return None  # maybe a blip: told when the next window breaks too, or when over
    elif flags[now] and exact and e.breached == policy.confirm_windows:
        phase, severity = "started", "warning"
        message = (f"SLO breach: {known} windows over the SLO since tick {e.since_tick}; "
                   f"now {_figures(w, slo)} over the last {w.window_s:.0f} s")
    elif flags[now] and exact and e.breached == policy.escalate_after:
        phase, severity = "escalated", "error"
        message = (f"SLO breach persists: {known} windows over the SLO since tick "
                   f"{e.since_tick}; now {_figures(w, slo)}; {_worst(e, slo)}")
    elif tick % policy.summary_every == 0:
        phase = "continuing"
        severity = "error" if e.breached >= policy.escalate_after else "warning"
        message = (f"breaching for {span} ticks since tick {e.since_tick} ({known} windows "
                   f"over the SLO); now {_figures(w, slo)}; {_worst(e, slo)}")
    else:
        return None
    return BreachEvent(job, w.deployment_id, phase, severity, message,
                       _attributes(phase, w, slo, e))


def breach_events(tick: int, history: Mapping[int, Mapping[str, JobWindow]],
                  slos: Mapping[str, Slo], policy: BreachPolicy) -> list[BreachEvent]:
    """The SLO-breach events of ``tick``, given each tick's ``job_windows`` (``history``
    must hold ``tick`` and may hold the ``lookback - 1`` ticks before it; older entries
    are ignored, a missing tick means no window)."""
    first = tick - policy.lookback + 1
    events = []
    for job in sorted(history.get(tick, {})):  # sorted: the same order on every replay
        slo = slos.get(job)
        if slo is None:
            continue
        obs = [(t, history[t][job]) for t in range(max(first, 0), tick + 1)
               if t in history and job in history[t]]
        event = _job_event(tick, job, obs, slo, policy, whole_run=first <= 0)
        if event is not None:
            events.append(event)
    return events
