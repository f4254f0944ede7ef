"""Every policy runs on scenarios nobody wrote (issue 26, item 1): generated scenarios
(development seeds 0-999 only), any sample fraction, and jobs as thin as 0.01 req/s,
cut to their first ticks. A policy that raises in a tick is a failure here, not a
skipped tick: the bench used to die at tick 5 of an unseen scenario (a window in which
thinning keeps no request)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from koi.bench.runner import run_once
from koi.catalog import load_catalog
from koi.policies import policy_class, policy_names
from koi.rlm.settings import endpoint_configured
from koi.scenario import parse_scenario
from koi.scenario.generate import first_ticks, generate_scenario

CATALOG = load_catalog()
TICKS = 4
THIN_RPS = 0.01


def _thin(data: dict[str, Any]) -> dict[str, Any]:
    """Every rate- or diurnal-driven online job at ``THIN_RPS``: fewer than one arrival
    per tick, so most sampled windows hold no request at all."""
    jobs = []
    for job in data["jobs"]:
        arrival = dict(job.get("arrival", {}))
        for key in ("rate_rps", "mean_rps"):
            if key in arrival:
                arrival[key] = THIN_RPS
        jobs.append({**job, "arrival": arrival} if arrival else job)
    return {**data, "jobs": jobs}


def _policies() -> list:
    """Every policy; those that ask a language model only with an endpoint configured."""
    skip = pytest.mark.skip(reason="needs KOI_RLM_BASE_URL and KOI_RLM_MODEL")
    return [pytest.param(p, marks=skip)
            if policy_class(p).needs_model and not endpoint_configured() else p
            for p in policy_names()]


@pytest.mark.parametrize("policy", _policies())
# no shrinking: an example costs 10-27 CPU-s for the profiling policies, and a failure
# (a pytest-timeout included) shrunk with line tracing ran on for over 20 minutes on a
# loaded machine; the failing seed, fraction and thin are in the assertion's message
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(seed=st.integers(0, 999), fraction=st.floats(0.01, 1.0), thin=st.booleans())
def test_every_policy_runs_on_generated_scenarios(policy: str, seed: int, fraction: float,
                                                  thin: bool) -> None:
    data = first_ticks(generate_scenario(seed, "small", CATALOG), TICKS)
    assume(data["jobs"])  # every job of this one arrives after the first ticks
    scn = parse_scenario(_thin(data) if thin else data, catalog=CATALOG)
    result = run_once(scn, policy, seed=seed, sample_fraction=fraction, catalog=CATALOG)
    assert result.policy_failures == (), (seed, fraction, thin, result.policy_failures)
    assert result.record.horizon_s == TICKS * 60
