"""Scraping engines' ``/metrics`` pages into a tick's telemetry: the pure part.

The engine-metrics service (``services/engine_metrics``) reads a Prometheus HTTP
service-discovery document (``http_sd``: a JSON list of ``{"targets": ["host:port"],
"labels": {...}}``) for the replica pages to read, fetches them, and hands the pages to
this module; everything it decides is decided here:

- ``parse_targets`` — the document as one ``ScrapeTarget`` per replica page (URL, Koi
  deployment, job, replica, engine). Koi's labels: ``koi_deployment`` (a target without
  it is not Koi's and is skipped), ``koi_job``, ``koi_replica``, ``koi_engine``;
  ``__scheme__`` and ``__metrics_path__`` as Prometheus reads them. ``targets_document``
  writes one (the simulator's ``/targets``).
- ``ScrapeBook`` — the last scrape of every replica. ``step(snapshot, results)`` windows
  each replica against its previous scrape, merges the replicas of each deployment and
  fills GPU-seconds and cost from the snapshot; it returns the telemetry and the book to
  keep, which the caller keeps only once the telemetry is published (a retried tick
  windows against the same scrapes again). A replica's first scrape (a new replica, or
  after a restart of the adapter: the book is in memory only) is a baseline and yields
  no window; a deployment none of whose replicas has a window is left out, and so is one
  any of whose replicas could not be read — never zeros for what was not read.

No HTTP, no sockets, no clock: time is the snapshot's.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry
from koi.errors import KoiError
from koi.fleet.engine_metrics import EngineScrape, ReplicaWindow, merge, window
from koi.safe_text import printable

__all__ = [
    "LABEL_DEPLOYMENT", "LABEL_ENGINE", "LABEL_JOB", "LABEL_REPLICA", "MAX_TARGETS",
    "Collected", "ScrapeBook", "ScrapeTarget", "TargetsError", "cost_of", "parse_targets",
    "targets_document",
]

LABEL_DEPLOYMENT = "koi_deployment"
LABEL_JOB = "koi_job"
LABEL_REPLICA = "koi_replica"
# not ``engine``: vLLM's V1 series carry an ``engine`` label of their own (the data-parallel
# engine index), which a target label of that name would overwrite in Prometheus
LABEL_ENGINE = "koi_engine"

MAX_TARGETS = 10_000
"""Most replica pages one document may list (a bigger one is refused, not scraped)."""

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?$")
_LABEL_VALUE_MAX = 253


class TargetsError(KoiError, ValueError):
    """A service-discovery document that cannot be read (not JSON, not a list of
    target groups, a malformed address or path, too many targets)."""


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One replica's page: where it is and whose it is."""

    url: str
    deployment_id: str
    job_id: str = ""
    replica: str = ""
    engine: str = ""

    @property
    def key(self) -> str:
        """What identifies the replica across scrapes: its URL."""
        return self.url


def _label(labels: Mapping[str, object], name: str) -> str:
    value = labels.get(name, "")
    if not isinstance(value, str):
        raise TargetsError(f"label {name} is not a string")
    if len(value) > _LABEL_VALUE_MAX:
        raise TargetsError(f"label {name} is longer than {_LABEL_VALUE_MAX} characters")
    return value


def parse_targets(document: str | bytes) -> tuple[list[ScrapeTarget], int]:
    """The replica pages a ``http_sd`` document lists, and how many targets it listed
    that are not Koi's (no ``koi_deployment`` label). A URL listed twice is kept once."""
    try:
        groups = json.loads(document)
    except (ValueError, UnicodeDecodeError) as e:
        raise TargetsError(f"targets document is not JSON: {printable(str(e), 200)}") from None
    if not isinstance(groups, list):
        raise TargetsError("targets document is not a JSON list of target groups")
    out: dict[str, ScrapeTarget] = {}
    skipped = 0
    for g in groups:
        if not isinstance(g, dict) or not isinstance(g.get("targets", []), list):
            raise TargetsError("a target group is not an object with a list of targets")
        labels = g.get("labels") or {}
        if not isinstance(labels, dict):
            raise TargetsError("a target group's labels are not an object")
        scheme = _label(labels, "__scheme__") or "http"
        path = _label(labels, "__metrics_path__") or "/metrics"
        if scheme not in ("http", "https"):
            raise TargetsError(f"scheme {printable(scheme, 20)!r}: http or https only")
        if not path.startswith("/") or any(c in path for c in " ?#\r\n\t"):
            raise TargetsError(f"metrics path {printable(path, 100)!r} is not an absolute "
                               "path")
        deployment = _label(labels, LABEL_DEPLOYMENT)
        for host in g.get("targets", []):
            if not isinstance(host, str) or not _HOST_PORT.match(host):
                raise TargetsError(f"target {printable(str(host), 100)!r} is not host:port")
            if not deployment:
                skipped += 1
                continue
            t = ScrapeTarget(f"{scheme}://{host}{path}", deployment, _label(labels, LABEL_JOB),
                       _label(labels, LABEL_REPLICA), _label(labels, LABEL_ENGINE))
            out.setdefault(t.url, t)
            if len(out) > MAX_TARGETS:
                raise TargetsError(f"more than {MAX_TARGETS} targets")
    return list(out.values()), skipped


def replica_path(deployment_id: str, replica: int) -> str:
    """The simulator's path of one replica's page."""
    return f"/replicas/{quote(deployment_id, safe='')}/{replica}/metrics"


