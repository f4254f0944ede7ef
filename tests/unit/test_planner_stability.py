"""Plan stability holds, tick by tick with an explicit clock: the composer's (pinned,
cool-down) from the snapshot, the placer's (scale-down window, move limit) with memory;
KOI_CHURN_* settings."""

from __future__ import annotations

import pytest

from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus
from koi.jobs import parse_job
from koi.planner.place import Target
from koi.planner.stability import ChurnMemory, ChurnSettings, held_jobs, remember, stabilise
from koi.space import engine_default_config

OFF = "aws/us-east-1/h100-sxm/on_demand"
S = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, cooldown_s=900.0,
                  scale_up_confirm=1, scale_down_headroom=0.0)


def job(**extra) -> JobStatus:
    spec = parse_job({"kind": "online", "id": "a", "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": 1000, "tpot_ms": 50}, **extra})
    return JobStatus(spec=spec, admitted=True, rejected=False)


def cfg(**knobs):
    return engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", **knobs)


def dep(did: str = "d1", replicas: int = 4, started: float = 0.0, **knobs) -> Deployment:
    return Deployment(did, "a", cfg(**knobs).with_(offering=OFF, replicas=replicas), OFF,
                      DeploymentState.RUNNING, replicas, 0, started)


def snap(t: float, deps=(), jobs=None) -> ClusterSnapshot:
    return ClusterSnapshot(int(t // 120), t, 120.0, 36000.0, (), tuple(deps),
                           tuple(jobs if jobs is not None else [job()]))


def target(replicas: int, **knobs) -> Target:
    return Target("a", "place", "plan", cfg(**knobs), OFF, replicas)


def test_scale_down_keeps_the_most_planned_in_the_window_growth_is_at_once():
    m = ChurnMemory()
    s0 = snap(0, [dep(replicas=4)])
    (t,), m = stabilise([target(4)], s0, remember(m, s0), S)
    s1 = snap(120, [dep(replicas=4)])
    (t,), m = stabilise([target(3)], s1, remember(m, s1), S)
    assert t.replicas == 4 and "scale-down held: 3 planned, keeping 4" in t.reason
    s2 = snap(360, [dep(replicas=4)])
    (t,), m = stabilise([target(3)], s2, remember(m, s2), S)
    assert t.replicas == 3                    # the 4 of tick 0 left the window
    (t,), _ = stabilise([target(6)], s2, m, S)
    assert t.replicas == 6


def test_without_a_window_the_plan_passes_through():
    off = ChurnSettings.off()
    s = snap(120, [dep(replicas=4)])
    (t,), _ = stabilise([target(2)], s, remember(ChurnMemory(), s), off)
    assert t.replicas == 2 and t.reason == "plan"


def test_cool_down_from_the_newest_deployment_and_pinned_from_the_spec():
    s = snap(300, [dep("d1", started=0.0), dep("d2", started=180.0)])
    assert held_jobs(s, S)["a"].startswith("held back: cooling down, placed 120 s ago")
    assert held_jobs(snap(1200, [dep(started=180.0)]), S) == {}
    pinned = snap(5000, [dep()], [job(pinned=True)])
    assert "pinned" in held_jobs(pinned, S)["a"]


def test_moves_are_read_off_the_fleet_a_repair_is_not_one():
    m = remember(ChurnMemory(), snap(0, [dep(replicas=2)]))
    m = remember(m, snap(120, [dep(replicas=2)]))
    assert m.moves == {}
    m = remember(m, snap(240, [dep(replicas=3)]))
    m = remember(m, snap(360, [dep(replicas=3, max_num_seqs=64)]))
    m = remember(m, snap(480, [dep(replicas=3, max_num_seqs=64), dep("d2", replicas=3)]))
    assert m.moves["a"] == (240, 360, 480)
    assert remember(m, snap(240 + 3600, [])).moves["a"] == (360, 480)


def test_a_job_at_its_move_limit_keeps_what_it_runs():
    m = ChurnMemory(moves={"a": (0.0, 100.0)})
    s = snap(200, [dep(replicas=4)], [job(max_moves_per_hour=2)])
    (t,), _ = stabilise([target(6, max_num_seqs=64)], s, m, S)
    assert t.replicas == 4 and t.config.max_num_seqs == cfg().max_num_seqs
    assert "2 moves in the last hour, its limit is 2 per hour" in t.reason
    fleet = ChurnSettings(default_max_moves_per_hour=1.0)
    (t,), _ = stabilise([target(6)], snap(200, [dep(replicas=4)]), m, fleet)
    assert t.replicas == 4 and "limit is 1 per hour" in t.reason


def test_settings_from_the_environment_name_the_bad_variable():
    s = ChurnSettings.from_env({"KOI_CHURN_COOLDOWN_S": "60",
                                "KOI_CHURN_MAKE_BEFORE_BREAK": "false"})
    assert s.cooldown_s == 60.0 and not s.make_before_break
    with pytest.raises(ValueError, match="KOI_CHURN_SCALE_DOWN_WINDOW_S"):
        ChurnSettings.from_env({"KOI_CHURN_SCALE_DOWN_WINDOW_S": "-1"})


def test_an_untried_scope_is_as_uncertain_as_the_prior_and_the_belief_together():
    from koi.catalog import load_catalog
    from koi.causal.scope import scope_of
    from koi.causal.store import BeliefStore
    from koi.planner.stability import estimate_sd

    store = BeliefStore()
    scope = scope_of(cfg(), load_catalog())
    prior = store.config.prior_sd
    assert estimate_sd(store, scope) == pytest.approx((2 * prior ** 2) ** 0.5)


def test_a_dead_band_keeps_a_plan_wavering_by_one():
    banded = ChurnSettings(scale_down_window_s=300.0, scale_down_band=1)
    m = ChurnMemory()
    s = snap(0, [dep(replicas=4)])
    (t,), m = stabilise([target(3)], s, remember(m, s), banded)
    assert t.replicas == 4 and "a band of 1" in t.reason
    (t,), m = stabilise([target(2)], snap(120, [dep(replicas=4)]), m, banded)
    assert t.replicas == 4                        # the window's most (3) is within the band
    (t,), _ = stabilise([target(1)], snap(600, [dep(replicas=4)]), m, banded)
    assert t.replicas == 2                        # the window's most is 1: to 1 + the band


RATES = ChurnSettings(rate_window_s=600.0, rate_rise_s=120.0)


def test_a_rise_is_planned_for_at_once_a_fall_once_the_window_saw_it():
    from koi.planner.stability import planned_rate

    steady = [(60.0 * i, 2.0) for i in range(10)]
    assert planned_rate(steady, 540.0, RATES) == pytest.approx(2.0)
    up = [*steady, (600.0, 4.0)]
    assert planned_rate(up, 600.0, RATES) == pytest.approx((2.0 + 4.0) / 2)
    down = [*steady, (600.0, 1.0)]                  # one low tick: the window's mean
    assert planned_rate(down, 600.0, RATES) == pytest.approx((9 * 2.0 + 1.0) / 10)
    low = [*steady, *((600.0 + 60.0 * i, 1.0) for i in range(10))]
    assert planned_rate(low, 1140.0, RATES) == pytest.approx(1.0)
    assert planned_rate(down, 600.0, ChurnSettings.off()) == 1.0
    assert planned_rate([], 600.0, RATES) is None


def test_rates_are_remembered_per_online_job_and_planned_in_the_view():
    from koi.planner.stability import planning_view

    def at(t: float, rate: float) -> ClusterSnapshot:
        return snap(t, [dep()], [JobStatus(job().spec, True, False, observed_rate_rps=rate)])

    m = remember(ChurnMemory(), at(0.0, 0.0))        # nothing counted yet: no observation
    assert m.rates == {}
    for t, r in ((60.0, 2.0), (120.0, 1.0), (180.0, 1.0), (240.0, 1.0)):
        m = remember(m, at(t, r))
    m = remember(m, at(240.0, 1.0))                  # the same snapshot twice: one sample
    assert m.rates["a"] == ((60.0, 2.0), (120.0, 1.0), (180.0, 1.0), (240.0, 1.0))
    (j,) = planning_view(at(240.0, 1.0), m, RATES).jobs
    assert j.observed_rate_rps == pytest.approx(5.0 / 4)
    (j,) = planning_view(at(240.0, 1.0), m, ChurnSettings.off()).jobs
    assert j.observed_rate_rps == 1.0


def test_a_scale_up_goes_its_margin_beyond_as_far_as_spare_gpus_allow():
    from koi.cluster import OfferingCapacity

    margin = ChurnSettings(scale_down_window_s=300.0, scale_down_band=1, scale_up_margin=0.25,
                           scale_up_confirm=1)

    def with_free(t: float, free: int, replicas: int) -> ClusterSnapshot:
        s = snap(t, [dep(replicas=replicas)])
        used = replicas * cfg().gpus_per_replica
        return ClusterSnapshot(s.tick, t, s.tick_s, s.horizon_s,
                               (OfferingCapacity(OFF, used + free, used),), s.deployments,
                               s.jobs)

    s = with_free(0.0, 100, 4)
    (t,), m = stabilise([target(8)], s, remember(ChurnMemory(), s), margin)
    assert t.replicas == 10 and "scaled up 2 beyond the 8 planned" in t.reason
    s = with_free(0.0, 5 * cfg().gpus_per_replica, 4)   # 4 more planned, room for 1 beyond
    (t,), _ = stabilise([target(8)], s, remember(ChurnMemory(), s), margin)
    assert t.replicas == 9
    s = with_free(120.0, 100, 10)                       # 8 planned within the widened band
    (t,), _ = stabilise([target(8)], s, remember(m, s), margin)
    assert t.replicas == 10
    (t,), _ = stabilise([target(3)], with_free(0.0, 100, 2), ChurnMemory(), margin)
    assert t.replicas == 3                              # below 1 / margin: nothing beyond


def test_a_scale_up_waits_for_plans_in_a_row_and_goes_to_the_fewest_they_asked():
    confirm = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, scale_up_confirm=2)
    s0 = snap(0, [dep(replicas=4)])
    (t,), m = stabilise([target(7)], s0, remember(ChurnMemory(), s0), confirm)
    assert t.replicas == 4 and "scale-up held: 7 planned" in t.reason   # one plan alone
    s1 = snap(120, [dep(replicas=4)])
    (t,), m = stabilise([target(9)], s1, remember(m, s1), confirm)
    assert t.replicas == 7                     # the fewest of the two asked for
    (t,), _ = stabilise([target(9, max_num_seqs=64)], s1, m, confirm)
    assert t.replicas == 9                     # a new placement is not held
    at_once = ChurnSettings(scale_down_window_s=0.0, scale_up_confirm=2)
    (t,), m = stabilise([target(6)], s0, remember(ChurnMemory(), s0), at_once)
    (t,), _ = stabilise([target(6)], s1, remember(m, s1), at_once)
    assert t.replicas == 6                     # remembered without a scale-down window


