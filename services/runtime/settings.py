"""Service settings, read from the environment: the one list of ``KOI_*`` variables.

Every variable a service, the demo, ``compose/`` or the Kubernetes manifests name is
declared in ``ENV`` with its default and meaning (a test checks the manifests against
it). ``ServiceSettings.from_env()`` reads them once at start-up; bad values (not a
number, out of bounds, not a host:port address, an unreadable password file) fail there
with the variable's name.
No secret value ever appears in an error message or a repr.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from koi.planner.churn_settings import ChurnSettings
from koi.rlm.settings import env_table as rlm_env_table

# name → (default, meaning)
ENV: dict[str, tuple[str, str]] = {
    "KOI_NATS_URL": ("nats://127.0.0.1:4222", "NATS server(s), comma-separated; tls://… "
                     "requires TLS"),
    "KOI_NATS_USER": ("", "NATS user of this process (one per service); empty = no auth"),
    "KOI_NATS_PASSWORD": ("", "that user's password (prefer KOI_NATS_PASSWORD_FILE)"),
    "KOI_NATS_PASSWORD_FILE": ("", "file holding that user's password (a mounted Secret)"),
    "KOI_NATS_CA": ("", "CA certificate (PEM) to trust for NATS TLS; set = TLS on"),
    "KOI_REDIS_URL": ("", "Redis for the prediction cache; empty = no cache"),
    "KOI_SCENARIO": ("hetero-3h", "scenario the sim service runs (name or YAML path)"),
    "KOI_SEED": ("1", "seed of the simulated world and the jobs"),
    "KOI_HORIZON_S": ("", "cut the scenario's horizon to this many seconds; empty = full"),
    "KOI_SAMPLE_FRACTION": ("", "simulator request thinning; empty = the scenario's/auto"),
    "KOI_POLICY": ("koi", "planner variant: koi | koi-no-causal | koi-no-learning | koi-no-dro"
                   " | koi-ttft-nominal"),
    "KOI_GRPC_ADDR": ("127.0.0.1:50051", "planner-api's gRPC listen address"),
    "KOI_GRPC_TLS_CERT": ("", "planner-api's TLS certificate (PEM); with the key = TLS only"),
    "KOI_GRPC_TLS_KEY": ("", "that certificate's private key (PEM)"),
    "KOI_GRPC_TOKEN": ("", "bearer token every gRPC call but health must carry; empty = none"
                       " (prefer KOI_GRPC_TOKEN_FILE)"),
    "KOI_GRPC_TOKEN_FILE": ("", "file holding that token (a mounted Secret)"),
    "KOI_GRPC_HEALTH_ADDR": ("", "planner-api's plaintext listen address for grpc.health.v1"
                             " alone (probes that cannot speak TLS); empty = none"),
    "KOI_STAGE_DEADLINE_S": ("60", "seconds a tick waits for a stage before it degrades"),
    "KOI_LOG_LEVEL": ("info", "debug | info | warning | error"),
    "KOI_LOG_FORMAT": ("json", "json (structlog JSON lines) | console"),
    "KOI_REPLICA": ("0", "replica index of this process (queue groups, leader election)"),
    "KOI_LEASE_TTL_S": ("5", "placer leader lease: seconds before a standby takes over"),
    "KOI_EVAL_SHARD": ("2000", "candidates per evaluator work item"),
    "KOI_SIM_METRICS_PORT": ("", "sim: serve each simulated replica's engine /metrics page and"
                             " a Prometheus http_sd /targets on 127.0.0.1 at this port (0 ="
                             " any free port; the URL is in KV koi_sim/metrics) and leave the"
                             " telemetry to engine-metrics; empty = off"),
    "KOI_METRICS_SOURCE": ("scrape", "engine-metrics: scrape (read the pages the targets list)"
                           " | prometheus (ask KOI_PROMETHEUS_URL)"),
    "KOI_METRICS_TARGETS_URL": ("", "engine-metrics: Prometheus http_sd JSON listing the replica"
                                " pages; empty = the sim's /targets when it serves them, else"
                                " idle"),
    "KOI_PROMETHEUS_URL": ("", "engine-metrics with KOI_METRICS_SOURCE=prometheus: the server's"
                           " base URL, e.g. http://prometheus:9090"),
    "KOI_SCRAPE_TIMEOUT_S": ("2", "engine-metrics: seconds for one page, targets list or query"),
    "KOI_SCRAPE_CONCURRENCY": ("8", "engine-metrics: pages (or queries) read at once"),
}
# The proposer's language-model hypothesis layer (docs/RLM.md): koi.rlm.settings.RlmSettings
# reads and checks these itself (RlmSettings.from_env; every field is one variable, its
# default and meaning taken from the field). Off unless a model is named.
ENV.update(rlm_env_table())
# The planner's churn holds (koi.planner.stability.ChurnSettings, read by KoiSettings at
# start-up): make-before-break, the scale-down window, the cool-down, the move price and
# the per-job move limit.
ENV.update(ChurnSettings.env_table())

# numeric variables: name → (type, lowest, highest), both ends allowed
BOUNDS: dict[str, tuple[type, float, float]] = {
    "KOI_SEED": (int, 0, 2**63 - 1),
    "KOI_HORIZON_S": (float, 1e-3, 10 * 365 * 86400.0),
    "KOI_SAMPLE_FRACTION": (float, 1e-6, 1.0),
    "KOI_STAGE_DEADLINE_S": (float, 1e-3, 3600.0),
    "KOI_REPLICA": (int, 0, 10_000),
    "KOI_LEASE_TTL_S": (float, 0.1, 3600.0),
    "KOI_EVAL_SHARD": (int, 1, 10_000_000),
    "KOI_SIM_METRICS_PORT": (int, 0, 65535),
    "KOI_SCRAPE_TIMEOUT_S": (float, 1e-2, 300.0),
    "KOI_SCRAPE_CONCURRENCY": (int, 1, 256),
}
METRICS_SOURCES = ("scrape", "prometheus")
_USER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of a declared variable (its default when unset or empty)."""
    if name not in ENV:
        raise KeyError(f"{name} is not a declared Koi variable; declared: {', '.join(ENV)}")
    source = os.environ if environ is None else environ
    return source.get(name) or ENV[name][0]


