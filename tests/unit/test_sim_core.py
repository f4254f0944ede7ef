"""The simulator: determinism, accounting, lifecycles (start-up, swap, preemption, relaunch),
KV overflow, thinning and refused actions — on tiny scenarios built in code."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.cluster import Action, ActionKind, PlanDecision
from koi.scenario.types import CapacityEvent
from koi.sim import Simulator, run
from koi.sim.physics import startup_s
from koi.sim.replica import Replica, ReplicaSpec, Req
from koi.sim.testing import FixedPolicy, batch_job, online_job, tiny_scenario
from koi.sim.world import load_world
from koi.space import engine_default_config, kv_capacity_tokens

CAT = load_catalog()
OD = "aws/us-east-1/h100-sxm/on_demand"
SPOT = "aws/us-east-1/h100-sxm/spot"
RUNPOD_SPOT = "runpod/us/h100-sxm/spot"


def _cfg(offering: str = OD, **kw):
    accel = CAT.offering(offering).accelerator
    return engine_default_config("llama-3.1-8b", accel, "vllm", CAT, offering=offering, **kw)


def _launch(job: str, offering: str = OD, replicas: int = 1, **kw) -> Action:
    return Action(ActionKind.LAUNCH, job, "test", config=_cfg(offering, **kw),
                  offering=offering, replicas=replicas)


def _scenario(**kw):
    return tiny_scenario([online_job("chat", rate=3), batch_job("bulk", 1500)], **kw)


def _accounted(rec):
    for j in rec.jobs:
        if j.kind == "online":
            total = j.served_requests + j.dropped_requests + j.queued_at_end
            assert total == pytest.approx(j.offered_requests, rel=1e-9, abs=1e-6), j
        else:
            assert j.served_requests + j.queued_at_end == pytest.approx(
                dataclasses.replace(j).served_requests + j.queued_at_end)


def test_same_seed_same_record() -> None:
    sc = _scenario(horizon_s=900)
    a = run(sc, FixedPolicy([SPOT, OD]), seed=3)
    b = run(sc, FixedPolicy([SPOT, OD]), seed=3)
    c = run(sc, FixedPolicy([SPOT, OD]), seed=4)
    assert a == b
    assert a.jobs != c.jobs


def test_every_request_accounted_and_capacity_respected() -> None:
    sc = _scenario(horizon_s=1200, events=(CapacityEvent(600, OD, -15, "stock-out"),))
    sim = Simulator(sc, seed=1)
    pol = FixedPolicy([OD], replicas=4)
    while not sim.done:
        sim.apply(pol.decide(sim.snapshot(), []))
        sim.advance()
        for c in sim.snapshot().capacity:
            assert c.used_gpus <= c.total_gpus
    rec = sim.record("fixed")
    _accounted(rec)
    chat = next(j for j in rec.jobs if j.job_id == "chat")
    assert chat.served_requests > 0 and chat.offered_requests > 0
    assert any(e.kind == "stockout" and e.job_id for e in rec.events)


def test_startup_time_is_provisioning_plus_weight_load() -> None:
    world = load_world()
    sc = tiny_scenario([online_job("chat", rate=2)], horizon_s=600)
    sim = Simulator(sc, seed=0)
    sim.apply(PlanDecision(0, (_launch("chat"),)))
    expect = startup_s(_cfg(), CAT.offering(OD), CAT, world)
    assert 150 <= expect <= 200  # aws provisioning 150 s + 16 GB at 2 GB/s
    while sim.now + sim.scenario.tick_s <= expect:
        sim.advance()
        assert sim.snapshot().deployments[0].replicas_ready == 0
    while sim.now < expect + 60:
        sim.advance()
    assert sim.snapshot().deployments[0].replicas_ready == 1
    # requests that arrived before the replica was ready waited (TTFT ≥ the wait) or dropped
    rec = sim.record("t")
    assert rec.jobs[0].dropped_requests > 0  # the first ~100 s of arrivals timed out


def _chat_running_five_ticks() -> Simulator:
    """One online job on one replica, five ticks in (the replica is serving)."""
    sc = tiny_scenario([online_job("chat", rate=4)], horizon_s=1500)
    sim = Simulator(sc, seed=0)
    sim.apply(PlanDecision(0, (_launch("chat"),)))
    for _ in range(5):
        sim.advance()
    return sim


def test_swap_is_make_before_break() -> None:
    sim = _chat_running_five_ticks()
    old = sim.snapshot().deployments[0]
    assert old.replicas_ready == 1
    swap = Action(ActionKind.SWAP, "chat", "test", deployment_id=old.id,
                  config=_cfg(max_num_seqs=128), offering=OD, replicas=1)
    assert sim.apply(PlanDecision(sim.tick, (swap,)))[0].applied
    served_during = []
    while sim.now < 1200:
        tel = sim.advance()
        served_during.append(sum(t.requests_finished for t in tel))
    deps = sim.snapshot().deployments
    assert [d.id for d in deps] != [old.id] and all(d.id != old.id for d in deps)
    assert min(served_during[:3]) > 0  # the old deployment kept serving while the new started
    kinds = [e.kind for e in sim.record("t").events]
    assert "swap" in kinds and "drain" in kinds


def _preempt_world():
    return load_world({"preemption_mult": {"aws": 1e5 / 3, "runpod": 1e5 / 3}})


@pytest.mark.parametrize("offering,notice", [(SPOT, 120.0), (RUNPOD_SPOT, 0.0)])
def test_spot_preemption(offering: str, notice: float) -> None:
    sc = tiny_scenario([online_job("chat", rate=3)], {offering: 8, OD: 8}, horizon_s=900)
    sim = Simulator(sc, seed=2, world=_preempt_world())
    sim.apply(PlanDecision(0, (_launch("chat", offering, replicas=2),
                               )))
    while not sim.done:
        sim.advance()
    rec = sim.record("t")
    ev = [e for e in rec.events if e.kind == "preemption"]
    assert ev and f"notice {notice:g}s" in ev[0].detail
    _accounted(rec)
    assert sim.fleet.used.get(offering, 0) < 2  # the replicas were reclaimed


def test_preempted_requests_requeue_to_other_replicas_or_drop() -> None:
    sc = tiny_scenario([online_job("chat", rate=6, out=400)], {RUNPOD_SPOT: 8, OD: 8},
                       horizon_s=900)
    sim = Simulator(sc, seed=5, world=_preempt_world())
    sim.apply(PlanDecision(0, (_launch("chat", RUNPOD_SPOT), _launch("chat", OD))))
    while not sim.done:
        sim.advance()
    rec = sim.record("t")
    _accounted(rec)
    assert rec.jobs[0].served_requests > 0


def test_kv_overflow_preempts_and_recomputes() -> None:
    cfg = _cfg()
    world = load_world()
    from koi.sim.physics import step_coef
    coef = step_coef(cfg, CAT, world)
    cap = kv_capacity_tokens(CAT.model(cfg.model), CAT.accelerator(cfg.accelerator), cfg,
                             CAT.engine("vllm"))
    rep = Replica(ReplicaSpec(coef, cap, 1024, 8192, True), np.random.default_rng(0), 0.0)
    n = int(cap / 1500 * 2)  # twice what the cache can hold once outputs grow
    for _ in range(n):
        rep.enqueue(Req(0, 0.0, 500, 1000, 1.0, 0.0))
    rep.run_until(3600.0)
    st = rep.take_stats()
    assert st.preemptions > 0
    assert len(st.done) == n and rep.empty
    assert st.gen_tokens == pytest.approx(1000 * n)


def test_a_thinned_group_reads_as_its_members() -> None:
    """A group of w thinned requests stands for w arrivals spread out: each member's first
    token comes after its own prompt, and its TPOT is the decode's time per token, not the
    rest of the group's prefill spread over its output."""
    from koi.sim.physics import step_coef
    cfg = _cfg()
    coef = step_coef(cfg, CAT, load_world())
    cap = kv_capacity_tokens(CAT.model(cfg.model), CAT.accelerator(cfg.accelerator), cfg,
                             CAT.engine("vllm"))

    def alone(w: float):
        rep = Replica(ReplicaSpec(coef, cap, 1024, 8192, True), np.random.default_rng(0), 0.0)
        rep.enqueue(Req(0, 0.0, 4000, 11, w, 0.0))
        rep.run_until(600.0)
        (done,) = rep.take_stats().done
        return done

    one, group = alone(1.0), alone(16.0)
    # 16 × 4000 prompt tokens take eight 8k-token passes; a member waits for 1/16 of them
    assert group.ttft < 2.5 * one.ttft
    # the group decodes 16 sequences per pass, a little slower than one: same order
    assert one.tpot <= group.tpot < 2.0 * one.tpot


