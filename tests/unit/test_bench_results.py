"""Tests for ``koi bench report`` (koi.bench.bar, koi.bench.results): the bar on a suite
small enough to check by hand, the held-out flag, missing data shown as missing, the
shipped-scenario tables and the CLI writing the file.

Records are built in the format the writers use: ``koi.bench.report.run_json``'s keys
with ``RunMetrics.to_dict()`` as ``metrics``, plus the ``suite`` block of
``koi bench suite`` or the ``bench`` block of ``koi bench --out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from koi.bench.bar import suite_bar
from koi.bench.results import RunFile, load_run_files, render
from koi.bench.stats import bootstrap_ci, min_detectable_difference
from koi.cli.bench_cmd import report_command
from koi.metrics import RunMetrics

SHIPPED = ("hetero-3h", "real-104")
SEEDS = (0, 1, 2, 3)


def record(policy: str, seed: int, score: float, *, scenario: str | None = None,
           size: str | None = "medium", goodput: float = 100.0,
           offered: float | None = 200.0, cost: float | None = 1e-5, wall: float = 10.0,
           commit: str = "abc1234def567890") -> dict[str, Any]:
    """One runs.jsonl line; ``size=None``: a ``koi bench`` run, else a suite run."""
    metrics = RunMetrics(
        batch_progress_pct=90.0, admit_online_pct=100.0, admit_batch_pct=100.0,
        cost_per_token_usd=math.inf if cost is None else cost, ttft_met_pct=80.0,
        tpot_met_pct=85.0, goodput_tok_s=goodput, offered_goodput_tok_s=offered or 0.0,
        reference_cost_per_token_usd=1e-5, overall_score=score, score_terms={},
        spend_usd=10.0, tokens_served=1e6).to_dict()
    metrics.pop("jobs")
    if cost is None:
        metrics["cost_per_token_usd"] = None          # run_json writes inf as null
    if offered is None:
        del metrics["offered_goodput_tok_s"]          # a run from before it was recorded
    stamp = {"commit": commit, "host": "vm", "cpus": 2}
    rec: dict[str, Any] = {
        "scenario": scenario or f"gen-{size}-{seed}", "policy": policy, "seed": seed,
        "wall_s": wall, "sample_fraction": 1.0, "ticks": 10, "events": 0,
        "refused_actions": 0, "policy_failures": [], "metrics": metrics}
    if size is None:
        rec["bench"] = stamp
    else:
        rec["suite"] = {"size": size, "scenario_seed": seed, "ticks": None, **stamp}
    return rec


def hand_suite() -> list[dict[str, Any]]:
    """Four scenarios; every figure of the bar below is worked out in the test."""
    rows = {  # policy: scores on seeds 0..3
        "koi": [80, 70, 90, 60], "melange-ilp": [78, 72, 85, 50],
        "fcfs-first-fit": [50, 50, 50, 50], "koi-no-dro": [79, 70, 88, 60],
        "oracle": [85, 70, 88, 66]}
    goodput = {"koi": [150, 100, 190, 120], "melange-ilp": [100, 100, 180, 210]}
    cost = {"koi": [1e-5, 2e-5, 3e-5, None], "melange-ilp": [4e-5, 2e-5, 5e-5, 1e-5]}
    wall = [100.0, 120.0, 300.0, 110.0]
    return [record(p, s, scores[i], goodput=goodput.get(p, [100.0] * 4)[i],
                   cost=cost.get(p, [1e-5] * 4)[i], wall=wall[i] if p == "koi" else 5.0)
            for p, scores in rows.items() for i, s in enumerate(SEEDS)]


def page(records: list[dict[str, Any]]) -> str:
    return render([RunFile("out/x/runs.jsonl", tuple(records))], command="koi bench report",
                  date="2026-12-04 00:00 UTC", shipped=SHIPPED)


# --- the bar -----------------------------------------------------------------------------

def test_the_bar_on_a_hand_checkable_suite() -> None:
    b = suite_bar(hand_suite())
    means = {p.policy: (p.scenarios, p.mean) for p in b.scores}
    assert means["koi"] == (4, 75.0) and means["melange-ilp"] == (4, 71.25)
    assert b.baselines == ("melange-ilp", "fcfs-first-fit")   # not koi-*, not oracle
    # (a) Koi > both baselines on seeds 0, 2, 3; melange-ilp wins seed 1 (the oracle,
    # above Koi on seed 0, does not count)
    assert (b.above_all.hits, b.above_all.of) == (3, 4)       # type: ignore[union-attr]
    # (b) strongest by mean score; koi − melange-ilp = 2, −2, 5, 10
    assert b.strongest == "melange-ilp" and b.gain is not None
    assert b.gain.mean_diff == pytest.approx(3.75) and b.gain.win_rate == 0.75
    assert (b.gain.ci_low, b.gain.ci_high) == pytest.approx(bootstrap_ci([2, -2, 5, 10]))
    fcfs = next(p.vs_koi for p in b.scores if p.policy == "fcfs-first-fit")
    assert fcfs is not None and fcfs.mean_diff == 25.0 and fcfs.verdict == "better"
    # (c) 80/85, 70/70, 90/88, 60/66; the oracle ≥ Koi on seeds 0, 1, 3
    assert b.oracle is not None
    assert b.oracle.mean_pct == pytest.approx(25 * (80 / 85 + 1 + 90 / 88 + 60 / 66))
    assert (b.oracle.scenarios, b.oracle.oracle_at_least_koi) == (4, 3)
    # (d) (150−100)/(200−100), 0/100, (190−180)/(200−180); seed 3: melange-ilp met the offer
    assert b.gap is not None and (b.gap.median, b.gap.scenarios, b.gap.no_gap) == (0.5, 3, 1)
    # (e) seed 3 left out (Koi's $/token null); medians of 1,2,3 and 4,2,5 (× 1e-5)
    assert b.cost is not None and b.cost.scenarios == 3
    assert (b.cost.koi, b.cost.other) == pytest.approx((2e-5, 4e-5))
    # (f) koi − koi-no-dro = 1, 0, 2, 0: two wins and two ties
    assert [(c.policy, c.mean_diff, c.win_rate) for c in b.ablations] == [
        ("koi-no-dro", 0.75, 0.75)]
    # (g) Koi's wall seconds 100, 120, 300, 110
    assert b.koi_wall is not None and (b.koi_wall.median_s, b.koi_wall.max_s) == (115, 300)


def test_the_page_states_the_bar() -> None:
    text = page(hand_suite())
    assert "### gen-medium, seeds 0–3 (4 scenarios)" in text
    assert "Development seeds only" in text and "HELD OUT" not in text
    assert "**3 of 4** scenarios" in text
    assert "**melange-ilp**; Koi's mean paired gain over it +3.75" in text
    lo, hi = bootstrap_ci([30, 20, 40, 10])
    mde = min_detectable_difference([30, 20, 40, 10])
    assert (f"| fcfs-first-fit | 4 | 50.00 | +25.00 | [{lo:+.2f}, {hi:+.2f}] | {mde:.2f} | "
            "100 % | better (4 pairs) |") in text
    assert "**96.8 %** of the oracle's" in text and "≥ Koi on 3 of 4" in text
    assert "median **50 %** of the gap" in text
    assert "Koi 0.200 against melange-ilp 0.400 (×1e-4 $); Koi ÷ melange-ilp = 0.50" in text
    assert "koi-no-dro +0.75" in text and "median 115 s, max 300 s (4 runs)" in text
    assert "abc1234def56 (20 runs)" in text and "vm, 2 CPUs (20 runs)" in text


def test_a_suite_with_held_out_seeds_is_flagged() -> None:
    recs = [record(p, s, 70.0 + s % 3) for p in ("koi", "melange-ilp")
            for s in (998, 999, 1000, 1001)]
    text = page(recs)
    assert "seeds 998–1001 (4 scenarios)" in text
    assert "**HELD OUT:** 2 of these 4 scenarios have seeds ≥ 1000 (1000–1001)" in text


def test_missing_oracle_and_offered_goodput_are_shown_missing() -> None:
    recs = [record(p, s, 60.0 + s, offered=None) for p in ("koi", "best-fixed")
            for s in SEEDS]
    b = suite_bar(recs)
    assert b.oracle is None and b.ablations == ()
    assert b.gap is not None and (b.gap.scenarios, b.gap.not_recorded) == (0, 4)
    assert math.isnan(b.gap.median)
    text = page(recs)
    assert "no `oracle` runs in this suite" in text
    assert "goodput gap closed: not measured, offered goodput not recorded" in text


def test_a_suite_without_koi_has_no_bar_and_no_runs_say_so() -> None:
    assert "did not run in this suite: no bar" in page([record("oracle", 0, 70.0)])
    empty = page([])
    assert "**No runs yet**" in empty and "No generated-suite runs" in empty


# --- shipped scenarios -------------------------------------------------------------------

def test_shipped_scenarios_get_the_koi_bench_table() -> None:
    recs = [record(p, s, 80.0 + s, scenario="hetero-3h", size=None,
                   cost=None if (p, s) == ("koi", 2) else 2e-5)
            for p in ("koi", "best-fixed") for s in (1, 2, 3)]
    recs.append(record("koi", 1, 50.0, scenario="mine.yaml", size=None))
    text = page(recs)
    assert "## Shipped scenarios\n\n### hetero-3h" in text and "### real-104" not in text
    row = next(line for line in text.splitlines() if line.startswith("| hetero-3h | koi |"))
    assert "| 82.0 ± 1.0 |" in row and "| nan |" in row     # one null $/token: missing
    assert "| hetero-3h | best-fixed |" in text and "| 0.200 ± 0.000 |" in text
    assert "## Other scenarios\n\n### mine.yaml" in text


# --- files and the CLI -------------------------------------------------------------------

def write_runs(directory: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    directory.mkdir(parents=True)
    path = directory / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_loading_skips_torn_lines_and_keeps_a_repeated_run_once(tmp_path: Path) -> None:
    write_runs(tmp_path / "suite", [record("koi", 0, 1.0), record("koi", 0, 2.0)],
               tail='{"scenario": "gen-me')
    (tmp_path / "suite" / "suite.md").write_text("# x\n- machine: vm, 2 CPUs\n"
                                                 "- wall time: 12.0 s for 1 run(s)\n")
    [f] = load_run_files([tmp_path])
    assert [r["metrics"]["overall_score"] for r in f.records] == [2.0] and f.skipped == 1
    assert f.suite_md == ("- machine: vm, 2 CPUs", "- wall time: 12.0 s for 1 run(s)")
    assert "the suite's: wall time: 12.0 s for 1 run(s) (suite.md)" in render(
        [f], command="c", date="d", shipped=SHIPPED)
    with pytest.raises(FileNotFoundError):
        load_run_files([tmp_path / "nope"])


def cli() -> typer.Typer:
    """``koi bench report`` wired as koi.cli.main wires bench subcommands."""
    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    bench.command("report")(report_command)
    return app


def test_cli_writes_the_file(tmp_path: Path) -> None:
    write_runs(tmp_path / "suite-dev", hand_suite())
    write_runs(tmp_path / "bench" / "hetero-3h",
               [record("koi", 1, 80.0, scenario="hetero-3h", size=None)])
    out = tmp_path / "docs" / "RESULTS.md"
    res = CliRunner().invoke(cli(), ["bench", "report", str(tmp_path / "suite-dev"),
                                     str(tmp_path / "bench"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "21 runs from 2 runs.jsonl file(s)" in res.output
    text = out.read_text()
    assert text.startswith("# Koi benchmark results")
    assert f"`koi bench report {tmp_path / 'suite-dev'} {tmp_path / 'bench'} -o {out}`" in text
    assert "### gen-medium, seeds 0–3" in text and "### hetero-3h" in text


def test_cli_refuses_a_path_that_does_not_exist(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli(), ["bench", "report", str(tmp_path / "nope"), "-o",
                                     str(tmp_path / "r.md")])
    assert res.exit_code == 2 and "no such file or directory" in res.output
    assert not (tmp_path / "r.md").exists()


def test_policies_that_need_a_model_are_named_not_numbered() -> None:
    files = [RunFile("out/x/runs.jsonl", tuple(hand_suite()))]
    text = render(files, command="koi bench report", date="today", shipped=(),
                  needs_model=("koi-rlm", "llm-only", "koi"))
    # koi ran: only the two with no runs are listed as needing an endpoint
    assert "**Needs an endpoint:** `koi-rlm`, `llm-only` plan with a language model" in text
    assert "needs an endpoint" not in page(hand_suite()).lower()


def test_bench_power_reads_recorded_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from koi.cli.main import app

    recs = [record(p, s, 70.0 + s % 3 + (p == "koi")) for p in ("koi", "melange-ilp")
            for s in range(4)]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    done = CliRunner().invoke(app, ["bench", "power", str(runs), "--target", "0.5"])
    assert done.exit_code == 0, done.output
    assert "| melange-ilp | 4 | 1 | 0 | 0 | 2 |" in done.output
    missing = CliRunner().invoke(app, ["bench", "power", str(tmp_path / "nothing")])
    assert missing.exit_code == 2
