"""``KubernetesBackend``: Koi's ``FleetBackend`` on a Kubernetes cluster.

The I/O half of ``koi.fleet.k8s`` and nothing else: it lists what runs (objects labelled
``app.kubernetes.io/managed-by=koi`` in one namespace), hands that and the tick's
decision to the pure ``plan_decision`` / ``converge``, and carries out the operations they
return with the ``kubernetes`` client — server-side apply (``PATCH`` as
``application/apply-patch+yaml``, ``fieldManager=koi``, ``force=true``), the ``scale``
subresource, delete — in their make-before-break order. Pod and node events come back as
``FleetEvent``s, each reported once.

Level-triggered: every ``snapshot``, ``plan``, ``apply`` and ``reconcile`` starts by
listing the cluster, so a backend started on a running cluster carries on from what it
finds (a swap half done is finished by ``reconcile``). What it keeps in memory is only
what the cluster cannot hold: rejected jobs, which events it has reported, and the jobs
(specs) and capacity it was given.

Capacity: the snapshot's ``OfferingCapacity`` comes from the fleet it is given (a
scenario's ``fleet`` entries, i.e. the catalog offerings and GPU counts the operator
may use), minus the GPUs its deployments hold. It does NOT discover capacity from the
nodes' allocatable ``nvidia.com/gpu``: an autoscaled cluster's nodes are not its quota.

Dry run: ``dry_run="local"`` plans and applies nothing (no write reaches the API);
``dry_run="server"`` sends every write with ``dryRun=All`` so the API server validates
and admits it without persisting. Either way every outcome says it was a dry run.
"""

from __future__ import annotations

import json
import math
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from koi.catalog import Catalog
from koi.cluster import ActionOutcome, ClusterSnapshot, JobStatus, OfferingCapacity, PlanDecision
from koi.fleet.k8s import names as N
from koi.fleet.k8s.manifests import (
    KIND_DEPLOYMENT,
    KIND_LWS,
    KIND_SERVICE,
    LWS_GROUP,
    LWS_PLURAL,
    LWS_VERSION,
    ManifestOptions,
)
from koi.fleet.k8s.observe import (
    Running,
    fleet_events,
    node_events,
    pod_events,
    pod_owners,
    read_running,
    to_deployments,
)
from koi.fleet.k8s.reconcile import NewId, Op, Operation, Plan, converge, plan_decision
from koi.fleet.ports import FleetEvent
from koi.jobs import JobSpec
from koi.scenario.types import FleetEntry

log = structlog.get_logger(__name__)

FIELD_MANAGER = "koi"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
DRY_RUN_MODES = ("", "local", "server")
# a request's (connect, read) timeouts and the connection retries, when the caller names
# none: fail in seconds, not urllib3's default minutes (KOI_K8S_* override them)
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
RETRIES = 1


@dataclass(frozen=True)
class ClusterFailure:
    """Why a request to the API server failed, in an operator's terms.

    ``cause`` is one of ``refused`` (nothing listens there), ``dns`` (the host name does
    not resolve), ``tls`` (the server's certificate is not trusted, or TLS failed),
    ``timeout`` (no connection, or no answer, in time), ``auth`` (HTTP 401: the
    credentials were refused), ``forbidden`` (HTTP 403: RBAC), ``http`` (any other
    answer) or ``transport`` (anything else on the way); ``detail`` is the API's Status
    message where it sent one; ``hint`` says what to check."""

    cause: str
    server: str
    detail: str
    hint: str

    def line(self) -> str:
        return f"{self.cause} at {self.server}: {self.detail} ({self.hint})"


_HINTS = {
    "refused": "is the API server, or kubectl proxy, running at that address?",
    "dns": "check the server name in the kubeconfig or --kube-url",
    "tls": "the kubeconfig's certificate-authority(-data) must be the CA that signed "
           "the server's certificate",
    "timeout": "the server did not connect or answer in time: KOI_K8S_CONNECT_TIMEOUT_S, "
               "KOI_K8S_READ_TIMEOUT_S",
    "auth": "the credentials were refused: refresh the kubeconfig's token or client "
            "certificate",
    "forbidden": "the user lacks a permission: grant the Role Koi needs (docs/FLEETS.md)",
    "http": "the API server refused the request",
    "transport": "the connection failed on the way",
}