def test_thinning_keeps_throughput_unbiased() -> None:
    sc = tiny_scenario([online_job("chat", rate=20, inp=400, out=100)], horizon_s=1200)
    full = run(sc, FixedPolicy([OD], replicas=2), seed=7, sample_fraction=1.0)
    thin = run(sc, FixedPolicy([OD], replicas=2), seed=7, sample_fraction=0.25)
    a, b = full.jobs[0], thin.jobs[0]
    assert b.served_output_tokens == pytest.approx(a.served_output_tokens, rel=0.1)
    assert b.offered_requests == pytest.approx(a.offered_requests, rel=0.1)


def test_bad_actions_are_refused_with_reasons() -> None:
    sc = tiny_scenario([online_job("chat")], {OD: 2}, horizon_s=600)
    sim = Simulator(sc, seed=0)
    bad_cfg = _cfg().with_(tp=3)
    actions = (
        _launch("nope"),
        Action(ActionKind.LAUNCH, "chat", "t", config=bad_cfg, offering=OD),
        _launch("chat", replicas=3),
        Action(ActionKind.SCALE, "chat", "t", deployment_id="ghost", replicas=2),
        Action(ActionKind.LAUNCH, "chat", "t", config=_cfg(SPOT), offering=SPOT),
        Action(ActionKind.LAUNCH, "chat", "t", config=None, offering=OD),
    )
    out = sim.apply(PlanDecision(0, actions))
    assert not any(o.applied for o in out)
    reasons = [o.reason for o in out]
    assert "unknown job" in reasons[0]
    assert "tp" in reasons[1] and "invalid config" in reasons[1]
    assert "capacity" in reasons[2]
    assert "unknown deployment" in reasons[3]
    assert "capacity" in reasons[4]
    assert "needs a config" in reasons[5]
    assert sim.apply(PlanDecision(0, (_launch("chat"),)))[0].applied
    rej = sim.apply(PlanDecision(0, (Action(ActionKind.REJECT, "chat", "t"),)))[0]
    assert not rej.applied and "admitted" in rej.reason


