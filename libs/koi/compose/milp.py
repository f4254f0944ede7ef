"""The exact composer: one mixed-integer program solved by HiGHS (scipy.optimize.milp).

The textbook form has, per candidate c, integer replicas x[c], a selection binary y[c]
and continuous served tok/s s[c], with Σ_{c∈j} y ≤ 1, lo·y ≤ x ≤ hi·y, s ≤ cap·x,
Σ s ≤ demand and Σ gpus·x ≤ free per offering. Its LP relaxation is weak (churn and the
minimum replicas are paid only in proportion to x/hi), and HiGHS needed ~2 s to close a
40-job × 40-candidate tick. We solve the same problem in its *option* form instead:

    one binary z[k] per option k = (candidate c, replicas r), lo[c] ≤ r ≤ hi[c], worth
        f[k] = a[c]·(min(d[j], s) + w_ahead·(s − min(d[j], s))) − cost[c]·r − churn[c],
        s = min(d[j] + ahead[j], cap[c]·r)                     (the exact objective term)
    maximise  Σ_k f[k]·z[k]
    s.t.      Σ_{k of job j} z[k] ≤ 1                   (one candidate, one replica count)
              Σ_k use[k, o]·z[k] ≤ room[o]     (per offering; ``Problem.use``)

which has exactly the same feasible plans and objective values (served = min(d, cap·r) is
what the textbook form's s[c] equals at its optimum, with ahead[j] = 0), and whose LP
relaxation is the convex hull of each job's options. Options of one job on one offering
that all stay in place, or all move, use the same capacity elsewhere and compete only
through (GPUs on that offering, value), so only that Pareto frontier is kept: options
with more GPUs and no more value, or no positive value, can never be in an optimum.

HiGHS sees the objective as a non-negative *loss* Σ_j V[j]·(d[j] + w_ahead·ahead[j]) −
Σ_k f[k]·z[k] (a fixed variable carries the constant), so its relative gap is relative to
the value the plan leaves on the table plus what it pays, not to the large value total.
No I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, linprog, milp
from scipy.sparse import coo_array, csr_array

from koi.compose.problem import EPS, Assignment, Problem, empty_assignment, evaluate

STATUS = {0: "optimal", 1: "time or node limit", 2: "infeasible", 3: "unbounded", 4: "other"}


@dataclass(frozen=True, eq=False)
class Options:
    """The (candidate, replicas) options that can be in an optimal plan."""

    row: np.ndarray       # table row of the candidate
    replicas: np.ndarray
    gpus: np.ndarray      # GPUs of its replicas (on its own offering)
    value: np.ndarray     # objective term f[k]
    job: np.ndarray
    off: np.ndarray
    use: np.ndarray       # (k, O) capacity used of the room, ``Problem.use``


@dataclass(frozen=True, eq=False)
class MilpResult:
    assignment: Assignment | None   # None: no feasible incumbent (or the solver failed)
    status: str
    gap: float | None
    loss_bound: float | None        # HiGHS dual bound on the loss
    seconds: float
    options: int = 0
    message: str = ""


def options(p: Problem) -> Options:
    rows = p.kept
    count = (p.hi[rows] - p.lo[rows] + 1).clip(min=0)
    row = np.repeat(rows, count)
    start = np.repeat(np.cumsum(count) - count, count)
    reps = p.lo[row] + np.arange(row.size) - start
    job, off = p.job_of[row], p.off_of[row]
    value, _ = p.terms(row, reps)
    gpus = p.table.gpus_per_replica[row] * reps
    # an option worth nothing can still belong in the plan: placing a job that keeps its
    # GPUs while unplaced (in place, on fewer of them) releases the rest to other jobs
    frees = np.zeros(row.size, dtype=bool)
    maybe = (value <= EPS) & (p.extra[job, (~p.table.in_place[row]).astype(np.int64)]
                              < 0).any(axis=1)
    if maybe.any():
        frees[maybe] = (p.use(row[maybe], reps[maybe]) < 0).any(axis=1)
    pos = (value > EPS) | frees
    row, reps, job, off, value, gpus = (v[pos] for v in (row, reps, job, off, value, gpus))
    moves = ~p.table.in_place[row]
    # per (job, offering, in place or not): ascending GPUs, best value first; keep strict
    # improvements only
    order = np.lexsort((row, reps, -value, gpus, moves, off, job))
    key = np.stack([job, off, moves.astype(np.int64)])[:, order]
    group = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)]
    keep = np.zeros(order.size, dtype=bool)
    starts = np.flatnonzero(group)
    ends = np.r_[starts[1:], order.size]
    vals = value[order]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        prev = np.maximum.accumulate(np.r_[-np.inf, vals[s:e - 1]])
        keep[s:e] = vals[s:e] > prev + EPS
    k = np.sort(order[keep], kind="stable")
    return Options(row=row[k], replicas=reps[k], gpus=gpus[k], value=value[k], job=job[k],
                   off=off[k], use=p.use(row[k], reps[k]))


def solve_milp(p: Problem, time_limit_s: float, mip_rel_gap: float,
               incumbent: Assignment | None = None, node_limit: int = 2000) -> MilpResult:
    """Solve the option MILP; ``incumbent`` (e.g. the greedy's plan) seeds the pruning.

    Exact up to HiGHS's gap: the LP relaxation gives a lower bound L on the loss and
    reduced costs r[k]; an LP-guided rounding (or ``incumbent``, whichever is better) gives
    a plan of loss U. An option with L + r[k] > U cannot be in any plan better than U
    (reduced-cost fixing), so HiGHS only sees the rest; if it finds nothing better, the
    rounded plan is optimal.
    """
    t0 = time.perf_counter()
    opt = options(p)
    jn = len(p.jobs)
    if opt.row.size == 0:
        return MilpResult(empty_assignment(jn), "optimal", 0.0, None,
                          time.perf_counter() - t0)
    total = p.value_total
    lp = _relaxation(p, opt)
    best = incumbent if incumbent is not None else empty_assignment(jn)
    if lp is not None:
        rounded = _round(p, opt, lp[0])
        if evaluate(p, rounded) > evaluate(p, best):
            best = rounded
    upper = total - evaluate(p, best)
    cols = np.arange(opt.row.size)
    lower = 0.0
    if lp is not None:
        lower = lp[1]
        cols = np.flatnonzero(lower + lp[2] <= upper + 1e-9 * max(1.0, abs(upper)))
    left = time_limit_s - (time.perf_counter() - t0)
    res = _solve(p, opt, cols, total, max(left, 1e-3), mip_rel_gap, node_limit) \
        if cols.size else None
    seconds = time.perf_counter() - t0
    if isinstance(res, str):
        return MilpResult(None, "error", None, None, seconds, cols.size, res)
    status, bound = "optimal", lower
    if res is not None:
        status = STATUS.get(res.status, str(res.status))
        if res.x is not None:
            found = _decode(p, opt, cols, res.x)
            if evaluate(p, found) >= evaluate(p, best):
                best = found
        dual = getattr(res, "mip_dual_bound", None)
        if dual is not None and np.isfinite(dual):
            bound = max(lower, min(upper, float(dual)))
    loss = total - evaluate(p, best)
    gap = max(loss - bound, 0.0) / max(abs(loss), 1e-9) if loss > 1e-9 else 0.0
    if gap <= mip_rel_gap:
        status = "optimal"   # proven within the gap, by HiGHS or by the LP bound
    return MilpResult(best, status, gap, bound, seconds, cols.size)


def _relaxation(p: Problem, opt: Options) -> tuple[np.ndarray, float, np.ndarray] | None:
    """(LP solution, LP lower bound on the loss, reduced costs), or None if HiGHS fails."""
    a, b = _rows(p, opt, np.arange(opt.row.size))
    total = p.value_total
    try:
        res = linprog(-opt.value, A_ub=a, b_ub=b, bounds=(0, 1), method="highs")
    except (ValueError, RuntimeError):
        return None
    if res.status != 0:
        return None
    reduced = -opt.value - a.T @ res.ineqlin.marginals
    return res.x, total + float(res.fun), np.maximum(reduced, 0.0)


def _rows(p: Problem, opt: Options, cols: np.ndarray,
          extra: int = 0) -> tuple[csr_array, np.ndarray]:
    """One-per-job rows, then one capacity row per offering used; ``extra`` empty columns."""
    jn, m = len(p.jobs), cols.size
    use = opt.use[cols]
    used_off = np.flatnonzero((use != 0).any(axis=0))
    k_use, o_use = np.nonzero(use[:, used_off])
    k = np.arange(m)
    r = np.r_[opt.job[cols], jn + o_use]
    v = np.r_[np.ones(m), use[k_use, used_off[o_use]].astype(np.float64)]
    a = csr_array(coo_array((v, (r, np.r_[k, k_use])), shape=(jn + used_off.size, m + extra)))
    return a, np.r_[np.ones(jn), p.room[used_off].astype(np.float64)]


def _solve(p: Problem, opt: Options, cols: np.ndarray, total: float, time_limit_s: float,
           mip_rel_gap: float, node_limit: int) -> OptimizeResult | str:
    a, b = _rows(p, opt, cols, extra=1)
    m = cols.size
    c = np.r_[-opt.value[cols], total]      # last variable, fixed at 1, carries the offset
    bounds = Bounds(np.r_[np.zeros(m), 1.0], np.ones(m + 1))
    try:
        return milp(c, integrality=np.r_[np.ones(m), 0.0], bounds=bounds,
                    constraints=LinearConstraint(a, -np.inf, b),
                    options={"time_limit": time_limit_s, "node_limit": node_limit,
                             "mip_rel_gap": mip_rel_gap, "disp": False})
    except (ValueError, RuntimeError) as e:  # HiGHS failure: the caller falls back
        return str(e)


def _decode(p: Problem, opt: Options, cols: np.ndarray, x: np.ndarray) -> Assignment:
    sol = empty_assignment(len(p.jobs))
    for i in cols[np.flatnonzero(x[:cols.size] > 0.5)].tolist():
        j = int(opt.job[i])
        if sol.row[j] < 0:   # a second pick can only be HiGHS tolerance: keep the first
            sol.row[j], sol.replicas[j] = opt.row[i], opt.replicas[i]
    return sol


def _round(p: Problem, opt: Options, z: np.ndarray) -> Assignment:
    """LP-guided plan, then single-job moves while any improves the objective.

    Jobs go in order of the value they have at stake (V·demand); each takes its option of
    largest LP weight that still fits, else its most valuable option that fits.
    """
    by_job = [np.flatnonzero(opt.job == j) for j in range(len(p.jobs))]
    sol = empty_assignment(len(p.jobs))
    pick = np.full(len(p.jobs), -1, dtype=np.int64)     # option index per job
    left = p.room.copy()
    for j in np.lexsort((np.arange(len(p.jobs)), -p.value * p.demand)).tolist():
        ks = by_job[j]
        fit = ks[(opt.use[ks] <= left).all(axis=1)]
        if fit.size == 0:
            continue
        weighted = fit[z[fit] > 1e-6]
        k = (weighted[np.argmax(z[weighted])] if weighted.size
             else fit[np.argmax(opt.value[fit])])
        pick[j] = k
        left -= opt.use[k]
    for _ in range(3):
        if not _improve(opt, by_job, pick, left):
            break
    for j, k in enumerate(pick.tolist()):
        if k >= 0:
            sol.row[j], sol.replicas[j] = opt.row[k], opt.replicas[k]
    return sol


def _improve(opt: Options, by_job: list[np.ndarray], pick: np.ndarray,
             left: np.ndarray) -> bool:
    """One pass of best single-job moves (in place); True if any move was made."""
    moved = False
    for j, ks in enumerate(by_job):
        if ks.size == 0:
            continue
        cur = int(pick[j])
        room = left + opt.use[cur] if cur >= 0 else left
        fit = ks[(opt.use[ks] <= room).all(axis=1)]
        if fit.size == 0:
            continue
        k = int(fit[np.argmax(opt.value[fit])])
        if opt.value[k] > (opt.value[cur] if cur >= 0 else 0.0) + EPS:
            left[:] = room - opt.use[k]
            pick[j] = k
            moved = True
    return moved
