"""Load-equivalent dilation: recovering how much slower the world is than the prediction."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.predictor.api import evaluate_matrix
from koi.predictor.columns import IN, OUT
from koi.predictor.dilation import GRID, fit_dilation
from koi.predictor.features import build_inputs
from koi.predictor.types import LoadMode, Workload
from koi.space import engine_default_config


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    cat = load_catalog()
    pairs = [(engine_default_config(m, a, "vllm", cat),
              Workload(input_len=1000, output_len=200, mode=LoadMode.RATE, load=rate))
             for m, a, rate in (("llama-3.1-8b", "h100-sxm", 6.0),
                                ("llama-3.1-8b", "l40s", 1.5),
                                ("qwen2.5-7b", "a100-80gb", 3.0))]
    return build_inputs(pairs, cat)


def _dilated(X: np.ndarray, s: np.ndarray, outcome: str = "tpot") -> np.ndarray:
    """What a world ``s`` times slower than the prediction would show: s·y(s·rate)."""
    Xs = X.copy()
    Xs[IN["load"]] *= s
    return s * evaluate_matrix(Xs)[OUT[outcome]]


def _dilated_tpot(X: np.ndarray, s: np.ndarray) -> np.ndarray:
    return _dilated(X, s, "tpot")


@pytest.mark.parametrize("s", [0.6, 1.0, 1.3, 2.0])
def test_a_dilated_prediction_is_read_back_as_its_dilation(X, s) -> None:
    truth = np.full(X.shape[1], s)
    fitted = fit_dilation(X, _dilated_tpot(X, truth))
    # log-log interpolation between grid points 9 % apart
    np.testing.assert_allclose(fitted, truth, rtol=0.03)


def test_a_slower_world_means_a_larger_dilation(X) -> None:
    fits = [fit_dilation(X, _dilated_tpot(X, np.full(X.shape[1], s)))
            for s in (0.8, 1.1, 1.6, 2.5)]
    assert all(np.all(a < b) for a, b in pairwise(fits))


def test_no_tpot_means_no_dilation_and_extremes_are_clipped(X) -> None:
    fitted = fit_dilation(X, np.array([0.0, np.nan, 1e6]))
    assert fitted[0] == 1.0 and fitted[1] == 1.0
    assert fitted[2] == pytest.approx(GRID[-1])
    low = fit_dilation(X, np.full(X.shape[1], 1e-9))
    np.testing.assert_allclose(low, GRID[0])


def test_both_latencies_dilated_alike_give_that_dilation(X) -> None:
    truth = np.array([0.7, 1.5, 2.2])
    fitted = fit_dilation(X, _dilated(X, truth, "tpot"), _dilated(X, truth, "ttft"))
    np.testing.assert_allclose(fitted, truth, rtol=0.03)


def test_either_latency_past_the_knee_is_lost_capacity(X) -> None:
    one = np.ones(X.shape[1])
    slow = np.full(X.shape[1], 1.7)
    # TTFT as a 1.7x slower replica shows it (waiting for a slot), TPOT as predicted
    ttft_only = fit_dilation(X, _dilated(X, one, "tpot"), _dilated(X, slow, "ttft"))
    tpot_only = fit_dilation(X, _dilated(X, slow, "tpot"), _dilated(X, one, "ttft"))
    np.testing.assert_allclose(ttft_only, 1.7, rtol=0.03)
    np.testing.assert_allclose(tpot_only, 1.7, rtol=0.03)
    # a TTFT left out (NaN: a client in another region) or not measured: TPOT decides
    for ttft in (np.full(3, np.nan), np.zeros(3)):
        alone = fit_dilation(X, _dilated(X, slow, "tpot"), ttft)
        np.testing.assert_allclose(alone, 1.7, rtol=0.03)
