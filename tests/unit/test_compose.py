"""Composer unit tests: hand-built ticks with known optima, reasons, fallbacks, size."""

from __future__ import annotations

import pytest

from koi.compose import (
    ComposeInput,
    ComposeWeights,
    Decision,
    JobDemand,
    JobKind,
    ScoredCandidate,
    SolverName,
    compose,
)
from koi.compose.synthetic import synthetic_tick
from koi.errors import InvalidSpecError

H100 = "aws/us-east-1/h100-sxm/on_demand"
H200 = "gcp/us-central1/h200/on_demand"
L4 = "aws/us-east-1/l4/on_demand"


def cand(job: str, cid: str, offering: str = H100, gpus: int = 1, goodput: float = 1000.0,
         usd: float = 3.0, **kw: object) -> ScoredCandidate:
    return ScoredCandidate(job_id=job, candidate_id=cid, offering=offering,
                           gpus_per_replica=gpus, goodput_tok_s_per_replica=goodput,
                           usd_per_hour_per_replica=usd, **kw)  # type: ignore[arg-type]


def online(job: str, tok_s: float, **kw: object) -> JobDemand:
    return JobDemand(job, JobKind.ONLINE, demand_rate_rps=tok_s / 100.0,
                     output_tok_per_request=100.0, **kw)  # type: ignore[arg-type]


def run(jobs: list[JobDemand], cands: list[ScoredCandidate], capacity: dict[str, int],
        **kw: object):
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity=capacity,
                                **kw))  # type: ignore[arg-type]
    used: dict[str, int] = {}
    for c in plan.choices:
        used[c.offering] = used.get(c.offering, 0) + c.gpus
    for off, g in used.items():
        if off:
            assert g <= capacity.get(off, 0), (off, g)
    assert [c.job_id for c in plan.choices] == [j.job_id for j in jobs]
    return plan


def test_cheaper_of_two_equal_goodput_configs():
    plan = run([online("a", 2000)],
               [cand("a", "pricey", H100, usd=4.0), cand("a", "cheap", H200, usd=3.0)],
               {H100: 8, H200: 8})
    c = plan.choice("a")
    assert plan.solver == SolverName.HIGHS_MILP and plan.status == "optimal"
    assert (c.decision, c.candidate_id, c.replicas, c.gpus) == (Decision.PLACE, "cheap", 2, 2)
    assert c.goodput_tok_s == pytest.approx(2000)
    assert c.usd_per_hour == pytest.approx(6.0)
    assert "placed on" in c.reason and H200 in c.reason


def test_replicas_cover_demand_and_no_more():
    plan = run([online("a", 2500)], [cand("a", "x", gpus=2)], {H100: 16})
    assert plan.choice("a").replicas == 3
    assert plan.gpus_by_offering == {H100: 6}


def test_higher_priority_wins_contested_offering():
    jobs = [online("low", 4000, priority=3), online("high", 4000, priority=8)]
    cands = [cand("low", "l", gpus=4, goodput=4000), cand("high", "h", gpus=4, goodput=4000)]
    for solver in ("auto", "greedy"):
        plan = run(jobs, cands, {H100: 4}, solver=solver)
        assert plan.choice("high").decision == Decision.PLACE
        low = plan.choice("low")
        assert low.decision == Decision.DEFER
        assert "no capacity left" in low.reason and "held by high (p8" in low.reason


def test_staying_put_beats_marginally_better_swap():
    jobs = [online("a", 2000, currently_placed=True)]
    cands = [cand("a", "current", H100, usd=3.0, is_current=True),
             cand("a", "better", H200, usd=2.9, migration_cost=5.0)]
    plan = run(jobs, cands, {H100: 8, H200: 8})
    c = plan.choice("a")
    assert c.candidate_id == "current" and c.stays and "stays on" in c.reason
    # without churn the cheaper swap wins
    plan = run(jobs, cands, {H100: 8, H200: 8}, weights=ComposeWeights(churn=0.0))
    assert plan.choice("a").candidate_id == "better"
    assert "moves" in plan.choice("a").reason