def describe_failure(e: BaseException, server: str) -> ClusterFailure:
    """``e`` (an ``ApiException`` or a urllib3 error, as the client raises them) as a
    ``ClusterFailure`` naming its cause."""
    if isinstance(e, ApiException):
        try:
            message = str(json.loads(e.body or "{}").get("message", ""))
        except (ValueError, AttributeError):
            message = ""
        cause = {401: "auth", 403: "forbidden"}.get(e.status or 0, "http")
        detail = f"HTTP {e.status} {e.reason or ''}".strip()
        detail += f": {message or (e.body or '')[:300]}" if (message or e.body) else ""
        return ClusterFailure(cause, server, detail[:500], _HINTS[cause])
    inner: BaseException = e
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        inner = e.reason
    cause, detail = _transport_cause(inner)
    return ClusterFailure(cause, server, detail[:500], _HINTS[cause])


def _transport_cause(e: BaseException) -> tuple[str, str]:
    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or nxt in chain:
            break
        chain.append(nxt)
    text = str(e) or type(e).__name__
    if any(isinstance(x, (urllib3.exceptions.SSLError, ssl.SSLError)) for x in chain):
        reason = next((x for x in chain if isinstance(x, ssl.SSLCertVerificationError)), None)
        return "tls", (f"certificate not trusted: {reason.verify_message}"
                       if reason is not None else f"TLS failed: {text}")
    if any(isinstance(x, ConnectionRefusedError) or "Connection refused" in str(x)
           for x in chain):
        return "refused", "connection refused"
    if any(isinstance(x, socket.gaierror) or "Name or service not known" in str(x)
           or "nodename nor servname" in str(x) for x in chain):
        return "dns", text
    # urllib3's NewConnectionError subclasses ConnectTimeoutError: refusals are above
    if any(isinstance(x, urllib3.exceptions.ReadTimeoutError) for x in chain):
        return "timeout", "no answer in time: " + text
    if any(isinstance(x, (urllib3.exceptions.ConnectTimeoutError, TimeoutError, socket.timeout))
           for x in chain):
        return "timeout", "no connection in time: " + text
    return "transport", f"{type(e).__name__}: {text}"


def api_client(url: str | None = None, *, kubeconfig: str | None = None,
               context: str | None = None, retries: int = RETRIES) -> k8s.ApiClient:
    """An API client for ``url`` (no credentials: a ``kubectl proxy`` or a test
    stand-in), or from a kubeconfig (the default one when ``url`` is None). A refused
    or timed-out connection is retried ``retries`` times (urllib3 would retry 3 times
    with a back-off); an answer, or a TLS failure, never is."""
    conf = k8s.Configuration()
    if url:
        conf.host = url.rstrip("/")
    else:
        from kubernetes import config as kconfig

        kconfig.load_kube_config(config_file=kubeconfig, context=context,
                                 client_configuration=conf)
    conf.retries = urllib3.util.Retry(total=retries, connect=retries, read=0, redirect=0,
                                      status=0, other=0, backoff_factor=0.2,
                                      raise_on_status=False)
    return k8s.ApiClient(conf)


def server_of(api: k8s.ApiClient) -> str:
    """The API server's URL as the client dials it (never a credential: host only)."""
    return str(api.configuration.host)


