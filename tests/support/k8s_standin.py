"""A stand-in for the Kubernetes API server, for tests: NOT Kubernetes.

``StandIn()`` listens on 127.0.0.1 (a free port; ``url``) with a threading
``http.server`` and answers only the REST paths Koi's ``KubernetesBackend`` uses, keeping
objects in memory:

- ``apps/v1`` deployments and ``leaderworkerset.x-k8s.io/v1`` leaderworkersets in a
  namespace: list (``labelSelector``), get, server-side apply (``PATCH`` with
  ``Content-Type: application/apply-patch+yaml``; ``fieldManager`` required), delete,
  and the ``scale`` subresource (get, merge-patch);
- ``v1`` services in a namespace: list, get, apply, delete;
- ``v1`` pods and events in a namespace, and nodes: list only.

``dryRun=All`` is honoured (validated, answered, not stored). What it does not do, and
a real API server would: admission, schema validation, defaulting beyond ``status``,
conflicts between field managers (every apply replaces labels, annotations and spec),
watches, resource versions as preconditions, RBAC. There is no controller: a
workload's ``status.replicas`` follows ``spec.replicas`` at once, and its replicas are
ready only when a test says so (``mark_ready``); pods are derived from the workloads
(one per replica, or per node of a LeaderWorkerSet group) plus any the test adds.

Test hooks: ``mark_ready``, ``add_event`` (e.g. a ``Preempted`` pod event),
``add_node`` / ``set_node_ready``, ``objects``, and ``requests`` (every request: method,
path, query, content type, body as sent) for assertions such as "dry run wrote nothing".
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# (path prefix, plural) -> (apiVersion, kind, namespaced)
RESOURCES = {
    ("/apis/apps/v1", "deployments"): ("apps/v1", "Deployment", True),
    ("/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets"):
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", True),
    ("/api/v1", "services"): ("v1", "Service", True),
    ("/api/v1", "pods"): ("v1", "Pod", True),
    ("/api/v1", "events"): ("v1", "Event", True),
    ("/api/v1", "nodes"): ("v1", "Node", False),
}
WRITABLE = {"deployments", "leaderworkersets", "services"}
SCALABLE = {"deployments", "leaderworkersets"}
_PATH = re.compile(r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>scale))?$")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector syntax: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
    ``k in (a,b)``, ``k notin (a,b)``, comma-separated (all must hold)."""
    for term in _split_terms(selector):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            inside = key in labels and labels[key] in values
            if (op == "in") != inside:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    return [*terms, cur]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class StandIn:
    """A loopback stand-in for the few Kubernetes API paths Koi uses (not Kubernetes)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.store: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self._ready: dict[tuple[str, str, str], int] = {}
        self.extra_pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self._rv = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                standin._serve(self)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- test hooks --------------------------------------------------------------------
    def objects(self, plural: str = "deployments", namespace: str | None = None
                ) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(o)) for (p, ns, _), o in sorted(self.store.items())
                    if p == plural and (namespace is None or ns == namespace)]

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.store.get((plural, namespace, name))
            return json.loads(json.dumps(obj)) if obj else None

    def mark_ready(self, name: str, namespace: str = "koi", plural: str = "deployments",
                   ready: int | None = None) -> None:
        """``ready`` replicas (default: all desired) of a workload become ready."""
        with self._lock:
            key = (plural, namespace, name)
            obj = self.store[key]
            self._ready[key] = obj["spec"].get("replicas", 1) if ready is None else ready
            self._refresh_status(key)

    def add_event(self, reason: str, name: str, message: str = "", namespace: str = "koi",
                  kind: str = "Pod") -> dict[str, Any]:
        with self._lock:
            ev = {"apiVersion": "v1", "kind": "Event",
                  "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}",
                               "namespace": namespace, "uid": str(uuid.uuid4()),
                               "creationTimestamp": _now()},
                  "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
                  "reason": reason, "message": message, "type": "Warning", "count": 1,
                  "firstTimestamp": _now(), "lastTimestamp": _now()}
            self.events.append(ev)
            return ev

    def add_node(self, name: str, labels: Mapping[str, str] | None = None,
                 ready: bool = True) -> None:
        with self._lock:
            self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                                "metadata": {"name": name, "labels": dict(labels or {})},
                                "status": {"conditions": []}}
            self.set_node_ready(name, ready)

    def set_node_ready(self, name: str, ready: bool) -> None:
        with self._lock:
            self.nodes[name]["status"]["conditions"] = [{
                "type": "Ready", "status": "True" if ready else "Unknown",
                "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                "lastTransitionTime": _now()}]

    def pods(self, namespace: str = "koi") -> list[dict[str, Any]]:
        with self._lock:
            return self._pods(namespace)

    # --- the API -----------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            sent = json.loads(raw) if raw else None
        except ValueError:
            sent = None
        with self._lock:
            self.requests.append({"method": h.command, "path": parts.path, "query": query,
                                  "content_type": ctype, "body": sent})
        try:
            code, body = self._route(h.command, parts.path, query, ctype, raw)
        except ApiError as e:
            code, body = e.code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": e.reason, "message": e.message, "code": e.code}
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str], ctype: str,
               raw: bytes) -> tuple[int, Any]:
        m = _PATH.match(path)
        if not m or (m["prefix"], m["plural"]) not in RESOURCES:
            raise ApiError(404, "NotFound", f"the stand-in does not serve {path}")
        api_version, kind, namespaced = RESOURCES[(m["prefix"], m["plural"])]
        plural, ns, name, sub = m["plural"], m["ns"] or "", m["name"], m["sub"]
        if namespaced != bool(ns):
            raise ApiError(404, "NotFound", f"{plural} is {'' if namespaced else 'not '}"
                                            "namespaced")
        if query.get("dryRun") not in (None, "All"):
            raise ApiError(400, "BadRequest", f"invalid dryRun {query['dryRun']!r}")
        dry = query.get("dryRun") == "All"
        with self._lock:
            if name is None:
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
                return 200, self._list(plural, ns, api_version, kind,
                                       query.get("labelSelector", ""))
            if plural not in WRITABLE:
                raise ApiError(405, "MethodNotAllowed", f"{plural}/{name}")
            key = (plural, ns, name)
            if sub == "scale":
                return self._scale(method, key, ctype, raw, dry)
            if method == "GET":
                return 200, self._existing(key)
            if method == "DELETE":
                obj = self._existing(key)
                if not dry:
                    del self.store[key]
                    self._ready.pop(key, None)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "details": {"name": name, "kind": plural,
                                         "uid": obj["metadata"]["uid"]}}
            if method == "PATCH":
                return self._apply(key, api_version, kind, query, ctype, raw, dry)
            raise ApiError(405, "MethodNotAllowed", method)

    def _existing(self, key: tuple[str, str, str]) -> dict[str, Any]:
        obj = self.store.get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        return obj

    def _list(self, plural: str, ns: str, api_version: str, kind: str, selector: str
              ) -> dict[str, Any]:
        if plural == "pods":
            items = self._pods(ns)
        elif plural == "events":
            items = [e for e in self.events if e["metadata"]["namespace"] == ns]
        elif plural == "nodes":
            items = list(self.nodes.values())
        else:
            items = [o for (p, n, _), o in sorted(self.store.items()) if p == plural and n == ns]
        items = [i for i in items
                 if selector_matches(selector, (i.get("metadata") or {}).get("labels") or {})]
        return {"apiVersion": api_version, "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _apply(self, key: tuple[str, str, str], api_version: str, kind: str,
               query: dict[str, str], ctype: str, raw: bytes, dry: bool) -> tuple[int, Any]:
        if ctype != "application/apply-patch+yaml":
            raise ApiError(415, "UnsupportedMediaType",
                           f"the stand-in applies only application/apply-patch+yaml, not {ctype}")
        if not query.get("fieldManager"):
            raise ApiError(400, "BadRequest", "fieldManager is required for apply requests")
        try:
            body = json.loads(raw)  # JSON is YAML: the client sends JSON
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"body does not parse: {e}") from None
        meta = body.get("metadata") or {}
        if body.get("apiVersion") != api_version or body.get("kind") != kind:
            raise ApiError(400, "BadRequest", f"expected {api_version} {kind}")
        if meta.get("name") != key[2] or meta.get("namespace", key[1]) != key[1]:
            raise ApiError(400, "BadRequest", "name/namespace differ from the path")
        old = self.store.get(key)
        if old and query.get("force") not in ("true", "True", "1"):
            raise ApiError(409, "Conflict", "apply without force onto an existing object")
        self._rv += 1
        obj = json.loads(json.dumps(body))
        obj.setdefault("metadata", {})["namespace"] = key[1]
        obj["metadata"].update(
            uid=old["metadata"]["uid"] if old else str(uuid.uuid4()),
            creationTimestamp=old["metadata"]["creationTimestamp"] if old else _now(),
            resourceVersion=str(self._rv),
            generation=(old["metadata"].get("generation", 1) + 1) if old else 1,
            managedFields=[{"manager": query["fieldManager"], "operation": "Apply"}])
        if old and "status" in old:
            obj["status"] = old["status"]
        if dry:
            return 200, obj
        self.store[key] = obj
        self._refresh_status(key)
        return (200 if old else 201), obj

    def _scale(self, method: str, key: tuple[str, str, str], ctype: str, raw: bytes,
               dry: bool) -> tuple[int, Any]:
        if key[0] not in SCALABLE:
            raise ApiError(404, "NotFound", f"{key[0]} has no scale subresource")
        obj = self._existing(key)
        if method == "PATCH":
            if ctype not in ("application/merge-patch+json",
                             "application/strategic-merge-patch+json"):
                raise ApiError(415, "UnsupportedMediaType", f"scale patch as {ctype}")
            replicas = (json.loads(raw).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f"spec.replicas {replicas!r}")
            if not dry:
                obj["spec"]["replicas"] = replicas
                self._refresh_status(key)
        elif method != "GET":
            raise ApiError(405, "MethodNotAllowed", method)
        spec_replicas = obj["spec"]["replicas"] if not dry or method == "GET" else replicas
        return 200, {"apiVersion": "autoscaling/v1", "kind": "Scale",
                     "metadata": {"name": key[2], "namespace": key[1]},
                     "spec": {"replicas": spec_replicas},
                     "status": {"replicas": obj.get("status", {}).get("replicas", 0)}}

    def _refresh_status(self, key: tuple[str, str, str]) -> None:
        obj = self.store.get(key)
        if obj is None or key[0] not in SCALABLE:
            return
        want = obj["spec"].get("replicas", 1)
        ready = min(self._ready.get(key, 0), want)
        obj["status"] = {"replicas": want, "readyReplicas": ready,
                         "observedGeneration": obj["metadata"].get("generation", 1)}

    def _pods(self, ns: str) -> list[dict[str, Any]]:
        pods = [p for p in self.extra_pods if p["metadata"].get("namespace") == ns]
        for (plural, n, name), obj in sorted(self.store.items()):
            if n != ns or plural not in SCALABLE:
                continue
            status = obj.get("status") or {}
            if plural == "deployments":
                templates = [("", obj["spec"]["template"])]
            else:
                lwt = obj["spec"]["leaderWorkerTemplate"]
                size = lwt.get("size", 1)
                templates = [("", lwt.get("leaderTemplate") or lwt["workerTemplate"])]
                templates += [(f"-{k}", lwt["workerTemplate"]) for k in range(1, size)]
            for i in range(status.get("replicas", 0)):
                ready = i < status.get("readyReplicas", 0)
                for suffix, tmpl in templates:
                    pod_name = (f"{name}-{obj['metadata']['uid'][:10]}-{i}{suffix}"
                                if plural == "deployments" else f"{name}-{i}{suffix}")
                    pods.append({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "namespace": ns,
                                     "labels": dict(tmpl["metadata"].get("labels") or {})},
                        "spec": tmpl["spec"],
                        "status": {"phase": "Running", "startTime": _now(), "conditions": [
                            {"type": "Ready", "status": "True" if ready else "False",
                             "lastTransitionTime": obj["metadata"]["creationTimestamp"]}]}})
        return pods
