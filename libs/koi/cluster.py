"""Boundary types between the cluster (simulated or real) and the planning policies.

Every tick the cluster hands a policy a ``ClusterSnapshot`` (capacity, running
deployments, jobs and their progress) and the last tick's ``DeploymentTelemetry``; the
policy returns a ``PlanDecision`` — actions as data, each with a reason — that the
cluster applies. Frozen dataclasses only: no logic beyond small derived properties, no
I/O, no transport imports. The simulator (``koi.sim``), the baselines and the Koi
planner all speak these types; ``koi.wire`` maps them to protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from koi.jobs import BatchJob, JobSpec, OnlineJob
from koi.space import DeploymentConfig


class DeploymentState(StrEnum):
    STARTING = "starting"    # nodes provisioning / weights loading
    RUNNING = "running"
    DRAINING = "draining"    # finishing in-flight requests, accepts no new ones
    STOPPED = "stopped"


class ActionKind(StrEnum):
    LAUNCH = "launch"        # new deployment for a job
    SCALE = "scale"          # change replica count of a deployment
    SWAP = "swap"            # new config/offering, make-before-break
    RELAUNCH = "relaunch"    # same GPUs, new parallelism/engine knobs: ranks restart
    DRAIN = "drain"          # stop taking requests, stop when empty
    STOP = "stop"            # stop now (in-flight requests are dropped with a reason)
    REJECT = "reject"        # refuse a job (never admitted)
    DEFER = "defer"          # keep a job pending this tick


@dataclass(frozen=True, slots=True)
class OfferingCapacity:
    offering: str            # offering id
    total_gpus: int          # GPUs the fleet may use from it right now
    used_gpus: int           # GPUs held by deployments (starting, running, draining)

    @property
    def free_gpus(self) -> int:
        return max(self.total_gpus - self.used_gpus, 0)


@dataclass(frozen=True, slots=True)
class Deployment:
    id: str
    job_id: str
    config: DeploymentConfig  # config.replicas = desired replicas
    offering: str
    state: DeploymentState
    replicas_ready: int
    replicas_starting: int
    started_s: float

    @property
    def gpus(self) -> int:
        return (self.replicas_ready + self.replicas_starting) * self.config.gpus_per_replica


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A job as the cluster sees it: the spec plus what has happened to it."""

    spec: JobSpec
    admitted: bool
    rejected: bool
    reason: str = ""
    # batch progress (0 for online jobs)
    output_tokens_done: float = 0.0
    # online: recent offered load (req/s) over the last tick
    observed_rate_rps: float = 0.0
    # batch: requests finished so far, completed or failed (a failed one, e.g. too long
    # for any cache it met, is not retried). The job is done when every request is: its
    # output tokens are a sample, so their sum rarely lands on the spec's expected total
    requests_done: float = 0.0

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def is_batch(self) -> bool:
        return isinstance(self.spec, BatchJob)

    @property
    def is_online(self) -> bool:
        return isinstance(self.spec, OnlineJob)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    tick: int
    time_s: float
    tick_s: float
    horizon_s: float
    capacity: tuple[OfferingCapacity, ...]
    deployments: tuple[Deployment, ...]
    jobs: tuple[JobStatus, ...]  # submitted so far (pending, admitted, rejected)

    def capacity_of(self, offering: str) -> OfferingCapacity | None:
        return next((c for c in self.capacity if c.offering == offering), None)

    def deployments_of(self, job_id: str) -> list[Deployment]:
        return [d for d in self.deployments if d.job_id == job_id]


@dataclass(frozen=True, slots=True)
class DeploymentTelemetry:
    """One deployment's last tick, in the terms a vLLM ``/metrics`` endpoint reports."""

    tick: int
    deployment_id: str
    job_id: str
    window_s: float
    requests_arrived: float       # weighted counts (thinned simulation)
    requests_finished: float
    requests_dropped: float
    prompt_tokens: float
    generation_tokens: float
    ttft_bucket_bounds_s: tuple[float, ...]
    ttft_bucket_counts: tuple[float, ...]   # len(bounds) + 1 (last = overflow)
    tpot_bucket_bounds_s: tuple[float, ...]
    tpot_bucket_counts: tuple[float, ...]
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    kv_cache_usage: float          # mean fraction of KV blocks in use
    num_running: float             # running sequences, mean over the window (*)
    num_waiting: float             # queued requests, mean over the window (*)
    num_preemptions: float         # KV-overflow preemptions (recompute)
    replica_preemptions: int       # spot reclaims this tick
    output_tok_s: float
    gpu_seconds: float
    cost_usd: float
    num_running_end: float = 0.0   # running sequences at the window's end
    num_waiting_end: float = 0.0   # queued requests at the window's end
    # (*) The simulator knows both a window's means and its end; an engine's gauges show
    # only the end (what a scrape reads), so telemetry read from engines carries the end
    # values in both pairs of fields.


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    job_id: str
    reason: str
    deployment_id: str = ""
    config: DeploymentConfig | None = None   # LAUNCH/SWAP/RELAUNCH: the new config
    offering: str = ""                       # LAUNCH/SWAP: where
    replicas: int = 0                        # LAUNCH/SCALE: desired replicas; RELAUNCH:
                                             # after the restart (0: as many as now)


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """What a policy decided this tick: actions plus free-form notes for explanations."""

    tick: int
    actions: tuple[Action, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    action: Action
    applied: bool
    reason: str = ""  # why it was refused (capacity, invalid config, unknown id…)