def test_impossible_slo_is_rejected_with_the_evaluators_reason():
    why = "no configuration meets TTFT p95 ≤ 200 ms; best is 340 ms on h200 tp2"
    jobs = [online("a", 1000, best_infeasible_reason=why), online("b", 1000)]
    cands = [cand("a", "x", feasible_slo=False), cand("a", "y", H200, feasible_slo=False),
             cand("b", "z")]
    plan = run(jobs, cands, {H100: 8, H200: 8})
    a = plan.choice("a")
    assert (a.decision, a.reason, a.replicas, a.candidate_id) == (Decision.REJECT, why, 0, None)
    assert plan.choice("b").decision == Decision.PLACE


def test_job_without_candidates_or_reason_is_rejected_not_dropped():
    plan = run([online("a", 1000), online("b", 1000)],
               [cand("b", "x", feasible_slo=False)], {H100: 8})
    assert plan.choice("a").decision == Decision.REJECT
    assert "no candidate" in plan.choice("a").reason
    assert "meets its SLO" in plan.choice("b").reason


def test_no_capacity_defers_with_what_it_needs():
    plan = run([online("a", 1000)], [cand("a", "x", H100, gpus=8), cand("a", "y", L4, gpus=4)],
               {H100: 4, L4: 0})
    a = plan.choice("a")
    assert a.decision == Decision.DEFER and a.replicas == 0
    assert a.reason == (f"no capacity: needs 8 GPUs of {H100} (4 free)"
                        f" or 4 GPUs of {L4} (0 free)")
    assert plan.solver == SolverName.NONE


def test_unprofitable_and_no_demand_are_deferred_with_reason():
    plan = run([online("a", 100, value_per_tok=1e-9), online("b", 0)],
               [cand("a", "x"), cand("b", "y")], {H100: 8})
    assert plan.choice("a").decision == Decision.DEFER
    assert "not worth its cost" in plan.choice("a").reason
    assert plan.choice("b").reason == "no demand this tick"


def test_batch_deadline_at_risk_gets_best_effort():
    job = JobDemand.batch("nightly", remaining_tokens=36e6, time_left_s=3600)  # 10k tok/s
    plan = run([job], [cand("nightly", "x", gpus=2, goodput=1500)], {H100: 8})
    c = plan.choice("nightly")
    assert c.decision == Decision.PLACE and c.replicas == 4
    assert c.goodput_tok_s == pytest.approx(6000)
    assert "deadline at risk" in c.reason and "60%" in c.reason
    late = JobDemand.batch("late", remaining_tokens=1e6, time_left_s=0)
    plan = run([late], [cand("late", "x")], {H100: 8})
    assert plan.choice("late").reason.startswith("deadline passed")


def test_min_and_max_replicas():
    plan = run([online("a", 500, min_replicas=3)], [cand("a", "x")], {H100: 8})
    assert plan.choice("a").replicas == 3
    plan = run([online("a", 5000, max_replicas=2)], [cand("a", "x")], {H100: 8})
    c = plan.choice("a")
    assert c.replicas == 2 and "under-provisioned" in c.reason
    plan = run([online("a", 500, min_replicas=9)], [cand("a", "x")], {H100: 8})
    assert plan.choice("a").decision == Decision.DEFER


def test_greedy_flag_and_zero_time_limit_give_valid_plans():
    inp = synthetic_tick(3, jobs=12, candidates_per_job=30)
    greedy = compose(ComposeInput(jobs=inp.jobs, candidates=inp.candidates,
                                  capacity=inp.capacity, solver="greedy"))
    assert greedy.solver == SolverName.GREEDY and greedy.status == "greedy requested"
    rushed = compose(ComposeInput(jobs=inp.jobs, candidates=inp.candidates,
                                  capacity=inp.capacity, time_limit_s=0.0))
    exact = compose(inp)
    for plan in (greedy, rushed, exact):
        assert len(plan.choices) == 12
        for off, g in plan.gpus_by_offering.items():
            assert g <= inp.capacity[off]
    assert exact.objective >= greedy.objective - 1e-6
    assert rushed.objective >= greedy.objective - 1e-6


