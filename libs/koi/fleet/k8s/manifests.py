"""Koi deployments as Kubernetes objects: pure functions from a ``Workload`` to manifests.

One Koi deployment (a job's replicas of one ``DeploymentConfig`` on one offering) is an
``apps/v1`` Deployment whose pods each run one engine replica, or, when a replica needs
more GPUs than one node of its accelerator has (the catalog's ``gpus_per_node``), a
``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet whose groups of pods (a leader and
workers, one per node) each run one replica. A job gets one ``v1`` Service selecting
the serving pods (single pods and LWS leaders) of all its deployments, so during a
make-before-break swap both old and new serve.

Placement: node selectors for the accelerator (``koi.dev/accelerator``, a label the
operator puts on node pools) and region (``topology.kubernetes.io/region``); the
capacity type as a required node affinity whose terms are ORed: Koi's own
``koi.dev/capacity-type`` label, or the cloud's well-known one (Karpenter's and EKS's on
AWS, GKE's spot labels, AKS's scale-set priority); tolerations for spot taints and the
GPU vendor's taint. Labels carry sanitized ids (``names``), annotations the raw ones.

Objects are built from the kubernetes client's models and serialized with
``ApiClient().sanitize_for_serialization``; the LeaderWorkerSet (a CRD with no client
model) is a dict around serialized pod templates. No API calls here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import (
    ApiClient,
    V1Affinity,
    V1Container,
    V1ContainerPort,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStrategy,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1EnvVarSource,
    V1HTTPGetAction,
    V1LabelSelector,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1PodSpec,
    V1PodTemplateSpec,
    V1Probe,
    V1ResourceRequirements,
    V1RollingUpdateDeployment,
    V1SecretKeySelector,
    V1Service,
    V1ServicePort,
    V1ServiceSpec,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)

from koi.catalog import Accelerator, Catalog, Market, Offering
from koi.fleet.k8s import names as N
from koi.fleet.k8s.engines import HEALTH_PATH, IMAGES, Launch, ManifestError, image_for, launch
from koi.space import DeploymentConfig, config_hash, config_to_dict

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
KIND_DEPLOYMENT, KIND_LWS, KIND_SERVICE = "Deployment", "LeaderWorkerSet", "Service"
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "habana.ai/gaudi"}
REGION_LABEL = "topology.kubernetes.io/region"
CAPACITY = {Market.SPOT: "spot", Market.ON_DEMAND: "on-demand", Market.RESERVED: "reserved"}
SERVICE_PORT = 80


@dataclass(frozen=True, slots=True)
class ManifestOptions:
    """What an operator decides about the manifests, not the planner."""

    namespace: str = "koi"
    images: Mapping[tuple[str, str], str] = field(default_factory=lambda: dict(IMAGES))
    # "<model>/<precision>" -> pre-quantized checkpoint (HF repo or path in the image)
    checkpoints: Mapping[str, str] = field(default_factory=dict)
    # model id -> draft model for EAGLE / draft-model speculative decoding
    draft_models: Mapping[str, str] = field(default_factory=dict)
    # a Secret with key "token" for gated models (optional: pods start without it)
    hf_token_secret: str = "hf-token"
    shm_size: str = "16Gi"   # /dev/shm for NCCL / torch IPC between ranks
    # seconds a draining pod gets to finish its in-flight requests after SIGTERM
    termination_grace_s: int = 120
    progress_deadline_s: int = 3600  # weights load slowly: don't call a rollout stuck early


@dataclass(frozen=True, slots=True)
class Workload:
    """One Koi deployment to render: ids are raw (untrusted) text."""

    job_id: str
    deployment_id: str
    config: DeploymentConfig   # config.offering is ignored: ``offering`` is where
    offering: Offering
    replicas: int
    plan_tick: int
    reason: str = ""
    replaces: str = ""         # "<Kind>/<name>" of the object this one makes way for
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Rendered:
    """A manifest as the API takes it (camelCase dict) and what it is."""

    kind: str
    name: str
    body: dict[str, Any]

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


def to_dict(obj: Any) -> dict[str, Any]:
    """A client model as the JSON the API server takes (camelCase, no None fields)."""
    return ApiClient().sanitize_for_serialization(obj)


def nodes_per_replica(cfg: DeploymentConfig, accel: Accelerator) -> int:
    """Pods (one per node) one replica spans: more than one when its GPUs exceed what
    the catalog says one node of the accelerator has."""
    return max(1, math.ceil(cfg.gpus_per_replica / accel.gpus_per_node))


def workload_name(w: Workload) -> str:
    return N.object_name(w.deployment_id)


def service_name(job_id: str) -> str:
    return N.object_name(job_id, prefix="koi-job-")


def kind_for(cfg: DeploymentConfig, catalog: Catalog) -> str:
    return KIND_LWS if nodes_per_replica(cfg, catalog.accelerator(cfg.accelerator)) > 1 \
        else KIND_DEPLOYMENT


def render(w: Workload, catalog: Catalog, options: ManifestOptions) -> Rendered:
    """The Deployment (or LeaderWorkerSet) for ``w``. Raises ``ManifestError`` for a
    deployment that cannot be written (no image for the vendor, a quantized precision
    without a checkpoint, disaggregated prefill, GPUs that do not split over nodes)."""
    cfg = w.config.with_(offering=w.offering.id, replicas=max(w.replicas, 1))
    if cfg.pd_disaggregation:
        raise ManifestError("prefill/decode disaggregation is not written as manifests")
    if w.offering.accelerator != cfg.accelerator:
        raise ManifestError(f"{w.offering.id} sells {w.offering.accelerator}, not"
                            f" {cfg.accelerator}")
    accel = catalog.accelerator(cfg.accelerator)
    nodes = nodes_per_replica(cfg, accel)
    if cfg.gpus_per_replica % nodes:
        raise ManifestError(f"{cfg.gpus_per_replica} GPUs per replica do not split evenly"
                            f" over {nodes} nodes of {accel.gpus_per_node} {accel.id}")
    meta = _metadata(w, cfg, options)
    if nodes == 1:
        pod = _pod_template(w, cfg, catalog, options, "single", 1)
        body = to_dict(V1Deployment(
            api_version="apps/v1", kind=KIND_DEPLOYMENT, metadata=meta,
            spec=V1DeploymentSpec(
                replicas=0 if w.draining else w.replicas,
                selector=V1LabelSelector(match_labels=_selector_labels(w)),
                template=pod,
                strategy=V1DeploymentStrategy(  # make-before-break, replica by replica
                    type="RollingUpdate",
                    rolling_update=V1RollingUpdateDeployment(max_surge=1, max_unavailable=0)),
                revision_history_limit=2,
                progress_deadline_seconds=options.progress_deadline_s)))
        return Rendered(KIND_DEPLOYMENT, workload_name(w), body)
    leader = _pod_template(w, cfg, catalog, options, "leader", nodes)
    worker = _pod_template(w, cfg, catalog, options, "worker", nodes)
    body = {
        "apiVersion": LWS_API_VERSION, "kind": KIND_LWS, "metadata": to_dict(meta),
        "spec": {
            "replicas": 0 if w.draining else w.replicas,
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 0,
                                                               "maxSurge": 1}},
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",  # a lost rank ends the group
                "leaderTemplate": to_dict(leader),
                "workerTemplate": to_dict(worker),
            },
        },
    }
    return Rendered(KIND_LWS, workload_name(w), body)


def render_service(job_id: str, options: ManifestOptions) -> Rendered:
    """The job's Service: every ready serving pod of every deployment of the job."""
    name = service_name(job_id)
    labels = {N.LABEL_JOB: N.label_value(job_id), N.LABEL_MANAGED_BY: N.MANAGED_BY}
    svc = V1Service(
        api_version="v1", kind=KIND_SERVICE,
        metadata=V1ObjectMeta(name=name, namespace=options.namespace, labels=labels,
                              annotations={N.ANN_JOB_ID: job_id}),
        spec=V1ServiceSpec(
            type="ClusterIP",
            selector={**labels, N.LABEL_SERVING: "true"},
            ports=[V1ServicePort(name="http", port=SERVICE_PORT, target_port="http",
                                 protocol="TCP")]))
    return Rendered(KIND_SERVICE, name, to_dict(svc))