def test_a_falling_count_steps_down_once_per_gap_not_a_replica_a_tick():
    gap = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, scale_down_gap_s=600.0,
                        scale_down_headroom=0.0)
    m = ChurnMemory(moves={"a": (0.0,)})
    s = snap(360, [dep(replicas=6)])
    (t,), m2 = stabilise([target(3)], s, remember(m, s), gap)
    assert t.replicas == 6 and "its last move 360 s ago" in t.reason
    s = snap(600, [dep(replicas=6)])
    (t,), _ = stabilise([target(3)], s, remember(m2, s), gap)
    assert t.replicas == 3


def test_a_starting_deployment_is_held_like_a_running_one():
    s0 = snap(0, [dep(replicas=4)])
    _, m = stabilise([target(4)], s0, remember(ChurnMemory(), s0), S)
    starting = Deployment("d1", "a", cfg().with_(offering=OFF, replicas=4), OFF,
                          DeploymentState.STARTING, 0, 4, 0.0)
    s1 = snap(120, [starting])
    (t,), _ = stabilise([target(3)], s1, remember(m, s1), S)
    assert t.replicas == 4 and "scale-down held" in t.reason


def test_a_cool_down_does_not_hold_a_job_where_what_it_runs_misses_its_slo():
    from koi.planner.propose import Proposal
    from koi.planner.stability import binding_holds

    s = snap(300, [dep(started=180.0)])
    held = held_jobs(s, S)
    runs, other = Proposal("a", cfg(), ""), Proposal("a", cfg(max_num_seqs=64), "")
    assert binding_holds(held, [runs, other], [True, False], s) == held
    assert binding_holds(held, [runs, other], [False, True], s) == {}
    pinned = snap(300, [dep(started=180.0)], [job(pinned=True)])
    assert binding_holds(held_jobs(pinned, S), [runs], [False], pinned) != {}


