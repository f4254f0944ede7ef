"""Predictor speed: numba kernel vs numpy reference on a large candidate matrix.

Candidates are drawn from the in-scope measurement cases (real model × accelerator ×
engine combinations) with randomised lengths and an open-loop Poisson load — the
shape of the evaluator's work. Reports predictions per second, median of several runs.
The kernel on one core (its serial loop), then split over the machine's cores as the
planner runs a large batch (``koi.predictor.kernel``). No I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from koi.predictor.columns import IN, MODE_RATE
from koi.predictor.features import build_inputs
from koi.predictor.kernel import THREADS, predict_kernel
from koi.predictor.measurements import load_cases
from koi.predictor.reference import predict_reference


@dataclass(frozen=True)
class SpeedResult:
    backend: str
    candidates: int
    runs: int
    median_s: float         # wall clock
    per_s: float            # predictions per wall-clock second
    all_s: tuple[float, ...]
    cpu_median_s: float     # CPU time of this process (robust to other load on the box)
    cpu_per_s: float


def candidate_matrix(n: int, seed: int = 0, kernels: bool | None = None) -> np.ndarray:
    """``n`` candidate columns: real configs, random lengths, Poisson loads; with
    ``kernels``, passes timed from the kernel tables where they cover the config."""
    cases = load_cases()
    base = build_inputs([(c.config, c.workload) for c in cases], kernels=kernels)
    rng = np.random.default_rng(seed)
    X = base[:, rng.integers(0, base.shape[1], n)].copy()
    X[IN["in_len"]] = rng.integers(32, 8192, n)
    X[IN["out_len"]] = rng.integers(16, 2048, n)
    X[IN["mode"]] = MODE_RATE
    X[IN["load"]] = rng.uniform(0.05, 20.0, n) * X[IN["replicas"]]
    return X


def time_backend(name: str, fn: Callable[[np.ndarray], np.ndarray], X: np.ndarray,
                 runs: int) -> SpeedResult:
    times, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(X)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, cpu_med = float(np.median(times)), float(np.median(cpu))
    return SpeedResult(name, X.shape[1], runs, med, X.shape[1] / med, tuple(times),
                       cpu_med, X.shape[1] / cpu_med)


def run(n: int = 1_000_000, runs: int = 5, numpy_runs: int = 3,
        progress: Callable[[str], None] | None = None,
        kernels: bool | None = None) -> list[SpeedResult]:
    X = candidate_matrix(n, kernels=kernels)
    predict_kernel(X[:, :16])  # compile (or load the cache) outside the timing
    if progress:
        progress("numba kernel")
    # one core (the serial loop), then the batch split over the cores as the planner
    # runs it (koi.predictor.kernel.PARALLEL_MIN_COLUMNS)
    results = [time_backend("numba", lambda X: predict_kernel(X, parallel=False), X, runs)]
    if THREADS > 1:
        results.append(time_backend(f"numba, {THREADS} threads",
                                    lambda X: predict_kernel(X, parallel=True), X, runs))
    if numpy_runs > 0:
        if progress:
            progress("numpy reference")
        results.append(time_backend("numpy", predict_reference, X, numpy_runs))
    return results
