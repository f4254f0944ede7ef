"""Pass-time multipliers: the serving model's forward pass scaled, and read back from
telemetry by inverting the model.

The simulator's world (and a real fleet) differs from the predictor mostly in how long a
forward pass takes: achieved bandwidth and FLOP efficiency, engine overheads, throttled
nodes, a slow region. A multiplier on an *outcome* (TPOT × 1.3) says that badly where
queueing matters: a replica whose passes take 1.3× longer saturates at a lower rate and
queues sooner, so its TTFT grows far more than 1.3× near its capacity, and a faster pass
lets it serve more. A multiplier on the *pass* says both, because the queueing model
runs on the scaled pass. One is learnt per scope (docs/CAUSAL.md §3): every part of a
pass — memory, compute, collectives, per-step overhead — m× as long
(``reference.pass_time``'s total scales by exactly m), read from TPOT, a decode pass.

``scale_passes`` applies it to an input matrix. ``pass_curves`` predicts an observed
deployment at every multiplier of ``LOG_GRID`` and returns, per outcome, the log of the
predicted mean (ms) along it — the curves the causal store inverts (TPOT: the multiplier
whose prediction meets the observation) and re-scores against (TTFT at that multiplier).

Pure numpy over kernel matrices; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from koi.predictor.columns import IN, OUT

# log pass multipliers the model is evaluated at: ×1/3 … ×3, 1.0 exactly in the middle
LOG_GRID = np.linspace(-math.log(3.0), math.log(3.0), 13)
_Y = {"tpot": OUT["tpot"], "ttft": OUT["ttft"]}
_FLOOR = 1e-9     # s: a non-positive prediction is read as this before the log
_CEILING = 1e6    # s: a non-finite one (a saturated queue) as this


def scale_passes(X: np.ndarray, pass_mult: np.ndarray | float) -> np.ndarray:
    """A copy of ``X`` whose passes take ``pass_mult`` × longer in every part (per column
    or scalar): memory and compute time, collectives (bandwidth and latency), per-step
    overhead. A request's fixed TTFT overhead is not part of a pass."""
    out = X.copy()
    pm = np.broadcast_to(np.asarray(pass_mult, dtype=float), (X.shape[1],))
    out[IN["eff_mem"]] /= pm
    out[IN["eff_comp"]] /= pm
    out[IN["eff_link"]] /= pm
    out[IN["link_lat"]] *= pm
    out[IN["ovh_base"]] *= pm
    out[IN["ovh_seq"]] *= pm
    out[IN["kscale"]] *= pm  # passes timed from kernel tables
    return out


def solve(curve: Sequence[float] | np.ndarray, target: float) -> tuple[float, float]:
    """(log multiplier whose predicted value meets ``target``, the curve's slope there).

    ``curve`` is log predicted value at each ``LOG_GRID`` point (made non-decreasing
    first); a target outside it is met at the nearer end. The slope — d log prediction /
    d log multiplier — says how much one observation tells about the multiplier."""
    y = np.maximum.accumulate(np.asarray(curve, dtype=float))
    k = int(np.searchsorted(y, target))
    if k <= 0:
        lo, hi = 0, 1
    elif k >= len(y):
        lo, hi = len(y) - 2, len(y) - 1
    else:
        lo, hi = k - 1, k
    dx = LOG_GRID[hi] - LOG_GRID[lo]
    slope = float((y[hi] - y[lo]) / dx)
    theta = float(np.interp(target, y, LOG_GRID)) if y[-1] > y[0] else 0.0
    return theta, max(slope, 0.0)


def value_at(curve: Sequence[float] | np.ndarray, theta: float) -> float:
    """The curve (log predicted value) at log multiplier ``theta`` (clamped to the grid)."""
    return float(np.interp(theta, LOG_GRID, np.maximum.accumulate(np.asarray(curve))))


def pass_curves(X: np.ndarray, run: Callable[[np.ndarray], np.ndarray]
                ) -> dict[str, np.ndarray]:
    """"tpot" and "ttft" → the (n, len(LOG_GRID)) log predicted mean (ms) of each column
    of ``X`` with its passes scaled by each grid multiplier (one ``run`` of the kernel)."""
    n, k = X.shape[1], len(LOG_GRID)
    Y = run(scale_passes(np.repeat(X, k, axis=1), np.tile(np.exp(LOG_GRID), n)))
    out = {}
    for outcome, row in _Y.items():
        y = np.clip(np.where(np.isfinite(Y[row]), Y[row], _CEILING), _FLOOR, _CEILING)
        out[outcome] = np.log(y.reshape(n, k) * 1e3)
    return out
