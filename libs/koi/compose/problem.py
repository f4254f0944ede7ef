"""The composition problem in array form, its pruning and its objective.

``build_problem`` turns a ``ComposeInput`` into per-job and per-candidate coefficient
arrays (one definition of the objective that the MILP, the greedy and the tests share),
drops candidates that can never be chosen (SLO-infeasible, not fitting the room left,
losing money on every replica) and keeps the top-K per job by value density.
``evaluate`` scores an assignment exactly. No solver calls, no I/O.

Capacity. The plan disposes of every free GPU and every GPU the jobs hold now
(``avail``). What a plan occupies on each offering: an unplaced job what it keeps
(``keep``: an online job left serving; a batch job is drained and keeps nothing); a job
placed in place its replicas' GPUs; a job that moves its new replicas' GPUs *and* what
it holds now, since the old deployment serves until the new one is ready. Written as
the change from leaving the job unplaced, option k of job j uses

    use_k = gpus_k · e(offering_k) + extra[j, moves_k],   extra[j, m] = m·held[j] − keep[j]

of ``room = avail − Σ_j keep[j]`` (vectors over offerings); ``Problem.use`` is that one
definition, shared by the MILP's rows, the greedy and the checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from koi.compose.types import (
    SECONDS_PER_HOUR,
    CandidateTable,
    ComposeInput,
    JobDemand,
    JobKind,
)
from koi.errors import InvalidSpecError

EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Problem:
    """Per-job arrays (length J), full-table arrays (length N) and kept candidates (n)."""

    jobs: tuple[JobDemand, ...]
    table: CandidateTable
    offerings: tuple[str, ...]
    free: np.ndarray             # (O,) free GPUs per offering (not held by any job)
    avail: np.ndarray            # (O,) free + held: what the plan disposes of
    room: np.ndarray             # (O,) avail − what unplaced jobs keep
    held: np.ndarray             # (J, O) GPUs each job holds now
    extra: np.ndarray            # (J, 2, O) use beyond an option's own GPUs: [in place, move]
    holds: np.ndarray            # (J,) bool: the job holds GPUs (its extra is not all 0)
    demand: np.ndarray           # (J,) tok/s wanted
    ahead: np.ndarray            # (J,) tok/s beyond demand worth ``ahead_share`` as much
    ahead_share: float           # ComposeWeights.ahead
    value: np.ndarray            # (J,) objective units per (tok/s · hour) at zero risk
    # over the full table (N,)
    job_of: np.ndarray           # job index of each row
    off_of: np.ndarray           # offering index of each row
    cap: np.ndarray              # effective served tok/s per replica (after preemption)
    a: np.ndarray                # value coefficient per served tok/s·hour, after risk
    cost: np.ndarray             # weighted $ per replica-hour
    churn: np.ndarray            # weighted migration cost (0 for the current candidate)
    lo: np.ndarray               # min replicas when chosen
    hi: np.ndarray               # max useful replicas that fit free capacity
    hi_at_pace: np.ndarray       # the same without work ahead of pace (≤ hi)
    fits: np.ndarray             # feasible and lo replicas fit free capacity
    profitable: np.ndarray       # fits and one fully used replica earns more than it costs
    density: np.ndarray          # net value per GPU-hour at full use
    kept: np.ndarray             # (n,) row indices handed to the solvers, grouped by job

    @property
    def n(self) -> int:
        return len(self.kept)

    def rows_of(self, j: int) -> np.ndarray:
        """All table rows of job ``j`` (any feasibility)."""
        return np.flatnonzero(self.job_of == j)

    @property
    def value_total(self) -> float:
        """The objective's ceiling before costs: every job's demand and ahead work served."""
        return float((self.value * (self.demand + self.ahead_share * self.ahead)).sum())

    def use(self, rows: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """(len(rows), O): capacity each option (row, replicas) uses of ``room``."""
        rows = np.asarray(rows, dtype=np.int64)
        out = self.extra[self.job_of[rows], (~self.table.in_place[rows]).astype(np.int64)]
        out[np.arange(rows.size), self.off_of[rows]] += \
            self.table.gpus_per_replica[rows] * np.asarray(replicas, dtype=np.int64)
        return out

    def fit_replicas(self, row: int, left: np.ndarray) -> int:
        """The most replicas of ``row`` that ``left`` (room per offering) allows; 0 when
        even its other offerings' part does not fit. (Hot in the greedy: no temporaries
        for the common job that holds nothing.)"""
        j, moves, off = self.job_of[row], int(not self.table.in_place[row]), self.off_of[row]
        base = self.extra[j, moves]
        if self.holds[j]:
            over = base > left
            over[off] = False
            if over.any():
                return 0
        return max(int(left[off] - base[off]) // int(self.table.gpus_per_replica[row]), 0)

    def terms(self, rows: np.ndarray, replicas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(objective term, served tok/s) of running ``replicas`` of each table row.

        served = min(demand + ahead, cap·x); the part up to the demand earns a, the part
        beyond it ``ahead_share``·a (batch work ahead of its deadline's pace).
        """
        job = self.job_of[rows]
        capx = self.cap[rows] * replicas
        served = np.minimum(self.demand[job] + self.ahead[job], capx)
        at_pace = np.minimum(self.demand[job], served)
        gain = self.a[rows] * (at_pace + self.ahead_share * (served - at_pace))
        return gain - self.cost[rows] * replicas - self.churn[rows], served


