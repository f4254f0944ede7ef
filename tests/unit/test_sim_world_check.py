"""The world against the public measurements, and the error thinning adds."""

from __future__ import annotations

import pytest

from koi.sim import check_world, thinning_error
from koi.sim.testing import FixedPolicy, online_job, tiny_scenario
from koi.sim.world_check import ape_summary, load_rows


def test_measurement_rows_parse_load_modes() -> None:
    rows = load_rows()
    modes = {r.mode for r in rows}
    assert {"saturate", "poisson", "burst", "closed", "static"} <= modes
    assert len(rows) >= 60


@pytest.mark.slow
def test_world_matches_measurements_within_20_percent_median() -> None:
    res = check_world()
    assert len(res) >= 60
    summary = ape_summary(res)
    assert summary["overall"] <= 0.20, summary


@pytest.mark.slow
def test_thinning_error_is_small_on_a_small_scenario() -> None:
    sc = tiny_scenario([online_job("a", rate=12), online_job("b", rate=6, inp=1500, out=300)],
                       horizon_s=1200)
    err = thinning_error(sc, lambda: FixedPolicy(["aws/us-east-1/h100-sxm/on_demand"],
                                                 replicas=2), seeds=(0,), fraction=0.25)
    assert err["jobs_compared"] == 2
    assert err["throughput"] < 0.1
    assert err["ttft_met"] < 0.1 and err["tpot_met"] < 0.1