def test_forty_jobs_two_hundred_candidates_is_solved_exactly():
    # its speed is a benchmark figure (`koi bench tick`, docs/COMPOSER.md), not a test:
    # a wall-clock bound here failed on a loaded 2-core machine (3.3 s)
    inp = synthetic_tick(0)   # 40 jobs × 200 candidates, contested
    plan = compose(inp)
    assert plan.candidates_in == 8000 and plan.candidates_kept <= 40 * 40
    assert plan.solver == SolverName.HIGHS_MILP and plan.status == "optimal"


def test_bad_input_names_the_field():
    with pytest.raises(InvalidSpecError, match="unknown job 'ghost'"):
        compose(ComposeInput(jobs=[online("a", 1)], candidates=[cand("ghost", "x")],
                             capacity={H100: 1}))
    with pytest.raises(InvalidSpecError, match=r"candidates\[0\].gpus_per_replica"):
        compose(ComposeInput(jobs=[online("a", 1)], candidates=[cand("a", "x", gpus=0)],
                             capacity={H100: 1}))
    with pytest.raises(InvalidSpecError, match="priority"):
        online("a", 1, priority=10)


def test_an_online_job_is_not_moved_onto_too_little_capacity():
    """Short of its demand an online deployment's queue grows without bound, so a new
    online candidate must cover the demand: the job goes to the offering that can carry
    all of it even at a higher price, or waits; a running deployment may stay short
    when nothing better fits (stopping it would serve no one)."""
    cheap_small = cand("a", "l4", L4, usd=1.0)          # 4 free: 4,000 of 5,000 tok/s
    dear_big = cand("a", "h100", H100, usd=4.0)         # 8 free: all of it
    plan = run([online("a", 5000)], [cheap_small, dear_big], {L4: 4, H100: 8})
    c = plan.choice("a")
    assert (c.decision, c.candidate_id, c.replicas) == (Decision.PLACE, "h100", 5)
    plan = run([online("a", 5000)], [cheap_small], {L4: 4})
    assert plan.choice("a").decision == Decision.DEFER
    running = cand("a", "l4", L4, usd=1.0, is_current=True)
    plan = run([online("a", 5000)], [running], {L4: 4})
    c = plan.choice("a")
    assert (c.decision, c.replicas) == (Decision.PLACE, 4) and "under-provisioned" in c.reason
    # a batch job may run short: its work waits, it is not lost
    job = JobDemand.batch("nightly", remaining_tokens=18e6, time_left_s=3600)  # 5k tok/s
    plan = run([job], [cand("nightly", "l4", L4, usd=1.0)], {L4: 4})
    assert plan.choice("nightly").replicas == 4


def test_batch_runs_ahead_of_pace_only_on_spare_capacity():
    """Work beyond the deadline's pace (``pace`` > 1) fills capacity nothing else wants,
    at ``weights.ahead`` of a token's value: never at the expense of another job's work
    at pace, and not at all when that share is 0."""
    job = JobDemand.batch("nightly", remaining_tokens=3.6e6, time_left_s=3600, pace=3.0)
    assert (job.required_tok_s, job.ahead_tok_s) == (pytest.approx(1000), pytest.approx(2000))
    for solver in ("auto", "greedy"):
        c = run([job], [cand("nightly", "x")], {H100: 8}, solver=solver).choice("nightly")
        assert (c.decision, c.replicas) == (Decision.PLACE, 3)
        assert c.goodput_tok_s == pytest.approx(3000) and "1,000 at the deadline's pace" in c.reason
        plan = run([job], [cand("nightly", "x")], {H100: 8}, solver=solver,
                   weights=ComposeWeights(ahead=0.0))
        assert plan.choice("nightly").replicas == 1
        # contested: an online job at a lower priority still outranks work ahead of pace
        jobs = [job, online("chat", 2000, priority=2)]
        cands = [cand("nightly", "x"), cand("chat", "y")]
        plan = run(jobs, cands, {H100: 3}, solver=solver)
        assert [plan.choice(j).replicas for j in ("nightly", "chat")] == [1, 2]


