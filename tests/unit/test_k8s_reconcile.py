"""From a decision and what runs to operations, and from objects back to Koi's types
(``koi.fleet.k8s.reconcile`` / ``observe``), driven tick by tick with plain dicts as the
API server would return them. Pure: no API server (the integration test has one)."""

from __future__ import annotations

from typing import Any

import pytest

from koi.catalog import load_catalog
from koi.cluster import Action, ActionKind, DeploymentState, PlanDecision
from koi.fleet.k8s import names as N
from koi.fleet.k8s.manifests import KIND_DEPLOYMENT, KIND_LWS, ManifestOptions
from koi.fleet.k8s.observe import (
    fleet_events,
    node_events,
    pod_events,
    pod_owners,
    read_running,
    running_from,
    to_deployments,
)
from koi.fleet.k8s.reconcile import Op, converge, field_diff, plan_decision
from koi.space import engine_default_config

CAT = load_catalog()
OPTS = ManifestOptions()
OFF = "aws/us-east-1/h100-sxm/spot"
OFF2 = "gcp/us-east4/h100-sxm/spot"
CFG = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)


def running(body: dict[str, Any], *, ready: int = 0, pods: int | None = None,
            created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    """A manifest as the API server returns it once applied: with status and times."""
    obj = {**body, "metadata": {**body["metadata"], "creationTimestamp": created}}
    want = obj["spec"].get("replicas", 1)
    obj["status"] = {"replicas": want if pods is None else pods, "readyReplicas": ready}
    return obj


def launch(job: str = "chat", replicas: int = 2, cfg=CFG, offering: str = OFF) -> Action:
    return Action(ActionKind.LAUNCH, job, "go", config=cfg, offering=offering,
                  replicas=replicas)


def launched(job: str = "chat", tick: int = 1, ready: int = 0, **kw) -> tuple[dict, str]:
    plan = plan_decision(PlanDecision(tick, (launch(job, **kw),)), [], CAT, OPTS)
    op = next(o for o in plan.operations if o.kind == KIND_DEPLOYMENT)
    return running(dict(op.body), ready=ready), plan.new_ids[0]


def test_launch_applies_the_service_then_the_deployment():
    plan = plan_decision(PlanDecision(3, (launch(),)), [], CAT, OPTS)
    assert plan.outcomes[0].applied
    assert [(o.op, o.kind) for o in plan.operations] == [(Op.APPLY, "Service"),
                                                         (Op.APPLY, KIND_DEPLOYMENT)]
    assert plan.new_ids == {0: "chat-t3-0"}
    assert plan.diff()[1].startswith("+ Deployment/koi-chat-t3-0 (chat-t3-0): 2 × h100-sxm")
    again = plan_decision(PlanDecision(3, (launch(),)), [], CAT, OPTS,
                          services=["koi-job-chat"])
    assert [o.kind for o in again.operations] == [KIND_DEPLOYMENT]


def test_applying_a_decision_again_is_idempotent_and_never_takes_another_jobs_id():
    obj, dep_id = launched(tick=3)
    run = read_running([obj])
    again = plan_decision(PlanDecision(3, (launch(),)), run, CAT, OPTS,
                          services=["koi-job-chat"])
    (op,) = again.operations
    assert again.new_ids[0] == dep_id and op.name == obj["metadata"]["name"]
    assert op.diff == (f"= Deployment/{op.name} ({dep_id}): already applied, unchanged",)
    more = plan_decision(PlanDecision(3, (launch(replicas=4),)), run, CAT, OPTS)
    assert "spec.replicas: 2 → 4" in " ".join(more.diff())
    other = plan_decision(PlanDecision(3, (launch("other"),)), run, CAT, OPTS,
                          new_id=lambda a, i: dep_id)  # an id another job's object has
    assert other.new_ids[0] == f"{dep_id}-2"


def test_refusals_say_why():
    obj, dep_id = launched()
    run = read_running([obj])
    bad_cfg = CFG.with_(tp=3)  # 3 does not divide llama's heads
    actions = (
        Action(ActionKind.SCALE, "chat", "x", deployment_id="nope", replicas=2),
        Action(ActionKind.SCALE, "other", "x", deployment_id=dep_id, replicas=2),
        Action(ActionKind.SCALE, "chat", "x", deployment_id=dep_id, replicas=0),
        launch(cfg=bad_cfg),
        Action(ActionKind.RELAUNCH, "chat", "x", deployment_id=dep_id, config=CFG,
               offering=OFF2),
        Action(ActionKind.LAUNCH, "chat", "x", config=None),
    )
    plan = plan_decision(PlanDecision(2, actions), run, CAT, OPTS)
    reasons = [o.reason for o in plan.outcomes]
    assert not any(o.applied for o in plan.outcomes)
    assert "unknown deployment 'nope'" in reasons[0]
    assert "serves job 'chat'" in reasons[1]
    assert "use DRAIN or STOP" in reasons[2]
    assert reasons[3].startswith("invalid config: tp")
    assert "use SWAP" in reasons[4]
    assert "needs a config" in reasons[5]
    assert plan.operations == ()


def test_scale_uses_the_scale_subresource():
    obj, dep_id = launched()
    plan = plan_decision(PlanDecision(2, (Action(ActionKind.SCALE, "chat", "more",
                                                 deployment_id=dep_id, replicas=5),)),
                         read_running([obj]), CAT, OPTS)
    (op,) = plan.operations
    assert (op.op, op.replicas, op.name) == (Op.SCALE, 5, obj["metadata"]["name"])
    assert op.diff == (f"~ Deployment/{op.name} ({dep_id}): replicas 2 → 5",)


def test_swap_is_make_before_break_and_level_triggered():
    old, old_id = launched(ready=2)
    swap = Action(ActionKind.SWAP, "chat", "move", deployment_id=old_id,
                  config=CFG.with_(engine="sglang"), offering=OFF2, replicas=2)
    plan = plan_decision(PlanDecision(2, (swap,)), read_running([old]), CAT, OPTS)
    assert plan.outcomes[0].applied
    (new_op,) = [o for o in plan.operations if o.kind == KIND_DEPLOYMENT]
    assert new_op.name != old["metadata"]["name"]  # the old one is not touched now
    assert new_op.body["metadata"]["annotations"][N.ANN_REPLACES] == \
        f"Deployment/{old['metadata']['name']}"
    assert "kept serving until" in plan.diff()[-1]

    # the new one is not ready: converging changes nothing, the old one keeps serving
    new = running(dict(new_op.body), ready=1, created="2026-01-01T00:01:00Z")
    assert converge(read_running([old, new]), CAT, OPTS, 3) == []
    # ready: the old one is drained (replicas 0, annotated), not yet deleted
    new["status"]["readyReplicas"] = 2
    (drain,) = converge(read_running([old, new]), CAT, OPTS, 3)
    assert (drain.op, drain.name, drain.draining) == (Op.APPLY, old["metadata"]["name"], True)
    assert drain.body["spec"]["replicas"] == 0
    assert drain.body["metadata"]["annotations"][N.ANN_STATE] == N.STATE_DRAINING
    assert drain.body["spec"]["template"] == old["spec"]["template"]  # no restart
    # drained and empty: deleted
    gone = running(dict(drain.body), pods=0)
    (delete,) = converge(read_running([gone, new]), CAT, OPTS, 4)
    assert (delete.op, delete.name) == (Op.DELETE, old["metadata"]["name"])
    # a backend started afresh reads the same from the objects: nothing remembered
    assert converge(read_running([new]), CAT, OPTS, 5) == []


def test_relaunch_rolls_the_same_object_and_shows_the_changed_flags():
    obj, dep_id = launched(ready=2)
    relaunch = Action(ActionKind.RELAUNCH, "chat", "tune", deployment_id=dep_id,
                      config=CFG.with_(max_num_seqs=128), offering=OFF)
    plan = plan_decision(PlanDecision(2, (relaunch,)), read_running([obj]), CAT, OPTS)
    (op,) = plan.operations
    assert op.name == obj["metadata"]["name"] and op.op == Op.APPLY
    assert op.body["spec"]["replicas"] == 2
    assert any("--max-num-seqs 1024 → 128" in line for line in op.diff)


def test_relaunch_that_spans_nodes_goes_the_swap_way():
    obj, dep_id = launched(ready=2, cfg=engine_default_config(
        "llama-3.1-405b", "h100-sxm", "vllm", catalog=CAT, tp=8, weight_precision="fp8"))
    wide = engine_default_config("llama-3.1-405b", "h100-sxm", "vllm", catalog=CAT, tp=8,
                                 pp=2, multi_node=True, weight_precision="fp8")
    relaunch = Action(ActionKind.RELAUNCH, "chat", "more memory", deployment_id=dep_id,
                      config=wide, offering=OFF)
    plan = plan_decision(PlanDecision(2, (relaunch,)), read_running([obj]), CAT, OPTS)
    (op,) = plan.operations
    assert op.kind == KIND_LWS and op.name == obj["metadata"]["name"]
    assert op.body["metadata"]["annotations"][N.ANN_REPLACES] == \
        f"Deployment/{obj['metadata']['name']}"
    # while both run, Koi sees one deployment: the new config, replicas added up
    lws = running(dict(op.body), ready=0, created="2026-01-01T00:05:00Z")
    (dep,) = to_deployments(read_running([obj, lws]))
    assert dep.config.pp == 2 and dep.replicas_ready == 2


def test_drain_stop_reject_defer_and_the_order_of_operations():
    a, a_id = launched("a", ready=2)
    b, b_id = launched("b", ready=2)
    actions = (
        Action(ActionKind.STOP, "a", "bye", deployment_id=a_id),
        Action(ActionKind.DRAIN, "b", "quiet", deployment_id=b_id),
        Action(ActionKind.REJECT, "c", "too big"),
        Action(ActionKind.DEFER, "d", "later"),
        launch("e"),
    )
    plan = plan_decision(PlanDecision(2, actions), read_running([a, b]), CAT, OPTS)
    assert all(o.applied for o in plan.outcomes)
    kinds = [(o.op, o.draining) for o in plan.operations]
    assert kinds == [(Op.APPLY, False), (Op.APPLY, False), (Op.APPLY, True),
                     (Op.DELETE, False)]  # new capacity first, removal last
    assert plan.for_action(2) == [] and plan.for_action(3) == []


def test_observe_states_and_what_is_not_koi():
    obj, _ = launched(ready=0)
    (d,) = to_deployments(read_running([obj]))
    assert (d.state, d.replicas_ready, d.replicas_starting) == (DeploymentState.STARTING, 0, 2)
    obj["status"]["readyReplicas"] = 1
    (d,) = to_deployments(read_running([obj]))
    assert (d.state, d.replicas_ready, d.replicas_starting) == (DeploymentState.RUNNING, 1, 1)
    assert d.config == CFG.with_(offering=OFF, replicas=2) and d.offering == OFF
    assert running_from({"metadata": {"labels": {}}}) is None
    broken = {**obj, "metadata": {**obj["metadata"], "annotations": {
        **obj["metadata"]["annotations"], N.ANN_CONFIG: "{not json"}}}
    (r,) = read_running([broken])
    assert r.problem and to_deployments([r]) == []


HOSTILE = "chat\n\x1b[2J ünï"


def test_events_map_back_to_raw_ids():
    obj, dep_id = launched(HOSTILE, ready=1)
    run = read_running([obj])
    pod_labels = obj["spec"]["template"]["metadata"]["labels"]
    pods = [{"metadata": {"name": "koi-x-abc-1", "labels": pod_labels},
             "status": {"phase": "Running", "conditions": [
                 {"type": "Ready", "status": "True",
                  "lastTransitionTime": "2026-01-01T00:02:00Z"}]}},
            {"metadata": {"name": "not-koi", "labels": {"app": "x"}}, "status": {}}]
    owners = pod_owners(pods, run)
    gone = obj["metadata"]["name"] + "-5d8f-zz"
    events = [
        _event("Preempted", "koi-x-abc-1"), _event("Evicted", gone),
        _event("FailedScheduling", "koi-x-abc-1"), _event("Preempted", "not-koi"),
        _event("Pulled", "koi-x-abc-1"), _event("NodeNotReady", "node-7", kind="Node"),
    ]
    found = [ev for _, ev in fleet_events(events, owners, run)]
    assert [e.kind for e in found] == ["preemption", "eviction", "unschedulable",
                                       "node_lost"]
    assert all(e.job_id == HOSTILE and e.deployment_id == dep_id for e in found[:3])
    assert found[0].time_s > 0
    (ready,) = [ev for _, ev in pod_events(pods, owners)]
    assert ready.kind == "ready" and ready.job_id == HOSTILE
    nodes = [{"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-01T00:03:00Z",
         "reason": "NodeStatusUnknown"}]}},
             {"metadata": {"name": "n2"}, "status": {"conditions": [
                 {"type": "Ready", "status": "True"}]}}]
    (lost,) = [ev for _, ev in node_events(nodes)]
    assert lost.kind == "node_lost" and "n1" in lost.detail


def _event(reason: str, name: str, kind: str = "Pod") -> dict:
    return {"metadata": {"uid": f"{reason}-{name}"}, "reason": reason, "message": "m",
            "involvedObject": {"kind": kind, "name": name},
            "lastTimestamp": "2026-01-01T00:04:00Z", "count": 1}


@pytest.mark.parametrize(("want", "have", "line"), [
    ({"a": {"b": 1}}, {"a": {"b": 2, "c": 3}}, "a.b: 2 → 1"),
    ({"x": {"args": ["m", "--k", "1", "--on"]}}, {"x": {"args": ["m", "--k", "2"]}},
     "x.args: --k 2 → 1"),
    ({"x": {"args": ["--on"]}}, {"x": {"args": []}}, "x.args: +--on"),
])
def test_field_diff(want, have, line):
    assert line in field_diff(want, have)
