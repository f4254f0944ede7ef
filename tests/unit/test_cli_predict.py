"""`koi predict`: JSON keys, error exits, capping, replicas and --batch JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from koi.cli.main import app

REQUIRED = {"ttft_ms", "tpot_ms", "output_throughput_tok_s", "total_throughput_tok_s",
            "kv_pressure", "comm_overhead_frac", "cost_per_mtok_usd", "mediators"}
BASE = ["predict", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm",
        "--input-len", "512", "--output-len", "128"]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


def run_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, [*BASE, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_has_the_documented_keys(runner: CliRunner) -> None:
    out = run_json(runner, "--rate", "4")
    assert set(out) >= REQUIRED
    assert set(out["mediators"]) >= {"kv_pressure", "comm_overhead_frac", "compute_util",
                                     "membw_util", "queue_util", "batch_efficiency",
                                     "memory_headroom"}
    assert out["output_throughput_tok_s"] == pytest.approx(4 * 128, rel=0.01)


def test_impossible_config_exits_nonzero_with_reason_on_stderr(runner: CliRunner) -> None:
    result = runner.invoke(app, ["predict", "--model", "llama-3.1-405b", "--accelerator",
                                 "h100-sxm", "--input-len", "100", "--output-len", "10"])
    assert result.exit_code != 0
    assert "GB" in result.stderr and "tp" in result.stderr
    fp8 = runner.invoke(app, ["predict", "--model", "llama-3.1-8b", "--accelerator",
                              "a100-80gb", "--precision", "fp8", "--input-len", "100",
                              "--output-len", "10"])
    assert fp8.exit_code != 0 and "weight_precision" in fp8.stderr


def test_rate_and_concurrency_together_are_refused(runner: CliRunner) -> None:
    result = runner.invoke(app, [*BASE, "--rate", "1", "--concurrency", "4"])
    assert result.exit_code == 2
    assert "at most one" in result.stderr


def test_concurrency_beyond_capacity_is_capped(runner: CliRunner) -> None:
    capped = run_json(runner, "--concurrency", "100000", "--set", "max_num_seqs=64")
    at_cap = run_json(runner, "--concurrency", "64", "--set", "max_num_seqs=64")
    assert capped["batch_size"] == pytest.approx(64)
    assert capped["output_throughput_tok_s"] == pytest.approx(
        at_cap["output_throughput_tok_s"], rel=1e-5)
    assert capped["ttft_ms"] > 10 * at_cap["ttft_ms"]  # the extra clients queue


def test_replicas_multiply_throughput(runner: CliRunner) -> None:
    one = run_json(runner)
    three = run_json(runner, "--replicas", "3")
    assert three["output_throughput_tok_s"] == pytest.approx(
        3 * one["output_throughput_tok_s"], rel=1e-5)  # JSON keeps 6 significant digits


def test_set_rejects_unknown_knob(runner: CliRunner) -> None:
    result = runner.invoke(app, [*BASE, "--set", "warp_drive=1"])
    assert result.exit_code == 2 and "warp_drive" in result.stderr


def test_batch_file_one_line_per_input_with_errors(runner: CliRunner, tmp_path: Path) -> None:
    lines = [
        {"model": "llama-3.1-8b", "accelerator": "l40s", "tp": 1, "input_len": 500,
         "output_len": 100, "concurrency": 8},
        {"model": "nope", "accelerator": "l4", "input_len": 1, "output_len": 1},
        {"model": "llama-3.1-8b", "accelerator": "a10g", "tp": 3, "input_len": 5,
         "output_len": 5},
        {"model": "llama-3.1-70b", "accelerator": "h100-sxm", "tp": 4, "precision": "fp8",
         "engine": "trtllm", "input_len": 1000, "output_len": 200, "rate": 3, "replicas": 2},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    result = runner.invoke(app, ["predict", "--batch", str(path)])
    assert result.exit_code == 0
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == 5
    assert set(out[0]) >= REQUIRED and set(out[3]) >= REQUIRED
    assert "llama-3.1-8b" in out[1]["error"]  # the suggestion names a close match
    assert out[2]["error"].startswith("tp:")
    assert out[4]["line"] == 5 and "error" in out[4]
