"""Tests for koi.bench.stats: paired differences, the bootstrap interval and verdicts.

Small hand-made ``runs.jsonl`` records with known differences pin the mean, the win rate
(a tie counts one half), dropped pairs and the verdicts; a hypothesis property checks that
the interval always contains the sample mean.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koi.bench.stats import (
    ALL_SCENARIOS,
    POWER,
    bootstrap_ci,
    compare,
    format_comparisons,
    format_power,
    metric_value,
    min_detectable_difference,
    paired_differences,
    pairs_for_mde,
    power_table,
)


def rec(policy: str, seed: int, score: float | None, scenario: str = "a",
        **metrics: Any) -> dict[str, Any]:
    """One ``runs.jsonl`` object, shaped as ``koi.bench.report.run_json`` writes it."""
    return {"scenario": scenario, "policy": policy, "seed": seed, "wall_s": 1.0,
            "metrics": {"overall_score": score, **metrics}}


def runs(policy: str, scores: list[float | None], scenario: str = "a",
         first_seed: int = 1) -> list[dict[str, Any]]:
    return [rec(policy, first_seed + i, s, scenario) for i, s in enumerate(scores)]


# --- pairing -----------------------------------------------------------------------------

def test_metric_value_reads_aliases_nested_terms_and_nulls() -> None:
    r = rec("koi", 1, 70.0, cost_per_token_usd=None, score_terms={"batch_progress": 0.5})
    assert metric_value(r, "score") == 70.0
    assert metric_value(r, "score_terms.batch_progress") == 0.5
    assert metric_value(r, "wall_s") == 1.0
    assert metric_value(r, "cost_per_token_usd") is None
    with pytest.raises(KeyError):
        metric_value(r, "scroe")


def test_paired_differences_are_reference_minus_policy_in_seed_order() -> None:
    records = runs("koi", [10.0, 20.0, 30.0]) + runs("fcfs", [8.0, 20.0, 25.0])
    p = paired_differences(records)["fcfs"]
    assert p.keys == (("a", 1), ("a", 2), ("a", 3))
    assert p.diffs == (2.0, 0.0, 5.0)
    assert p.dropped == 0


def test_missing_and_null_pairs_are_dropped_and_counted() -> None:
    records = runs("koi", [10.0, 20.0, 30.0]) + runs("fcfs", [15.0, None, 40.0], first_seed=2)
    p = paired_differences(records)["fcfs"]
    assert p.keys == (("a", 2),)
    assert p.diffs == (5.0,)
    assert (p.only_reference, p.only_policy, p.not_finite, p.dropped) == (1, 1, 1, 3)


def test_a_run_recorded_twice_or_no_reference_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        paired_differences(runs("koi", [1.0]) * 2)
    with pytest.raises(ValueError, match="reference"):
        paired_differences(runs("fcfs", [1.0]))


# --- the interval ------------------------------------------------------------------------

def test_interval_contains_the_mean_and_narrows_with_more_pairs() -> None:
    rng = np.random.default_rng(7)
    widths = []
    for n in (10, 1000):
        d = rng.normal(1.0, 1.0, n)
        low, high = bootstrap_ci(d)
        assert low < float(np.mean(d)) < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 4   # ~ 1/√n: a tenfold narrowing expected


def test_constant_difference_gives_a_zero_width_interval_at_that_value() -> None:
    assert bootstrap_ci([0.1] * 7) == (0.1, 0.1)
    assert bootstrap_ci([-3.5]) == (-3.5, -3.5)


def test_interval_is_deterministic_given_the_seed() -> None:
    d = [0.3, -1.2, 2.5, 0.7, 1.1, -0.4]
    assert bootstrap_ci(d, seed=3) == bootstrap_ci(d, seed=3)
    assert bootstrap_ci(d, seed=3) != bootstrap_ci(d, seed=4)


def test_interval_rejects_empty_and_non_finite_input() -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, math.nan])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], confidence=1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2,
                max_size=40))
def test_interval_always_contains_the_sample_mean(diffs: list[float]) -> None:
    low, high = bootstrap_ci(diffs, resamples=2000)
    # the module's mean: exact for a constant sample, else correctly rounded sum ÷ n
    mean = diffs[0] if len(set(diffs)) == 1 else math.fsum(diffs) / len(diffs)
    assert low <= mean <= high


# --- comparisons and verdicts ------------------------------------------------------------

def test_compare_gives_mean_win_rate_with_a_tie_and_interval() -> None:
    records = runs("koi", [10.0, 20.0, 30.0]) + runs("fcfs", [8.0, 20.0, 25.0])
    [c] = compare(records)
    assert (c.scenario, c.policy, c.reference, c.metric, c.n) == (ALL_SCENARIOS, "fcfs",
                                                                   "koi", "score", 3)
    assert c.mean_diff == pytest.approx(7.0 / 3.0)
    assert c.win_rate == pytest.approx(2.5 / 3.0)
    assert c.ci_low <= c.mean_diff <= c.ci_high
    assert c.ci_low >= 0.0 and c.ci_high <= 5.0


def test_verdicts_better_worse_and_no_difference() -> None:
    records = (runs("koi", [50.0] * 5) + runs("low", [45.0, 44.0, 46.0, 43.0, 45.5])
               + runs("high", [55.0, 56.0, 54.0, 57.0, 55.5])
               + runs("mixed", [49.0, 51.0, 48.0, 52.0, 49.5]))
    verdicts = {c.policy: c.verdict for c in compare(records)}
    assert verdicts == {"low": "better", "high": "worse", "mixed": "no difference"}
    mixed = next(c for c in compare(records) if c.policy == "mixed")
    assert mixed.ci_low < 0.0 < mixed.ci_high


def test_lower_is_better_metrics_flip_the_verdict_and_win_rate() -> None:
    records = [rec("koi", s, 0.0, cost_per_token_usd=1.0) for s in (1, 2, 3)]
    records += [rec("fcfs", s, 0.0, cost_per_token_usd=2.0 + s) for s in (1, 2, 3)]
    [c] = compare(records, metric="cost_per_token_usd")
    assert c.mean_diff == pytest.approx(-3.0)
    assert (c.higher_is_better, c.win_rate, c.verdict) == (False, 1.0, "better")


def test_compare_by_scenario_gives_one_row_per_scenario() -> None:
    records = (runs("koi", [10.0, 10.0], "a") + runs("fcfs", [5.0, 5.0], "a")
               + runs("koi", [10.0, 10.0], "b") + runs("fcfs", [15.0, 15.0], "b")
               + runs("fcfs", [1.0], "c"))  # no reference run: skipped
    rows = compare(records, by_scenario=True)
    assert [(c.scenario, c.mean_diff, c.verdict) for c in rows] == [
        ("a", 5.0, "better"), ("b", -5.0, "worse")]
    [pooled] = compare(records[:8])
    assert (pooled.n, pooled.mean_diff, pooled.verdict) == (4, 0.0, "no difference")


def test_a_policy_without_pairs_gets_nan_and_no_difference() -> None:
    [c] = compare(runs("koi", [1.0]) + runs("fcfs", [1.0], first_seed=9))
    assert (c.n, c.verdict, c.dropped) == (0, "no difference", 2)
    assert math.isnan(c.mean_diff) and math.isnan(c.win_rate)


# --- rendering ---------------------------------------------------------------------------

def test_format_comparisons_renders_a_markdown_table() -> None:
    records = runs("koi", [10.0, 12.0]) + runs("fcfs", [8.0, 10.0])
    text = format_comparisons(compare(records))
    assert text.splitlines()[1:] == [
        "| policy | pairs | mean Δ (ref − policy) | 95 % CI | MDE (80 % power) | win rate "
        "| verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
        "| fcfs | 2 | 2 | [2, 2] | 0 | 100 % | better |",
    ]
    assert text.startswith("<!-- score: reference koi")
    assert format_comparisons([]) == ""


# --- power ---------------------------------------------------------------------------------

def test_min_detectable_difference_has_the_power_it_claims() -> None:
    """A true mean of exactly the MDE (for the population's sd) is found by the paired
    t-test at about ``POWER``: the noncentral t distribution's exact power."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    for n, sd in ((6, 1.0), (12, 3.0), (40, 0.5)):
        z = student_t.ppf(0.975, n - 1) + student_t.ppf(POWER, n - 1)
        delta = z * sd / math.sqrt(n)            # the formula, with the true sd
        crit = student_t.ppf(0.975, n - 1)
        power = nct.sf(crit, n - 1, delta * math.sqrt(n) / sd)
        assert 0.75 <= power <= 0.85, (n, power)


def test_min_detectable_difference_scales_with_spread_and_pairs() -> None:
    rng = np.random.default_rng(3)
    d = rng.normal(0.0, 2.0, 48)
    assert min_detectable_difference(d[:12]) > min_detectable_difference(d)  # more pairs
    assert min_detectable_difference(2 * d) == pytest.approx(2 * min_detectable_difference(d))
    assert math.isnan(min_detectable_difference([1.0]))
    assert min_detectable_difference([1.0, 1.0, 1.0]) == 0.0


def test_comparisons_carry_their_mde() -> None:
    records = runs("koi", [10.0, 12.0, 9.0, 14.0]) + runs("fcfs", [8.0, 10.0, 10.0, 9.0])
    [c] = compare(records)
    assert c.mde == pytest.approx(min_detectable_difference([2.0, 2.0, -1.0, 5.0]))


def test_pairs_for_mde_is_the_first_n_that_reaches_the_target() -> None:
    from scipy.stats import t as student_t

    def mde(n: int, sd: float) -> float:
        return (student_t.ppf(0.975, n - 1) + student_t.ppf(POWER, n - 1)) * sd / math.sqrt(n)

    for sd in (0.5, 1.84, 4.9, 17.7):
        n = pairs_for_mde(sd, 1.0)
        assert n is not None and mde(n, sd) <= 1.0
        assert n == 2 or mde(n - 1, sd) > 1.0
    assert pairs_for_mde(0.0, 1.0) == 2
    assert pairs_for_mde(1e6, 1.0, most=1000) is None
    with pytest.raises(ValueError):
        pairs_for_mde(1.0, 0.0)


def test_power_table_per_policy() -> None:
    records = runs("koi", [10.0, 12.0, 9.0, 14.0]) + runs("fcfs", [8.0, 10.0, 10.0, 9.0])
    [row] = power_table(records, target=1.0)
    assert (row.policy, row.n) == ("fcfs", 4)
    assert row.sd == pytest.approx(np.std([2.0, 2.0, -1.0, 5.0], ddof=1))
    assert row.pairs_needed == pairs_for_mde(row.sd, 1.0)
    assert "| fcfs | 4 |" in format_power([row])