def number(name: str, raw: str) -> float | int:
    """``raw`` as the type ``BOUNDS`` gives ``name``, refused outside its bounds."""
    kind, low, high = BOUNDS[name]
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name}={raw!r} is out of bounds: must be in [{low:g}, {high:g}]")
    return value


def redact_url(url: str) -> str:
    """``url`` (or a comma-separated list) with any ``user:password@`` replaced by
    ``***@``: what log lines and error messages may show of a server address."""
    return re.sub(r"(?<=://)[^/@,]*@", "***@", url)


@dataclass(frozen=True)
class NatsAuth:
    """Who a process is on NATS and which CA it trusts. The password is kept out of the
    repr; an empty user means no credentials (a server without auth)."""

    user: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> NatsAuth:
        def get(name: str) -> str:
            return env(name, environ)

        user, password = get("KOI_NATS_USER"), get("KOI_NATS_PASSWORD")
        password_file, ca = get("KOI_NATS_PASSWORD_FILE"), get("KOI_NATS_CA")
        if password and password_file:
            raise ValueError("set KOI_NATS_PASSWORD or KOI_NATS_PASSWORD_FILE, not both")
        if password_file:
            try:
                password = Path(password_file).read_text().strip()
            except OSError as err:
                raise ValueError(f"KOI_NATS_PASSWORD_FILE={password_file!r} cannot be read "
                                 f"({type(err).__name__})") from None
        if user and not _USER.match(user):
            raise ValueError(f"KOI_NATS_USER={user!r}: letters, digits, '_' and '-' only")
        if bool(user) != bool(password):
            raise ValueError("KOI_NATS_USER and a password (KOI_NATS_PASSWORD or "
                             "KOI_NATS_PASSWORD_FILE) go together: set both or neither")
        if ca and not Path(ca).is_file():
            raise ValueError(f"KOI_NATS_CA={ca!r} is not a file")
        return NatsAuth(user, password, ca)


def listen_addr(name: str, raw: str) -> str:
    """``raw`` as a ``host:port`` listen address (port 0-65535; 0 = any free port)."""
    host, _, port = raw.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name}={raw!r} is not a host:port address (port 0-65535)")
    return raw


def grpc_health_addr(raw: str, grpc_addr: str) -> str:
    """The health-only listen address ("" = none), refused on the main port itself."""
    if not raw:
        return ""
    listen_addr("KOI_GRPC_HEALTH_ADDR", raw)
    port = raw.rpartition(":")[2]
    if port != "0" and port == grpc_addr.rpartition(":")[2]:
        raise ValueError(f"KOI_GRPC_HEALTH_ADDR={raw!r} uses KOI_GRPC_ADDR's port "
                         f"({grpc_addr!r}): the health listener needs a port of its own")
    return raw


def http_url(name: str, raw: str) -> str:
    """``raw`` as an http(s) URL with a host ("" = unset)."""
    if not raw:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name}={redact_url(raw)!r} is not an http:// or https:// URL")
    return raw


def metrics_source(raw: str) -> str:
    if raw not in METRICS_SOURCES:
        raise ValueError(f"KOI_METRICS_SOURCE={raw!r}: one of {', '.join(METRICS_SOURCES)}")
    return raw