def test_reject_and_relaunch_and_stop() -> None:
    sc = tiny_scenario([online_job("a"), online_job("b")], {OD: 4}, horizon_s=900)
    sim = Simulator(sc, seed=0)
    sim.apply(PlanDecision(0, (_launch("a"), Action(ActionKind.REJECT, "b", "no room"))))
    for _ in range(5):
        sim.advance()
    dep = sim.snapshot().deployments[0]
    out = sim.apply(PlanDecision(sim.tick, (Action(ActionKind.RELAUNCH, "a", "more seqs",
                                                    deployment_id=dep.id,
                                                    config=_cfg(max_num_seqs=64)),)))
    assert out[0].applied, out[0].reason
    d = sim.snapshot().deployments[0]
    assert d.replicas_ready == 0 and d.replicas_starting == 1 and d.config.max_num_seqs == 64
    sim.advance()
    sim.apply(PlanDecision(sim.tick, (Action(ActionKind.STOP, "a", "done",
                                              deployment_id=dep.id),)))
    assert sim.snapshot().deployments == ()
    while not sim.done:
        sim.advance()
    rec = sim.record("t")
    b = next(j for j in rec.jobs if j.job_id == "b")
    assert b.rejected and not b.admitted
    kinds = {e.kind for e in rec.events}
    assert {"admit", "launch", "reject", "relaunch", "stop"} <= kinds
    _accounted(rec)


def test_batch_progress_and_deadline() -> None:
    sc = tiny_scenario([batch_job("bulk", 40000, deadline_s=400)], {OD: 8}, horizon_s=900)
    rec = run(sc, FixedPolicy([OD], replicas=2), seed=0)
    j = rec.jobs[0]
    assert 0 < j.tokens_by_deadline < j.tokens_processed <= j.tokens_requested + 1e-6
    assert j.served_requests + j.queued_at_end == pytest.approx(40000)


