"""Why each job got what it got: the reason strings on ``JobChoice``.

Turns a solved ``Assignment`` into one ``JobChoice`` per job. Placed jobs say where, how
much of their demand is served and at what price (and whether the batch deadline is at
risk); deferred jobs say which capacity they would need or why they are not worth it;
rejected jobs carry the evaluator's reason. No solving here, no I/O.
"""

from __future__ import annotations

import numpy as np

from koi.compose.greedy import best_option
from koi.compose.problem import EPS, Assignment, Problem, contribution
from koi.compose.types import Decision, JobChoice, JobKind

SHORT = 1 - 1e-6   # served below this share of demand counts as short


def explain(p: Problem, sol: Assignment, used: np.ndarray) -> tuple[JobChoice, ...]:
    left = p.avail - used
    return tuple(_choice(p, sol, j, left) for j in range(len(p.jobs)))


def _choice(p: Problem, sol: Assignment, j: int, left: np.ndarray) -> JobChoice:
    job = p.jobs[j]
    rows = p.rows_of(j)
    demand = float(p.demand[j])
    if rows.size == 0:
        return JobChoice(job.job_id, Decision.REJECT, "no candidate configuration was proposed"
                         " for this job", demand_tok_s=demand)
    feasible = rows[p.table.feasible_slo[rows]]
    if feasible.size == 0:
        why = job.best_infeasible_reason or (
            f"none of its {rows.size} candidate configurations meets its SLO")
        return JobChoice(job.job_id, Decision.REJECT, why, demand_tok_s=demand)
    if sol.row[j] >= 0:
        return _placed(p, j, int(sol.row[j]), int(sol.replicas[j]))
    return JobChoice(job.job_id, Decision.DEFER, _defer_reason(p, sol, j, feasible, left),
                     demand_tok_s=demand)


def _placed(p: Problem, j: int, row: int, reps: int) -> JobChoice:
    job, t = p.jobs[j], p.table
    obj, served = contribution(p, row, reps)
    demand = float(p.demand[j])
    usd = float(t.usd_per_hour[row]) * reps
    gpus = int(t.gpus_per_replica[row]) * reps
    stays = bool(t.is_current[row])
    if stays:
        verb = "stays on"
    elif job.currently_placed:
        verb = f"moves (churn {float(p.churn[row]):.3g}) to"
    else:
        verb = "placed on"
    amount = f"{served:,.0f} of {demand:,.0f} tok/s"
    ahead = served > demand / SHORT + EPS      # batch work beyond its pace, or late work
    if ahead:
        late = job.kind == JobKind.BATCH and job.deadline_s <= 0
        amount = (f"{served:,.0f} tok/s (deadline passed: finishing on spare capacity)" if late
                  else f"{served:,.0f} tok/s ({demand:,.0f} at the deadline's pace, the rest"
                  " ahead of it on spare capacity)")
    reason = (f"{verb} {t.label(row)} ×{reps} ({gpus} GPUs): {amount}, ${usd:,.2f}/h,"
              f" SLO risk {float(t.slo_risk[row]):.0%}")
    if served < demand * SHORT:
        if job.kind == JobKind.BATCH:
            reason += (f"; deadline at risk: delivers {served / demand:.0%} of the"
                       f" {demand:,.0f} tok/s needed to finish in {job.deadline_s:,.0f} s")
        else:
            reason += f"; under-provisioned: capacity for {served / demand:.0%} of demand"
    return JobChoice(job.job_id, Decision.PLACE, reason, candidate_id=str(t.candidate_id[row]),
                     offering=str(t.offering[row]),
                     config=t.configs[row] if t.configs else None, replicas=reps, gpus=gpus,
                     goodput_tok_s=served, demand_tok_s=demand, usd_per_hour=usd,
                     objective=obj, stays=stays)


def _defer_reason(p: Problem, sol: Assignment, j: int, feasible: np.ndarray,
                  left: np.ndarray) -> str:
    job = p.jobs[j]
    if p.demand[j] + p.ahead[j] <= EPS:
        if job.kind == JobKind.BATCH and job.deadline_s <= 0:
            return "deadline passed: tokens finished now are worth nothing"
        return "no demand this tick"
    fits = feasible[p.fits[feasible]]
    if fits.size == 0:
        return "no capacity: " + _shortfall(p, feasible)
    if job.best_infeasible_reason and not (p.cap[fits] > 0).any():
        # feasible only on the nominal prediction: the planner plans no value for it
        held = "kept as it runs, nothing added" if job.currently_placed else "not started"
        return f"{held}: {job.best_infeasible_reason}"
    if not p.profitable[fits].any():
        best = fits[np.argmax(p.a[fits] * p.cap[fits] - p.cost[fits])]
        return (f"not worth its cost at these weights: best option {p.table.label(best)}"
                f" earns {float(p.a[best] * p.cap[best]):,.2f}/h per replica for"
                f" {float(p.cost[best]):,.2f}/h")
    kept = p.kept[p.job_of[p.kept] == j]
    alone = best_option(p, kept, p.room)
    if alone is None:
        if not any(p.fit_replicas(r, p.room) >= p.lo[r] for r in kept.tolist()):
            # it would fit only on GPUs that jobs kept as they run hold this tick
            return "no capacity: " + _shortfall(p, kept)
        return "not worth its cost: every option's churn and cost exceed the value it serves"
    row, reps = alone
    off = int(p.off_of[row])
    need = int(p.lo[row]) * int(p.table.gpus_per_replica[row])
    holders = _holders(p, sol, off)
    held = f"; held by {holders}" if holders else ""
    want = reps * int(p.table.gpus_per_replica[row])
    return (f"no capacity left this tick: its best option {p.table.label(row)} needs"
            f" {want} GPUs there (≥ {need} to start), {int(left[off])} left"
            f" after the plan{held}")


def _shortfall(p: Problem, feasible: np.ndarray) -> str:
    """'needs 8 GPUs of o1 (4 free) or 16 GPUs of o2 (0 free)', up to three offerings
    (free: the room with every other job unplaced)."""
    need = p.lo[feasible] * p.table.gpus_per_replica[feasible]
    offs = p.off_of[feasible]
    # the room there less what the row itself keeps or holds on it (Problem.extra)
    room = p.room[offs] - p.extra[p.job_of[feasible],
                                  (~p.table.in_place[feasible]).astype(np.int64), offs]
    short = need - room
    parts: list[str] = []
    seen: set[int] = set()
    for i in np.lexsort((feasible, short)).tolist():
        off = int(p.off_of[feasible[i]])
        if off in seen:
            continue
        seen.add(off)
        parts.append(f"{int(need[i])} GPUs of {p.offerings[off]} ({int(room[i])} free)")
        if len(parts) == 3:
            break
    more = len(set(p.off_of[feasible].tolist())) - len(parts)
    return "needs " + " or ".join(parts) + (f" (or {more} more offerings)" if more > 0 else "")


def _holders(p: Problem, sol: Assignment, off: int) -> str:
    """Up to three jobs the plan puts on offering ``off``, by GPUs held."""
    held = [(int(p.table.gpus_per_replica[r]) * int(x), p.jobs[j].priority, p.jobs[j].job_id)
            for j, (r, x) in enumerate(zip(sol.row, sol.replicas, strict=True))
            if r >= 0 and p.off_of[r] == off]
    held.sort(key=lambda h: (-h[0], h[2]))
    return ", ".join(f"{jid} (p{pri}, {g} GPUs)" for g, pri, jid in held[:3])
