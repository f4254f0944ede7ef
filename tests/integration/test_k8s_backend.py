"""``KubernetesBackend`` over real HTTP against the stand-in API server.

The stand-in (tests/support/k8s_standin.py) is not Kubernetes: it keeps objects in
memory and answers the few REST paths the backend uses, so these tests check what the
backend sends (server-side apply as ``application/apply-patch+yaml`` with
``fieldManager=koi`` and ``force``, the scale subresource, deletes, ``dryRun=All``) and
how it reads back what runs; the manifests themselves are checked against the stored
Kubernetes schema. Also ``koi plan --backend k8s --dry-run`` end to end on a hetero-3h
tick.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import yaml
from typer.testing import CliRunner

from koi.catalog import load_catalog
from koi.cluster import Action, ActionKind, DeploymentState, PlanDecision
from koi.fleet.k8s import names as N
from koi.scenario.types import FleetEntry
from koi.space import engine_default_config
from services.k8s_backend import KubernetesBackend, api_client
from services.koi_command import app
from support.k8s_schema import validate
from support.k8s_standin import StandIn

CAT = load_catalog()
OFF, OFF2 = "aws/us-east-1/h100-sxm/spot", "gcp/us-east4/h100-sxm/spot"
CFG = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
FLEET = (FleetEntry(OFF, 16), FleetEntry(OFF2, 8))

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as s:
        yield s


def backend(s: StandIn, dry_run: str = "") -> KubernetesBackend:
    return KubernetesBackend(api_client(s.url), CAT, fleet=FLEET, dry_run=dry_run,
                             clock=lambda: 1000.0, start_s=0.0)


def writes(s: StandIn) -> list[dict]:
    return [r for r in s.requests if r["method"] != "GET"]


def launch(job: str = "chat", replicas: int = 2, cfg=CFG, offering: str = OFF) -> Action:
    return Action(ActionKind.LAUNCH, job, "serve it", config=cfg, offering=offering,
                  replicas=replicas)


def test_apply_is_server_side_apply_and_snapshot_reads_it_back(standin):
    b = backend(standin)
    (out,) = b.apply(PlanDecision(4, (launch(),)))
    assert out.applied, out.reason
    (dep,) = standin.objects("deployments")
    assert len(standin.objects("services")) == 1
    applied = [r["body"] for r in writes(standin)]
    assert [a["kind"] for a in applied] == ["Service", "Deployment"]
    assert all(validate(a) == [] for a in applied)  # what was sent, not the stored copy
    assert dep["metadata"]["labels"][N.LABEL_MANAGED_BY] == "koi"
    for req in writes(standin):
        assert req["method"] == "PATCH"
        assert req["content_type"] == "application/apply-patch+yaml"
        assert req["query"]["fieldManager"] == "koi" and req["query"]["force"] == "true"
    assert any(r["query"].get("labelSelector") == "app.kubernetes.io/managed-by=koi"
               for r in standin.requests if r["method"] == "GET")
    snap = b.snapshot()
    (d,) = snap.deployments
    assert (d.id, d.job_id, d.state, d.replicas_starting) == ("chat-t4-0", "chat",
                                                             DeploymentState.STARTING, 2)
    cap = {c.offering: c for c in snap.capacity}
    assert (cap[OFF].total_gpus, cap[OFF].used_gpus) == (16, 2)
    standin.mark_ready(dep["metadata"]["name"])
    (d,) = backend(standin).snapshot().deployments
    assert d.state == DeploymentState.RUNNING and d.replicas_ready == 2


def test_make_before_break_swap_and_reconcile_on_start(standin):
    first = backend(standin)
    first.apply(PlanDecision(1, (launch(),)))
    old = standin.objects("deployments")[0]["metadata"]["name"]
    standin.mark_ready(old)
    swap = Action(ActionKind.SWAP, "chat", "cheaper", deployment_id="chat-t1-0",
                  config=CFG.with_(engine="sglang"), offering=OFF2, replicas=2)
    (out,) = first.apply(PlanDecision(2, (swap,)))
    assert out.applied, out.reason
    names = {d["metadata"]["name"] for d in standin.objects("deployments")}
    new = (names - {old}).pop()

    # a new backend (restarted, no memory) reads what runs and finishes the swap
    second = backend(standin)
    assert {d.id for d in second.snapshot().deployments} == {"chat-t1-0", "chat-t2-0"}
    assert second.reconcile() == []  # the new one is not ready: the old one stays
    assert standin.get("deployments", "koi", old)["spec"]["replicas"] == 2
    standin.mark_ready(new, ready=1)
    assert second.reconcile() == []
    standin.mark_ready(new)
    (drain,) = second.reconcile()
    assert drain.name == old
    drained = standin.get("deployments", "koi", old)
    assert drained["spec"]["replicas"] == 0
    assert drained["metadata"]["annotations"][N.ANN_STATE] == N.STATE_DRAINING
    states = {d.id: d.state for d in second.snapshot().deployments}
    assert states == {"chat-t1-0": DeploymentState.DRAINING,
                      "chat-t2-0": DeploymentState.RUNNING}
    (delete,) = backend(standin).reconcile()  # its pods are gone: deleted
    assert delete.name == old and standin.get("deployments", "koi", old) is None
    assert len(standin.objects("services")) == 1  # the job's Service stays throughout


def test_scale_drain_and_stop(standin):
    b = backend(standin)
    b.apply(PlanDecision(1, (launch("a"), launch("b"), launch("c"))))
    scale = Action(ActionKind.SCALE, "a", "busier", deployment_id="a-t1-0", replicas=5)
    drain = Action(ActionKind.DRAIN, "b", "quiet", deployment_id="b-t1-1")
    stop = Action(ActionKind.STOP, "c", "done", deployment_id="c-t1-2")
    outs = b.apply(PlanDecision(2, (scale, drain, stop)))
    assert all(o.applied for o in outs), [o.reason for o in outs]
    assert standin.get("deployments", "koi", "koi-a-t1-0")["spec"]["replicas"] == 5
    scale_req = [r for r in writes(standin) if r["path"].endswith("/scale")]
    assert scale_req and scale_req[0]["content_type"] == "application/merge-patch+json"
    assert standin.get("deployments", "koi", "koi-b-t1-1")["spec"]["replicas"] == 0
    assert standin.get("deployments", "koi", "koi-c-t1-2") is None
    missing = Action(ActionKind.SCALE, "c", "again", deployment_id="c-t1-2", replicas=1)
    (refused,) = b.apply(PlanDecision(3, (missing,)))
    assert not refused.applied and "unknown deployment" in refused.reason


def test_a_multi_node_deployment_is_a_leaderworkerset(standin):
    wide = engine_default_config("llama-3.1-405b", "h100-sxm", "sglang", catalog=CAT,
                                 tp=16, multi_node=True, weight_precision="fp8")
    b = backend(standin)
    (out,) = b.apply(PlanDecision(1, (launch("big", 1, wide),)))
    assert out.applied, out.reason
    assert len(standin.objects("leaderworkersets")) == 1
    (sent,) = [r["body"] for r in writes(standin) if "leaderworkersets" in r["path"]]
    assert validate(sent) == []
    (out,) = b.apply(PlanDecision(2, (Action(ActionKind.SCALE, "big", "x",
                                             deployment_id="big-t1-0", replicas=2),)))
    assert out.applied
    assert standin.get("leaderworkersets", "koi", "koi-big-t1-0")["spec"]["replicas"] == 2
    assert len([p for p in standin.pods() if "big" in p["metadata"]["name"]]) == 4


def test_preemption_and_lost_nodes_become_fleet_events(standin):
    hostile = "chat\n\x1b[31m"
    b = backend(standin)
    b.apply(PlanDecision(1, (launch(hostile, 1),)))
    name = standin.objects("deployments")[0]["metadata"]["name"]
    standin.mark_ready(name)
    standin.add_node("gpu-node-1")
    first = b.events()
    assert [e.kind for e in first] == ["ready"]
    pod = standin.pods()[0]["metadata"]["name"]
    standin.add_event("Preempted", pod, "Preempted by a higher-priority pod")
    standin.set_node_ready("gpu-node-1", False)
    kinds = {(e.kind, e.job_id, e.deployment_id) for e in b.events()}
    dep_id = f"{hostile}-t1-0"
    assert ("preemption", hostile, dep_id) in kinds and ("node_lost", "", "") in kinds
    assert b.events() == []  # each reported once


def test_dry_runs_apply_nothing(standin):
    local = backend(standin, dry_run="local")
    (out,) = local.apply(PlanDecision(1, (launch(),)))
    assert not out.applied and out.reason.startswith("dry run (local)")
    assert writes(standin) == [] and standin.objects("deployments") == []
    server = backend(standin, dry_run="server")
    (out,) = server.apply(PlanDecision(1, (launch(),)))
    assert not out.applied and out.reason.startswith("dry run (server)")
    sent = writes(standin)
    assert sent and all(r["query"].get("dryRun") == "All" for r in sent)
    assert standin.objects("deployments") == [] and standin.objects("services") == []


def test_an_unreachable_cluster_refuses_every_action_and_raises_nothing():
    with StandIn() as gone:
        url = gone.url  # closed when the block ends: nothing listens there any more
    b = KubernetesBackend(api_client(url), CAT, fleet=FLEET, clock=lambda: 0.0)
    outs = b.apply(PlanDecision(1, (launch(), launch("b"))))
    assert [o.applied for o in outs] == [False, False]
    assert all(o.reason.startswith("cannot read the cluster") for o in outs)


def test_koi_plan_dry_run_prints_schema_valid_manifests(standin, tmp_path):
    # every pre-quantized checkpoint a tick could ask for, so no launch is refused
    options = tmp_path / "options.yaml"
    options.write_text(yaml.safe_dump({"checkpoints": {
        f"{m}/{p}": f"example-org/{m}-{p}" for m in CAT.models
        for p in ("fp8", "int8", "int4", "fp4")}}))
    result = CliRunner().invoke(app, [
        "plan", "--backend", "k8s", "--dry-run", "--scenario", "hetero-3h", "--tick", "0",
        "--kube-url", standin.url, "--namespace", "koi", "--manifest-options",
        str(options)])
    assert result.exit_code == 0, result.output
    out = result.output
    header = re.search(r"(\d+) actions: (\d+) planned, (\d+) refused", out)
    assert header and int(header.group(1)) > 0 and header.group(3) == "0", out[-2000:]
    docs = [yaml.safe_load(d) for d in re.findall(r"^---\n(.*?)^\.\.\.$", out,
                                                  re.MULTILINE | re.DOTALL)]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
    assert len(workloads) == int(header.group(2))  # tick 0: every action launches
    for doc in docs:
        assert validate(doc) == [], doc["metadata"]["name"]
    assert out.count("  why: ") == int(header.group(1))
    assert "diff against the cluster:" in out and "+ Deployment/koi-" in out
    assert writes(standin) == []  # a dry run writes nothing