def _selector_labels(w: Workload) -> dict[str, str]:
    # immutable on a Deployment: only what never changes for this Koi deployment
    return {N.LABEL_MANAGED_BY: N.MANAGED_BY, N.LABEL_JOB: N.label_value(w.job_id),
            N.LABEL_DEPLOYMENT: N.label_value(w.deployment_id)}


def engine_config(cfg: DeploymentConfig) -> DeploymentConfig:
    """``cfg`` without its replica count: scaling does not make a new configuration
    (and must not change the pod template, which would restart every pod)."""
    return cfg.with_(replicas=1)


def _labels(w: Workload, cfg: DeploymentConfig) -> dict[str, str]:
    return {**_selector_labels(w), N.LABEL_CONFIG_HASH: config_hash(engine_config(cfg)),
            N.LABEL_PLAN_TICK: str(int(w.plan_tick)),
            N.LABEL_NAME: cfg.engine, N.LABEL_COMPONENT: "engine"}


def _metadata(w: Workload, cfg: DeploymentConfig, options: ManifestOptions) -> V1ObjectMeta:
    ann = {N.ANN_JOB_ID: w.job_id, N.ANN_DEPLOYMENT_ID: w.deployment_id,
           N.ANN_OFFERING: w.offering.id,
           N.ANN_CONFIG: json.dumps(config_to_dict(engine_config(cfg)), sort_keys=True,
                                    separators=(",", ":"))}
    if w.reason:
        ann[N.ANN_REASON] = N.short_text(w.reason)
    if w.replaces:
        ann[N.ANN_REPLACES] = w.replaces
    if w.draining:
        ann[N.ANN_STATE] = N.STATE_DRAINING
    return V1ObjectMeta(name=workload_name(w), namespace=options.namespace,
                        labels=_labels(w, cfg), annotations=ann)