def test_a_cool_down_does_not_hold_a_job_on_an_offering_stocked_out():
    from koi.cluster import OfferingCapacity
    from koi.planner.propose import Proposal
    from koi.planner.stability import binding_holds

    def at(total: int) -> ClusterSnapshot:
        s = snap(300, [dep(started=180.0)])
        return ClusterSnapshot(s.tick, s.time_s, s.tick_s, s.horizon_s,
                               (OfferingCapacity(OFF, total, min(total, 4)),),
                               s.deployments, s.jobs)

    runs = Proposal("a", cfg(), "")
    assert binding_holds(held_jobs(at(8), S), [runs], [True], at(8)) != {}
    assert binding_holds(held_jobs(at(0), S), [runs], [True], at(0)) == {}


def test_a_held_scale_down_gives_back_the_gpus_another_job_was_planned():
    from koi.cluster import OfferingCapacity

    per = cfg().gpus_per_replica
    one_free = (OfferingCapacity(OFF, 7 * per, 6 * per),)
    s = snap(120, [dep(replicas=6)])
    s = ClusterSnapshot(s.tick, s.time_s, s.tick_s, s.horizon_s, one_free, s.deployments,
                        s.jobs)
    m = ChurnMemory(plans={"a": ((60.0, _key_of(), 6),)})
    other = Target("b", "place", "plan", cfg(max_num_seqs=64), OFF, 3)   # 3 new: 2 short
    (t, _), _ = stabilise([target(2), other], s, remember(m, s), S)
    assert t.replicas == 6                       # off by default: the hold keeps them
    yields = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, scale_down_yield=True)
    (t, _), _ = stabilise([target(2), other], s, remember(m, s), yields)
    assert t.replicas == 4 and "2 given back for another job's growth" in t.reason
    (t,), _ = stabilise([target(2)], s, remember(m, s), yields)
    assert t.replicas == 6                       # nobody needs them: the window holds


