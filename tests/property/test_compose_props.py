"""Composer invariants (hypothesis): no plan exceeds capacity, every job gets exactly one
decision with a reason, an impossible SLO is a rejection, and the MILP is at least as good
as the greedy (and exact on tiny ticks, against brute force).

Capacity is checked against the rule written out here, independently of
``Problem.use``: a plan may occupy the free GPUs and those the jobs hold; an unplaced job
occupies what it holds if it keeps it unplaced, a job placed in place its replicas, and
a job that moves its replicas and what it holds (make-before-break)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from koi.compose import (
    ComposeInput,
    ComposeWeights,
    Decision,
    JobDemand,
    JobKind,
    ScoredCandidate,
    compose,
)
from koi.compose.greedy import solve_greedy
from koi.compose.milp import solve_milp
from koi.compose.problem import build_problem, check_assignment, contribution, evaluate

OFFERINGS = ("a/h100/od", "a/h100/spot", "b/l4/od", "c/h200/od")
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def ticks(draw: st.DrawFn, max_jobs: int = 6, max_cands: int = 5) -> ComposeInput:
    n_jobs = draw(st.integers(1, max_jobs))
    jobs, cands = [], []
    for j in range(n_jobs):
        jid = f"j{j}"
        lo = draw(st.integers(0, 2))
        placed = draw(st.booleans())
        held = {o: draw(st.sampled_from([1, 2, 4, 8, 16]))
                for o in draw(st.sets(st.sampled_from(OFFERINGS), max_size=2))} if placed else {}
        common = dict(priority=draw(st.integers(0, 9)), min_replicas=lo,
                      max_replicas=draw(st.integers(max(lo, 1), 6)),
                      value_per_tok=draw(st.sampled_from([1e-7, 1e-5, 1e-4, 1e-3])),
                      currently_placed=placed, held_gpus=held,
                      keeps_gpus_unplaced=draw(st.booleans()),
                      best_infeasible_reason=draw(st.sampled_from(["", "TTFT p95 340 ms > 200"])))
        if draw(st.booleans()):
            jobs.append(JobDemand(jid, JobKind.ONLINE, demand_rate_rps=draw(st.floats(0, 50)),
                                  output_tok_per_request=draw(st.sampled_from([0.0, 200.0])),
                                  **common))  # type: ignore[arg-type]
        else:
            jobs.append(JobDemand(jid, JobKind.BATCH, required_tok_s=draw(st.floats(0, 2e4)),
                                  ahead_tok_s=draw(st.sampled_from([0.0, 3e3, 2e4])),
                                  deadline_s=draw(st.floats(-10, 1e4)),
                                  **common))  # type: ignore[arg-type]
        for c in range(draw(st.integers(0, max_cands))):
            cands.append(ScoredCandidate(
                job_id=jid, candidate_id=f"{jid}c{c}", offering=draw(st.sampled_from(OFFERINGS)),
                gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])),
                goodput_tok_s_per_replica=draw(st.floats(0, 5000)),
                usd_per_hour_per_replica=draw(st.floats(0, 30)),
                max_rate_per_replica=draw(st.floats(0, 20)),
                slo_risk=draw(st.floats(0, 1)), preemption_exposure=draw(st.floats(0, 0.5)),
                is_current=c == 0 and placed,
                migration_cost=draw(st.floats(0, 50)),
                feasible_slo=draw(st.booleans()) or draw(st.booleans()),
                in_place=placed and (c == 0 or draw(st.booleans()))))
    capacity = {o: draw(st.integers(0, 24)) for o in OFFERINGS}
    weights = ComposeWeights(cost=draw(st.sampled_from([0.0, 1.0, 3.0])),
                             risk=draw(st.sampled_from([0.0, 1.0])),
                             churn=draw(st.sampled_from([0.0, 1.0])),
                             ahead=draw(st.sampled_from([0.0, 0.1, 1.0])))
    return ComposeInput(jobs=jobs, candidates=cands, capacity=capacity, weights=weights,
                        top_k=draw(st.integers(1, 6)))


def occupied(job: JobDemand, cand: ScoredCandidate | None, replicas: int) -> dict[str, int]:
    """GPUs per offering that ``job`` occupies with ``replicas`` of ``cand`` (None: unplaced)."""
    out = dict(job.held_gpus) if (job.keeps_gpus_unplaced if cand is None
                                  else not cand.in_place) else {}
    if cand is not None:
        out[cand.offering] = out.get(cand.offering, 0) + cand.gpus_per_replica * replicas
    return out


def within(inp: ComposeInput, occupancy: list[dict[str, int]]) -> bool:
    for off in OFFERINGS:
        held = sum(j.held_gpus.get(off, 0) for j in inp.jobs)
        if sum(o.get(off, 0) for o in occupancy) > inp.capacity[off] + held:
            return False
    return True


@SETTINGS
@given(ticks(), st.sampled_from(["auto", "greedy"]))
def test_plan_never_exceeds_capacity_and_decides_every_job(inp: ComposeInput, solver: str):
    plan = compose(ComposeInput(**{**inp.__dict__, "solver": solver}))
    assert [c.job_id for c in plan.choices] == [j.job_id for j in inp.jobs]
    by_id = {c.candidate_id: c for c in inp.candidates}  # type: ignore[union-attr]
    occupancy = []
    for job, choice in zip(inp.jobs, plan.choices, strict=True):
        assert choice.reason
        placed = choice.decision == Decision.PLACE
        assert (choice.replicas >= 1) == placed
        cand = by_id[choice.candidate_id] if placed else None
        if cand is not None:
            assert cand.job_id == choice.job_id and cand.feasible_slo
            assert choice.gpus == cand.gpus_per_replica * choice.replicas
        else:
            assert choice.candidate_id is None and choice.gpus == 0
        occupancy.append(occupied(job, cand, choice.replicas))
    assert within(inp, occupancy)
    for off in OFFERINGS:
        assert plan.gpus_by_offering.get(off, 0) == sum(o.get(off, 0) for o in occupancy)


@SETTINGS
@given(ticks())
def test_impossible_slo_is_rejected_with_reason_not_dropped(inp: ComposeInput):
    plan = compose(inp)
    for job in inp.jobs:
        mine = [c for c in inp.candidates if c.job_id == job.job_id]  # type: ignore[union-attr]
        choice = plan.choice(job.job_id)
        if not any(c.feasible_slo for c in mine):
            assert choice.decision == Decision.REJECT
            if mine and job.best_infeasible_reason:
                assert choice.reason == job.best_infeasible_reason
        else:
            assert choice.decision != Decision.REJECT


@SETTINGS
@given(ticks())
def test_milp_and_greedy_are_valid_and_milp_is_no_worse(inp: ComposeInput):
    p = build_problem(inp)
    greedy = solve_greedy(p)
    exact = solve_milp(p, time_limit_s=5.0, mip_rel_gap=0.0)
    assert check_assignment(p, greedy) == ""
    assert exact.assignment is not None and check_assignment(p, exact.assignment) == ""
    assert evaluate(p, exact.assignment) >= evaluate(p, greedy) - 1e-6 * (
        1 + abs(evaluate(p, greedy)))


@settings(max_examples=40, deadline=None)
@given(ticks(max_jobs=3, max_cands=3))
def test_milp_matches_brute_force_on_tiny_ticks(inp: ComposeInput):
    p = build_problem(inp)
    exact = solve_milp(p, time_limit_s=5.0, mip_rel_gap=0.0)
    assert exact.assignment is not None
    cands = list(inp.candidates)
    per_job = []
    for j in range(len(p.jobs)):
        opts: list[tuple[int, int] | None] = [None]
        for row in p.kept[p.job_of[p.kept] == j].tolist():
            top = min(p.jobs[j].max_replicas, 24 + sum(p.jobs[j].held_gpus.values()))
            opts += [(row, r) for r in range(int(p.lo[row]), top + 1)]
        per_job.append(opts)
    best = 0.0
    for combo in itertools.product(*per_job):
        occupancy = [occupied(job, cands[o[0]] if o else None, o[1] if o else 0)
                     for job, o in zip(p.jobs, combo, strict=True)]
        if within(inp, occupancy):
            best = max(best, sum(contribution(p, *o)[0] for o in combo if o is not None))
    assert evaluate(p, exact.assignment) >= best - 1e-6 * (1 + abs(best))