def grpc_token(token: str, token_file: str) -> str:
    """planner-api's bearer token, from the variable or the file (not both); "" = none."""
    if token and token_file:
        raise ValueError("set KOI_GRPC_TOKEN or KOI_GRPC_TOKEN_FILE, not both")
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as err:
            raise ValueError(f"KOI_GRPC_TOKEN_FILE={token_file!r} cannot be read "
                             f"({type(err).__name__})") from None
        if not token:
            raise ValueError(f"KOI_GRPC_TOKEN_FILE={token_file!r} is empty")
    return token


@dataclass(frozen=True)
class ServiceSettings:
    nats_url: str
    redis_url: str
    scenario: str
    seed: int
    horizon_s: float | None
    sample_fraction: float | None
    policy: str
    grpc_addr: str
    stage_deadline_s: float
    log_level: str
    log_format: str
    replica: int
    lease_ttl_s: float
    eval_shard: int
    nats_auth: NatsAuth = NatsAuth()
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    grpc_token: str = field(default="", repr=False)
    grpc_health_addr: str = ""
    sim_metrics_port: int | None = None
    metrics_source: str = "scrape"
    # URLs may carry credentials (user:password@): kept out of the repr
    metrics_targets_url: str = field(default="", repr=False)
    prometheus_url: str = field(default="", repr=False)
    scrape_timeout_s: float = 2.0
    scrape_concurrency: int = 8

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> ServiceSettings:
        def get(name: str) -> str:
            return env(name, environ)

        horizon, fraction = get("KOI_HORIZON_S"), get("KOI_SAMPLE_FRACTION")
        port = get("KOI_SIM_METRICS_PORT")
        return ServiceSettings(
            nats_url=get("KOI_NATS_URL"), redis_url=get("KOI_REDIS_URL"),
            scenario=get("KOI_SCENARIO"), seed=int(number("KOI_SEED", get("KOI_SEED"))),
            horizon_s=float(number("KOI_HORIZON_S", horizon)) if horizon else None,
            sample_fraction=(float(number("KOI_SAMPLE_FRACTION", fraction))
                             if fraction else None),
            policy=get("KOI_POLICY"),
            grpc_addr=listen_addr("KOI_GRPC_ADDR", get("KOI_GRPC_ADDR")),
            stage_deadline_s=float(number("KOI_STAGE_DEADLINE_S",
                                          get("KOI_STAGE_DEADLINE_S"))),
            log_level=get("KOI_LOG_LEVEL"), log_format=get("KOI_LOG_FORMAT"),
            replica=int(number("KOI_REPLICA", get("KOI_REPLICA"))),
            lease_ttl_s=float(number("KOI_LEASE_TTL_S", get("KOI_LEASE_TTL_S"))),
            eval_shard=int(number("KOI_EVAL_SHARD", get("KOI_EVAL_SHARD"))),
            nats_auth=NatsAuth.from_env(environ),
            grpc_tls_cert=get("KOI_GRPC_TLS_CERT"), grpc_tls_key=get("KOI_GRPC_TLS_KEY"),
            grpc_token=grpc_token(get("KOI_GRPC_TOKEN"), get("KOI_GRPC_TOKEN_FILE")),
            grpc_health_addr=grpc_health_addr(get("KOI_GRPC_HEALTH_ADDR"),
                                              get("KOI_GRPC_ADDR")),
            sim_metrics_port=int(number("KOI_SIM_METRICS_PORT", port)) if port else None,
            metrics_source=metrics_source(get("KOI_METRICS_SOURCE")),
            metrics_targets_url=http_url("KOI_METRICS_TARGETS_URL",
                                         get("KOI_METRICS_TARGETS_URL")),
            prometheus_url=http_url("KOI_PROMETHEUS_URL", get("KOI_PROMETHEUS_URL")),
            scrape_timeout_s=float(number("KOI_SCRAPE_TIMEOUT_S", get("KOI_SCRAPE_TIMEOUT_S"))),
            scrape_concurrency=int(number("KOI_SCRAPE_CONCURRENCY",
                                          get("KOI_SCRAPE_CONCURRENCY"))))


# service name (as `koi serve NAME` takes it) → module under services/
SERVICES: dict[str, str] = {
    "sim": "services.sim.main",
    "telemetry-ingest": "services.telemetry_ingest.main",
    "causal-store": "services.causal_store.main",
    "proposer": "services.proposer.main",
    "evaluator": "services.evaluator.main",
    "placer": "services.placer.main",
    "planner-api": "services.planner_api.main",
    "engine-metrics": "services.engine_metrics.main",
}