def _key_of() -> str:
    from koi.planner.stability import _key
    return _key(cfg(), OFF)


def test_a_held_scale_down_yields_only_to_a_job_that_holds_no_gpus():
    from koi.cluster import OfferingCapacity

    per = cfg().gpus_per_replica
    b_runs = Deployment("db", "b", cfg(max_num_seqs=64).with_(offering=OFF, replicas=1), OFF,
                        DeploymentState.RUNNING, 1, 0, 0.0)
    cap = (OfferingCapacity(OFF, 8 * per, 7 * per),)        # a's 6, b's 1, one free

    def at(deps) -> ClusterSnapshot:
        s = snap(120, deps)
        return ClusterSnapshot(s.tick, s.time_s, s.tick_s, s.horizon_s, cap, s.deployments,
                               s.jobs)

    m = ChurnMemory(plans={"a": ((60.0, _key_of(), 6),)})
    grows = Target("b", "place", "plan", cfg(max_num_seqs=64), OFF, 4)   # 3 more: 2 short
    newcomer = Target("c", "place", "plan", cfg(max_num_seqs=32), OFF, 3)  # 3 new: 2 short
    new_only = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0,
                             scale_down_yield_new=True)
    s = at([dep(replicas=6), b_runs])
    (t, _), _ = stabilise([target(2), grows], s, remember(m, s), new_only)
    assert t.replicas == 6                  # b holds GPUs: its growth waits, the hold keeps
    s = at([dep(replicas=6)])
    (t, _), _ = stabilise([target(2), newcomer], s, remember(m, s), new_only)
    assert t.replicas == 4 and "2 given back for another job's growth" in t.reason
    big = Target("c", "place", "plan", cfg(max_num_seqs=32), OFF, 1)     # fits in the free one
    (t, _), _ = stabilise([target(2), big], s, remember(m, s), new_only)
    assert t.replicas == 6