def test_a_late_batch_job_finishes_on_spare_capacity_only():
    late = JobDemand.batch("late", remaining_tokens=6e5, time_left_s=-5, late_s=300.0)
    assert (late.required_tok_s, late.ahead_tok_s) == (0.0, pytest.approx(2000))
    c = run([late], [cand("late", "x")], {H100: 8}).choice("late")
    assert (c.decision, c.replicas) == (Decision.PLACE, 2)
    assert "deadline passed: finishing on spare capacity" in c.reason
    on_time = JobDemand.batch("on-time", remaining_tokens=3.6e6, time_left_s=3600,
                              priority=2)
    plan = run([late, on_time], [cand("late", "x"), cand("on-time", "y")], {H100: 1})
    assert plan.choice("on-time").replicas == 1
    assert plan.choice("late").decision == Decision.DEFER
    with pytest.raises(InvalidSpecError, match="pace"):
        JobDemand.batch("x", remaining_tokens=1.0, time_left_s=1.0, pace=0.5)
    with pytest.raises(InvalidSpecError, match="ahead"):
        ComposeWeights(ahead=1.5)


# --- GPUs the jobs hold: in place, moves (make-before-break), released or kept ----------

def batch(job: str, tok_s: float, **kw: object) -> JobDemand:
    return JobDemand.batch(job, remaining_tokens=tok_s * 3600.0, time_left_s=3600.0,
                           **kw)  # type: ignore[arg-type]


def test_a_deferred_batch_job_releases_its_gpus_to_a_higher_priority_one():
    """Nothing free; the batch job's 8 GPUs go to the online job (the batch one drains)."""
    jobs = [batch("b", 8000, priority=2, held_gpus={H100: 8}, currently_placed=True),
            online("o", 8000, priority=8, keeps_gpus_unplaced=True)]
    cands = [cand("b", "b-here", H100, gpus=8, goodput=8000, is_current=True, in_place=True),
             cand("o", "o-new", H100, gpus=8, goodput=8000)]
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity={H100: 0}))
    assert plan.choice("o").decision == Decision.PLACE
    assert plan.choice("b").decision == Decision.DEFER
    assert plan.gpus_by_offering[H100] == 8 and plan.free_by_offering[H100] == 8


def test_an_unplaced_online_job_keeps_its_gpus():
    """The same tick with an online job holding the GPUs: left unplaced it keeps serving
    on them, so the newcomer cannot have them."""
    jobs = [online("old", 8000, priority=2, held_gpus={H100: 8}, currently_placed=True,
                   keeps_gpus_unplaced=True),
            online("new", 8000, priority=8, keeps_gpus_unplaced=True)]
    cands = [cand("old", "old-here", H100, gpus=8, goodput=8000, usd=1e6, is_current=True,
                  in_place=True),   # not worth its price: the plan leaves it unplaced
             cand("new", "new-h100", H100, gpus=8, goodput=8000)]
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity={H100: 0}))
    assert plan.choice("old").decision == Decision.DEFER
    assert plan.choice("new").decision == Decision.DEFER
    assert "no capacity" in plan.choice("new").reason