def _pod_template(w: Workload, cfg: DeploymentConfig, catalog: Catalog,
                  options: ManifestOptions, role: str, nodes: int) -> V1PodTemplateSpec:
    accel = catalog.accelerator(cfg.accelerator)
    entry = launch(cfg, catalog, role=role, nodes=nodes,
                   checkpoints=options.checkpoints, draft_models=options.draft_models)
    serving = role in ("single", "leader")
    labels = {k: v for k, v in _labels(w, cfg).items() if k != N.LABEL_PLAN_TICK}
    labels[N.LABEL_SERVING] = "true" if serving else "false"
    gpus = cfg.gpus_per_replica // nodes
    resource = GPU_RESOURCE.get(accel.vendor)
    if resource is None:
        raise ManifestError(f"no Kubernetes device resource known for {accel.vendor}")
    node_selector, affinity, tolerations = placement(w.offering, accel)
    spec = V1PodSpec(
        containers=[_container(cfg, accel, options, entry, resource, gpus, serving)],
        node_selector=node_selector, affinity=affinity, tolerations=tolerations,
        termination_grace_period_seconds=options.termination_grace_s,
        volumes=[V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(
            medium="Memory", size_limit=options.shm_size))])
    return V1PodTemplateSpec(metadata=V1ObjectMeta(labels=labels), spec=spec)


def _container(cfg: DeploymentConfig, accel: Accelerator, options: ManifestOptions,
               entry: Launch, resource: str, gpus: int, serving: bool) -> V1Container:
    env = [V1EnvVar(name=k, value=v) for k, v in entry.env]
    if options.hf_token_secret:
        env.append(V1EnvVar(name="HF_TOKEN", value_from=V1EnvVarSource(
            secret_key_ref=V1SecretKeySelector(name=options.hf_token_secret, key="token",
                                               optional=True))))
    probe = None
    if serving:
        probe = V1Probe(http_get=V1HTTPGetAction(path=HEALTH_PATH, port="http"),
                        period_seconds=10, timeout_seconds=5, failure_threshold=3)
    return V1Container(
        name="engine", image=image_for(cfg.engine, accel.vendor, options.images),
        command=list(entry.command), args=list(entry.args) or None,
        ports=[V1ContainerPort(name="http", container_port=entry.port, protocol="TCP")],
        env=env or None, readiness_probe=probe,
        resources=V1ResourceRequirements(limits={resource: str(gpus)}),
        volume_mounts=[V1VolumeMount(name="dshm", mount_path="/dev/shm")])


