"""Physical bounds on one telemetry window: what no engine on that hardware can report.

A service may publish well-formed telemetry that is absurd (a compromised or broken
engine adapter, a unit slip). Folded into beliefs, one such window moves the causal
store's estimates for every deployment of its scope. ``implausible_window`` says why a
window cannot be true, or None; telemetry-ingest refuses what it names (an
``implausible`` event) before any observation is made from it. The bounds are loose on
purpose: they must never refuse a genuine window, only one that physics rules out.

* **Counters** finite and non-negative, the window's length positive; latencies (TTFT,
  TPOT means and p95s) are durations, so never negative; ``kv_cache_usage`` a fraction
  (with room for overshoot).
* **The clock**: the window's own tick is within ``WINDOW_TICK_SKEW`` of the batch's
  (the sim labels a window with the tick it began in, the batch with the one it ends
  in), and it is no longer than
  ``WINDOW_TICKS_MAX`` ticks (a window that claims to span hours is not this tick's).
* **The roofline**: every generated token costs at least 2 × active parameters FLOPs
  in the linear layers alone (attention, prefill and collectives only add), so output
  tokens/s cannot exceed the deployment's GPUs × peak FLOP/s at its weight precision
  (the predictor's ``peak_flops``, from the catalog) ÷ that, with
  ``ROOFLINE_SLACK`` for accounting slop. Prompt tokens are not bounded this way: a
  prefix-cache hit costs no FLOPs.

Pure: no I/O, no clock; the service passes the deployment and the tick in.
"""

from __future__ import annotations

import math

from koi.catalog import Catalog
from koi.cluster import Deployment, DeploymentTelemetry
from koi.predictor.features import peak_flops

ROOFLINE_SLACK = 2.0      # a window may report up to this multiple of the compute ceiling
WINDOW_TICKS_MAX = 2.0    # a window at most this many ticks long
WINDOW_TICK_SKEW = 1      # a window's own tick is the one it began in: the batch's tick
                          # (the one it ends in) less one, as the simulator labels it
KV_USAGE_MAX = 1.25       # a gauge, not a count: the simulator reports up to ~1.002 when
                          # a tick's admissions overshoot the cache before preemption
_COUNTERS = ("requests_arrived", "requests_finished", "requests_dropped", "prompt_tokens",
             "generation_tokens", "num_running", "num_waiting", "num_preemptions",
             "output_tok_s", "gpu_seconds", "cost_usd")
_LATENCIES = ("ttft_mean_s", "ttft_p95_s", "tpot_mean_s", "tpot_p95_s")


def basic_reason(t: DeploymentTelemetry) -> str | None:
    """The checks that need nothing but the window: finite, non-negative, a fraction."""
    if not (math.isfinite(t.window_s) and t.window_s > 0):
        return f"window_s {t.window_s!r} is not a positive duration"
    for name in _LATENCIES:
        value = getattr(t, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name} {value!r} is not a duration (negative or not finite)"
    for name in _COUNTERS:
        value = getattr(t, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name} {value!r} is negative or not finite"
    if not (0.0 <= t.kv_cache_usage <= KV_USAGE_MAX):
        return f"kv_cache_usage {t.kv_cache_usage!r} is not a fraction of the cache"
    return None


def output_ceiling_tok_s(dep: Deployment, catalog: Catalog) -> float:
    """The most output tokens/s the deployment's GPUs could compute (the roofline's
    compute ceiling), counting starting replicas too (they may have served late in the
    window)."""
    cfg = dep.config
    model = catalog.model(cfg.model)
    accel = catalog.accelerator(cfg.accelerator)
    gpus = max(dep.replicas_ready + dep.replicas_starting, 1) * cfg.gpus_per_replica
    flops_per_token = 2.0 * model.active_params_b * 1e9
    return gpus * peak_flops(accel, cfg.weight_precision) / flops_per_token


def implausible_window(t: DeploymentTelemetry, tick: int, tick_s: float,
                       dep: Deployment | None, catalog: Catalog) -> str | None:
    """Why this window cannot be true (one line), or None. ``dep`` is the deployment
    in the tick's snapshot (None: not there; the roofline cannot be checked, and the
    observation step ignores such a window anyway)."""
    reason = basic_reason(t)
    if reason is not None:
        return reason
    if abs(t.tick - tick) > WINDOW_TICK_SKEW:
        return (f"window tick {t.tick} is more than {WINDOW_TICK_SKEW} tick from the "
                f"batch's tick {tick}")
    if tick_s > 0 and t.window_s > WINDOW_TICKS_MAX * tick_s:
        return (f"window_s {t.window_s:g} spans more than {WINDOW_TICKS_MAX:g} ticks "
                f"of {tick_s:g} s")
    if dep is None:
        return None
    ceiling = output_ceiling_tok_s(dep, catalog)
    rate = max(t.generation_tokens / t.window_s, t.output_tok_s)
    if rate > ROOFLINE_SLACK * ceiling:
        return (f"{rate:.4g} output tokens/s is above the roofline: {dep.config.model} on "
                f"{dep.config.accelerator} computes at most {ceiling:.4g}/s")
    return None
