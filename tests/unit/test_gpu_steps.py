"""GPU step times against the predictor's roofline (`koi.predictor.steps`, `koi bench steps`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from koi.catalog import load_catalog
from koi.cli.main import app
from koi.predictor.calibration import load_calibration
from koi.predictor.features import build_inputs
from koi.predictor.reference import pass_time
from koi.predictor.steps import StepsFileError, compare_steps, read_steps, step_config
from koi.predictor.types import Workload

CTX = 1024


def step_row(pass_s: float, **changes: object) -> dict:
    row = {"model": "llama-3.1-8b", "tp": 1, "phase": "decode", "batch": 1, "ctx": CTX,
           "tokens": 1, "layer_s": 0.0, "head_s": 0.0, "pass_s": pass_s}
    return {**row, **changes}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def three_runs(tmp_path: Path) -> Path:
    """One decode point measured three times (median 6.2 ms, mean 6.27 ms)."""
    runs = [{"env": {"device": "NVIDIA H200", "copy_bytes_per_s": bw}, "rows": [step_row(t)]}
            for t, bw in ((6.0e-3, 2.0e12), (6.6e-3, 4.0e12), (6.2e-3, 3.0e12))]
    return write(tmp_path, {"about": "test", "runs": runs})


def test_decode_b1_is_the_roofline_computed_by_hand(three_runs: Path) -> None:
    cal = load_calibration()
    eff_mem, eff_comp = cal.eff_mem("h200", "trtllm"), cal.eff_comp("h200", "bf16", "trtllm")
    attn_mem, serial = cal.global_("attn_mem"), cal.global_("serial_frac")
    # llama-3.1-8b, bf16, one GPU: every weight is read once; the KV cache of 1024
    # tokens × 32 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes
    weights = 8.03e9 * 2
    kv = CTX * 32 * 8 * 128 * 2 * 2
    flops = 2 * 8.03e9 + CTX * 4 * 32 * 32 * 128
    t_mem = (weights + kv / attn_mem) / (4.8e12 * eff_mem)
    t_comp = flops / (989e12 * eff_comp)
    by_hand = max(t_mem, t_comp) + serial * min(t_mem, t_comp)

    (row,) = compare_steps(three_runs).rows
    assert row.predicted_s == pytest.approx(by_hand, rel=1e-9)
    assert row.bound == "memory"
    assert row.mem_share == pytest.approx((weights + kv) / (4.8e12 * 6.2e-3), rel=1e-9)
    assert row.comp_share == pytest.approx(flops / (989e12 * 6.2e-3), rel=1e-9)

    # the same as the predictor's whole pass less its engine overhead (no collectives at tp1)
    cat = load_catalog()
    X = build_inputs([(step_config("llama-3.1-8b", 1, "h200", cat), Workload(CTX, 1))], cat,
                     cal)
    one = np.ones(1)
    total, _, _, t_comm = pass_time(X, one, 0 * one, CTX * one, 0 * one)
    ovh_base, ovh_seq = cal.overhead_s("trtllm")
    assert t_comm[0] == 0.0
    assert row.predicted_s == pytest.approx(total[0] - ovh_base - ovh_seq, rel=1e-9)


def test_the_median_over_runs_is_compared(three_runs: Path) -> None:
    comparison = compare_steps(three_runs)
    (row,) = comparison.rows
    assert row.runs == 3
    assert row.measured_s == pytest.approx(6.2e-3)
    assert row.ratio == pytest.approx(row.predicted_s / 6.2e-3)
    assert row.run_spread == pytest.approx(0.6e-3 / 6.2e-3)
    assert comparison.summary.copy_bytes_per_s == pytest.approx(3.0e12)
    assert comparison.summary.ratio["decode b ≤ 8"].n == 1
    assert comparison.summary.ratio["prefill"] is None


def test_a_single_run_file_as_the_script_writes_it(tmp_path: Path) -> None:
    rows = [step_row(6.0e-3), step_row(0.11, phase="prefill", ctx=4096, tokens=4096)]
    path = write(tmp_path, {"env": {"device": "NVIDIA H200"}, "rows": rows})
    envs, measured = read_steps(path)
    assert len(envs) == 1
    assert [m.pass_s for m in measured] == [(6.0e-3,), (0.11,)]
    prefill = compare_steps(path).rows[1]
    assert prefill.bound == "compute"
    assert compare_steps(path).summary.comp_share.n == 1


def test_the_shipped_h200_runs_compare_in_full() -> None:
    comparison = compare_steps()
    assert comparison.summary.runs == 3
    assert len(comparison.rows) == 88
    assert all(r.runs == 3 and 0 < r.ratio < 10 for r in comparison.rows)
    assert {g for g, s in comparison.summary.ratio.items() if s is not None} == {
        "decode b ≤ 8", "decode b ≥ 64", "prefill"}


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not a readable JSON file"),
    ({"about": "x"}, "expected {env, rows}"),
    ({"runs": [{"env": {}, "rows": []}]}, "run 0 has no rows"),
    ({"env": {}, "rows": [{"model": "llama-3.1-8b"}]}, "missing tp, phase"),
    ({"env": {}, "rows": [step_row(-1.0)]}, "pass_s must be a positive"),
    ({"env": {}, "rows": [step_row(1e-3, phase="train")]}, "phase 'train'"),
    ({"env": {}, "rows": [step_row(1e-3, batch=0)]}, "batch must be a positive integer"),
    ({"env": {}, "rows": [step_row(1e-3, model="no-such-model")]}, "no-such-model tp1"),
])
def test_a_malformed_file_says_what_is_wrong(tmp_path: Path, content: object,
                                             message: str) -> None:
    path = tmp_path / "steps.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(StepsFileError, match=r"steps\.json") as err:
        compare_steps(path)
    assert message in str(err.value)


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(StepsFileError, match=r"no such file.*scripts/gpu_steps\.py"):
        compare_steps(tmp_path / "absent.json")


def test_cli_prints_the_summary_and_the_points(three_runs: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "steps", "--file", str(three_runs), "--markdown",
                                      "--rows"])
    assert result.exit_code == 0, result.output
    assert "| decode b ≤ 8 |" in result.stdout
    assert "| llama-3.1-8b | 1 | decode | 1 | 1024 | 6.200 |" in result.stdout
    assert "eff_mem" in result.stdout


def test_cli_exits_2_on_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "steps", "--file", str(tmp_path / "no.json")])
    assert result.exit_code == 2
    assert "no such file" in " ".join(result.output.split())  # rich wraps long lines