@dataclass(frozen=True, eq=False)
class Assignment:
    """A solution: per job the chosen table row (−1 = none) and its replicas."""

    row: np.ndarray        # (J,) int
    replicas: np.ndarray   # (J,) int


def build_problem(inp: ComposeInput) -> Problem:
    jobs = tuple(inp.jobs)
    table = inp.table()
    w = inp.weights
    jindex = {j.job_id: i for i, j in enumerate(jobs)}
    try:
        job_of = np.fromiter((jindex[j] for j in table.job_id), np.int64, len(table))
    except KeyError as e:
        raise InvalidSpecError("candidates.job_id", f"unknown job {e.args[0]!r}") from None

    offerings = tuple(sorted(set(inp.capacity) | set(table.offering.tolist())
                             | {o for j in jobs for o in j.held_gpus}))
    oindex = {o: i for i, o in enumerate(offerings)}
    off_of = np.fromiter((oindex[o] for o in table.offering), np.int64, len(table))
    free = np.array([int(inp.capacity.get(o, 0)) for o in offerings], dtype=np.int64)
    held = np.zeros((len(jobs), len(offerings)), dtype=np.int64)
    for i, j in enumerate(jobs):
        for o, g in j.held_gpus.items():
            held[i, oindex[o]] = g
    keep = held * np.array([j.keeps_gpus_unplaced for j in jobs], dtype=np.int64)[:, None]
    extra = np.stack([-keep, held - keep], axis=1)
    avail = free + held.sum(axis=0)
    room = avail - keep.sum(axis=0)

    kind_online = np.array([j.kind == JobKind.ONLINE for j in jobs], dtype=bool)
    tpr = _tokens_per_request(jobs, table, job_of)
    demand = np.array([_demand(j, t) for j, t in zip(jobs, tpr, strict=True)], dtype=np.float64)
    ahead = np.array([j.ahead_tok_s if j.kind == JobKind.BATCH else 0.0 for j in jobs],
                     dtype=np.float64)
    value = np.array([SECONDS_PER_HOUR * j.value_per_tok * w.priority_factor(j.priority)
                      for j in jobs], dtype=np.float64)

    gpr = table.gpus_per_replica
    cap = table.goodput_tok_s.copy()
    online_rows = kind_online[job_of] & (table.max_rate_rps > 0) & (tpr[job_of] > 0)
    cap[online_rows] = np.minimum(cap[online_rows],
                                  table.max_rate_rps[online_rows] * tpr[job_of][online_rows])
    cap *= np.clip(1.0 - w.preemption * table.preemption_exposure, 0.0, 1.0)
    cap[cap < 1e-6] = 0.0   # a millionth of a token per second is nothing (and overflows)
    a = value[job_of] * np.clip(1.0 - w.risk * table.slo_risk, 0.0, 1.0)
    cost = w.cost * table.usd_per_hour
    churn = np.where(table.is_current, 0.0, w.churn * table.migration_cost)
    if w.move_value_h > 0:
        placed = np.array([j.currently_placed for j in jobs], dtype=bool)
        moves = ~table.is_current & placed[job_of]
        churn = churn + np.where(moves, w.move_value_h * value[job_of] * demand[job_of], 0.0)

    min_r = np.array([max(1, j.min_replicas) for j in jobs], dtype=np.int64)
    max_r = np.array([j.max_replicas for j in jobs], dtype=np.int64)
    # replicas that could fit: the room, plus what every other job that keeps its GPUs
    # unplaced could release by being placed in place on fewer of them (keep = -extra[:, 0])
    own = extra[job_of, (~table.in_place).astype(np.int64), off_of]
    keep = -extra[:, 0, :]
    releasable = keep.sum(axis=0)[off_of] - keep[job_of, off_of]
    fit_r = np.maximum(room[off_of] + releasable - own, 0) // gpr
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        need = np.where(cap > 0, np.ceil(demand[job_of] / cap - EPS), 0.0)
        want = np.where(cap > 0, np.ceil((demand + ahead)[job_of] / cap - EPS), 0.0)
    need = np.minimum(need, float(max_r.max(initial=1))).astype(np.int64)
    want = np.minimum(want, float(max_r.max(initial=1))).astype(np.int64)
    # An online deployment short of its demand does not serve the rest of it worse: its
    # queue grows without bound and nearly every request misses the SLO. So a new online
    # candidate must cover the demand (up to the job's max replicas); the current one may
    # stay short when capacity is missing, since stopping it would serve no one.
    lo = min_r[job_of]
    cover = kind_online[job_of] & ~table.is_current
    lo = np.where(cover, np.maximum(lo, np.minimum(need, max_r[job_of])), lo)
    hi = np.minimum(np.minimum(max_r[job_of], fit_r), np.maximum(lo, want))
    hi_at_pace = np.minimum(hi, np.maximum(lo, need))
    fits = table.feasible_slo & (fit_r >= lo) & (lo <= max_r[job_of])
    net = a * cap - cost
    profitable = fits & (cap > 0) & (net > EPS) & ((demand + ahead)[job_of] > 0)
    density = net / gpr
    kept = _prune(profitable, job_of, off_of, density, table.is_current, inp.top_k,
                  _groups(table))
    # numpy's stub types any(axis=...) as bool | array: it cannot see that held is 2-D
    holds: np.ndarray = held.any(axis=1)  # type: ignore[assignment]
    return Problem(jobs=jobs, table=table, offerings=offerings, free=free, avail=avail,
                   room=room, held=held, extra=extra, holds=holds, demand=demand,
                   ahead=ahead, ahead_share=w.ahead, value=value, job_of=job_of,
                   off_of=off_of, cap=cap, a=a, cost=cost, churn=churn, lo=lo, hi=hi,
                   hi_at_pace=hi_at_pace, fits=fits, profitable=profitable,
                   density=density, kept=kept)


