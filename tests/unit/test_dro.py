"""DRO calibration: the conformal radius, honest coverage, shrinking and growing."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace

import numpy as np
import pytest

from koi.causal.observe import OutcomeObservation, log_residuals
from koi.causal.scope import Scope
from koi.dro import (
    MIN_SPREAD,
    POOL_WEIGHT,
    Z95,
    DroCalibrator,
    conformal_radius,
    miss_share,
    tail_spread,
)


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


def tpot_obs(tick: int, observed_ms: float, i: int = 0) -> OutcomeObservation:
    """A deployment whose TPOT was predicted at 20 ms."""
    return OutcomeObservation(deployment_id=f"d{i}", job_id="j", tick=tick,
                              scope=Scope(accelerator="h100", engine="vllm"),
                              predicted={"tpot_ms": 20.0}, observed={"tpot_ms": observed_ms},
                              weight=100.0)


def test_rescoring_measures_the_learnt_model_not_the_model_of_each_tick() -> None:
    # the world is 2x slower than predicted; the model learns that from the first tick
    rng = np.random.default_rng(3)
    bias = math.log(2.0)

    def learnt(o: OutcomeObservation) -> dict[str, float]:
        return {k: r - bias for k, r in log_residuals(o).items()}

    plain = rescored = DroCalibrator(coverage=0.5)
    for t in range(2):
        obs = [tpot_obs(t, 40.0 * math.exp(rng.normal(0.0, 0.05)), i) for i in range(20)]
        # tick 0 is planned on the raw prediction, later ticks on the learnt one
        batch = [log_residuals(o) if t == 0 else learnt(o) for o in obs]
        plain = plain.update(batch, t)
        rescored = rescored.update(batch, t, observations=obs, rescore=learnt)
    # without re-scoring, the tick-0 residuals (≈ log 2) still fill half the window, so
    # the plan would be shrunk ×2 again for an error the beliefs already correct
    assert rescored.radius("tpot") < 0.1 and plain.radius("tpot") > 0.5
    # tick 0 missed the prior's ×1.65 either way; tick 1 (judged before its own
    # learning, against the radius after tick 0) is over-covered by the stale window and
    # covered about as often as the 0.5 target by the re-scored one
    assert rescored.hits["tpot"][:20] == plain.hits["tpot"][:20] == (0,) * 20
    assert plain.hits["tpot"][20:] == (1,) * 20
    assert 0.2 <= sum(rescored.hits["tpot"][20:]) / 20 <= 0.8
    assert len(rescored.observations) == 40 and rescored.residuals["tpot"][0] < 0.2


def test_the_observation_window_keeps_the_last_window_and_round_trips() -> None:
    cal = DroCalibrator(window=3)
    obs = [tpot_obs(t, 20.0 + t, t) for t in range(5)]
    for t, o in enumerate(obs):
        cal = cal.update([log_residuals(o)], t, observations=[o], rescore=log_residuals)
    assert cal.observations == tuple(obs[-3:])
    assert cal.residuals["tpot"] == tuple(log_residuals(o)["tpot"] for o in obs[-3:])
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal


def test_a_calibrator_saved_before_observation_windows_still_loads() -> None:
    doc = {"format": "koi.calibrate/1", "coverage": 0.5, "window": 200, "prior_radius": 0.5,
           "outcomes": ["tpot"], "tick": 4, "version": 2, "residuals": {"tpot": [0.1, 0.3]},
           "hits": {"tpot": [1, 0]}}
    cal = DroCalibrator.from_bytes(zlib.compress(json.dumps(doc).encode()))
    assert cal.observations == () and cal.residuals["tpot"] == (0.1, 0.3)
    assert cal.radius("tpot") == 0.3  # the 2nd smallest of 2 at q = 0.5
    with pytest.raises(ValueError, match=r"not a koi\.calibrate"):
        DroCalibrator.from_bytes(zlib.compress(json.dumps({**doc, "format": "x"}).encode()))


def test_tail_spread_inverts_a_lognormal_mean_and_p95() -> None:
    for sigma in (0.1, 0.4, 0.9):
        mu = 2.0
        mean, p95 = math.exp(mu + sigma ** 2 / 2), math.exp(mu + Z95 * sigma)
        assert tail_spread(mean, p95) == pytest.approx(sigma, rel=1e-9)
    assert tail_spread(10.0, 10.0) == MIN_SPREAD          # no visible tail: the floor
    assert tail_spread(1.0, 100.0) == pytest.approx(Z95)  # heavier than any lognormal
    assert math.isnan(tail_spread(0.0, 5.0))


def test_miss_share_is_five_percent_when_the_margin_equals_the_error() -> None:
    # a tick whose p95 came out 0.3 above its prediction: planned 0.3 above, its p95
    # lands on the SLO and 5 % of requests miss it; more margin, fewer; less, more
    assert miss_share(0.3, 0.5, 0.3) == pytest.approx(0.05, abs=1e-9)
    assert miss_share(0.3, 0.5, 0.6) < 0.05 < miss_share(0.3, 0.5, 0.0)
    # monte carlo: lognormal requests whose p95 sits e^0.2 above the SLO
    rng = np.random.default_rng(0)
    sigma, mu = 0.4, 0.0
    lat = np.exp(rng.normal(mu, sigma, 200_000))
    slo = math.exp(mu + Z95 * sigma - 0.2)
    assert miss_share(0.2, sigma, 0.0) == pytest.approx(float(np.mean(lat > slo)), abs=0.003)


def spread_obs(tick: int, p95_ms: float, i: int = 0) -> OutcomeObservation:
    """TTFT and TPOT p95 predicted at 100 / 20 ms; observed p95 with mean p95 / 1.5."""
    return OutcomeObservation(
        deployment_id=f"d{i}", job_id="j", tick=tick, scope=Scope(accelerator="h100"),
        predicted={"ttft_p95_ms": 100.0, "tpot_p95_ms": 20.0},
        observed={"ttft_ms": p95_ms / 1.5, "ttft_p95_ms": p95_ms, "tpot_ms": 10.0,
                  "tpot_p95_ms": 20.0}, weight=10.0)


def test_slo_risk_falls_with_the_margin_and_needs_spreads() -> None:
    obs = [spread_obs(0, 100.0 * math.exp(e), i) for i, e in enumerate((-0.2, 0.0, 0.4))]
    res = [log_residuals(o) for o in obs]
    cal = DroCalibrator(coverage=0.5).update(res, 0, observations=obs, rescore=log_residuals)
    sigma = tail_spread(1.0, 1.5)
    assert cal.spreads["ttft_p95"] == pytest.approx((sigma,) * 3)
    risks = [cal.slo_risk("ttft_p95", r) for r in (0.0, 0.2, 0.5, 1.0)]
    assert risks == sorted(risks, reverse=True) and risks[-1] < 0.01 < risks[0]
    assert risks[0] == pytest.approx(np.mean([miss_share(e, sigma, 0.0)
                                              for e in (-0.2, 0.0, 0.4)]))
    # TPOT came out exactly as predicted on every tick: 5 % at margin 0
    assert cal.slo_risk("tpot_p95", 0.0) == pytest.approx(0.05, abs=1e-6)
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
    # residuals alone (no observations to read spreads from): the risk is unknown
    assert DroCalibrator().update(res, 0).slo_risk("ttft_p95", 0.0) is None
    # a calibrator's other coverage targets: the radius it would have there
    assert cal.radius_at("ttft_p95", 0.95) == pytest.approx(0.5)  # rank > n: the prior
    assert cal.radius_at("ttft_p95", 0.5) == cal.radius("ttft_p95")


def test_a_jobs_own_ticks_set_its_risk_shrunk_towards_everyones() -> None:
    # "calm" came out as predicted on 30 ticks, "bursty" 0.5 above on 10
    calm = [spread_obs(0, 100.0, i) for i in range(30)]
    bursty = [replace(spread_obs(0, 100.0 * math.exp(0.5), 100 + i), job_id="bursty")
              for i in range(10)]
    obs = [replace(o, job_id="calm") for o in calm] + bursty
    cal = DroCalibrator(coverage=0.5).update([log_residuals(o) for o in obs], 0,
                                             observations=obs, rescore=log_residuals)
    pooled = cal.slo_risk("ttft_p95", 0.0)
    mine = cal.slo_risk("ttft_p95", 0.0, job="bursty")
    calm_risk = cal.slo_risk("ttft_p95", 0.0, job="calm")
    sigma = tail_spread(1.0, 1.5)
    own = miss_share(0.5, sigma, 0.0)
    assert mine == pytest.approx((10 * own + POOL_WEIGHT * pooled) / (10 + POOL_WEIGHT))
    assert calm_risk < pooled < mine < own
    assert cal.slo_risk("ttft_p95", 0.0, job="new") == pytest.approx(pooled)  # no ticks
    # its margins: at 0.8 coverage its own residuals (rank 9 of 10) say 0.5, everyone's 0.5
    # only for the top fifth; at 0.95 it has too few for the rank: everyone's
    assert cal.radius_at("ttft_p95", 0.8, job="bursty") == pytest.approx(0.5)
    assert cal.radius_at("ttft_p95", 0.8, job="calm") == pytest.approx(0.0)
    assert cal.radius_at("ttft_p95", 0.95, job="bursty") == cal.radius_at("ttft_p95", 0.95)
    assert DroCalibrator.from_bytes(cal.to_bytes()) == cal
