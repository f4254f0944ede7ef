"""Per-deployment telemetry in vLLM's terms, and its Prometheus text rendering.

``build_telemetry`` folds what a deployment's replicas did over one tick into a
``DeploymentTelemetry`` (weighted request counts, TTFT/TPOT histograms with vLLM's bucket
bounds, means and p95s, KV usage, running/waiting means). ``to_prometheus_text`` renders
one as the ``/metrics`` text a vLLM server would expose, so the ingest path is the same
for simulated and real engines. Stats objects only: no routing, no fleet logic.
"""

from __future__ import annotations

import numpy as np

from koi.cluster import DeploymentTelemetry

TTFT_BOUNDS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BOUNDS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


def histogram(values: np.ndarray, weights: np.ndarray, bounds: tuple[float, ...]
              ) -> tuple[float, ...]:
    """Weighted counts per bucket (value ≤ bound), plus a last overflow bucket."""
    idx = np.searchsorted(np.asarray(bounds), values, side="left")
    counts = np.bincount(idx, weights=weights, minlength=len(bounds) + 1)
    return tuple(float(c) for c in counts)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if values.size == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(values[order][min(i, values.size - 1)])


def build_telemetry(tick: int, dep_id: str, job_id: str, window_s: float, *,
                    counts: dict[str, float], ttft: np.ndarray, tpot: np.ndarray,
                    weights: np.ndarray, means: dict[str, float]) -> DeploymentTelemetry:
    """One deployment's tick; ``counts`` and ``means`` carry the scalar fields."""
    wsum = float(weights.sum())

    def mean(x: np.ndarray) -> float:
        return float((x * weights).sum() / wsum) if wsum > 0 else 0.0

    return DeploymentTelemetry(
        tick=tick, deployment_id=dep_id, job_id=job_id, window_s=window_s,
        requests_arrived=counts["arrived"], requests_finished=wsum,
        requests_dropped=counts["dropped"], prompt_tokens=counts["prompt_tokens"],
        generation_tokens=counts["gen_tokens"],
        ttft_bucket_bounds_s=TTFT_BOUNDS_S,
        ttft_bucket_counts=histogram(ttft, weights, TTFT_BOUNDS_S),
        tpot_bucket_bounds_s=TPOT_BOUNDS_S,
        tpot_bucket_counts=histogram(tpot, weights, TPOT_BOUNDS_S),
        ttft_mean_s=mean(ttft), ttft_p95_s=weighted_quantile(ttft, weights, 0.95),
        tpot_mean_s=mean(tpot), tpot_p95_s=weighted_quantile(tpot, weights, 0.95),
        kv_cache_usage=means["kv"], num_running=means["running"],
        num_waiting=means["waiting"], num_preemptions=counts["preemptions"],
        replica_preemptions=int(counts["replica_preemptions"]),
        output_tok_s=counts["gen_tokens"] / window_s if window_s > 0 else 0.0,
        gpu_seconds=counts["gpu_seconds"], cost_usd=counts["cost_usd"])


def _bucket_lines(name: str, labels: str, bounds: tuple[float, ...],
                  counts: tuple[float, ...], total: float) -> list[str]:
    lines, cum = [], 0.0
    for b, c in zip(bounds, counts, strict=False):
        cum += c
        lines.append(f'{name}_bucket{{{labels},le="{b:g}"}} {cum:g}')
    cum += counts[-1]
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {cum:g}')
    lines.append(f"{name}_count{{{labels}}} {cum:g}")
    lines.append(f"{name}_sum{{{labels}}} {total:g}")
    return lines


def to_prometheus_text(t: DeploymentTelemetry) -> str:
    """The telemetry as vLLM-style Prometheus exposition text (one scrape)."""
    labels = f'model_name="{t.job_id}",deployment="{t.deployment_id}"'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {t.num_running:g}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {t.num_waiting:g}",
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        f"vllm:gpu_cache_usage_perc{{{labels}}} {t.kv_cache_usage:g}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {t.prompt_tokens:g}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {t.generation_tokens:g}",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {t.num_preemptions:g}",
        "# TYPE vllm:request_success_total counter",
        f"vllm:request_success_total{{{labels}}} {t.requests_finished:g}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    lines += _bucket_lines("vllm:time_to_first_token_seconds", labels, t.ttft_bucket_bounds_s,
                           t.ttft_bucket_counts, t.ttft_mean_s * t.requests_finished)
    lines.append("# TYPE vllm:time_per_output_token_seconds histogram")
    lines += _bucket_lines("vllm:time_per_output_token_seconds", labels,
                           t.tpot_bucket_bounds_s, t.tpot_bucket_counts,
                           t.tpot_mean_s * t.requests_finished)
    return "\n".join(lines) + "\n"
