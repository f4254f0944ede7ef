"""Small builders for exercising the simulator: tiny scenarios and a fixed policy.

Used by the simulator's tests and by anyone who needs a quick, deterministic run
(``thinning_error`` callers, benchmarks' smoke checks). Builders only: no simulation
logic, no ``koi.predictor`` imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from koi.catalog import Catalog, load_catalog
from koi.cluster import (
    Action,
    ActionKind,
    ClusterSnapshot,
    DeploymentTelemetry,
    PlanDecision,
)
from koi.jobs import JobSpec, parse_job
from koi.scenario.types import CapacityEvent, FleetEntry, Scenario
from koi.space import DeploymentConfig, engine_default_config


def online_job(job_id: str, rate: float = 4.0, model: str = "llama-3.1-8b", inp: int = 512,
               out: int = 128, ttft_ms: float = 1000, tpot_ms: float = 60,
               **extra: Any) -> JobSpec:
    return parse_job({"kind": "online", "id": job_id, "model": model,
                      "arrival": {"kind": "rate", "rate_rps": rate},
                      "input_len": {"kind": "lognormal", "mean": inp, "sigma": 0.5},
                      "output_len": {"kind": "lognormal", "mean": out, "sigma": 0.5},
                      "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}, **extra})


def batch_job(job_id: str, num_requests: int = 2000, model: str = "llama-3.1-8b",
              inp: int = 1000, out: int = 200, deadline_s: float = 3600,
              **extra: Any) -> JobSpec:
    return parse_job({"kind": "batch", "id": job_id, "model": model,
                      "num_requests": num_requests,
                      "input_len": {"kind": "fixed", "mean": inp},
                      "output_len": {"kind": "fixed", "mean": out},
                      "deadline_s": deadline_s, **extra})


def tiny_scenario(jobs: Sequence[JobSpec], fleet: dict[str, int] | None = None, *,
                  horizon_s: float = 1800, tick_s: float = 60,
                  events: Sequence[CapacityEvent] = (), world: dict[str, Any] | None = None,
                  sample_fraction: float = 1.0, name: str = "tiny") -> Scenario:
    fleet = fleet or {"aws/us-east-1/h100-sxm/on_demand": 16,
                      "aws/us-east-1/h100-sxm/spot": 8}
    return Scenario(name, "built in code", horizon_s, tick_s, 0,
                    tuple(FleetEntry(o, g) for o, g in fleet.items()), tuple(jobs),
                    tuple(events), dict(world or {}), False, sample_fraction)


class FixedPolicy:
    """Launch ``replicas`` replicas of one engine-default config per job, once, on the
    first offering (in the given order) with room; nothing else."""

    name = "fixed"

    def __init__(self, offerings: Sequence[str], replicas: int = 1,
                 catalog: Catalog | None = None, **knobs: Any) -> None:
        self.offerings = list(offerings)
        self.replicas = replicas
        self.catalog = catalog or load_catalog()
        self.knobs = knobs
        self.launched: set[str] = set()

    def config(self, model: str, offering: str) -> DeploymentConfig:
        accel = self.catalog.offering(offering).accelerator
        return engine_default_config(model, accel, "vllm", self.catalog, offering=offering,
                                     **self.knobs)

    def decide(self, snap: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        actions = []
        free = {c.offering: c.free_gpus for c in snap.capacity}
        for job in snap.jobs:
            if job.id in self.launched or job.rejected:
                continue
            for off in self.offerings:
                cfg = self.config(job.spec.model, off)
                need = cfg.gpus_per_replica * self.replicas
                if free.get(off, 0) >= need:
                    free[off] -= need
                    actions.append(Action(ActionKind.LAUNCH, job.id, "fixed policy",
                                          config=cfg, offering=off, replicas=self.replicas))
                    self.launched.add(job.id)
                    break
        return PlanDecision(snap.tick, tuple(actions))