def _tokens_per_request(jobs: tuple[JobDemand, ...], table: CandidateTable,
                        job_of: np.ndarray) -> np.ndarray:
    """Online jobs' output tokens per request: given, else the median goodput ÷ max rate."""
    out = np.array([j.output_tok_per_request for j in jobs], dtype=np.float64)
    ok = table.feasible_slo & (table.max_rate_rps > 1e-6) & (table.goodput_tok_s > 1e-6)
    for i, j in enumerate(jobs):
        if j.kind != JobKind.ONLINE or out[i] > 0:
            continue
        rows = ok & (job_of == i)
        if rows.any():
            out[i] = float(np.median(table.goodput_tok_s[rows] / table.max_rate_rps[rows]))
    return out


def _demand(job: JobDemand, tok_per_request: float) -> float:
    if job.kind == JobKind.BATCH:
        return job.required_tok_s
    return job.demand_rate_rps * tok_per_request


def _groups(table: CandidateTable) -> np.ndarray:
    """A group id per row: rows of one job with one configuration on one offering (the
    same candidate at several margins, each with its SLO risk) share one; without
    configuration every row is its own group."""
    if not table.configs:
        return np.arange(len(table))
    ids: dict = {}
    # a configuration object repeated over rows (one per margin) is hashed once
    seen: dict[tuple[str, int], int] = {}
    out = np.empty(len(table), dtype=np.int64)
    for i, (j, c) in enumerate(zip(table.job_id, table.configs, strict=True)):
        if c is None:
            out[i] = ids.setdefault(i, len(ids))
            continue
        key = (j, id(c))
        if key not in seen:
            seen[key] = ids.setdefault((j, c), len(ids))
        out[i] = seen[key]
    return out


