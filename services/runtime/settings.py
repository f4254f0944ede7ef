"""Service settings, read from the environment: the one list of ``KOI_*`` variables.

``ServiceSettings`` is a pydantic dataclass: each field is one variable
(``KOI_<FIELD>``), with its default, its description and its bounds next to it; the NATS
credentials (``NatsAuth``) and the gRPC token file are the few variables that are not
one field each (``CREDENTIAL_ENV``). ``ENV``, every variable a service, the demo,
``compose/`` or the Kubernetes manifests name with its default and meaning (a test checks
the manifests against it), is derived from them and from ``RlmSettings``;
docs/SETTINGS.md is generated from them (``koi settings --markdown``).
``ServiceSettings.from_env()`` reads the variables once at start-up; bad values (not a
number, out of bounds, not a host:port address, an unreadable password file) fail there
with the variable's name. No secret value ever appears in an error message or a repr.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic import dataclasses as pydantic_dataclasses

from koi.planner.churn_settings import ChurnSettings
from koi.planner.settings import VARIANTS
from koi.rlm.settings import env_table as rlm_env_table

ENV_PREFIX = "KOI_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_USER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# the variables that are not one ServiceSettings field each: name → (default, meaning)
CREDENTIAL_ENV: dict[str, tuple[str, str]] = {
    "KOI_NATS_USER": ("", "NATS user of this process (one per service); empty = no auth"),
    "KOI_NATS_PASSWORD": ("", "that user's password (prefer KOI_NATS_PASSWORD_FILE)"),
    "KOI_NATS_PASSWORD_FILE": ("", "file holding that user's password (a mounted Secret)"),
    "KOI_NATS_CA": ("", "CA certificate (PEM) to trust for NATS TLS; set = TLS on"),
    "KOI_GRPC_TOKEN_FILE": ("", "file holding planner-api's gRPC bearer token (a mounted "
                            "Secret); instead of KOI_GRPC_TOKEN"),
}
# fields of ServiceSettings that no variable of their own sets
_NOT_A_VARIABLE = frozenset({"nats_auth"})
_SECRET_FIELDS = frozenset({"grpc_token", "metrics_targets_url", "prometheus_url", "nats_url",
                            "redis_url"})


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


def _env_default(default: Any) -> str:
    """A field's default as the environment spells it ("" for None: unset)."""
    if default is None:
        return ""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


@pydantic_dataclasses.dataclass(frozen=True, config=ConfigDict(allow_inf_nan=False))
class ServiceSettings:
    """Every service's settings; field ``x`` is the variable ``KOI_X`` (``from_env``)."""

    nats_url: str = Field(default="nats://127.0.0.1:4222", min_length=1,
                          description="NATS server(s), comma-separated; tls://… requires TLS")
    redis_url: str = Field(default="", description="Redis for the prediction cache; empty = "
                                                   "no cache")
    scenario: str = Field(default="hetero-3h", min_length=1, description="scenario the sim "
                          "service runs (name or YAML path)")
    seed: int = Field(default=1, ge=0, le=2**63 - 1,
                      description="seed of the simulated world and the jobs")
    horizon_s: float | None = Field(default=None, ge=1e-3, le=10 * 365 * 86400.0,
                                    description="cut the scenario's horizon to this many "
                                                "seconds; empty = full")
    sample_fraction: float | None = Field(default=None, ge=1e-6, le=1.0,
                                          description="simulator request thinning; empty = "
                                                      "the scenario's/auto")
    policy: str = Field(default="koi", min_length=1,
                        description="planner variant: " + " | ".join(VARIANTS))
    grpc_addr: str = Field(default="127.0.0.1:50051",
                           description="planner-api's gRPC listen address")
    stage_deadline_s: float = Field(default=60.0, ge=1e-3, le=3600.0,
                                    description="seconds a tick waits for a stage before it "
                                                "degrades")
    log_level: str = Field(default="info", description="debug | info | warning | error "
                           "| critical")
    log_format: Literal["json", "console"] = Field(
        default="json", description="json (structlog JSON lines) | console")
    replica: int = Field(default=0, ge=0, le=10_000, description="replica index of this "
                         "process (queue groups, leader election)")
    lease_ttl_s: float = Field(default=5.0, ge=0.1, le=3600.0, description="leader leases "
                               "(the placer's, and the proposer's for hypothesis rounds): "
                               "seconds before a standby takes over")
    eval_shard: int = Field(default=2000, ge=1, le=10_000_000,
                            description="candidates per evaluator work item")
    nats_auth: InstanceOf[NatsAuth] = Field(
        default_factory=NatsAuth, description="NATS credentials (KOI_NATS_USER, "
        "KOI_NATS_PASSWORD(_FILE), KOI_NATS_CA)")
    grpc_tls_cert: str = Field(default="", description="planner-api's TLS certificate "
                               "(PEM); with the key = TLS only")
    grpc_tls_key: str = Field(default="", description="that certificate's private key (PEM)")
    grpc_token: str = Field(default="", repr=False, description="bearer token every gRPC "
                            "call but health must carry; empty = none (prefer "
                            "KOI_GRPC_TOKEN_FILE)")
    grpc_health_addr: str = Field(default="", description="planner-api's plaintext listen "
                                  "address for grpc.health.v1 alone (probes that cannot speak"
                                  " TLS); empty = none")
    sim_metrics_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="sim: serve each simulated replica's engine /metrics page and a "
                    "Prometheus http_sd /targets on 127.0.0.1 at this port (0 = any free "
                    "port; the URL is in KV koi_sim/metrics) and leave the telemetry to "
                    "engine-metrics; empty = off")
    metrics_source: Literal["scrape", "prometheus"] = Field(
        default="scrape", description="engine-metrics: scrape (read the pages the targets "
                                      "list) | prometheus (ask KOI_PROMETHEUS_URL)")
    # URLs may carry credentials (user:password@): kept out of the repr
    metrics_targets_url: str = Field(
        default="", repr=False, description="engine-metrics: Prometheus http_sd JSON listing "
        "the replica pages; empty = the sim's /targets when it serves them, else idle")
    prometheus_url: str = Field(
        default="", repr=False, description="engine-metrics with KOI_METRICS_SOURCE="
        "prometheus: the server's base URL, e.g. http://prometheus:9090")
    scrape_timeout_s: float = Field(default=2.0, ge=1e-2, le=300.0, description="engine-"
                                    "metrics: seconds for one page, targets list or query")
    scrape_concurrency: int = Field(default=8, ge=1, le=256, description="engine-metrics: "
                                    "pages (or queries) read at once")
    submit_rate_per_s: float = Field(default=10.0, ge=0.0, le=1e6, description="placer: "
                                     "job submissions a second one user (the last token "
                                     "of koi.jobs.submit.<user>) may make, after its "
                                     "burst, across all placer replicas together; "
                                     "beyond it the answer is busy with the wait; 0 = "
                                     "no limit")
    submit_burst: int = Field(default=100, ge=1, le=1_000_000, description="placer: "
                              "submissions one user may make at once before "
                              "KOI_SUBMIT_RATE_PER_S holds it")
    k8s_connect_timeout_s: float = Field(default=3.0, ge=0.1, le=300.0, description="koi "
                                         "plan / the K8s backend: seconds to connect to "
                                         "the API server")
    k8s_read_timeout_s: float = Field(default=10.0, ge=0.1, le=600.0, description="koi plan "
                                      "/ the K8s backend: seconds to wait for its answer")
    k8s_retries: int = Field(default=1, ge=0, le=10, description="koi plan / the K8s "
                             "backend: retries of a refused or timed-out connection (never "
                             "of an answer)")

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in LOG_LEVELS:
            raise ValueError(f"not one of {', '.join(LOG_LEVELS)}")
        return value

    @field_validator("grpc_addr")
    @classmethod
    def _grpc_addr(cls, value: str) -> str:
        return listen_addr("KOI_GRPC_ADDR", value)

    @field_validator("metrics_targets_url")
    @classmethod
    def _targets_url(cls, value: str) -> str:
        return http_url("KOI_METRICS_TARGETS_URL", value)

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url(cls, value: str) -> str:
        return http_url("KOI_PROMETHEUS_URL", value)

    @model_validator(mode="after")
    def _health_addr(self) -> ServiceSettings:
        grpc_health_addr(self.grpc_health_addr, self.grpc_addr)
        return self

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> ServiceSettings:
        """The settings from ``KOI_*`` variables (unset or empty = the default)."""
        source = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in variable_fields():
            raw = source.get(ENV_PREFIX + name.upper())
            if raw:
                values[name] = raw
        values["grpc_token"] = grpc_token(source.get("KOI_GRPC_TOKEN") or "",
                                          source.get("KOI_GRPC_TOKEN_FILE") or "")
        values["nats_auth"] = NatsAuth.from_env(environ)
        try:
            return ServiceSettings(**values)
        except ValidationError as err:
            raise ValueError(_env_errors(err, values)) from None


