"""Service settings, read from the environment: the one list of ``KOI_*`` variables.

Every variable a service, the demo, ``compose/`` or the Kubernetes manifests name is
declared in ``ENV`` with its default and meaning (a test checks the manifests against
it). ``ServiceSettings.from_env()`` reads them once at start-up; bad values fail there
with the variable's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# name → (default, meaning)
ENV: dict[str, tuple[str, str]] = {
    "KOI_NATS_URL": ("nats://127.0.0.1:4222", "NATS server(s), comma-separated"),
    "KOI_REDIS_URL": ("", "Redis for the prediction cache; empty = no cache"),
    "KOI_SCENARIO": ("hetero-3h", "scenario the sim service runs (name or YAML path)"),
    "KOI_SEED": ("1", "seed of the simulated world and the jobs"),
    "KOI_HORIZON_S": ("", "cut the scenario's horizon to this many seconds; empty = full"),
    "KOI_SAMPLE_FRACTION": ("", "simulator request thinning; empty = the scenario's/auto"),
    "KOI_POLICY": ("koi", "planner variant: koi | koi-no-causal | koi-no-learning | koi-no-dro"
                   " | koi-ttft-nominal"),
    "KOI_GRPC_ADDR": ("127.0.0.1:50051", "planner-api's gRPC listen address"),
    "KOI_STAGE_DEADLINE_S": ("60", "seconds a tick waits for a stage before it degrades"),
    "KOI_LOG_LEVEL": ("info", "debug | info | warning | error"),
    "KOI_LOG_FORMAT": ("json", "json (structlog JSON lines) | console"),
    "KOI_REPLICA": ("0", "replica index of this process (queue groups, leader election)"),
    "KOI_LEASE_TTL_S": ("5", "placer leader lease: seconds before a standby takes over"),
    "KOI_EVAL_SHARD": ("2000", "candidates per evaluator work item"),
}


def env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of a declared variable (its default when unset or empty)."""
    if name not in ENV:
        raise KeyError(f"{name} is not a declared Koi variable; declared: {', '.join(ENV)}")
    source = os.environ if environ is None else environ
    return source.get(name) or ENV[name][0]


def _number(name: str, raw: str, kind: type) -> float | int:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


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

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> ServiceSettings:
        def get(name: str) -> str:
            return env(name, environ)

        horizon, fraction = get("KOI_HORIZON_S"), get("KOI_SAMPLE_FRACTION")
        return ServiceSettings(
            nats_url=get("KOI_NATS_URL"), redis_url=get("KOI_REDIS_URL"),
            scenario=get("KOI_SCENARIO"), seed=int(_number("KOI_SEED", get("KOI_SEED"), int)),
            horizon_s=float(_number("KOI_HORIZON_S", horizon, float)) if horizon else None,
            sample_fraction=(float(_number("KOI_SAMPLE_FRACTION", fraction, float))
                             if fraction else None),
            policy=get("KOI_POLICY"), grpc_addr=get("KOI_GRPC_ADDR"),
            stage_deadline_s=float(_number("KOI_STAGE_DEADLINE_S",
                                           get("KOI_STAGE_DEADLINE_S"), float)),
            log_level=get("KOI_LOG_LEVEL"), log_format=get("KOI_LOG_FORMAT"),
            replica=int(_number("KOI_REPLICA", get("KOI_REPLICA"), int)),
            lease_ttl_s=float(_number("KOI_LEASE_TTL_S", get("KOI_LEASE_TTL_S"), float)),
            eval_shard=int(_number("KOI_EVAL_SHARD", get("KOI_EVAL_SHARD"), int)))


# service name (as `koi serve NAME` takes it) → module under services/
SERVICES: dict[str, str] = {
    "sim": "services.sim.main",
    "telemetry-ingest": "services.telemetry_ingest.main",
    "causal-store": "services.causal_store.main",
    "proposer": "services.proposer.main",
    "evaluator": "services.evaluator.main",
    "placer": "services.placer.main",
    "planner-api": "services.planner_api.main",
}
