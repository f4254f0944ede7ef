"""Pass-time multipliers: scaling the model's passes, inverting it from telemetry, and the
causal store learning (and re-scoring) online observations through the inversion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koi.catalog import load_catalog
from koi.causal import BeliefStore, OutcomeObservation, scope_of
from koi.causal.observe import log_residuals, pass_residual
from koi.dro import DroCalibrator
from koi.predictor.api import evaluate_matrix
from koi.predictor.columns import IN, OUT
from koi.predictor.features import build_inputs
from koi.predictor.passes import LOG_GRID, pass_curves, scale_passes, solve
from koi.predictor.reference import pass_time
from koi.predictor.types import LoadMode, Workload
from koi.space import engine_default_config

CAT = load_catalog()
# 6,000-token prompts on one L4 at two loads (the second near the queue bound), a chat
# load on an H100 tp4 (collectives in the pass)
CASES = [("llama-3.1-8b", "l4", 1, 6000, 200, 0.05), ("llama-3.1-8b", "l4", 1, 6000, 200, 0.08),
         ("llama-3.1-70b", "h100-sxm", 4, 1200, 211, 2.0)]


def run(X: np.ndarray) -> np.ndarray:
    return evaluate_matrix(X, backend="numpy")


def inputs() -> tuple[list, np.ndarray]:
    pairs = [(engine_default_config(m, a, "vllm", CAT, tp=tp),
              Workload(input_len=i, output_len=o, mode=LoadMode.RATE, load=r))
             for m, a, tp, i, o, r in CASES]
    return pairs, build_inputs(pairs, CAT)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.3, 3.0), st.floats(1.0, 256.0), st.floats(0.0, 4096.0))
def test_scaling_multiplies_every_pass_by_the_multiplier(pm: float, b: float, p: float) -> None:
    _, X = inputs()
    n = X.shape[1]
    args = (np.full(n, b), np.full(n, p), np.full(n, 1500.0), np.full(n, p / 2))
    total, t_mem, t_comp, t_comm = pass_time(X, *args)
    scaled = pass_time(scale_passes(X, pm), *args)
    for got, want in zip(scaled, (total, t_mem, t_comp, t_comm), strict=True):
        assert got == pytest.approx(pm * want, rel=1e-9)
    # a request's fixed TTFT overhead is not part of a pass
    assert np.array_equal(scale_passes(X, pm)[IN["ttft_ovh"]], X[IN["ttft_ovh"]])


@pytest.mark.parametrize("pm", [0.6, 0.8, 1.0, 1.4, 2.2])
def test_inverting_the_model_recovers_the_pass_of_a_world(pm: float) -> None:
    """Telemetry of a world whose passes take pm× the model's: the TPOT curve meets the
    observed mean within 3 % of pm, and the TTFT curve there predicts the world's TTFT."""
    _, X = inputs()
    world = run(scale_passes(X, pm))
    curves = pass_curves(X, run)
    for j in range(X.shape[1]):
        if world[OUT["queue_util"], j] >= 1.0:
            continue  # an overloaded world: its steady state is not a TPOT (CAUSAL.md §8)
        theta, slope = solve(curves["tpot"][j], math.log(world[OUT["tpot"], j] * 1e3))
        assert math.exp(theta) == pytest.approx(pm, rel=0.03), j
        assert slope > 0.5
        if pm > 1.5:
            continue  # 6,000-token prompts at ×2.2 fill the L4's slots: TTFT steps there
        ttft = np.interp(theta, LOG_GRID, curves["ttft"][j])
        assert ttft == pytest.approx(math.log(world[OUT["ttft"], j] * 1e3), abs=0.1), j


def test_solve_meets_the_nearer_end_outside_the_curve_and_reads_flat_as_no_slope() -> None:
    curve = np.linspace(1.0, 3.0, len(LOG_GRID))
    assert solve(curve, 0.0)[0] == pytest.approx(LOG_GRID[0])
    assert solve(curve, 9.0)[0] == pytest.approx(LOG_GRID[-1])
    assert solve(curve, 2.0)[0] == pytest.approx(0.0, abs=1e-12)
    assert solve(np.ones(len(LOG_GRID)), 1.0)[1] == 0.0


def online_obs(pm: float, ttft_extra: float = 1.0, tick: int = 1) -> OutcomeObservation:
    """The third case's deployment (a 70B on H100 tp4) observed in a world whose
    passes take pm× the model's and whose TTFT is ``ttft_extra``× on top, with curves."""
    pairs, X = inputs()
    X = X[:, 2:3]
    world, raw = run(scale_passes(X, pm)), run(X)
    keys = {"ttft_ms": "ttft", "ttft_p95_ms": "ttft_p95", "tpot_ms": "tpot",
            "tpot_p95_ms": "tpot_p95"}
    observed = {k: float(world[OUT[c], 0]) * 1e3 * (ttft_extra if "ttft" in k else 1.0)
                for k, c in keys.items()}
    predicted = {k: float(raw[OUT[c], 0]) * 1e3 for k, c in keys.items()}
    predicted["queue_util"] = float(raw[OUT["queue_util"], 0])
    curves = pass_curves(X, run)
    return OutcomeObservation("d1", "chat", tick, scope_of(pairs[2][0], CAT), predicted,
                              observed, weight=500.0,
                              curves={o: tuple(c[0]) for o, c in curves.items()})


def test_the_store_learns_the_pass_and_ttft_beyond_it_and_its_residuals_fall() -> None:
    """A world with passes ×1.25 and TTFT ×1.2 beyond what they explain: the store
    learns the pass from TPOT and TTFT's rest, both on the base regime's edges (what an
    online candidate reads), and the re-scored residuals of the same observation fall to
    near zero."""
    obs = online_obs(1.25, ttft_extra=1.2)
    raw = log_residuals(obs)
    assert raw["ttft"] > 0.3
    theta, slope = pass_residual(obs)
    assert math.exp(theta) == pytest.approx(1.25, rel=0.03) and slope > 0.5
    store = BeliefStore()
    for t in range(1, 15):
        store = store.update([obs], t)
    after = store.corrected_residuals(obs)
    assert abs(after["ttft"]) < 0.05 and abs(after["tpot"]) < 0.05
    online = store.online_correction(obs.scope)
    assert online["pass"] == pytest.approx(1.25, rel=0.05)
    assert online["ttft"] == pytest.approx(1.2, rel=0.05)
    assert store.belief(("queue_util", "ttft"), obs.scope) is None
    assert store.belief(("compute_util", "ttft"), obs.scope) is not None


def test_online_observations_with_curves_survive_the_calibrators_bytes() -> None:
    obs = online_obs(1.2)
    cal = DroCalibrator().update([log_residuals(obs)], 1, observations=[obs],
                                 rescore=log_residuals)
    back = DroCalibrator.from_bytes(cal.to_bytes())
    assert back == cal and back.observations[0].curves == obs.curves
