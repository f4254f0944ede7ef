"""Placer: least disruptive actions, migration budget, rejections and finished jobs."""

from __future__ import annotations

from koi.cluster import (
    ActionKind,
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
    OfferingCapacity,
)
from koi.jobs import parse_job
from koi.planner.place import Target, in_place, place
from koi.space import engine_default_config

OFF = "aws/us-east-1/h100-sxm/on_demand"
OFF2 = "aws/us-east-1/h100-sxm/spot"


def job(jid: str, admitted: bool = True) -> JobStatus:
    spec = parse_job({"kind": "online", "id": jid, "model": "llama-3.1-8b",
                      "arrival": {"rate_rps": 2}, "input_len": 500, "output_len": 100,
                      "slo": {"ttft_ms": 1000, "tpot_ms": 50}})
    return JobStatus(spec=spec, admitted=admitted, rejected=False)


def cfg(**kw):
    return engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", **kw)


def dep(did: str, jid: str, config, offering: str = OFF, ready: int = 1,
        state: DeploymentState = DeploymentState.RUNNING) -> Deployment:
    return Deployment(did, jid, config.with_(offering=offering, replicas=ready), offering,
                      state, ready, 0, 0.0)


def snap(deps=(), jobs=()) -> ClusterSnapshot:
    cap = (OfferingCapacity(OFF, 64, 8), OfferingCapacity(OFF2, 64, 0))
    return ClusterSnapshot(1, 60.0, 60.0, 3600.0, cap, tuple(deps), tuple(jobs))


def target(jid: str, config, offering: str = OFF, replicas: int = 1) -> Target:
    return Target(jid, "place", "plan", config, offering, replicas)


def test_launch_when_nothing_runs() -> None:
    (a,) = place([target("a", cfg(), replicas=2)], snap(jobs=[job("a", False)]))
    assert a.kind == ActionKind.LAUNCH and a.replicas == 2 and a.offering == OFF
    assert a.config.offering == OFF and a.config.replicas == 2


def test_scale_same_shape_and_reset_lost_replicas() -> None:
    running = dep("d1", "a", cfg(), ready=1)
    (a,) = place([target("a", cfg(), replicas=3)], snap([running], [job("a")]))
    assert a.kind == ActionKind.SCALE and a.replicas == 3 and a.deployment_id == "d1"
    assert place([target("a", cfg(), replicas=1)], snap([running], [job("a")])) == []


def test_relaunch_for_new_knobs_on_same_gpus_swap_otherwise() -> None:
    running = dep("d1", "a", cfg())
    (r,) = place([target("a", cfg(max_num_seqs=64))], snap([running], [job("a")]),
                 make_before_break=False)
    assert r.kind == ActionKind.RELAUNCH and r.deployment_id == "d1"
    (s,) = place([target("a", cfg(), offering=OFF2)], snap([running], [job("a")]))
    assert s.kind == ActionKind.SWAP and s.offering == OFF2
    (t,) = place([target("a", cfg(tp=2))], snap([running], [job("a")]))
    assert t.kind == ActionKind.SWAP  # more GPUs per replica: not the same GPUs


def test_migration_budget_defers_extra_moves() -> None:
    deps = [dep(f"d{i}", f"j{i}", cfg()) for i in range(3)]
    targets = [target(f"j{i}", cfg(), offering=OFF2) for i in range(3)]
    actions = place(targets, snap(deps, [job(f"j{i}") for i in range(3)]), migration_budget=2)
    kinds = [a.kind for a in actions]
    assert kinds.count(ActionKind.SWAP) == 2 and kinds.count(ActionKind.DEFER) == 1
    assert "migration budget" in actions[-1].reason


def test_no_second_swap_while_the_successor_starts() -> None:
    old = dep("d1", "a", cfg())
    new = dep("d2", "a", cfg(), offering=OFF2, state=DeploymentState.STARTING)
    assert place([target("a", cfg(), offering=OFF2)], snap([old, new], [job("a")])) == []


def test_reject_stops_and_finished_jobs_stop() -> None:
    actions = place([Target("a", "reject", "no config meets TTFT")],
                    snap(jobs=[job("a", admitted=False)]))
    assert [a.kind for a in actions] == [ActionKind.REJECT]
    assert actions[0].reason == "no config meets TTFT"
    running = dep("d1", "b", cfg())
    (stop,) = place([], snap([running], [job("b")]), finished=["b"])
    assert stop.kind == ActionKind.STOP and stop.deployment_id == "d1"


def test_defer_says_why_when_nothing_runs() -> None:
    (a,) = place([Target("a", "defer", "no capacity: needs 8 GPUs")],
                 snap(jobs=[job("a", False)]))
    assert a.kind == ActionKind.DEFER and "no capacity" in a.reason


def batch_job(jid: str) -> JobStatus:
    spec = parse_job({"kind": "batch", "id": jid, "model": "llama-3.1-8b",
                      "num_requests": 1000, "input_len": 500, "output_len": 100,
                      "deadline_s": 3600})
    return JobStatus(spec=spec, admitted=True, rejected=False)


def deferred(jid: str) -> Target:
    return Target(jid, "defer", "not worth its cost")


