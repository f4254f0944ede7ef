"""Predictor accuracy against the public measurements, and the calibration table's shape."""

from __future__ import annotations

import csv
import math

import pytest

from koi.catalog import Catalog, Interconnect, load_catalog
from koi.predictor.accuracy import CaseResult, accuracy_report, predict_cases
from koi.predictor.calibration import GROUPS, PRIORS, Calibration, load_calibration
from koi.predictor.measurements import Case, load_cases, measurements_path
from koi.space import Precision

IN_SCOPE_METRICS = {"output_throughput_tok_s", "total_throughput_tok_s", "tpot_ms", "ttft_ms"}
# the project's published accuracy targets (median absolute percentage error)
TARGETS = {"throughput": 0.15, "tpot": 0.20, "ttft": 0.35}


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def cases(cat: Catalog) -> list[Case]:
    return load_cases(catalog=cat)


@pytest.fixture(scope="module")
def report() -> tuple[list[CaseResult], dict[str, dict[str, float]]]:
    return accuracy_report()


def in_scope_rows() -> list[int]:
    """1-based data row numbers of the CSV rows the accuracy brief puts in scope."""
    with measurements_path().open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    keep = []
    for i, r in enumerate(rows, start=1):
        if (r["model_id"].strip() and r["accelerator_id"].strip()
                and r["input_len"].strip().isdigit() and r["output_len"].strip().isdigit()
                and r["tp"].strip().isdigit() and r["metric"].strip() in IN_SCOPE_METRICS):
            keep.append(i)
    return keep


def test_every_in_scope_row_is_a_case(cases: list[Case]) -> None:
    expected = in_scope_rows()
    assert len(expected) > 50
    assert len(cases) == len(expected)
    assert [c.row for c in cases] == expected


def test_cases_use_catalog_ids(cat: Catalog, cases: list[Case]) -> None:
    for case in cases:
        cat.model(case.config.model)
        cat.accelerator(case.config.accelerator)
        cat.engine(case.config.engine)
        assert case.value > 0, case.label


def test_every_case_has_a_finite_positive_prediction(cat: Catalog, cases: list[Case]) -> None:
    for result in predict_cases(cases, cat):
        assert math.isfinite(result.predicted) and result.predicted > 0, result.case.label


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_median_error_meets_the_published_target(
        report: tuple[list[CaseResult], dict[str, dict[str, float]]], kind: str) -> None:
    _, summary = report
    entry = summary[f"kind:{kind}"]
    assert entry["n"] >= 5
    assert entry["median_ape"] <= TARGETS[kind], (
        f"{kind}: median APE {entry['median_ape']:.1%} over {entry['n']:.0f} cases "
        f"exceeds the {TARGETS[kind]:.0%} target")


def test_calibration_has_no_per_row_keys(cat: Catalog) -> None:
    allowed = {
        "mem": set(cat.accelerators), "comp": set(cat.accelerators),
        "precision_comp": {p.value for p in Precision},
        "engine_mem": set(cat.engines), "engine_comp": set(cat.engines),
        "engine_ovh_base_ms": set(cat.engines), "engine_ovh_seq_us": set(cat.engines),
        "engine_ttft_ms": set(cat.engines),
        "link": {i.value for i in Interconnect},
        "global": set(PRIORS["global"]),
        "kernel_scale": set(cat.engines),
    }
    assert set(allowed) == set(GROUPS)
    for kernels in (False, True):
        _shared_factors_only(load_calibration(kernels=kernels), allowed)


def _shared_factors_only(cal: Calibration, allowed: dict[str, set[str]]) -> None:
    assert set(cal.factors) <= set(GROUPS)
    for group, table in cal.factors.items():
        for key, value in table.items():
            assert key in allowed[group], f"calibration {group}.{key} is not a shared factor"
            assert value > 0
