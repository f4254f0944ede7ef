"""From evaluated proposals to the composer's inputs: the GPUs a job holds, the rows that
keep them (in place), and best-effort rows for a job nothing serves robustly."""

from __future__ import annotations

from koi.catalog import load_catalog
from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus, OfferingCapacity
from koi.compose import ComposeInput, Decision, compose
from koi.jobs import parse_job
from koi.planner.candidates import job_demands, job_loads, scored_candidates
from koi.planner.evaluate import Robustness, evaluate
from koi.planner.propose import ProposerLimits, propose
from koi.space import engine_default_config

CAT = load_catalog()
H100 = "aws/us-east-1/h100-sxm/on_demand"
L4 = "aws/us-east-1/l4/on_demand"


def online(jid: str, ttft_ms: float = 2000) -> JobStatus:
    spec = parse_job({"kind": "online", "id": jid, "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": ttft_ms, "tpot_ms": 100}})
    return JobStatus(spec=spec, admitted=True, rejected=False)


def running_snapshot(job: JobStatus) -> tuple[ClusterSnapshot, Deployment]:
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", CAT, replicas=2,
                                offering=H100)
    dep = Deployment("d1", job.id, cfg, H100, DeploymentState.RUNNING, 2, 0, 0.0)
    caps = (OfferingCapacity(H100, 8, 2), OfferingCapacity(L4, 8, 0))
    return ClusterSnapshot(5, 300.0, 60.0, 3600.0, caps, (dep,), (job,)), dep


def test_held_gpus_are_the_jobs_and_only_rows_on_them_are_in_place() -> None:
    job = online("a")
    snap, dep = running_snapshot(job)
    props = propose("a", "llama-3.1-8b", ["h100-sxm", "l4"], CAT, current=dep.config,
                    limits=ProposerLimits(max_per_job=30))
    loads = job_loads([job], snap, 1.0)
    ev = evaluate(props, loads, catalog=CAT, backend="numpy")
    table, capacity = scored_candidates(ev, snap, CAT, 1.0)
    assert capacity == {H100: 6, L4: 8}            # free GPUs only: the job's 2 are held
    (demand,) = job_demands([job], loads, snap, ev)
    assert demand.held_gpus == {H100: 2} and demand.keeps_gpus_unplaced
    here = [i for i, c in enumerate(table.configs)
            if c.with_(offering="", replicas=1) == dep.config.with_(offering="", replicas=1)
            and table.offering[i] == H100]
    assert table.in_place[here].all() and table.is_current[here].all()
    assert not table.in_place[table.offering == L4].any()


def test_a_job_nothing_serves_robustly_is_held_as_it_runs() -> None:
    """A radius no configuration survives: the admitted job's rows stay feasible where the
    nominal prediction meets the SLO (so it is deferred, not rejected and stopped) but
    carry no goodput (so nothing is added); the reason says so."""
    job = online("a")
    snap, dep = running_snapshot(job)
    props = propose("a", "llama-3.1-8b", ["h100-sxm"], CAT, current=dep.config,
                    limits=ProposerLimits(max_per_job=10))
    loads = job_loads([job], snap, 1.0)
    ev = evaluate(props, loads, catalog=CAT, backend="numpy",
                  robustness=lambda p: Robustness(radius_ttft=8.0, radius_tpot=8.0))
    assert not ev.slo_feasible.any() and (ev.nominal_max_rate_rps > 0).any()
    table, capacity = scored_candidates(ev, snap, CAT, 1.0)
    assert len(table) == len(props)          # one H100 offering: one row per proposal
    assert table.feasible_slo.any() and not table.goodput_tok_s.any()
    assert (table.feasible_slo == (ev.nominal_max_rate_rps > 0)).all()
    demands = job_demands([job], loads, snap, ev)
    plan = compose(ComposeInput(jobs=demands, candidates=table, capacity=capacity))
    choice = plan.choice("a")
    assert choice.decision == Decision.DEFER
    assert choice.reason.startswith("kept as it runs, nothing added: no configuration meets")


def test_the_running_deployments_mediators_guide_the_proposer_only_when_enabled() -> None:
    from koi.planner.propose import Hints
    from koi.planner.settings import KoiSettings
    from koi.planner.tick import propose_stage

    job = online("a")
    snap, dep = running_snapshot(job)
    comm_bound = {dep.id: Hints(comm_overhead_frac=0.4)}
    lim = ProposerLimits(max_per_job=30, guided=4)
    off = KoiSettings(proposer=lim)
    on = KoiSettings(proposer=lim, mediator_guidance=True)
    plain = propose_stage(snap, [], off, CAT)
    assert propose_stage(snap, [], off, CAT, hints=comm_bound) == plain
    # the running config is tp1 here, so "fewer ranks" has nothing to promote; a tp2 one
    wide = dep.config.with_(tp=2)
    snap2 = ClusterSnapshot(5, 300.0, 60.0, 3600.0, snap.capacity,
                            (Deployment("d1", "a", wide, H100, DeploymentState.RUNNING,
                                        2, 0, 0.0),), (job,))
    guided = propose_stage(snap2, [], on, CAT, hints=comm_bound)
    assert guided[0].config == wide.with_(offering="", replicas=1)
    assert all(p.config.tp < 2 and "comm-bound" in p.hypothesis for p in guided[1:5])
    assert propose_stage(snap2, [], off, CAT, hints=comm_bound)[1:5] != guided[1:5]


