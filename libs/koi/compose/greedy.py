"""The greedy composer: the fallback when HiGHS is too slow, fails or the tick is too big.

Jobs in order of priority (highest first), then of their best value density; each takes
the candidate that fits the capacity still left and ranks best by
    (serves its whole demand, objective term per GPU)
with the replica count that maximises its objective term within what fits, counting
only work at pace. A job whose best option does not earn more than it costs is left
unplaced. A second pass in the same order grows batch jobs with work ahead of their pace
(and places late ones) on the capacity every job's work at pace left over. Same
``Assignment`` as the MILP, same objective (``koi.compose.problem``). No I/O;
deterministic.
"""

from __future__ import annotations

import numpy as np

from koi.compose.problem import (
    EPS,
    Assignment,
    Problem,
    best_replicas,
    contribution,
    empty_assignment,
)


def solve_greedy(p: Problem) -> Assignment:
    sol = empty_assignment(len(p.jobs))
    left = p.room.copy()
    by_job = _rows_by_job(p)
    order = _job_order(p, by_job)
    # first every job's work at pace, then work ahead of pace on the capacity left
    for j in order:
        if p.demand[j] <= EPS:
            continue
        pick = best_option(p, by_job[j], left, at_pace=True)
        if pick is not None:
            _take(p, sol, left, j, *pick)
    for j in order:
        if p.ahead[j] <= EPS:
            continue
        row, reps = int(sol.row[j]), int(sol.replicas[j])
        if row < 0:
            pick = best_option(p, by_job[j], left)
            if pick is not None:
                _take(p, sol, left, j, *pick)
            continue
        left += p.use(np.array([row]), np.array([reps]))[0]   # as if unplaced again
        more = best_replicas(p, row, min(int(p.hi[row]), p.fit_replicas(row, left)))
        _take(p, sol, left, j, row, more if more > reps and contribution(p, row, more)[0]
              > contribution(p, row, reps)[0] else reps)
    return sol


def _take(p: Problem, sol: Assignment, left: np.ndarray, j: int, row: int, reps: int) -> None:
    sol.row[j] = row
    sol.replicas[j] = reps
    left -= p.use(np.array([row]), np.array([reps]))[0]


def best_option(p: Problem, rows: np.ndarray, left: np.ndarray,
                at_pace: bool = False) -> tuple[int, int] | None:
    """The greedy's pick among ``rows`` given ``left`` room per offering, or None.

    ``at_pace`` leaves out replicas that would only serve work ahead of a batch job's pace.
    """
    best: tuple[tuple[bool, float, int], int, int] | None = None
    top = p.hi_at_pace if at_pace else p.hi
    for row in rows.tolist():
        gpr = int(p.table.gpus_per_replica[row])
        limit = min(int(top[row]), p.fit_replicas(row, left))
        reps = best_replicas(p, row, limit)
        if reps == 0:
            continue
        obj, served = contribution(p, row, reps)
        if obj <= EPS:
            continue
        full = served >= p.demand[p.job_of[row]] * (1 - 1e-9)
        key = (full, obj / (reps * gpr), -row)
        if best is None or key > best[0]:
            best = (key, row, reps)
    return None if best is None else (best[1], best[2])


def _rows_by_job(p: Problem) -> list[np.ndarray]:
    jobs = p.job_of[p.kept]
    return [p.kept[jobs == j] for j in range(len(p.jobs))]


def _job_order(p: Problem, by_job: list[np.ndarray]) -> list[int]:
    best_density = [float(p.density[r].max()) if r.size else -np.inf for r in by_job]
    return sorted(range(len(p.jobs)),
                  key=lambda j: (-p.jobs[j].priority, -best_density[j], j))