def test_batch_job_is_done_when_every_request_is() -> None:
    from koi.lifecycle import batch_done, batch_tokens_left

    job = batch_job("bulk", 600, deadline_s=3000,
                    output_len={"kind": "lognormal", "mean": 200, "sigma": 0.8})
    sim = Simulator(tiny_scenario([job], {OD: 8}, horizon_s=3600), seed=0)
    policy = FixedPolicy([OD], replicas=2)
    seen = []
    while not sim.done:
        snap = sim.snapshot()
        seen.append(snap.jobs[0])
        sim.apply(policy.decide(snap, ()))
        sim.advance()
    assert not batch_done(seen[0]) and batch_tokens_left(seen[0]) > 0
    done = [s for s in seen if batch_done(s)]
    assert done, "the batch finished within the horizon"
    first = done[0]
    assert first.requests_done == pytest.approx(600) and batch_tokens_left(first) == 0
    # the sampled outputs rarely sum to the expected total: done by requests, not tokens
    assert first.output_tokens_done != pytest.approx(job.total_output_tokens, rel=1e-9)
    before = [s.requests_done for s in seen]
    assert before == sorted(before)


def test_a_batch_jobs_tokens_do_not_depend_on_how_replicas_group_its_requests() -> None:
    # an H100 and an L40S replica cut the backlog into groups of different sizes; the
    # requests, and so the tokens they sum to, are the job's own
    job = batch_job("bulk", 400, deadline_s=7200,
                    output_len={"kind": "lognormal", "mean": 200, "sigma": 0.8})
    l40s = "aws/us-east-1/l40s/on_demand"
    served = []
    for offering in (OD, l40s):
        rec = run(tiny_scenario([job], {offering: 8}, horizon_s=7200),
                  FixedPolicy([offering]), seed=5)
        (j,) = rec.jobs
        assert j.served_requests == pytest.approx(400)
        served.append(j.served_output_tokens)
    assert served[0] == pytest.approx(served[1], rel=2e-3)


def test_telemetry_renders_as_engine_metrics() -> None:
    from koi.fleet import ReplicaCounters, parse_page, render, split_tick

    sc = tiny_scenario([online_job("chat", rate=5)], horizon_s=600)
    sim = Simulator(sc, seed=0)
    sim.apply(PlanDecision(0, (_launch("chat"),)))
    tel = []
    while not sim.done:
        tel = sim.advance()
    t = tel[0]
    assert sum(t.ttft_bucket_counts) == pytest.approx(t.requests_finished)
    assert len(t.ttft_bucket_counts) == len(t.ttft_bucket_bounds_s) + 1
    assert t.cost_usd > 0 and t.gpu_seconds == pytest.approx(60.0)
    replica = ReplicaCounters("chat-model")
    split_tick(t, [replica])
    text = render("vllm-0.34.0", replica)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:num_preemptions_total", "vllm:request_success_total"):
        assert name in text
    assert 'le="+Inf"' in text
    page = parse_page(text)   # the page reads back as the tick's counters
    assert page.counters["requests_finished"] == pytest.approx(t.requests_finished)
    assert page.counters["generation_tokens"] == pytest.approx(t.generation_tokens)


def test_spend_is_gpus_times_price_times_time() -> None:
    sc = tiny_scenario([online_job("chat")], {OD: 4}, horizon_s=600)
    rec = run(sc, FixedPolicy([OD], replicas=2), seed=0)
    price = CAT.offering(OD).usd_per_gpu_hour
    assert rec.spend_usd == pytest.approx(2 * price * 600 / 3600)


def test_burst_probe_compares_single_requests_with_thinned_groups() -> None:
    from koi.jobs.lengths import LengthDist
    from koi.sim.thinning import burst_probe

    cfg = engine_default_config("qwen2.5-7b", "l40s", "sglang", CAT)
    lens = dict(input_len=LengthDist.lognormal(1500, 0.5),
                output_len=LengthDist.lognormal(60, 0.8), catalog=CAT)
    rows = burst_probe(cfg, rate_rps=2.0, weights=(1.0, 6.0), requests=3000, **lens)
    assert [r.weight for r in rows] == [1.0, 6.0]
    single, group = rows
    assert all(v > 0 for r in rows for v in (r.ttft_mean_ms, r.tpot_mean_ms, r.tpot_p95_ms))
    # every 6th request, its members spread up to the next kept one with their own prompt
    # lengths: the replica sees what single requests make it see, within a few tenths
    assert group.ttft_mean_ms == pytest.approx(single.ttft_mean_ms, rel=0.2)
    assert group.ttft_p95_ms == pytest.approx(single.ttft_p95_ms, rel=0.3)
    assert group.tpot_mean_ms == pytest.approx(single.tpot_mean_ms, rel=0.3)
    # as groups were simulated before: kept at random, arriving at once; a burst every
    # request behind it waits for, though a member's TPOT is still not its group's whole
    # prefill spread over its output (see replica.py)
    _, burst = burst_probe(cfg, rate_rps=2.0, weights=(1.0, 6.0), requests=3000,
                           spread=False, **lens)
    assert burst.ttft_p95_ms > 1.5 * group.ttft_p95_ms
    assert single.tpot_mean_ms <= burst.tpot_mean_ms < 4 * single.tpot_mean_ms