def targets_document(host_port: str, replicas: Iterable[tuple[str, str, int, str]]) -> str:
    """A ``http_sd`` document listing pages served at ``host_port``: one target group per
    ``(deployment, job, replica index, engine)``, the page at ``replica_path``."""
    groups = [{"targets": [host_port],
               "labels": {"__metrics_path__": replica_path(dep, i), LABEL_DEPLOYMENT: dep,
                          LABEL_JOB: job, LABEL_REPLICA: str(i), LABEL_ENGINE: engine}}
              for dep, job, i, engine in replicas]
    return json.dumps(groups, separators=(",", ":"))


def host_of(url: str) -> str:
    """``host:port`` of a URL, for messages (no user info, no path)."""
    return urlsplit(url).netloc.rpartition("@")[2]


# --- windows over scrapes ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Previous:
    """A replica's last scrape, at the snapshot (tick, scenario time) it was read for."""

    scrape: EngineScrape
    deployment_id: str
    tick: int
    time_s: float


@dataclass(frozen=True, slots=True)
class Collected:
    """One tick's outcome: the telemetry (in the snapshot's deployment order), the
    deployments left out because a replica could not be read (id → first error), how
    many replicas were read as baselines only, and how many pages were tried."""

    telemetry: list[DeploymentTelemetry]
    failed: dict[str, str] = field(default_factory=dict)
    baselines: int = 0
    pages: int = 0


def cost_of(snapshot: ClusterSnapshot, deployment_id: str, window_s: float,
            catalog: Catalog) -> tuple[float, float]:
    """(GPU-seconds, USD) of a deployment over a window, from the snapshot: its GPUs
    (ready and starting replicas) × the window × its offering's price. Engines do not
    report either; (0, 0) for a deployment the snapshot does not hold."""
    dep = next((d for d in snapshot.deployments if d.id == deployment_id), None)
    if dep is None or window_s <= 0:
        return 0.0, 0.0
    gpu_s = dep.gpus * window_s
    try:
        price = catalog.offering(dep.offering).usd_per_gpu_hour
    except (KeyError, KoiError):
        price = 0.0
    return gpu_s, gpu_s * price / 3600.0


@dataclass(frozen=True, slots=True)
class ScrapeBook:
    """Each replica's last scrape, by target key. Immutable: ``step`` returns the next."""

    previous: Mapping[str, Previous] = field(default_factory=dict)

    def step(self, snapshot: ClusterSnapshot,
             results: Sequence[tuple[ScrapeTarget, EngineScrape | str]],
             catalog: Catalog) -> tuple[Collected, ScrapeBook]:
        """The telemetry of the window ending at ``snapshot`` from this tick's scrapes
        (``results``: a scrape, or the error text of a target that could not be read),
        and the book to keep once it is published.

        A replica is windowed against its previous scrape when that scrape was of the
        same deployment at an earlier snapshot; else this scrape is its baseline. Every
        window of a deployment must span the same time (``merge`` sums them): a replica
        whose window differs (it missed a tick) is a baseline again."""
        now, tick = snapshot.time_s, snapshot.tick
        keep: dict[str, Previous] = {}
        windows: dict[str, list[ReplicaWindow]] = {}
        failed: dict[str, str] = {}
        jobs: dict[str, str] = {}   # the snapshot's job of a deployment wins over labels
        baselines = 0
        for target, got in results:
            dep = target.deployment_id
            job = jobs.setdefault(dep, _job_of(snapshot, dep) or target.job_id)
            if isinstance(got, str):
                failed.setdefault(dep, got)
                continue  # forgotten: its next scrape is a baseline
            keep[target.key] = Previous(got, dep, tick, now)
            prev = self.previous.get(target.key)
            if prev is None or prev.deployment_id != dep or prev.time_s >= now:
                baselines += 1
                continue
            windows.setdefault(dep, []).append(window(
                prev.scrape, got, tick=max(tick - 1, 0), deployment_id=dep,
                job_id=job, window_s=now - prev.time_s))
        telemetry = []
        for dep in _in_snapshot_order(snapshot, windows):
            if dep in failed:
                continue
            ws = _same_span(windows[dep])
            baselines += len(windows[dep]) - len(ws)
            gpu_s, cost = cost_of(snapshot, dep, ws[0].window_s, catalog)
            telemetry.append(merge(ws, gpu_seconds=gpu_s, cost_usd=cost))
        return (Collected(telemetry, failed, baselines, len(results)),
                ScrapeBook(keep))


def _job_of(snapshot: ClusterSnapshot, deployment_id: str) -> str:
    return next((d.job_id for d in snapshot.deployments if d.id == deployment_id), "")


def _in_snapshot_order(snapshot: ClusterSnapshot, windows: Mapping[str, object]) -> list[str]:
    """Deployment ids in the snapshot's order (the order the simulator reports them in),
    then any the snapshot does not hold, by id."""
    order = {d.id: i for i, d in enumerate(snapshot.deployments)}
    return sorted(windows, key=lambda d: (order.get(d, math.inf), d))


def _same_span(ws: list[ReplicaWindow]) -> list[ReplicaWindow]:
    """The windows sharing the most common span (ties: the shortest)."""
    spans = Counter(w.window_s for w in ws)
    if len(spans) == 1:
        return ws
    span = min(spans, key=lambda s: (-spans[s], s))
    return [w for w in ws if w.window_s == span]
