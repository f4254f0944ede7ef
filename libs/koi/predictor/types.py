"""Predictor boundary types: the workload a configuration is asked to serve, and the
prediction (mediators and outcomes) that comes back.

Frozen dataclasses only; no logic beyond small derived properties, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum


class LoadMode(StrEnum):
    SATURATED = "saturated"      # offline max throughput: as many requests as fit
    CONCURRENCY = "concurrency"  # closed loop with a fixed number of clients
    RATE = "rate"                # Poisson arrivals, req/s
    STATIC = "static"            # one static batch of `load` requests
    BURST = "burst"              # `load` requests arriving at once, continuous batching


@dataclass(frozen=True, slots=True)
class Workload:
    """What one deployment (all its replicas together) is asked to serve."""

    input_len: float
    output_len: float
    mode: LoadMode = LoadMode.SATURATED
    load: float = 0.0  # clients | req/s | batch size | burst size, by mode
    prefix_hit: float = 0.0  # share of prompt tokens served from the prefix cache
    window_s: float = 600.0  # horizon over which an overload's backlog is averaged
    slo_ttft_ms: float = 0.0  # 0 = none; used for max_rate_under_slo
    slo_tpot_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be ≥ 1 token")
        if self.mode != LoadMode.SATURATED and self.load <= 0:
            raise ValueError(f"a {self.mode} workload needs load > 0")
        if not 0.0 <= self.prefix_hit < 1.0:
            raise ValueError("prefix_hit must be in [0, 1)")


MEDIATORS = ("kv_pressure", "comm_overhead_frac", "compute_util", "membw_util",
             "queue_util", "batch_efficiency", "memory_headroom")
OUTCOMES = ("ttft_ms", "ttft_p50_ms", "ttft_p95_ms", "tpot_ms", "tpot_p50_ms", "tpot_p95_ms",
            "output_throughput_tok_s", "total_throughput_tok_s", "request_rate_rps",
            "max_rate_under_slo_rps", "cost_per_mtok_usd", "e2e_latency_s")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted mediators and outcomes of one configuration under one workload.

    TTFT/TPOT are means unless suffixed with a percentile; throughputs and cost are for
    the whole deployment; ``cost_per_mtok_usd`` is per million output tokens.
    """

    # outcomes
    ttft_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    output_throughput_tok_s: float
    total_throughput_tok_s: float
    request_rate_rps: float
    max_rate_under_slo_rps: float
    cost_per_mtok_usd: float
    e2e_latency_s: float
    # mediators
    kv_pressure: float
    comm_overhead_frac: float
    compute_util: float
    membw_util: float
    queue_util: float
    batch_efficiency: float
    memory_headroom: float
    # context the numbers came from
    batch_size: float
    kv_capacity_tokens: float
    weights_gb_per_gpu: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def mediators(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in MEDIATORS}