def test_a_spread_group_times_each_member_from_its_own_arrival() -> None:
    """A group whose members arrive far apart on an idle replica: each member's prompt
    is prefilled when it arrives, so every member's TTFT is a lone request's, and the
    group decodes once its last member has arrived."""
    from koi.sim.physics import step_coef
    cfg = _cfg()
    coef = step_coef(cfg, CAT, load_world())
    cap = kv_capacity_tokens(CAT.model(cfg.model), CAT.accelerator(cfg.accelerator), cfg,
                             CAT.engine("vllm"))

    def run_one(r: Req) -> list:
        rep = Replica(ReplicaSpec(coef, cap, 1024, 8192, True), np.random.default_rng(0), 0.0)
        rep.add_arrival(r)
        rep.run_until(600.0)
        return rep.take_stats().done

    (one,) = run_one(Req(0, 0.0, 2000, 11, 1.0, 0.0))
    group = Req(0, 0.0, 2000, 11, 8.0, 0.0)
    group.members([2000] * 8)
    group.spread([5.0 * i for i in range(8)])
    members = run_one(group)
    assert len(members) == 8 and sum(c.w for c in members) == pytest.approx(8.0)
    for c in members:
        assert c.ttft == pytest.approx(one.ttft, rel=0.05)
        assert c.t >= 7 * 5.0 + one.ttft   # the last member arrives 35 s in
        assert c.tpot == pytest.approx(one.tpot, rel=0.5)
    # the same group arriving at once: 16k prompt tokens in two 8k-token passes, the
    # first four members done after the first, the other four after the second
    burst = Req(0, 0.0, 2000, 11, 8.0, 0.0)
    burst.members([2000] * 8)
    ttfts = sorted(c.ttft for c in run_one(burst))
    assert ttfts[0] > 2 * one.ttft
    assert ttfts[3] == pytest.approx(ttfts[0]) and ttfts[4] > 1.8 * ttfts[0]


def test_systematic_thinning_keeps_one_request_in_w_with_its_members() -> None:
    """Thinning at f = 1/8 keeps every 8th request: per window the weighted count is the
    real count to within one group (a coin flip per request would be off by ~sqrt(8 n)),
    and each kept request carries its 8 members' prompt lengths."""
    from koi.sim.jobstate import JobState

    spec = online_job("chat", rate=40.0, inp=400, out=100)
    thin = JobState(0, spec, np.random.default_rng(3))
    thin._phase = 0.5   # drawn on first use otherwise; set, both draw the same requests
    full = JobState(0, spec, np.random.default_rng(3))
    for k in range(20):
        t0, t1 = 60.0 * k, 60.0 * (k + 1)
        kept, real = thin.arrivals(t0, t1, 0.125), full.arrivals(t0, t1, 1.0)
        assert abs(sum(r.w for r in kept) - len(real)) <= 8.0
        assert all(r.w == 8.0 and r.n == 8 and r.cum[-1] == 1.0 for r in kept)
        # a group's prompt is its members' mean; the share up to each member grows
        assert all(r.cum == sorted(r.cum) and r.cum[0] > 0.0 for r in kept)
    assert thin.offered == pytest.approx(full.offered, abs=8.0)
    assert thin.offered_tokens == pytest.approx(full.offered_tokens, rel=0.05)


def test_a_preempted_spread_group_keeps_its_members_first_tokens() -> None:
    """KV overflow preempts decoding groups; a spread group recomputes its prompt but its
    members' first tokens were already out, so each member is still reported with its
    own TTFT."""
    from koi.sim.physics import step_coef
    cfg = _cfg()
    coef = step_coef(cfg, CAT, load_world())
    rep = Replica(ReplicaSpec(coef, 60_000, 1024, 8192, True), np.random.default_rng(0), 0.0)
    for k in range(6):   # six groups of 4 x 2,000-token prompts, 2,000 tokens out each
        r = Req(0, 0.1 * k, 2000, 2000, 4.0, 0.0)
        r.members([1500, 2500, 2000, 2000])
        r.spread([0.0, 0.01, 0.02, 0.03])
        rep.add_arrival(r)
    rep.run_until(3600.0)
    st = rep.take_stats()
    assert st.preemptions > 0 and rep.empty
    assert len(st.done) == 24 and sum(c.w for c in st.done) == pytest.approx(24.0)