def test_headroom_keeps_a_share_above_the_most_planned():
    room = ChurnSettings(scale_down_window_s=300.0, scale_down_band=1,
                         scale_down_headroom=0.25, scale_down_gap_s=0.0)
    s = snap(600, [dep(replicas=12)])
    m = ChurnMemory(plans={"a": ((360.0, _key_of(), 6),)})
    (t,), _ = stabilise([target(5)], s, remember(m, s), room)
    assert t.replicas == 8                  # ceil(6 × 1.25) = 8 > 6 + the band of 1
    (t,), _ = stabilise([target(5)], s, remember(m, s), room.model_copy(
        update={"scale_down_headroom": 0.0}))
    assert t.replicas == 7


def test_no_scale_down_while_the_rate_is_rising():
    from koi.planner.stability import rate_rising

    hold = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, scale_down_gap_s=0.0,
                         scale_down_rising_hold=True, scale_down_headroom=0.0)
    flat = tuple((60.0 * i, 2.0) for i in range(10))
    rising = (*flat[:-2], (480.0, 3.0), (540.0, 3.0))
    assert rate_rising(rising, 560.0, hold) and not rate_rising(flat, 560.0, hold)
    assert not rate_rising(rising, 560.0, ChurnSettings.off())
    s = snap(560, [dep(replicas=6)])
    for rates, want in ((rising, 6), (flat, 3)):
        m = ChurnMemory(rates={"a": rates})
        (t,), _ = stabilise([target(3)], s, m, hold)
        assert t.replicas == want
        assert ("its rate is rising" in t.reason) == (want == 6)


def test_a_scale_up_soon_after_a_scale_down_needs_more_plans_unless_it_goes_beyond():
    after = ChurnSettings(scale_down_window_s=600.0, scale_down_band=0, scale_down_gap_s=600.0,
                          scale_up_confirm=2, scale_up_after_down_confirm=4)
    m = ChurnMemory()
    for t0, n in ((0.0, 6), (60.0, 4)):                   # the fleet shows 6 -> 4 at 60 s
        m = remember(m, snap(t0, [dep(replicas=n)]))
    assert m.downs["a"] == (60.0, 6)
    asked = []
    for t0 in (120.0, 180.0, 240.0, 300.0):
        s = snap(t0, [dep(replicas=4)])
        (t,), m = stabilise([target(5)], s, remember(m, s), after)
        asked.append(t.replicas)
    assert asked == [4, 4, 4, 5]                        # the fourth plan in a row
    m2 = remember(ChurnMemory(), snap(0.0, [dep(replicas=6)]))
    m2 = remember(m2, snap(60.0, [dep(replicas=4)]))
    for t0 in (120.0, 180.0):
        s = snap(t0, [dep(replicas=4)])
        (t,), m2 = stabilise([target(7)], s, remember(m2, s), after)
    assert t.replicas == 7                   # beyond the 6 it ran: the usual two plans
    m3 = remember(ChurnMemory(), snap(0.0, [dep(replicas=6)]))
    m3 = remember(m3, snap(60.0, [dep(replicas=4)]))
    for t0 in (600.0, 660.0):
        s = snap(t0, [dep(replicas=4)])
        (t,), m3 = stabilise([target(5)], s, remember(m3, s), after)
    assert t.replicas == 5                   # the gap since the scale-down passed: two plans


def test_a_launch_count_is_held_like_any_plan_for_its_placement():
    s0 = snap(0, [])
    (t,), m = stabilise([target(9)], s0, remember(ChurnMemory(), s0), S)
    assert t.replicas == 9
    starting = Deployment("d1", "a", cfg().with_(offering=OFF, replicas=9), OFF,
                          DeploymentState.STARTING, 0, 9, 0.0)
    s1 = snap(120, [starting])
    (t,), m = stabilise([target(6)], s1, remember(m, s1), S)
    assert t.replicas == 9 and "the most planned in the last 300 s: 9" in t.reason
    s2 = snap(360, [dep(replicas=9)])
    (t,), _ = stabilise([target(6)], s2, remember(m, s2), S)
    assert t.replicas == 6                    # the launch's 9 left the window