def test_a_batch_job_holding_a_full_offering_can_change_its_parallelism_there() -> None:
    """A batch job on all 8 GPUs of an offering as tp2 ×4: with ``reshard_batch`` its tp1
    rows there keep the GPUs (a re-shard in place), so the plan may choose one although
    nothing is free; without it, and for an online job, they are swaps, which need 8
    free GPUs first."""
    spec = parse_job({"kind": "batch", "id": "b", "model": "llama-3.1-8b",
                      "num_requests": 200000, "input_len": 500, "output_len": 100,
                      "deadline_s": 3600})
    job = JobStatus(spec=spec, admitted=True, rejected=False)
    wide = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", CAT, tp=2,
                                 replicas=4, offering=H100)
    dep = Deployment("d1", "b", wide, H100, DeploymentState.RUNNING, 4, 0, 0.0)
    snap = ClusterSnapshot(5, 300.0, 60.0, 3600.0, (OfferingCapacity(H100, 8, 8),),
                           (dep,), (job,))
    props = propose("b", "llama-3.1-8b", ["h100-sxm"], CAT, current=dep.config,
                    limits=ProposerLimits(max_per_job=30))
    loads = job_loads([job], snap, 1.0)
    ev = evaluate(props, loads, catalog=CAT, backend="numpy")
    table, capacity = scored_candidates(ev, snap, CAT, 1.0, reshard_batch=True)
    assert capacity == {H100: 0}
    tp1 = [i for i, c in enumerate(table.configs) if c.tp == 1]
    assert tp1 and table.in_place[tp1].all() and not table.is_current[tp1].any()
    assert not scored_candidates(ev, snap, CAT, 1.0)[0].in_place[tp1].any()
    # the composer can take it: a re-shard uses only the GPUs the job holds
    plan = compose(ComposeInput(jobs=job_demands([job], loads, snap, ev), candidates=table,
                                capacity=capacity))
    choice = plan.choice("b")
    assert choice.decision == Decision.PLACE and choice.gpus <= 8
    # the same deployment as an online job's: tp1 on its GPUs is a swap
    online_snap = ClusterSnapshot(5, 300.0, 60.0, 3600.0, snap.capacity,
                                  (Deployment("d1", "a", wide, H100, DeploymentState.RUNNING,
                                              4, 0, 0.0),), (online("a"),))
    oprops = propose("a", "llama-3.1-8b", ["h100-sxm"], CAT, current=wide,
                     limits=ProposerLimits(max_per_job=30))
    oev = evaluate(oprops, job_loads([online("a")], online_snap, 1.0), catalog=CAT,
                   backend="numpy")
    otable, _ = scored_candidates(oev, online_snap, CAT, 1.0, reshard_batch=True)
    otp1 = [i for i, c in enumerate(otable.configs) if c.tp == 1]
    assert otp1 and not otable.in_place[otp1].any()


def test_measured_rates_replace_the_predicted_ones_and_unmeasured_rows_are_left_out() -> None:
    """The true oracle's hook: each measured (row, offering) carries the measured rate
    and goodput (0 req/s: infeasible); a pair it did not measure is not offered."""
    job = online("a")
    snap, dep = running_snapshot(job)
    props = propose("a", "llama-3.1-8b", ["h100-sxm", "l4"], CAT, current=dep.config,
                    limits=ProposerLimits(max_per_job=10))
    ev = evaluate(props, job_loads([job], snap, 1.0), catalog=CAT, backend="numpy")
    h100 = next(i for i, p in enumerate(ev.proposals) if p.config.accelerator == "h100-sxm")
    l4 = next(i for i, p in enumerate(ev.proposals) if p.config.accelerator == "l4")
    table, _ = scored_candidates(ev, snap, CAT, 1.0,
                                 measured={(h100, H100): (3.0, 300.0), (l4, L4): (0.0, 0.0)})
    assert list(table.candidate_id) == [f"{h100}@{H100}", f"{l4}@{L4}"]
    assert list(table.max_rate_rps) == [3.0, 0.0]
    assert list(table.goodput_tok_s) == [300.0, 0.0]
    assert list(table.feasible_slo) == [True, False]
