"""Churn: how often a policy moves its jobs, how often it undoes a move, what moving costs.

One definition, used by ``koi bench --jobs``, its JSON and docs/RESULTS.md, from the run's
records only (``RunRecord.events``' structured ``before``/``after``, the timeline's GPUs
per job, and the per-job costs the cluster counted in ``JobOutcome``):

* a **move** is a policy's change to a running job: ``scale_up`` / ``scale_down`` (the
  planned replica count changes; re-placing a replica the world took, at the same count,
  is a repair, not a move), ``swap`` (another offering or accelerator, make-before-break)
  and ``relaunch`` (ranks restart on the same GPUs). A first launch, a stop and a drain
  that finishes a swap are not moves;
* **moves per job-hour** — a job's moves ÷ the hours it held GPUs; a run's is the median
  over its jobs that held any (``median_moves_per_job_hour``) and the pooled ratio;
* a **flap** — a move that undoes one made less than ``window_s`` before it on the same
  job: a scale in the other direction (4 → 3 → 4), or a swap/relaunch back to a
  placement the job left (A → B → A). Each move counts at most once;
* **start-up / drain GPU-minutes** — GPUs held by replicas still provisioning and loading
  weights, or draining (first launches included: it is what a move's start-up costs
  beside what any placement costs);
* **requests disrupted** — requests a move evicted (a relaunch, a cancelled starting
  replica; a STOP ends a job, it is not a move) or that arrived while a relaunch left
  the job no replica; **dropped by a move** — those of them never served.

Pure functions over records; no simulator, no policy, no I/O. ``placement_key`` is the
one name a placement has in the events.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from koi.records import EventRecord, RunRecord
from koi.space import DeploymentConfig, config_hash

FLAP_WINDOW_S = 600.0
MOVE_KINDS: tuple[str, ...] = ("scale_up", "scale_down", "swap", "relaunch")
FORCED_RELAUNCH = "capacity forbids make-before-break"   # = koi.planner.place's reason
_SCALE_DETAIL = re.compile(r"^(\d+) → (\d+) replicas")


def placement_key(config: DeploymentConfig, offering: str) -> str:
    """A placement's name in the events: accelerator, parallelism and engine to read, a
    hash of every other knob to compare (replicas and the offering left out of it)."""
    shape = config.with_(offering="", replicas=1)
    return (f"{config.accelerator} tp{config.tp} pp{config.pp} {config.engine}"
            f" #{config_hash(shape)[:8]} @{offering}")


@dataclass(frozen=True, slots=True)
class Move:
    time_s: float
    job_id: str
    kind: str            # one of MOVE_KINDS
    before: str          # replicas (scale) or placement key (swap, relaunch)
    after: str


def _scale_ends(e: EventRecord) -> tuple[int, int] | None:
    if e.before and e.after:
        return int(e.before), int(e.after)
    m = _SCALE_DETAIL.match(e.detail)   # records written before the structured ends
    return (int(m.group(1)), int(m.group(2))) if m else None


def moves_of(events: Iterable[EventRecord]) -> list[Move]:
    """The policy's moves among a run's events, in time order."""
    out = []
    for e in events:
        if e.kind == "scale":
            ends = _scale_ends(e)
            if ends is None or ends[0] == ends[1]:
                continue
            kind = "scale_up" if ends[1] > ends[0] else "scale_down"
            out.append(Move(e.time_s, e.job_id, kind, str(ends[0]), str(ends[1])))
        elif e.kind in ("swap", "relaunch"):
            out.append(Move(e.time_s, e.job_id, e.kind, e.before, e.after))
    return sorted(out, key=lambda m: m.time_s)


def flaps(moves: Sequence[Move], window_s: float = FLAP_WINDOW_S) -> list[Move]:
    """The moves (of any jobs, in time order) that undo an earlier move of the same job
    made less than ``window_s`` before (module docstring)."""
    by_job: dict[str, list[Move]] = defaultdict(list)
    out = []
    for m in sorted(moves, key=lambda m: m.time_s):
        earlier = [p for p in by_job[m.job_id] if m.time_s - p.time_s < window_s]
        if any(_undoes(m, p) for p in earlier):
            out.append(m)
        by_job[m.job_id].append(m)
    return out


def _undoes(m: Move, p: Move) -> bool:
    if m.kind.startswith("scale") and p.kind.startswith("scale"):
        return m.kind != p.kind
    if m.kind in ("swap", "relaunch") and p.kind in ("swap", "relaunch"):
        return bool(m.after) and m.after == p.before
    return False


def job_hours(record: RunRecord) -> dict[str, float]:
    """Hours each job held GPUs (a tick counts whole when it ended holding any)."""
    hours: dict[str, float] = defaultdict(float)
    tl = record.timeline
    for i, t in enumerate(tl):
        end = tl[i + 1].time_s if i + 1 < len(tl) else record.horizon_s
        for job, by_family in t.gpus_by_job.items():
            if sum(by_family.values()) > 0:
                hours[job] += max(end - t.time_s, 0.0) / 3600.0
    return dict(hours)


@dataclass(frozen=True, slots=True)
class JobChurn:
    """One job's churn over a run."""

    job_id: str
    kind: str                        # "online" | "batch"
    hours: float                     # hours it held GPUs
    moves: dict[str, int]            # MOVE_KINDS → count
    flaps: int
    startup_gpu_min: float
    drain_gpu_min: float
    disrupted_requests: float
    dropped_by_move: float

    @property
    def total_moves(self) -> int:
        return sum(self.moves.values())

    @property
    def moves_per_hour(self) -> float:
        return self.total_moves / self.hours if self.hours > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "total_moves": self.total_moves,
                "moves_per_hour": self.moves_per_hour}


