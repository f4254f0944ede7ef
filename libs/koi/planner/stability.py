"""Plan stability: what keeps Koi from moving a job more often than its gain is worth.

Four holds, each with a setting in ``ChurnSettings`` (``KOI_CHURN_<FIELD>`` overrides):

* **scale-down stabilisation** (``scale_down_window_s``, as the Kubernetes HPA's): an
  online job is planned for the highest rate it showed over the window, so a replica
  added for a burst is not taken away the next tick and added back the one after;
  growth is immediate;
* **cool-down** (``cooldown_s``): a job whose placement changed (swap, relaunch) less
  than this long ago keeps its configuration and offering (it may still scale);
* **operator limits** from the job spec: ``pinned`` (never moved; scales only) and
  ``max_moves_per_hour`` (its swaps, relaunches and scale changes in the last hour);
* the composer prices each move (``move_value_h`` hours of the job's demand value,
  ``koi.compose``), so a move must gain more than a few minutes of the job's worth —
  the estimate's noise — to be made.

``ChurnMemory`` is what the holds need from earlier ticks (rates, moves), updated from
each snapshot by ``remember``; ``held_jobs`` says which jobs may not change placement
this tick and why (the reason reaches ``koi explain``). Pure: no I/O, time comes from
the snapshot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from koi.cluster import ClusterSnapshot, DeploymentState, JobStatus

ENV_PREFIX = "KOI_CHURN_"
HOUR_S = 3600.0


class ChurnSettings(BaseModel):
    """The fleet's churn settings. Defaults chosen on development seeds (NOTES.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    make_before_break: bool = Field(
        True, description="An online job changes shape on its offering make-before-break "
        "(a swap there), relaunching in place only where both ends can never fit.")
    scale_down_window_s: float = Field(
        300.0, ge=0.0, le=86_400.0, description="Plan an online job for the highest rate "
        "it showed over this window (0: the last tick's rate only).")
    cooldown_s: float = Field(
        900.0, ge=0.0, le=86_400.0, description="After a swap or relaunch, a job keeps its "
        "placement this long (it may still scale).")
    move_value_h: float = Field(
        0.0, ge=0.0, le=10.0, description="A move that changes a running job's placement "
        "costs this many hours of the job's demand value in the composer's objective.")
    default_max_moves_per_hour: float = Field(
        0.0, ge=0.0, le=3600.0, description="Moves per hour a job may make when its spec "
        "sets no max_moves_per_hour (0: no limit).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChurnSettings:
        """Defaults overridden by ``KOI_CHURN_<FIELD>``; a bad value raises ValueError
        naming the variable."""
        env = os.environ if environ is None else environ
        given = {name: env[ENV_PREFIX + name.upper()] for name in cls.model_fields
                 if ENV_PREFIX + name.upper() in env}
        try:
            return cls.model_validate(given)
        except ValidationError as err:
            bad = "; ".join(f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}"
                            for e in err.errors(include_input=False, include_url=False))
            raise ValueError(bad) from None

    @classmethod
    def off(cls) -> ChurnSettings:
        """Every hold off: the planner as it was before plan stability."""
        return cls(make_before_break=False, scale_down_window_s=0.0, cooldown_s=0.0,
                   move_value_h=0.0, default_max_moves_per_hour=0.0)


@dataclass(frozen=True)
class ChurnMemory:
    """What the holds remember between ticks."""

    # online job → ((time, observed rate), …) within the window
    rates: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # deployment id → (job, shape key, planned replicas) at the last snapshot
    seen: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    # job → times of its moves (any kind) within the last hour
    moves: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # job → time of its last change of placement (swap, relaunch)
    placed_at: Mapping[str, float] = field(default_factory=dict)


def _shape_key(d) -> str:
    c = d.config
    return f"{c.with_(offering='', replicas=1)!r}@{d.offering}"


def remember(memory: ChurnMemory, snapshot: ClusterSnapshot,
             settings: ChurnSettings) -> ChurnMemory:
    """``memory`` brought up to ``snapshot``: this tick's rates, and the moves that the
    fleet shows happened since the last snapshot (a new deployment of a job that had one,
    a deployment whose shape or planned replicas changed)."""
    now = snapshot.time_s
    rates = {}
    for j in snapshot.jobs:
        if j.is_batch:
            continue
        keep = tuple(p for p in memory.rates.get(j.id, ())
                     if now - p[0] < settings.scale_down_window_s)
        rates[j.id] = (*keep, (now, j.observed_rate_rps))
    live = [d for d in snapshot.deployments
            if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING)]
    had = {job for job, _, _ in memory.seen.values()}
    moves = {k: tuple(t for t in v if now - t < HOUR_S) for k, v in memory.moves.items()}
    placed = dict(memory.placed_at)
    seen = {}
    for d in live:
        key, n = _shape_key(d), d.config.replicas
        seen[d.id] = (d.job_id, key, n)
        before = memory.seen.get(d.id)
        if before is None:
            moved = d.job_id in had          # a new deployment beside an old one: a swap
            placement = moved
        else:
            placement = before[1] != key     # a relaunch
            moved = placement or before[2] != n
        if moved:
            moves[d.job_id] = (*moves.get(d.job_id, ()), now)
        if placement:
            placed[d.job_id] = now
    return ChurnMemory(rates, seen, moves, placed)


def stabilised(snapshot: ClusterSnapshot, memory: ChurnMemory,
               settings: ChurnSettings) -> ClusterSnapshot:
    """``snapshot`` with each online job's observed rate the highest of the window (the
    scale-down stabilisation); unchanged with a window of 0."""
    if settings.scale_down_window_s <= 0:
        return snapshot
    jobs = []
    for j in snapshot.jobs:
        seen = memory.rates.get(j.id)
        peak = max((r for _, r in seen), default=0.0) if seen else 0.0
        jobs.append(replace(j, observed_rate_rps=peak)
                    if not j.is_batch and peak > j.observed_rate_rps else j)
    return replace(snapshot, jobs=tuple(jobs))


def held_jobs(snapshot: ClusterSnapshot, memory: ChurnMemory,
              settings: ChurnSettings) -> dict[str, str]:
    """Jobs that may not change placement this tick → why (for ``koi explain``)."""
    now = snapshot.time_s
    out = {}
    for j in snapshot.jobs:
        reason = _held(j, now, memory, settings)
        if reason:
            out[j.id] = reason
    return out


def _held(job: JobStatus, now: float, memory: ChurnMemory, settings: ChurnSettings) -> str:
    if getattr(job.spec, "pinned", False):
        return "held back: pinned by its spec (scales only)"
    limit = getattr(job.spec, "max_moves_per_hour", None) or settings.default_max_moves_per_hour
    recent = [t for t in memory.moves.get(job.id, ()) if now - t < HOUR_S]
    if limit and len(recent) >= limit:
        return (f"held back: {len(recent)} moves in the last hour, its limit is"
                f" {limit:g} per hour")
    at = memory.placed_at.get(job.id)
    if at is not None and settings.cooldown_s > 0 and now - at < settings.cooldown_s:
        return (f"held back: cooling down, moved {now - at:.0f} s ago"
                f" (cool-down {settings.cooldown_s:.0f} s)")
    return ""


__all__ = ["ENV_PREFIX", "ChurnMemory", "ChurnSettings", "held_jobs", "remember",
           "stabilised"]