def placement(offering: Offering, accel: Accelerator
              ) -> tuple[dict[str, str], V1Affinity, list[V1Toleration]]:
    """Node selector, affinity and tolerations that put a pod on ``offering``'s nodes."""
    capacity = CAPACITY[offering.market]
    selector = {N.LABEL_ACCELERATOR: N.label_value(accel.id),
                REGION_LABEL: N.label_value(offering.region)}
    terms = [_term((N.LABEL_CAPACITY, "In", [capacity]))]
    terms += [_term(*exprs) for exprs in _cloud_capacity(offering.cloud, offering.market)]
    affinity = V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=V1NodeSelector(
            node_selector_terms=terms)))
    tolerations = [V1Toleration(key=GPU_RESOURCE[accel.vendor], operator="Exists",
                                effect="NoSchedule")]
    if offering.market == Market.SPOT:
        tolerations.append(V1Toleration(key=N.LABEL_CAPACITY, operator="Equal",
                                        value="spot", effect="NoSchedule"))
        tolerations += [V1Toleration(key=k, operator="Equal", value=v, effect="NoSchedule")
                        for k, v in SPOT_TAINTS.get(offering.cloud, ())]
    return selector, affinity, tolerations


# The clouds' own capacity-type node labels (each tuple: the expressions of one term).
# AWS: Karpenter's karpenter.sh/capacity-type and EKS managed node groups'
# eks.amazonaws.com/capacityType; GKE labels Spot VMs cloud.google.com/gke-spot=true
# (and legacy preemptible ones gke-preemptible); AKS labels spot pools
# kubernetes.azure.com/scalesetpriority=spot. An on-demand node is one without them.
Expr = tuple[str, str, list[str] | None]


def _cloud_capacity(cloud: str, market: Market) -> list[tuple[Expr, ...]]:
    spot = market == Market.SPOT
    if cloud == "aws" and market != Market.RESERVED:
        return [(("karpenter.sh/capacity-type", "In", ["spot" if spot else "on-demand"]),),
                (("eks.amazonaws.com/capacityType", "In", ["SPOT" if spot else "ON_DEMAND"]),)]
    if cloud == "gcp":
        if spot:
            return [(("cloud.google.com/gke-spot", "In", ["true"]),)]
        return [(("cloud.google.com/gke-spot", "DoesNotExist", None),
                 ("cloud.google.com/gke-preemptible", "DoesNotExist", None))]
    if cloud == "azure":
        key = "kubernetes.azure.com/scalesetpriority"
        return [((key, "In", ["spot"]),)] if spot else [((key, "DoesNotExist", None),)]
    return []


# taints the clouds put (AKS always) or document (GKE) on spot nodes
SPOT_TAINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "gcp": (("cloud.google.com/gke-spot", "true"),),
    "azure": (("kubernetes.azure.com/scalesetpriority", "spot"),),
}


def _term(*exprs: Expr) -> V1NodeSelectorTerm:
    return V1NodeSelectorTerm(match_expressions=[
        V1NodeSelectorRequirement(key=k, operator=op, values=v) for k, op, v in exprs])


__all__ = [
    "KIND_DEPLOYMENT",
    "KIND_LWS",
    "KIND_SERVICE",
    "LWS_API_VERSION",
    "ManifestError",
    "ManifestOptions",
    "Rendered",
    "Workload",
    "engine_config",
    "kind_for",
    "nodes_per_replica",
    "placement",
    "render",
    "render_service",
    "service_name",
    "to_dict",
    "workload_name",
]
