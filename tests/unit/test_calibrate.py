"""DRO calibration: the conformal radius, honest coverage, shrinking and growing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from koi.calibrate import DroCalibrator, conformal_radius


def feed(cal: DroCalibrator, rng: np.random.Generator, ticks: range, mean: float, sd: float,
         per_tick: int = 50) -> DroCalibrator:
    for t in ticks:
        cal = cal.update([{"tpot": float(r)} for r in rng.normal(mean, sd, per_tick)], t)
    return cal


def test_conformal_radius_hand_values() -> None:
    xs = [float(i) for i in range(1, 11)]
    assert conformal_radius(xs, 0.9, 0.5) == 10.0  # ⌈11·0.9⌉ = 10th of 10
    assert conformal_radius([float(i) for i in range(1, 20)], 0.9, 0.5) == 18.0
    assert conformal_radius([0.1, 0.2], 0.9, 0.5) == 0.5  # too few: the prior
    assert conformal_radius([0.1, 0.9], 0.9, 0.5) == 0.9  # ... or the largest seen
    assert conformal_radius([], 0.9, 0.5) == 0.5


def test_realised_coverage_is_near_target_on_stationary_noise() -> None:
    rng = np.random.default_rng(7)
    cal = feed(DroCalibrator(), rng, range(40), 0.0, 0.2)
    assert 0.85 <= cal.realised_coverage("tpot") <= 0.95
    # one-sided: the 90 % quantile of max(r, 0) for r ~ N(0, 0.2) is 1.2816 × 0.2
    assert cal.radius("tpot") == pytest.approx(1.2816 * 0.2, rel=0.2)
    assert math.isnan(cal.realised_coverage("ttft"))
    assert cal.radius("ttft") == cal.prior_radius
    assert cal.version == 40 and cal.tick == 39


def test_radius_shrinks_as_the_model_learns_and_grows_after_a_shift() -> None:
    rng = np.random.default_rng(11)
    cal = feed(DroCalibrator(), rng, range(10), 0.0, 0.2)
    wide = cal.radius("tpot")
    cal = feed(cal, rng, range(10, 20), 0.0, 0.05)
    narrow = cal.radius("tpot")
    assert narrow < wide / 2
    assert 0.85 <= cal.realised_coverage("tpot") <= 0.95
    cal = feed(cal, rng, range(20, 22), 0.5, 0.05)  # the world shifts
    assert cal.radius("tpot") > 0.4
    assert cal.realised_coverage("tpot") < 0.7  # the shift shows up as misses, honestly
    cal = feed(cal, rng, range(22, 30), 0.5, 0.05)
    assert cal.realised_coverage("tpot") > 0.85


def test_robust_prediction_is_the_worst_case_inside_the_radius() -> None:
    cal = DroCalibrator().update([{"tpot": 0.1, "throughput": -0.1}] * 20, 0)
    assert cal.radius("tpot") == pytest.approx(0.1)
    assert cal.robust("tpot", 20.0) == pytest.approx(20.0 * math.exp(0.1))
    assert cal.robust("throughput", 100.0) == pytest.approx(100.0 * math.exp(-0.1))


def test_only_the_adverse_side_widens_the_radius() -> None:
    # a latency below its prediction, or a throughput above it, costs a plan nothing
    good = DroCalibrator().update([{"tpot": -0.4, "throughput": 0.4}] * 20, 0)
    assert good.radius("tpot") == 0.0 and good.radius("throughput") == 0.0
    assert good.update([{"tpot": -0.4, "throughput": 0.4}], 1).hits["tpot"][-1] == 1
    bad = DroCalibrator().update([{"tpot": 0.4, "throughput": -0.4}] * 20, 0)
    assert bad.radius("tpot") == pytest.approx(0.4)
    assert bad.radius("throughput") == pytest.approx(0.4)
    # an outcome exactly at the robust bound is covered, one beyond it is not
    nxt = bad.update([{"tpot": 0.4}, {"tpot": 0.41}], 1)
    assert nxt.hits["tpot"][-2:] == (1, 0)


def test_residuals_are_judged_before_they_join() -> None:
    cal = DroCalibrator(prior_radius=0.2)
    cal = cal.update([{"ttft": 0.3}, {"ttft": 0.1}], 0)  # against the prior 0.2
    assert cal.hits["ttft"] == (0, 1)
    assert cal.residuals["ttft"] == (0.3, 0.1)


def test_guards_and_round_trip() -> None:
    cal = DroCalibrator(window=3).update([{"tpot": x} for x in (0.1, -0.2, 0.3, 0.4)], 2)
    assert cal.residuals["tpot"] == (-0.2, 0.3, 0.4)
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
    with pytest.raises(ValueError):
        cal.update([], 1)
    with pytest.raises(KeyError):
        cal.radius("goodput")
    with pytest.raises(ValueError):
        DroCalibrator(coverage=1.0)
    ignored = cal.update([{"tpot": float("nan"), "other": 1.0}], 3)
    assert ignored.residuals == cal.residuals
