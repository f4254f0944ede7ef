"""Per-deployment telemetry in vLLM's terms.

``build_telemetry`` folds what a deployment's replicas did over one tick into a
``DeploymentTelemetry`` (weighted request counts, TTFT/TPOT histograms on every bucket
bound of the engines' layouts, means and p95s, KV usage, running/waiting means and at
the window's end). The simulated replicas' engine ``/metrics`` pages (cumulative, per
replica, in each engine's own layout) are ``koi.fleet.sim_pages`` /
``koi.fleet.exposition``. Stats objects only: no routing, no fleet logic.
"""

from __future__ import annotations

import numpy as np

from koi.cluster import DeploymentTelemetry

# Bucket bounds: every bound of the engine layouts Koi reads (vLLM 0.6-0.34 and SGLang
# 0.4-0.5, ``koi.fleet.engine_tables``), so that each simulated replica's ``/metrics``
# page counts its requests on its release's own buckets exactly, as the real engine
# would, instead of spreading a coarser bucket over finer ones.
TTFT_BOUNDS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.25, 0.4, 0.5, 0.6,
                 0.75, 0.8, 1.0, 2.0, 2.5, 4.0, 5.0, 6.0, 7.5, 8.0, 10.0, 15.0, 20.0, 25.0,
                 30.0, 40.0, 60.0, 80.0, 100.0, 160.0, 200.0, 400.0, 640.0, 2560.0)
TPOT_BOUNDS_S = (0.002, 0.004, 0.005, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035,
                 0.04, 0.05, 0.06, 0.075, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.8,
                 1.0, 2.0, 2.5, 4.0, 5.0, 6.0, 7.5, 8.0, 10.0, 20.0, 40.0, 80.0)


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
                    weights: np.ndarray, means: dict[str, float],
                    end: dict[str, float] | None = None) -> DeploymentTelemetry:
    """One deployment's tick; ``counts``, ``means`` (over the window) and ``end`` (the
    queue at the window's end: ``running``, ``waiting``) carry the scalar fields."""
    end = end or {}
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
        gpu_seconds=counts["gpu_seconds"], cost_usd=counts["cost_usd"],
        num_running_end=max(float(end.get("running", 0.0)), 0.0),
        num_waiting_end=max(float(end.get("waiting", 0.0)), 0.0))