class KubernetesBackend:
    """``FleetBackend`` over one namespace of a Kubernetes cluster."""

    def __init__(self, api: k8s.ApiClient, catalog: Catalog, *,
                 options: ManifestOptions | None = None,
                 fleet: Sequence[FleetEntry] = (), jobs: Sequence[JobSpec] = (),
                 dry_run: str = "", tick_s: float = 60.0, horizon_s: float = math.inf,
                 start_s: float | None = None, clock: Callable[[], float] = time.time,
                 new_id: NewId | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        if dry_run not in DRY_RUN_MODES:
            raise ValueError(f"dry_run must be one of {DRY_RUN_MODES} (got {dry_run!r})")
        self.api = api
        self.apps = k8s.AppsV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.catalog = catalog
        self.options = options or ManifestOptions()
        self.namespace = self.options.namespace
        self.fleet = tuple(fleet)
        self.jobs = {j.id: j for j in jobs}
        self.dry_run = dry_run
        self.timeout = (connect_timeout_s, read_timeout_s)  # urllib3's (connect, read)
        self.tick_s, self.horizon_s = tick_s, horizon_s
        self.clock = clock
        self.start_s = clock() if start_s is None else start_s
        self.new_id = new_id
        self.lws_available = True
        self._admitted: set[str] = set()
        self._rejected: dict[str, str] = {}
        self._reported: set[str] = set()

    # --- reading ---------------------------------------------------------------------
    def _get(self, call: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
        resp = call(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        return json.loads(resp.data or b"{}")

    def list_running(self) -> list[Running]:
        """Koi's Deployments and LeaderWorkerSets in the namespace, as they run."""
        ns, sel = self.namespace, N.MANAGED_SELECTOR
        items = self._get(self.apps.list_namespaced_deployment, ns,
                          label_selector=sel).get("items", [])
        for item in items:  # list items carry no kind
            item.setdefault("kind", KIND_DEPLOYMENT)
        try:
            lws = self._get(self.custom.list_namespaced_custom_object, LWS_GROUP,
                            LWS_VERSION, ns, LWS_PLURAL, label_selector=sel).get("items", [])
            self.lws_available = True
        except ApiException as e:
            if e.status != 404:
                raise
            lws, self.lws_available = [], False  # the LeaderWorkerSet CRD is not installed
        for item in lws:
            item.setdefault("kind", KIND_LWS)
        return read_running([*items, *lws])

    def list_services(self) -> list[str]:
        items = self._get(self.core.list_namespaced_service, self.namespace,
                          label_selector=N.MANAGED_SELECTOR).get("items", [])
        return [i["metadata"]["name"] for i in items]

    def snapshot(self) -> ClusterSnapshot:
        """Capacity from the given fleet, deployments from what runs, jobs from the
        given specs (submitted by now)."""
        now = self.clock() - self.start_s
        deps = to_deployments(self.list_running())
        used: dict[str, int] = {}
        for d in deps:
            used[d.offering] = used.get(d.offering, 0) + d.gpus
            self._admitted.add(d.job_id)
        total: dict[str, int] = {}
        for f in self.fleet:
            total[f.offering] = total.get(f.offering, 0) + f.gpus
        cap = tuple(OfferingCapacity(o, total.get(o, 0), used.get(o, 0))
                    for o in sorted(set(total) | set(used)))
        jobs = tuple(JobStatus(spec, spec.id in self._admitted, spec.id in self._rejected,
                               self._rejected.get(spec.id, ""))
                     for spec in self.jobs.values() if spec.submit_s <= now)
        return ClusterSnapshot(int(now // self.tick_s), now, self.tick_s, self.horizon_s,
                               cap, tuple(deps), jobs)

    # --- writing ---------------------------------------------------------------------
    def plan(self, decision: PlanDecision, new_id: NewId | None = None) -> Plan:
        """What ``apply`` would do with ``decision`` on the cluster as it is now."""
        return plan_decision(decision, self.list_running(), self.catalog, self.options,
                             services=self.list_services(), new_id=new_id or self.new_id)

    def apply(self, decision: PlanDecision) -> list[ActionOutcome]:
        """Carry out the tick's actions (or, in a dry run, only check them): one outcome
        per action, refused ones with the reason; never raises for an action."""
        try:
            plan = self.plan(decision)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            reason = f"cannot read the cluster: {describe_failure(e, server_of(self.api)).line()}"
            return [ActionOutcome(a, False, reason) for a in decision.actions]
        return self.execute(plan)

    def execute(self, plan: Plan) -> list[ActionOutcome]:
        """Run ``plan``'s operations in order; an operation that fails marks the action
        it belongs to as refused, with the API server's reason."""
        failed: dict[int, str] = {}
        for op in plan.operations:
            if op.action >= 0 and op.action in failed:
                continue  # the action already failed: do not half-carry it out
            error = self.run(op)
            if error and op.action >= 0:
                failed[op.action] = error
        out = []
        for i, o in enumerate(plan.outcomes):
            if not o.applied:
                out.append(o)
            elif i in failed:
                out.append(ActionOutcome(o.action, False, failed[i]))
            elif self.dry_run:
                out.append(ActionOutcome(o.action, False, f"dry run ({self.dry_run}):"
                                                          " nothing applied"))
            else:
                out.append(o)
                self._note(o)
        return out

    def _note(self, o: ActionOutcome) -> None:
        a = o.action
        if a.kind.value == "reject":
            self._rejected.setdefault(a.job_id, a.reason)
        elif a.kind.value in ("launch", "swap"):
            self._admitted.add(a.job_id)

    def start(self) -> ClusterSnapshot:
        """What a backend does when it starts: read what runs, finish what the objects
        say is under way (``reconcile``), and return the snapshot."""
        done = self.reconcile()
        log.info("k8s_backend_started", namespace=self.namespace, converged=len(done),
                 dry_run=self.dry_run)
        return self.snapshot()

    def reconcile(self) -> list[Operation]:
        """Finish what the objects say is under way (drain what a ready replacement
        replaces, delete what is drained); returns the operations carried out."""
        ops = converge(self.list_running(), self.catalog, self.options,
                       int((self.clock() - self.start_s) // self.tick_s))
        return [op for op in ops if not self.run(op)]

    def run(self, op: Operation) -> str:
        """Carry out one operation; '' when done, else the reason it failed."""
        if self.dry_run == "local":
            return ""
        dry = "All" if self.dry_run == "server" else None
        try:
            if op.kind == KIND_LWS and not self.lws_available:
                return ("the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io/v1) is not"
                        " installed in the cluster")
            if op.op == Op.APPLY:
                self._apply(op, dry)
            elif op.op == Op.SCALE:
                self._scale(op, dry)
            else:
                self._delete(op, dry)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            log.warning("k8s_operation_failed", op=op.op.value, ref=op.ref,
                        error=type(e).__name__)
            return f"{op.op.value} {op.ref}: {describe_failure(e, server_of(self.api)).line()}"
        log.info("k8s_operation_done", op=op.op.value, ref=op.ref, dry_run=self.dry_run)
        return ""

    def _apply(self, op: Operation, dry: str | None) -> None:
        kw: dict[str, Any] = dict(field_manager=FIELD_MANAGER, force=True, dry_run=dry,
                                  _content_type=APPLY, _preload_content=False,
                                  _request_timeout=self.timeout)
        ns, body = self.namespace, dict(op.body or {})
        if op.kind == KIND_DEPLOYMENT:
            self.apps.patch_namespaced_deployment(op.name, ns, body, **kw)
        elif op.kind == KIND_SERVICE:
            self.core.patch_namespaced_service(op.name, ns, body, **kw)
        else:
            self.custom.patch_namespaced_custom_object(LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL,
                                                       op.name, body, **kw)

    def _scale(self, op: Operation, dry: str | None) -> None:
        body = {"spec": {"replicas": op.replicas}}
        kw: dict[str, Any] = dict(dry_run=dry, _content_type=MERGE, _preload_content=False,
                                  _request_timeout=self.timeout)
        if op.kind == KIND_DEPLOYMENT:
            self.apps.patch_namespaced_deployment_scale(op.name, self.namespace, body, **kw)
        else:
            self.custom.patch_namespaced_custom_object_scale(
                LWS_GROUP, LWS_VERSION, self.namespace, LWS_PLURAL, op.name, body, **kw)

    def _delete(self, op: Operation, dry: str | None) -> None:
        kw: dict[str, Any] = dict(dry_run=dry, propagation_policy="Background",
                                  _preload_content=False, _request_timeout=self.timeout)
        # only workloads are ever deleted (a job's Service outlives its deployments)
        if op.kind == KIND_DEPLOYMENT:
            self.apps.delete_namespaced_deployment(op.name, self.namespace, **kw)
        elif op.kind == KIND_LWS:
            self.custom.delete_namespaced_custom_object(LWS_GROUP, LWS_VERSION, self.namespace,
                                                        LWS_PLURAL, op.name, **kw)
        else:
            raise ValueError(f"Koi does not delete {op.ref}")

    # --- events ----------------------------------------------------------------------
    def events(self) -> list[FleetEvent]:
        """Preemptions, evictions, scheduling failures, lost nodes, replicas that became
        ready or failed — since the last call, each reported once."""
        running = self.list_running()
        pods = self._get(self.core.list_namespaced_pod, self.namespace,
                         label_selector=N.MANAGED_SELECTOR).get("items", [])
        owners = pod_owners(pods, running)
        evs = self._get(self.core.list_namespaced_event, self.namespace).get("items", [])
        found = [*fleet_events(evs, owners, running), *pod_events(pods, owners)]
        try:
            nodes = self._get(self.core.list_node).get("items", [])
            found += node_events(nodes)
        except ApiException as e:  # nodes are cluster-scoped: the Role may not reach them
            log.warning("k8s_nodes_unreadable", status=e.status)
        out = []
        for key, ev in found:
            if key not in self._reported:
                self._reported.add(key)
                out.append(ev)
        return sorted(out, key=lambda e: e.time_s)
