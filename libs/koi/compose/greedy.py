"""The greedy composer: the fallback when HiGHS is too slow, fails or the tick is too big.

Jobs in order of priority (highest first), then of their best value density; each takes
the candidate that fits the capacity still left and ranks best by
    (serves its whole demand, objective term per GPU)
with the replica count that maximises its objective term within what fits. A job whose
best option does not earn more than it costs is left unplaced. Same ``Assignment`` as the
MILP, same objective (``koi.compose.problem``). No I/O; deterministic.
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
    left = p.free.copy()
    by_job = _rows_by_job(p)
    for j in _job_order(p, by_job):
        pick = best_option(p, by_job[j], left)
        if pick is None:
            continue
        row, reps = pick
        sol.row[j] = row
        sol.replicas[j] = reps
        left[p.off_of[row]] -= int(p.table.gpus_per_replica[row]) * reps
    return sol


def best_option(p: Problem, rows: np.ndarray, left: np.ndarray) -> tuple[int, int] | None:
    """The greedy's pick among ``rows`` given ``left`` GPUs per offering, or None."""
    best: tuple[tuple[bool, float, int], int, int] | None = None
    for row in rows.tolist():
        gpr = int(p.table.gpus_per_replica[row])
        limit = min(int(p.hi[row]), int(left[p.off_of[row]]) // gpr)
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
