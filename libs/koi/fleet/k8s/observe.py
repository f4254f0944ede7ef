"""What the cluster runs, read back into Koi's terms.

Input is what the API server returns, as plain dicts (camelCase, as
``ApiClient().sanitize_for_serialization`` or ``json.loads`` gives them): Deployments
and LeaderWorkerSets with Koi's labels, their pods, core/v1 Events and Nodes. Output:
``Running`` (one Koi object as it runs), ``koi.cluster.Deployment`` (one per Koi
deployment id) and ``FleetEvent`` (what the fleet did on its own). Level-triggered:
everything here is derived from the objects, nothing from what was asked before.

Pure: no API calls, no clock (times come from the objects or are passed in).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from koi.cluster import Deployment, DeploymentState
from koi.errors import KoiError
from koi.fleet.k8s import names as N
from koi.fleet.ports import FleetEvent
from koi.space import DeploymentConfig, config_from_dict

# Event reasons and what they mean for Koi (kubelet / scheduler / node controller)
EVENT_KINDS = {
    "Preempted": "preemption",          # the scheduler preempted the pod for another
    "Evicted": "eviction",              # the kubelet evicted it (node pressure)
    "TaintManagerEviction": "eviction",  # the node went away under it (NoExecute taint)
    "FailedScheduling": "unschedulable",
    "NodeNotReady": "node_lost",
}


@dataclass(frozen=True, slots=True)
class Running:
    """One Koi object (Deployment or LeaderWorkerSet) as the cluster runs it."""

    kind: str
    name: str
    job_id: str
    deployment_id: str
    config: DeploymentConfig | None    # None when its config annotation does not read
    offering: str
    replicas: int                      # spec.replicas (LWS: groups)
    ready: int                         # status.readyReplicas
    pods: int                          # status.replicas: replicas that still exist
    draining: bool
    replaces: str                      # "<Kind>/<name>" it makes way for, or ""
    plan_tick: int
    created_s: float
    body: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    problem: str = ""                  # why it cannot be managed, when it cannot

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def is_ready(self) -> bool:
        """Every desired replica ready (and at least one desired)."""
        return self.replicas > 0 and self.ready >= self.replicas


def parse_time(stamp: str | None) -> float:
    """Seconds since the epoch of an RFC 3339 API timestamp (0.0 when absent/bad)."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def running_from(obj: Mapping[str, Any]) -> Running | None:
    """A Koi object read from what the API returned; None when it is not Koi's."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(N.LABEL_MANAGED_BY) != N.MANAGED_BY:
        return None
    ann = meta.get("annotations") or {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    job_id = ann.get(N.ANN_JOB_ID) or labels.get(N.LABEL_JOB, "")
    dep_id = ann.get(N.ANN_DEPLOYMENT_ID) or labels.get(N.LABEL_DEPLOYMENT, "")
    config, problem = None, ""
    try:
        config = config_from_dict(json.loads(ann.get(N.ANN_CONFIG, "")))
    except (ValueError, TypeError, KoiError) as e:
        problem = f"config annotation {N.ANN_CONFIG} does not read: {e}"
    if not dep_id:
        problem = problem or "no deployment id"
    try:
        tick = int(labels.get(N.LABEL_PLAN_TICK, "-1"))
    except ValueError:
        tick = -1
    return Running(
        kind=str(obj.get("kind", "")), name=str(meta.get("name", "")), job_id=job_id,
        deployment_id=dep_id, config=config, offering=ann.get(N.ANN_OFFERING, ""),
        replicas=_int(spec.get("replicas"), 1), ready=_int(status.get("readyReplicas")),
        pods=_int(status.get("replicas")),
        draining=ann.get(N.ANN_STATE) == N.STATE_DRAINING,
        replaces=ann.get(N.ANN_REPLACES, ""), plan_tick=tick,
        created_s=parse_time(meta.get("creationTimestamp")), body=obj, problem=problem)


def _int(x: Any, default: int = 0) -> int:
    try:
        return int(x) if x is not None else default
    except (TypeError, ValueError):
        return default


def read_running(objects: Iterable[Mapping[str, Any]]) -> list[Running]:
    return [r for r in (running_from(o) for o in objects) if r is not None]


def to_deployments(running: Sequence[Running]) -> list[Deployment]:
    """One ``koi.cluster.Deployment`` per Koi deployment id (objects whose config does
    not read are left out: Koi cannot say what they run). Two objects share an id only
    while a relaunch moves between kinds: their replicas add up, the newer's config wins."""
    by_id: dict[str, list[Running]] = {}
    for r in running:
        if r.config is not None and not r.problem:
            by_id.setdefault(r.deployment_id, []).append(r)
    out = []
    for dep_id, objs in by_id.items():
        live = [o for o in objs if not o.draining] or objs
        head = max(live, key=lambda o: o.created_s)
        ready = sum(o.ready for o in objs)
        wanted = sum(o.replicas for o in live if not o.draining)
        draining = all(o.draining for o in objs)
        state = (DeploymentState.DRAINING if draining else
                 DeploymentState.RUNNING if ready > 0 else DeploymentState.STARTING)
        starting = 0 if draining else max(wanted - ready, 0)
        assert head.config is not None
        out.append(Deployment(
            id=dep_id, job_id=head.job_id,
            config=head.config.with_(replicas=max(wanted, 1), offering=head.offering),
            offering=head.offering, state=state, replicas_ready=ready,
            replicas_starting=starting, started_s=min(o.created_s for o in objs)))
    return sorted(out, key=lambda d: d.id)