def test_a_relaunch_reshards_the_same_gpus() -> None:
    """tp1 ×4 → tp2 ×2 on the 4 GPUs the deployment holds (none free beyond them): the
    ranks restart with the action's replica count; asking for more GPUs than it holds
    plus the free ones is refused."""
    sc = tiny_scenario([batch_job("bulk", 1500)], {OD: 4}, horizon_s=900)
    sim = Simulator(sc, seed=0)
    sim.apply(PlanDecision(0, (_launch("bulk", replicas=4),)))
    for _ in range(4):
        sim.advance()
    (dep,) = sim.snapshot().deployments
    assert dep.replicas_ready == 4 and dep.gpus == 4

    def relaunch(replicas: int):
        return sim.apply(PlanDecision(sim.tick, (Action(
            ActionKind.RELAUNCH, "bulk", "reshard", deployment_id=dep.id,
            config=_cfg(tp=2), replicas=replicas),)))[0]

    too_many = relaunch(3)                      # 6 GPUs: 4 held, none free
    assert not too_many.applied and "GPUs" in too_many.reason
    assert relaunch(2).applied
    (d,) = sim.snapshot().deployments
    assert d.config.tp == 2 and d.replicas_starting == 2 and d.gpus == 4
    assert next(c for c in sim.snapshot().capacity if c.offering == OD).used_gpus == 4
    while not sim.done:
        sim.advance()
    rec = sim.record("t")
    assert any(e.kind == "relaunch" and "tp2" in e.detail for e in rec.events)
    (bulk,) = rec.jobs
    assert bulk.tokens_processed > 0


def test_no_telemetry_shows_a_negative_latency_or_queue() -> None:
    """A batch job's request whose first token came on a reclaimed spot replica keeps
    its arrival when it is fed to another (its TTFT came out negative when the feed
    restamped it), and an emptied queue weighs exactly 0 (not -1e-14)."""
    sc = tiny_scenario([batch_job("bulk", 60000, out=600), online_job("chat", rate=6)],
                       {RUNPOD_SPOT: 8, OD: 8}, horizon_s=1800)
    sim = Simulator(sc, seed=5, world=_preempt_world())
    sim.apply(PlanDecision(0, (_launch("bulk", RUNPOD_SPOT), _launch("bulk", OD),
                               _launch("chat", RUNPOD_SPOT), _launch("chat", OD))))
    seen = 0
    while not sim.done:
        for t in sim.advance():
            seen += 1
            assert min(t.ttft_mean_s, t.ttft_p95_s, t.num_waiting, t.num_running,
                       t.num_waiting_end, t.num_running_end) >= 0.0, t
    assert seen > 20
    assert any(e.kind == "preemption" for e in sim.fleet.events)


def _changed_shape(kind: ActionKind):
    """An online job's change of knobs on its offering as ``kind``, from a running
    deployment at tick 5, then the run to its end; the record."""
    sim = _chat_running_five_ticks()
    old = sim.snapshot().deployments[0]
    move = Action(kind, "chat", "test", deployment_id=old.id, config=_cfg(max_num_seqs=128),
                  offering=OD, replicas=1 if kind == ActionKind.SWAP else 0)
    assert sim.apply(PlanDecision(sim.tick, (move,)))[0].applied
    while not sim.done:
        sim.advance()
    return sim.record("t")


def test_a_relaunch_disrupts_an_online_job_and_a_swap_in_place_does_not() -> None:
    from koi.churn import run_churn

    relaunched = _changed_shape(ActionKind.RELAUNCH).jobs[0]
    assert relaunched.disrupted_requests > 0   # waited through the restart (or dropped)
    swapped = _changed_shape(ActionKind.SWAP)
    assert swapped.jobs[0].disrupted_requests == 0 and swapped.jobs[0].dropped_by_move == 0
    (row,) = run_churn(swapped).jobs
    assert row.moves["swap"] == 1 and row.startup_gpu_min > 0 and row.drain_gpu_min >= 0
    _accounted(swapped)