def test_gpus_a_kept_job_releases_by_shrinking_in_place_go_to_others_in_the_same_plan():
    """An online job holding 8 GPUs whose load now needs 4 shrinks in place; the 4 it
    releases serve a newcomer in the same tick (found by the brute-force property test:
    the composer used to bound a row by the room with every kept job holding all it
    has)."""
    jobs = [online("old", 4000, held_gpus={H100: 8}, currently_placed=True,
                   keeps_gpus_unplaced=True),
            online("new", 4000, keeps_gpus_unplaced=True)]
    cands = [cand("old", "old-here", H100, gpus=4, goodput=4000, is_current=True,
                  in_place=True),
             cand("new", "new-h100", H100, gpus=4, goodput=4000)]
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity={H100: 0}))
    assert (plan.choice("old").decision, plan.choice("old").replicas) == (Decision.PLACE, 1)
    assert (plan.choice("new").decision, plan.choice("new").replicas) == (Decision.PLACE, 1)
    assert plan.gpus_by_offering[H100] == 8


@pytest.mark.parametrize("free, moves", [(4, False), (8, True)])
def test_a_move_holds_the_old_gpus_until_it_completes(free: int, moves: bool):
    """Moving 4 GPUs' worth to a better configuration on the same offering needs 4 new
    GPUs while the old 4 still serve: it happens only when 8 are there in all."""
    jobs = [online("a", 4000, held_gpus={H100: 4}, currently_placed=True,
                   keeps_gpus_unplaced=True)]
    cands = [cand("a", "here", H100, gpus=4, goodput=2000, is_current=True, in_place=True),
             cand("a", "better", H100, gpus=4, goodput=4000)]
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity={H100: free - 4},
                                weights=ComposeWeights(churn=0.0)))
    c = plan.choice("a")
    assert c.decision == Decision.PLACE
    assert (c.candidate_id == "better") == moves
    assert plan.gpus_by_offering[H100] == (8 if moves else 4)   # staying: 1 replica


def test_staying_in_place_needs_no_free_gpus_and_scaling_up_needs_only_the_difference():
    jobs = [online("a", 6000, held_gpus={H100: 4}, currently_placed=True,
                   keeps_gpus_unplaced=True)]
    cands = [cand("a", "here", H100, gpus=2, goodput=1000, is_current=True, in_place=True)]
    plan = compose(ComposeInput(jobs=jobs, candidates=cands, capacity={H100: 4}))
    c = plan.choice("a")
    assert (c.decision, c.replicas, c.gpus) == (Decision.PLACE, 4, 8)   # 2 held + 2 more
    assert plan.gpus_by_offering[H100] == 8 and plan.free_by_offering[H100] == 8


def test_held_gpus_must_not_be_negative():
    with pytest.raises(InvalidSpecError, match="held_gpus"):
        online("a", 100, held_gpus={H100: -1})


def test_a_candidate_buys_margin_where_capacity_is_spare_and_not_where_it_is_short():
    """One configuration at two margins (the evaluator's risk levels): tight (1000 tok/s
    a replica, 10 % of requests expected to miss an SLO) and wide (600 tok/s, 1 %). The
    composer pays for the margin while GPUs are free, and gives it up to fit a second job
    when they are not."""
    from koi.catalog import load_catalog
    from koi.space import engine_default_config

    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", load_catalog())
    cfg = cfg.with_(offering=H100)

    def levels(job: str) -> list[ScoredCandidate]:
        return [cand(job, f"{job}-tight", goodput=1000.0, slo_risk=0.10, config=cfg),
                cand(job, f"{job}-wide", goodput=600.0, slo_risk=0.01, config=cfg)]

    spare = run([online("a", 3000)], levels("a"), {H100: 8}, top_k=1)
    assert (spare.choice("a").candidate_id, spare.choice("a").replicas) == ("a-wide", 5)
    assert "SLO risk 1%" in spare.choice("a").reason
    # 6 GPUs: both jobs fit only at the tight margin (3 + 3); wide would need 5 + 5
    short = run([online("a", 3000), online("b", 3000)], levels("a") + levels("b"),
                {H100: 6}, top_k=1)
    assert {short.choice(j).candidate_id for j in "ab"} == {"a-tight", "b-tight"}