@dataclass(frozen=True, slots=True)
class PodOwner:
    job_id: str
    deployment_id: str


def pod_owners(pods: Iterable[Mapping[str, Any]], running: Sequence[Running]
               ) -> dict[str, PodOwner]:
    """Pod name -> the Koi job and deployment it belongs to, from the pod's labels (raw
    ids from the owning object when the sanitized label matches one)."""
    by_label = {(N.label_value(r.job_id), N.label_value(r.deployment_id)): r
                for r in running}
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(N.LABEL_MANAGED_BY) != N.MANAGED_BY:
            continue
        key = (labels.get(N.LABEL_JOB, ""), labels.get(N.LABEL_DEPLOYMENT, ""))
        owner = by_label.get(key)
        out[str(meta.get("name", ""))] = (PodOwner(owner.job_id, owner.deployment_id)
                                          if owner else PodOwner(*key))
    return out


def _owner_by_prefix(pod_name: str, running: Sequence[Running]) -> PodOwner | None:
    # a pod already gone: Deployment pods are "<name>-<hash>-<id>", LWS pods "<name>-<n>"
    best = None
    for r in running:
        if pod_name.startswith(r.name + "-") and (best is None or len(r.name) > len(best.name)):
            best = r
    return PodOwner(best.job_id, best.deployment_id) if best else None


def event_key(ev: Mapping[str, Any]) -> str:
    """What identifies one report of an event: its uid and how often it has fired."""
    meta = ev.get("metadata") or {}
    return f"{meta.get('uid') or meta.get('name')}:{ev.get('count') or 1}"


def fleet_events(events: Iterable[Mapping[str, Any]], owners: Mapping[str, PodOwner],
                 running: Sequence[Running]) -> list[tuple[str, FleetEvent]]:
    """(key, FleetEvent) for each core/v1 Event that matters to Koi: pod preemptions,
    evictions and scheduling failures of Koi's pods, and nodes going NotReady. The key
    lets a caller report each once (``event_key``)."""
    out = []
    for ev in events:
        kind = EVENT_KINDS.get(str(ev.get("reason", "")))
        if kind is None:
            continue
        involved = ev.get("involvedObject") or {}
        name = str(involved.get("name", ""))
        when = parse_time(ev.get("lastTimestamp") or ev.get("eventTime")
                          or (ev.get("metadata") or {}).get("creationTimestamp"))
        detail = f"{ev.get('reason')}: {ev.get('message', '')}".strip()
        if involved.get("kind") == "Node":
            if kind in ("node_lost", "eviction"):
                out.append((event_key(ev), FleetEvent("node_lost", when, detail=f"{name}:"
                                                      f" {detail}")))
            continue
        if involved.get("kind") != "Pod":
            continue
        owner = owners.get(name) or _owner_by_prefix(name, running)
        if owner is None:
            continue  # not one of Koi's pods
        out.append((event_key(ev), FleetEvent(kind, when, owner.job_id, owner.deployment_id,
                                              f"pod {name}: {detail}")))
    return out


def node_events(nodes: Iterable[Mapping[str, Any]]) -> list[tuple[str, FleetEvent]]:
    """A ``node_lost`` event for each node whose Ready condition is not True, keyed by
    the node and the condition's transition time (so each outage is reported once)."""
    out = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") != "True":
                since = cond.get("lastTransitionTime") or ""
                out.append((f"node:{name}:{since}", FleetEvent(
                    "node_lost", parse_time(since),
                    detail=f"{name}: Ready={cond.get('status')}"
                           f" ({cond.get('reason', '')})")))
    return out


def pod_events(pods: Iterable[Mapping[str, Any]], owners: Mapping[str, PodOwner]
               ) -> list[tuple[str, FleetEvent]]:
    """``ready`` when a Koi pod's Ready condition is True, ``failed`` when it failed or
    its engine container keeps restarting; keyed so each transition is reported once."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name = str(meta.get("name", ""))
        owner = owners.get(name)
        if owner is None:
            continue
        if status.get("phase") == "Failed":
            out.append((f"pod:{name}:failed", FleetEvent(
                "failed", parse_time(status.get("startTime")), owner.job_id,
                owner.deployment_id, f"pod {name}: {status.get('reason', 'Failed')}")))
            continue
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                since = cond.get("lastTransitionTime") or ""
                out.append((f"pod:{name}:ready:{since}", FleetEvent(
                    "ready", parse_time(since), owner.job_id, owner.deployment_id,
                    f"pod {name} ready")))
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                out.append((f"pod:{name}:crash:{cs.get('restartCount', 0)}", FleetEvent(
                    "failed", 0.0, owner.job_id, owner.deployment_id,
                    f"pod {name}: CrashLoopBackOff after {cs.get('restartCount', 0)}"
                    " restarts")))
    return out