def variable_fields() -> list[str]:
    """The ``ServiceSettings`` fields that one ``KOI_<FIELD>`` variable each sets."""
    return [name for name in _field_info() if name not in _NOT_A_VARIABLE]


def _field_info() -> dict[str, Any]:
    """Field name → pydantic ``FieldInfo`` (default, description, bounds) of
    ``ServiceSettings``, in declaration order."""
    return dict(ServiceSettings.__pydantic_fields__)  # type: ignore[attr-defined]


def _env_errors(err: ValidationError, values: Mapping[str, Any]) -> str:
    """One line per bad variable, naming it; secrets and URLs' credentials left out."""
    parts = []
    for e in err.errors(include_url=False):
        name = str(e["loc"][0]) if e["loc"] else ""
        msg = e["msg"].removeprefix("Value error, ")
        var = ENV_PREFIX + name.upper() if name else ""
        if not var or msg.startswith(var):
            parts.append(msg)
            continue
        raw = values.get(name, "")
        shown = ("" if name == "grpc_token" else
                 f"={redact_url(str(raw))!r}" if name in _SECRET_FIELDS else f"={raw!r}")
        parts.append(f"{var}{shown}: {msg}")
    return "; ".join(parts)


def _service_env() -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for name, info in _field_info().items():
        if name not in _NOT_A_VARIABLE:
            out[ENV_PREFIX + name.upper()] = (_env_default(info.default), info.description or "")
    return out


# name → (default, meaning): every variable, from the settings models
ENV: dict[str, tuple[str, str]] = {**_service_env(), **CREDENTIAL_ENV}
# The proposer's language-model hypothesis layer (docs/RLM.md): koi.rlm.settings.RlmSettings
# reads and checks these itself (RlmSettings.from_env; every field is one variable, its
# default and meaning taken from the field). Off unless a model is named.
ENV.update(rlm_env_table())
# The planner's churn holds (koi.planner.stability; ChurnSettings, read by KoiSettings at
# start-up): make-before-break, the scale-down window and band, the cool-down, the move
# price and the per-job move limit.
ENV.update(ChurnSettings.env_table())


def env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of a declared variable (its default when unset or empty)."""
    if name not in ENV:
        raise KeyError(f"{name} is not a declared Koi variable; declared: {', '.join(ENV)}")
    source = os.environ if environ is None else environ
    return source.get(name) or ENV[name][0]


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
