"""When to run a hypothesis round: a pure function of the tick's signals and its state.

``triggers(state, signals, settings) -> (reasons, state')``: a round is due (``reasons``
non-empty) when a job appears that no round has seen, when a job has breached its SLO
``breach_streak_ticks`` ticks running, when a median |log residual| moved by
``residual_shift`` since the last round, or ``trigger_period_ticks`` after the last
round — and never within ``cooldown_ticks`` of the last one (what triggered meanwhile
is still due after it: unseen jobs stay unseen until a round runs). The caller records
that a round ran with ``ran(state, signals)``. No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from koi.rlm.settings import RlmSettings


@dataclass(frozen=True)
class TickSignals:
    """What the tick says: the active jobs, those breaching an SLO this tick, and the
    median |log residual| per outcome (``TickReport.abs_error``)."""

    tick: int
    job_ids: frozenset[str] = frozenset()
    breaching: frozenset[str] = frozenset()
    abs_error: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TriggerState:
    last_round: int | None = None
    seen_jobs: frozenset[str] = frozenset()
    streaks: Mapping[str, int] = field(default_factory=dict)  # job → breaching ticks running
    reference_error: Mapping[str, float] = field(default_factory=dict)  # at the last round


def triggers(state: TriggerState, signals: TickSignals, settings: RlmSettings
             ) -> tuple[list[str], TriggerState]:
    """Why a round is due now (empty: not due), and the state with this tick's streaks."""
    streaks = {j: state.streaks.get(j, 0) + 1 for j in signals.breaching
               if j in signals.job_ids}
    nxt = replace(state, streaks=streaks)
    if state.last_round is not None and signals.tick - state.last_round < settings.cooldown_ticks:
        return [], nxt
    reasons = [f"new job {j}" for j in sorted(signals.job_ids - state.seen_jobs)]
    reasons += [f"SLO breach streak of {n} ticks on job {j}"
                for j, n in sorted(streaks.items()) if n >= settings.breach_streak_ticks]
    for outcome, err in sorted(signals.abs_error.items()):
        ref = state.reference_error.get(outcome)
        if ref is not None and abs(err - ref) >= settings.residual_shift:
            reasons.append(f"residual shift on {outcome}: {ref:.2f} → {err:.2f}")
    if state.last_round is None:
        reasons.append("first round")
    elif signals.tick - state.last_round >= settings.trigger_period_ticks:
        reasons.append(f"periodic (every {settings.trigger_period_ticks} ticks)")
    return reasons, nxt


def ran(state: TriggerState, signals: TickSignals) -> TriggerState:
    """The state after a round ran at ``signals.tick``: its jobs seen, its residual
    levels the new reference, breach streaks restarted."""
    return replace(state, last_round=signals.tick, seen_jobs=state.seen_jobs | signals.job_ids,
                   streaks={}, reference_error={**state.reference_error,
                                                **dict(signals.abs_error)})
