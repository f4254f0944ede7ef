"""The composer: one candidate (or defer / reject, with the reason) per job, integer
replica counts under per-offering capacity, for the whole cluster at once.

``compose(ComposeInput) -> ComposePlan``. Pure: no I/O, no clock beyond timing the solve.

The objective, in objective units per hour (``$`` when ``weights.cost`` is 1), over the
chosen candidate c of every placed job j with x replicas:

    maximise  Σ_j  V_j · (1 − w_risk·risk_c) · (at_pace_j + w_ahead·(served_j − at_pace_j))
                 − w_cost · usd_c · x
                 − w_churn · migration_cost_c        (0 when c is the job's current one)

    V_j       = 3600 · value_per_tok_j · priority_step ** (priority_j − 5)
    served_j  = min(demand_j + ahead_j, cap_c · x)                         [tok/s]
    at_pace_j = min(demand_j, served_j)   (ahead_j: batch work ahead of pace, or late)
    cap_c     = min(goodput_c, max_rate_c · tok_per_request_j)   (online;  goodput_c batch)
                · (1 − w_preempt · preemption_exposure_c)
    demand_j  = demand_rate_rps · tok_per_request (online) | required_tok_s (batch)

subject to: at most one candidate per job, ``min_replicas ≤ x ≤ max_replicas``, and per
offering the GPUs the plan occupies ≤ free GPUs + those the jobs hold now, where a job
left unplaced keeps what it holds if it is online (it serves on, as it is) and releases
it if batch (drained), an in-place candidate reuses what its job holds, and a move
occupies its new GPUs and the old ones (make-before-break) — ``problem.py``. The exact
solve is a MILP (``milp.py``) with HiGHS's time limit and relative gap, seeded by the
greedy (``greedy.py``), which is always computed and is the plan when HiGHS fails, its
answer is invalid, the problem is too large or ``solver="greedy"``. Jobs with no
SLO-feasible candidate are rejected with the evaluator's reason; every other unplaced job
is deferred with why.
"""

from __future__ import annotations

import time

from koi.compose.greedy import solve_greedy
from koi.compose.milp import MilpResult, solve_milp
from koi.compose.problem import (
    Assignment,
    Problem,
    build_problem,
    check_assignment,
    evaluate,
    gpus_used,
)
from koi.compose.reasons import explain
from koi.compose.types import (
    CandidateTable,
    ComposeInput,
    ComposePlan,
    ComposeWeights,
    Decision,
    JobChoice,
    JobDemand,
    JobKind,
    ScoredCandidate,
    SolverName,
)

__all__ = [
    "CandidateTable", "ComposeInput", "ComposePlan", "ComposeWeights", "Decision",
    "JobChoice", "JobDemand", "JobKind", "ScoredCandidate", "SolverName", "compose",
]


def compose(inp: ComposeInput) -> ComposePlan:
    """The cluster plan for one tick (see the module docstring for the objective)."""
    t0 = time.perf_counter()
    p = build_problem(inp)
    greedy = solve_greedy(p)
    solver, status, sol = SolverName.GREEDY, "", greedy
    milp: MilpResult | None = None
    if p.n == 0:
        solver, status = SolverName.NONE, "nothing placeable"
    elif inp.solver == "greedy":
        status = "greedy requested"
    elif p.n > inp.max_milp_candidates and inp.solver == "auto":
        status = f"{p.n} candidates > max_milp_candidates={inp.max_milp_candidates}"
    else:
        milp = solve_milp(p, inp.time_limit_s, inp.mip_rel_gap, incumbent=greedy,
                          node_limit=inp.node_limit)
        solver, status, sol = _pick(p, milp, greedy, fallback=inp.solver == "auto")
    used = gpus_used(p, sol)
    objective = evaluate(p, sol)
    use_milp = solver == SolverName.HIGHS_MILP and milp is not None
    bound = None
    if use_milp and milp is not None and milp.loss_bound is not None:
        bound = p.value_total - milp.loss_bound
    return ComposePlan(
        choices=explain(p, sol, used), solver=solver, status=status, objective=objective,
        objective_bound=bound, gap=milp.gap if use_milp and milp is not None else None,
        solve_s=time.perf_counter() - t0, milp_s=milp.seconds if milp is not None else 0.0,
        candidates_in=len(p.table), candidates_kept=p.n,
        gpus_by_offering={o: int(u) for o, u in zip(p.offerings, used, strict=True) if u},
        free_by_offering={o: int(f) for o, f in zip(p.offerings, p.avail, strict=True)})


def _pick(p: Problem, milp: MilpResult, greedy: Assignment,
          fallback: bool) -> tuple[SolverName, str, Assignment]:
    """The MILP's answer when it is valid, else (with ``fallback``) the greedy's.

    Without ``fallback`` (``solver="milp"``) the MILP's answer is kept even when a time
    limit left it worse than the greedy, and no answer at all raises ``RuntimeError``.
    """
    if milp.assignment is None:
        why = f"highs {milp.status}: {milp.message}".strip()
    else:
        invalid = check_assignment(p, milp.assignment)
        if not invalid:
            beaten = evaluate(p, greedy) > evaluate(p, milp.assignment) + 1e-9
            if not (fallback and milp.status != "optimal" and beaten):
                return SolverName.HIGHS_MILP, milp.status, milp.assignment
            why = f"highs stopped ({milp.status}) with an incumbent worse than the greedy"
        else:
            why = f"highs answer rejected: {invalid}"
    if not fallback:
        raise RuntimeError(f"solver='milp' and {why}")
    return SolverName.GREEDY, f"fallback: {why}", greedy