def _prune(ok: np.ndarray, job_of: np.ndarray, off_of: np.ndarray, density: np.ndarray,
           current: np.ndarray, k: int, group: np.ndarray | None = None) -> np.ndarray:
    """Per job keep ≤ k groups of rows: its current one, the best per offering, then the
    densest (a group ranks by its densest row, and is kept whole: the MILP chooses among
    a candidate's margins, not the pruning).

    The best-per-offering tier keeps the MILP able to move a job to another offering when
    its favourite one is contested, instead of K near-copies on one offering.
    """
    rows = np.flatnonzero(ok)
    if rows.size == 0 or group is None:
        return _prune_rows(rows, job_of, off_of, density, current, k)
    g = group[rows]
    order = np.lexsort((rows, -density[rows], g))
    first = np.r_[True, g[order][1:] != g[order][:-1]]
    reps = _prune_rows(rows[order[first]], job_of, off_of, density, current, k)
    return rows[np.isin(g, group[reps])]


def _prune_rows(rows: np.ndarray, job_of: np.ndarray, off_of: np.ndarray,
                density: np.ndarray, current: np.ndarray, k: int) -> np.ndarray:
    if rows.size == 0:
        return rows
    j, o, d = job_of[rows], off_of[rows], density[rows]
    by_off = np.lexsort((rows, -d, o, j))
    first = np.ones(rows.size, dtype=bool)
    first[1:] = (j[by_off][1:] != j[by_off][:-1]) | (o[by_off][1:] != o[by_off][:-1])
    tier = np.full(rows.size, 2, dtype=np.int64)
    tier[by_off[first]] = 1
    tier[current[rows]] = 0
    order = np.lexsort((rows, -d, tier, j))
    js = j[order]
    starts = np.flatnonzero(np.r_[True, js[1:] != js[:-1]])
    rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
    keep = order[(rank < k) | (tier[order] == 0)]
    return np.sort(rows[keep], kind="stable")


def contribution(p: Problem, row: int, replicas: int) -> tuple[float, float]:
    """(objective term, served tok/s) of running ``replicas`` of table row ``row``."""
    obj, served = p.terms(np.array([row]), np.array([replicas]))
    return float(obj[0]), float(served[0])


def evaluate(p: Problem, sol: Assignment) -> float:
    """The objective of an assignment, objective units per hour."""
    return sum(contribution(p, int(r), int(x))[0]
               for r, x in zip(sol.row, sol.replicas, strict=True) if r >= 0)


def gpus_used(p: Problem, sol: Assignment) -> np.ndarray:
    """(O,) GPUs the plan occupies per offering (≤ ``p.avail`` when valid)."""
    placed = np.flatnonzero(sol.row >= 0)
    used = p.avail - p.room
    if placed.size:
        used = used + p.use(sol.row[placed], sol.replicas[placed]).sum(axis=0)
    return used


def check_assignment(p: Problem, sol: Assignment) -> str:
    """'' if the assignment is valid, else what is wrong (used to vet solver output)."""
    for j, (r, x) in enumerate(zip(sol.row, sol.replicas, strict=True)):
        if r < 0:
            if x != 0:
                return f"job {p.jobs[j].job_id} has replicas but no candidate"
            continue
        if p.job_of[r] != j or not p.table.feasible_slo[r]:
            return f"job {p.jobs[j].job_id} got a foreign or SLO-infeasible candidate"
        if not p.lo[r] <= x <= p.jobs[j].max_replicas:
            return f"job {p.jobs[j].job_id} got {x} replicas outside its bounds"
    over = np.flatnonzero(gpus_used(p, sol) > p.avail)
    if over.size:
        return f"offering {p.offerings[int(over[0])]} over capacity"
    return ""


def empty_assignment(n_jobs: int) -> Assignment:
    return Assignment(row=np.full(n_jobs, -1, dtype=np.int64),
                      replicas=np.zeros(n_jobs, dtype=np.int64))


def best_replicas(p: Problem, row: int, limit: int) -> int:
    """The replica count in [lo, limit] that maximises the row's objective term (0 if none)."""
    lo = int(p.lo[row])
    if limit < lo:
        return 0
    cap, j = float(p.cap[row]), p.job_of[row]
    options = {lo, limit}
    for d in (float(p.demand[j]), float(p.demand[j] + p.ahead[j])):
        exact = d / cap if cap > 0 else 0.0
        options |= {min(max(math.floor(exact + EPS), lo), limit),
                    min(max(math.ceil(exact - EPS), lo), limit)}
    return max(sorted(options), key=lambda r: contribution(p, row, r)[0])
