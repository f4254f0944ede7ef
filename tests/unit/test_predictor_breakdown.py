"""The held-out pass split: its parts add up to the pass the predictor times."""

from __future__ import annotations

import pytest

from koi.predictor import tables
from koi.predictor.breakdown import held_out_breakdown, markdown
from koi.predictor.measurements import load_cases


def test_kernel_parts_and_overhead_add_up_to_the_decode_pass() -> None:
    cases = load_cases()
    results = held_out_breakdown(kinds=("tpot",), cases=cases)
    got = {r.case.row: r for r in results}
    assert {27, 35} <= set(got)  # a TP1 and a TP4 TPOT row
    assert all(r.case.kind == "tpot" for r in results)
    for row in (27, 35):
        k = got[row].kernels
        assert set(k.parts) == set(tables.PARTS)
        assert sum(k.parts.values()) + k.overhead == pytest.approx(k.decode_pass, rel=1e-9)
        assert k.parts["gemm"] > 0 and k.parts["decode_attention"] > 0
        assert set(got[row].roofline.parts) == {"memory", "compute", "collectives"}
    assert got[27].kernels.parts["allreduce"] == 0.0   # TP1: nothing to reduce
    assert got[35].kernels.parts["allreduce"] > 0.0
    assert "| 35 |" in markdown(results)


def test_chosen_rows_are_predicted_by_a_fit_without_their_source() -> None:
    """Showing one row must not shrink the fit to that row's neighbours: the split is
    the same as in the full held-out run."""
    cases = load_cases()
    one = held_out_breakdown(rows=[35], cases=cases)
    assert [r.case.row for r in one] == [35]
    full = {r.case.row: r for r in held_out_breakdown(kinds=("tpot",), cases=cases)}
    assert one[0].kernels.predicted == pytest.approx(full[35].kernels.predicted, rel=1e-12)
