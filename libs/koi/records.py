"""What a run leaves behind: per-job outcomes, per-tick timeline and events.

The cluster (simulator or real) fills these; ``koi.metrics`` turns them into the
DESIGN §4 metrics; ``koi.bench`` plots them. Frozen dataclasses only, no logic, no I/O.
Counts are weighted (a thinned simulation's sampled request stands for ``weight``
requests), so they are floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job_id: str
    kind: str                         # "online" | "batch"
    model: str
    submitted: bool                   # the job's submit time fell inside the horizon
    admitted: bool
    rejected: bool
    reason: str = ""
    # online
    offered_requests: float = 0.0     # requests the job sent over the horizon
    offered_output_tokens: float = 0.0
    served_requests: float = 0.0      # requests completed
    dropped_requests: float = 0.0     # dropped with a reason (no deployment, stopped, …)
    ttft_met_requests: float = 0.0    # completed and TTFT ≤ SLO
    tpot_met_requests: float = 0.0    # completed and TPOT ≤ SLO
    good_output_tokens: float = 0.0   # output tokens of requests meeting both SLOs
    served_output_tokens: float = 0.0
    queued_at_end: float = 0.0        # still waiting or running when the horizon ended
    # what the policy's moves cost the job (koi.churn): requests evicted by a move or that
    # arrived while a move left the job no replica, and how many of those were dropped
    disrupted_requests: float = 0.0
    dropped_by_move: float = 0.0
    # GPU-seconds held by replicas still starting (provisioning, weight load) or draining
    startup_gpu_s: float = 0.0
    drain_gpu_s: float = 0.0
    # batch
    tokens_requested: float = 0.0     # output tokens the batch job asked for
    tokens_by_deadline: float = 0.0   # output tokens processed before its deadline
    tokens_processed: float = 0.0     # output tokens processed at all (incl. late)


@dataclass(frozen=True, slots=True)
class TickRecord:
    tick: int
    time_s: float
    spend_usd_per_hour: float
    gpus_by_family: dict[str, int] = field(default_factory=dict)
    gpus_by_job: dict[str, dict[str, int]] = field(default_factory=dict)  # job → family → GPUs
    ttft_met_frac: float = 1.0        # over requests completed this tick (weighted)
    tpot_met_frac: float = 1.0
    output_tok_s: float = 0.0
    good_tok_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EventRecord:
    time_s: float
    tick: int
    kind: str                         # launch | scale | swap | relaunch | drain | stop |
    job_id: str                       # preemption | stockout | reject | admit | defer
    detail: str = ""
    deployment_id: str = ""
    # a move's structured ends (koi.churn reads these, not ``detail``): replica counts
    # for scale ("3" → "4"); placements (``placement_key``) for launch, swap and relaunch
    before: str = ""
    after: str = ""


@dataclass(frozen=True, slots=True)
class RunRecord:
    scenario: str
    policy: str
    seed: int
    horizon_s: float
    tick_s: float
    spend_usd: float                  # fleet spend over the horizon
    jobs: tuple[JobOutcome, ...]
    timeline: tuple[TickRecord, ...] = ()
    events: tuple[EventRecord, ...] = ()
    sample_fraction: float = 1.0
    wall_s: float = 0.0