@dataclass(frozen=True, slots=True)
class RunChurn:
    """A run's churn: totals and the per-job rows."""

    jobs: tuple[JobChurn, ...]
    window_s: float = FLAP_WINDOW_S
    moves: dict[str, int] = field(default_factory=dict)
    # relaunches of online jobs (their traffic waits through the restart), and of those
    # the ones the placer said capacity forced (no room for make-before-break)
    online_relaunches: int = 0
    forced_relaunches: int = 0

    @property
    def total_moves(self) -> int:
        return sum(self.moves.values())

    @property
    def job_hours(self) -> float:
        return sum(j.hours for j in self.jobs)

    @property
    def moves_per_job_hour(self) -> float:
        """Pooled: all moves ÷ all job-hours."""
        return self.total_moves / self.job_hours if self.job_hours > 0 else 0.0

    @property
    def median_moves_per_job_hour(self) -> float:
        """The median over jobs that held GPUs of each one's moves per hour."""
        rates = [j.moves_per_hour for j in self.jobs if j.hours > 0]
        return statistics.median(rates) if rates else 0.0

    @property
    def max_moves_per_job_hour(self) -> float:
        return max((j.moves_per_hour for j in self.jobs if j.hours > 0), default=0.0)

    @property
    def flaps(self) -> int:
        return sum(j.flaps for j in self.jobs)

    @property
    def jobs_with_flaps(self) -> int:
        return sum(1 for j in self.jobs if j.flaps)

    def total(self, name: str) -> float:
        return float(sum(getattr(j, name) for j in self.jobs))

    def to_dict(self, *, jobs: bool = False) -> dict[str, object]:
        """The run's figures (``koi bench`` JSON ``churn``); per job with ``jobs``."""
        out: dict[str, object] = {
            "window_s": self.window_s, "moves": dict(self.moves),
            "total_moves": self.total_moves, "job_hours": self.job_hours,
            "moves_per_job_hour": self.moves_per_job_hour,
            "median_moves_per_job_hour": self.median_moves_per_job_hour,
            "max_moves_per_job_hour": self.max_moves_per_job_hour,
            "flaps": self.flaps, "jobs_with_flaps": self.jobs_with_flaps,
            "online_relaunches": self.online_relaunches,
            "forced_relaunches": self.forced_relaunches,
            **{k: self.total(k) for k in ("startup_gpu_min", "drain_gpu_min",
                                          "disrupted_requests", "dropped_by_move")},
            # online jobs' alone: a batch request a move evicts is re-fed, not lost
            **{f"online_{k}": float(sum(getattr(j, k) for j in self.jobs
                                        if j.kind == "online"))
               for k in ("disrupted_requests", "dropped_by_move")}}
        if jobs:
            out["jobs"] = [j.to_dict() for j in self.jobs]
        return out


def run_churn(record: RunRecord, window_s: float = FLAP_WINDOW_S) -> RunChurn:
    """The churn of one run's record (submitted jobs, in the record's order)."""
    moves = moves_of(record.events)
    flapped = Counter(m.job_id for m in flaps(moves, window_s))
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    for m in moves:
        kinds[m.job_id][m.kind] += 1
    hours = job_hours(record)
    rows = tuple(JobChurn(
        j.job_id, j.kind, hours.get(j.job_id, 0.0),
        {k: kinds[j.job_id][k] for k in MOVE_KINDS}, flapped[j.job_id],
        j.startup_gpu_s / 60.0, j.drain_gpu_s / 60.0, j.disrupted_requests,
        j.dropped_by_move) for j in record.jobs if j.submitted)
    total = Counter(m.kind for m in moves)
    online = {j.job_id for j in record.jobs if j.kind == "online"}
    relaunches = [e for e in record.events if e.kind == "relaunch" and e.job_id in online]
    forced = sum(1 for e in relaunches if FORCED_RELAUNCH in e.detail)
    return RunChurn(rows, window_s, {k: total[k] for k in MOVE_KINDS}, len(relaunches),
                    forced)


def by_job(churn: RunChurn) -> Mapping[str, JobChurn]:
    return {j.job_id: j for j in churn.jobs}


__all__ = ["FLAP_WINDOW_S", "MOVE_KINDS", "JobChurn", "Move", "RunChurn", "by_job", "flaps",
           "job_hours", "moves_of", "placement_key", "run_churn"]
