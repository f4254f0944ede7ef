"""Reading an observation as a time dilation of the prediction.

When a deployment serves ``rate`` req/s and its decode is slower than predicted, the gap
is rarely a constant factor on latency. A replica whose every pass takes ``s`` times the
predicted time also saturates at ``1/s`` of the predicted rate, so near the knee its
latency is the prediction's at ``s·rate``, times ``s``:

    observed_latency(rate)  ≈  s · predicted_latency(s · rate)

``fit_dilation`` finds that ``s`` from the observed mean TPOT and mean TTFT and keeps the
larger (see its docstring). The planner then compares telemetry
with the prediction at the *load-equivalent* rate ``s·rate``: the TPOT residual is
``log s``, the throughput residual is ``−log s`` (the replica does ``1/s`` of the work
the prediction would at that load), and TTFT keeps only what the dilation does not
explain. A slow world then shows up as lost capacity, which the planner can buy back
with replicas, instead of as a huge latency multiplier that no configuration can meet.

Pure numpy over the predictor's input matrix; no I/O.
"""

from __future__ import annotations

import numpy as np

from koi.predictor.api import evaluate_matrix
from koi.predictor.columns import IN, OUT

# dilations tried, log-spaced; a fit outside them is clipped to the ends
GRID = np.exp(np.linspace(np.log(0.25), np.log(8.0), 41))


def fit_dilation(X: np.ndarray, observed_tpot_s: np.ndarray,
                 observed_ttft_s: np.ndarray | None = None, *,
                 backend: str = "numba") -> np.ndarray:
    """Per column of ``X`` (open-loop rate workloads), the larger of the ``s`` with
    ``s · tpot(s · load) = observed TPOT`` and the one with ``s · ttft(s · load) =
    observed TTFT`` (each only where observed, > 0; 1 where neither is).

    The larger, because either latency can be the first to show a replica past its knee:
    decode slows when passes fill with prefill and sequences, TTFT when requests wait for
    a batch slot or KV; both are fixed by more capacity. Pass ``NaN`` for a TTFT that
    carries what capacity does not change (a client in another region).
    """
    fits = [_fit_one(X, observed_tpot_s, "tpot", backend)]
    if observed_ttft_s is not None:
        fits.append(_fit_one(X, observed_ttft_s, "ttft", backend))
    stacked = np.vstack(fits)
    out = np.max(np.where(np.isnan(stacked), -np.inf, stacked), axis=0)
    return np.where(np.isfinite(out), out, 1.0)


def _fit_one(X: np.ndarray, observed_s: np.ndarray, outcome: str, backend: str) -> np.ndarray:
    """``s`` with ``s · outcome(s · load) = observed`` per column (NaN where unobserved),
    after making ``s · outcome(s · load)`` non-decreasing in ``s``; interpolated in
    log-log space between grid points and clipped to the grid."""
    out = np.full(X.shape[1], np.nan)
    obs = np.asarray(observed_s, dtype=float)
    todo = np.flatnonzero(np.isfinite(obs) & (obs > 0))
    if todo.size == 0:
        return out
    g = GRID.size
    Xg = np.repeat(X[:, todo], g, axis=1)
    Xg[IN["load"]] *= np.tile(GRID, todo.size)
    y = evaluate_matrix(Xg, backend=backend)[OUT[outcome]].reshape(todo.size, g)
    f = np.maximum.accumulate(np.maximum(y, 1e-9) * GRID, axis=1)
    log_s = np.log(GRID)
    for row, j in enumerate(todo):
        out[j] = float(np.exp(np.interp(np.log(obs[j]), np.log(f[row]), log_s)))
    return out