def test_a_plan_short_of_demand_does_not_scale_down_unless_a_newcomer_needs_the_gpus():
    from dataclasses import replace as with_

    from koi.cluster import OfferingCapacity

    short = ChurnSettings(scale_down_window_s=300.0, scale_down_band=0, scale_down_gap_s=0.0,
                          scale_down_short_hold=True, scale_down_headroom=0.0)
    s = snap(600, [dep(replicas=6)])
    m = ChurnMemory(plans={"a": ((360.0, _key_of(), 3),)})
    (t,), _ = stabilise([with_(target(3), served=0.6)], s, remember(m, s), short)
    assert t.replicas == 6 and "the plan serves 60% of its demand" in t.reason
    (t,), _ = stabilise([with_(target(3), served=1.0)], s, remember(m, s), short)
    assert t.replicas == 3                    # demand fell: the window alone
    per = cfg().gpus_per_replica
    full = ClusterSnapshot(s.tick, s.time_s, s.tick_s, s.horizon_s,
                           (OfferingCapacity(OFF, 6 * per, 6 * per),), s.deployments, s.jobs)
    newcomer = Target("c", "place", "plan", cfg(max_num_seqs=32), OFF, 2)
    both = short.model_copy(update={"scale_down_yield_new": True})
    (t, _), _ = stabilise([with_(target(3), served=0.6), newcomer], full,
                          remember(m, full), both)
    assert t.replicas == 4 and "2 given back" in t.reason


def test_the_documented_off_environment_leaves_every_newer_hold_inert():
    """history/ISSUE30-rate: today's Koi is run with these variables; holds added since
    must not act under them, so a run with them is the same planner as ``off()``."""
    from dataclasses import replace as with_

    env = {"KOI_CHURN_MAKE_BEFORE_BREAK": "false", "KOI_CHURN_SCALE_DOWN_WINDOW_S": "0",
           "KOI_CHURN_SCALE_DOWN_BAND": "0", "KOI_CHURN_SCALE_DOWN_GAP_S": "0",
           "KOI_CHURN_SCALE_UP_MARGIN": "0", "KOI_CHURN_SCALE_UP_CONFIRM": "1",
           "KOI_CHURN_RATE_WINDOW_S": "0", "KOI_CHURN_RATE_RISE_S": "0",
           "KOI_CHURN_COOLDOWN_S": "0", "KOI_CHURN_MOVE_VALUE_H": "0",
           "KOI_CHURN_UNCERTAINTY_Z": "0", "KOI_CHURN_DEFAULT_MAX_MOVES_PER_HOUR": "0"}
    on = {"KOI_CHURN_SCALE_DOWN_RISING_HOLD": "true", "KOI_CHURN_SCALE_DOWN_HEADROOM": "0.5",
          "KOI_CHURN_SCALE_DOWN_SHORT_HOLD": "true", "KOI_CHURN_SCALE_DOWN_YIELD_NEW": "true",
          "KOI_CHURN_SCALE_UP_AFTER_DOWN_CONFIRM": "5"}
    documented = ChurnSettings.from_env({**env, **on})
    rising = tuple((60.0 * i, 1.0 + i) for i in range(10))
    runs = []
    for settings in (documented, ChurnSettings.off()):
        m = ChurnMemory(rates={"a": rising})
        got = []
        for t0, deps, plan in ((0.0, [], target(9)), (60.0, [dep(replicas=9)], target(6)),
                               (120.0, [dep(replicas=6)], with_(target(3), served=0.5)),
                               (180.0, [dep(replicas=3)], target(5))):
            s = snap(t0, deps)
            (t,), m = stabilise([plan], s, remember(m, s), settings)
            got.append((t.replicas, t.reason))
        runs.append(got)
    assert runs[0] == runs[1] == [(9, "plan"), (6, "plan"), (3, "plan"), (5, "plan")]
