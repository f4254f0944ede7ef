"""DRO calibration: the conformal radius, honest coverage, shrinking and growing."""

from __future__ import annotations

import json
import math
import zlib

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
    assert cal.radius("tpot") == pytest.approx(1.645 * 0.2, rel=0.2)
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


def test_each_group_gets_its_own_radius_and_coverage_holds() -> None:
    # a steady job (σ 0.05) and a volatile one (σ 0.5) share the pooled window
    rng = np.random.default_rng(3)
    cal = DroCalibrator()
    for t in range(60):
        steady, volatile = rng.normal(0.0, 0.05, 5), rng.normal(0.0, 0.5, 5)
        cal = cal.update([{"ttft": float(r)} for r in (*steady, *volatile)], t,
                         ["steady"] * 5 + ["volatile"] * 5)
    assert cal.radius("ttft", "steady") == pytest.approx(1.645 * 0.05, rel=0.3)
    assert cal.radius("ttft", "volatile") == pytest.approx(1.645 * 0.5, rel=0.3)
    pooled = cal.radius("ttft")
    assert cal.radius("ttft", "steady") < pooled < cal.radius("ttft", "volatile")
    assert cal.radius("ttft", "new-job") == pooled  # no evidence of its own: the pool
    # each residual was judged against the radius its group had then
    assert 0.85 <= cal.realised_coverage("ttft") <= 0.95
    assert cal.radii("steady")["ttft"] == cal.radius("ttft", "steady")


def test_a_group_needs_enough_residuals_for_the_conformal_rank() -> None:
    cal = DroCalibrator().update([{"tpot": 0.3}] * 20, 0)  # pooled: 0.3
    few = cal.update([{"tpot": 0.01}] * 8, 1, ["j"] * 8)
    assert few.radius("tpot", "j") == few.radius("tpot")  # 8 < 9 at q = 0.9
    enough = few.update([{"tpot": 0.01}], 2, ["j"])
    assert enough.radius("tpot", "j") == pytest.approx(0.01)


def test_groups_are_forgotten_after_their_ttl_and_round_trip() -> None:
    cal = DroCalibrator(group_ttl=5).update([{"tpot": 0.1}] * 10, 0, ["old"] * 10)
    cal = cal.update([{"tpot": 0.2}], 5, ["new"])
    assert set(cal.group_residuals) == {"old", "new"}
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
    cal = cal.update([{"tpot": 0.2}], 6, ["new"])
    assert set(cal.group_residuals) == {"new"} and set(cal.group_seen) == {"new"}
    with pytest.raises(ValueError, match="groups for"):
        cal.update([{"tpot": 0.1}], 7, ["a", "b"])


def test_documents_from_before_groups_still_load() -> None:
    cal = DroCalibrator().update([{"tpot": 0.1}] * 3, 0)
    doc = json.loads(zlib.decompress(cal.to_bytes()))
    for key in ("group_window", "group_ttl", "group_residuals", "group_seen"):
        doc.pop(key)
    old = zlib.compress(json.dumps(doc).encode())
    assert DroCalibrator.from_bytes(old) == cal