def test_a_deferred_batch_job_drains_and_a_deferred_online_job_keeps_serving() -> None:
    deps = [dep("d1", "b", cfg()), dep("d2", "o", cfg())]
    actions = place([deferred("b"), deferred("o")],
                    snap(deps, [batch_job("b"), job("o")]))
    assert [(a.kind, a.deployment_id) for a in actions] == [(ActionKind.DRAIN, "d1")]
    assert "deferred: not worth its cost" in actions[0].reason


def test_an_action_needing_more_than_is_free_waits_instead_of_being_refused() -> None:
    # OFF has 64 GPUs, 8 used: 56 free, taken in action order
    actions = place([target("a", cfg(), replicas=40), target("b", cfg(), replicas=20),
                     target("c", cfg(), replicas=16)],
                    snap(jobs=[job("a", False), job("b", False), job("c", False)]))
    assert [a.kind for a in actions] == [ActionKind.LAUNCH, ActionKind.DEFER, ActionKind.LAUNCH]
    assert "waiting for GPUs: needs 20 on" in actions[1].reason and "16 free now" in \
        actions[1].reason


def test_in_place_is_the_running_deployment_or_a_relaunch_on_its_gpus() -> None:
    keeps = in_place([dep("d1", "a", cfg())])
    assert keeps(cfg(), OFF)                          # scaled in place
    assert keeps(cfg(max_num_seqs=64), OFF)           # relaunched on the same GPUs
    assert not keeps(cfg(), OFF2)                     # a swap to other GPUs
    assert not keeps(cfg(tp=2), OFF)                  # more GPUs per replica
    assert not in_place([])(cfg(), OFF)
    starting = dep("d2", "a", cfg(), state=DeploymentState.STARTING)
    assert not in_place([starting])(cfg(max_num_seqs=64), OFF)   # nothing runs to relaunch
    # a batch job may be re-sharded on its GPUs; never moved off them by a relaunch
    batch_keeps = in_place([dep("d1", "b", cfg())], reshard=True)
    assert batch_keeps(cfg(tp=2), OFF) and batch_keeps(cfg(max_num_seqs=64), OFF)
    assert not batch_keeps(cfg(tp=2), OFF2)


def test_a_batch_job_is_resharded_in_place_when_enabled_and_an_online_job_swaps() -> None:
    """tp1 ×8 → tp2 ×4 on the same 8 GPUs (OFF has none free beyond them): with
    ``reshard_batch`` the batch job relaunches there with the plan's replica count;
    without it, and for an online job, it is a swap, which must wait for GPUs (the old
    deployment serves until the new one is ready)."""
    full = ClusterSnapshot(1, 60.0, 60.0, 3600.0, (OfferingCapacity(OFF, 8, 8),),
                           (dep("d1", "b", cfg(), ready=8),), (batch_job("b"),))
    (r,) = place([target("b", cfg(tp=2), replicas=4)], full, reshard_batch=True)
    assert r.kind == ActionKind.RELAUNCH and r.deployment_id == "d1" and r.replicas == 4
    assert r.config.tp == 2 and r.config.replicas == 4
    (more,) = place([target("b", cfg(tp=2), replicas=5)], full, reshard_batch=True)
    assert more.kind == ActionKind.DEFER and "needs 2 on" in more.reason    # 10 of 8
    (off,) = place([target("b", cfg(tp=2), replicas=4)], full)
    assert off.kind == ActionKind.DEFER and "waiting for GPUs: needs 8" in off.reason
    online = ClusterSnapshot(1, 60.0, 60.0, 3600.0, (OfferingCapacity(OFF, 8, 8),),
                             (dep("d1", "a", cfg(), ready=8),), (job("a"),))
    (s,) = place([target("a", cfg(tp=2), replicas=4)], online, reshard_batch=True)
    assert s.kind == ActionKind.DEFER and "waiting for GPUs: needs 8" in s.reason


def test_an_online_change_of_shape_is_make_before_break_where_both_ends_fit() -> None:
    running = dep("d1", "a", cfg())
    (r,) = place([target("a", cfg(max_num_seqs=64))], snap([running], [job("a")]))
    assert r.kind == ActionKind.SWAP and r.offering == OFF and r.deployment_id == "d1"


def test_an_online_relaunch_only_where_the_offering_can_never_hold_both_ends() -> None:
    running = dep("d1", "a", cfg())
    full = ClusterSnapshot(1, 60.0, 60.0, 3600.0, (OfferingCapacity(OFF, 1, 1),),
                           (running,), (job("a"),))
    (r,) = place([target("a", cfg(max_num_seqs=64))], full)
    assert r.kind == ActionKind.RELAUNCH and r.deployment_id == "d1"
    assert r.reason.startswith("capacity forbids make-before-break")


def test_an_online_swap_in_place_waits_for_gpus_a_drain_will_free() -> None:
    running = dep("d1", "a", cfg())
    busy = ClusterSnapshot(1, 60.0, 60.0, 3600.0, (OfferingCapacity(OFF, 4, 4),),
                           (running,), (job("a"),))
    (r,) = place([target("a", cfg(max_num_seqs=64))], busy)
    assert r.kind == ActionKind.DEFER and "waiting for GPUs" in r.reason


def test_in_place_without_relaunch_counts_only_the_running_shape() -> None:
    running = dep("d1", "a", cfg())
    keeps = in_place([running], relaunch=False)
    assert keeps(cfg(), OFF) and not keeps(cfg(max_num_seqs=64), OFF)
    assert in_place([running])(cfg(max_num_seqs=64), OFF)
