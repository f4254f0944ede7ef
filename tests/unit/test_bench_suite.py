"""Tests for koi.bench.suite and ``koi bench suite``: planning, resume, failures, the
process pool, and the CLI's refusals.

Real runs use small generated scenarios cut to their first few ticks (``ticks``), so
each takes well under a second; the held-out reminder and the CLI's wiring are checked
with ``run_once`` replaced by a stub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from koi.bench import suite
from koi.bench.suite import (
    FAILURES,
    HELD_OUT_NOTE,
    REPORT,
    RUNS,
    SuiteConfig,
    done_keys,
    parse_range,
    pending,
    plan,
    read_records,
    run_suite,
)
from koi.cli.main import app

CHEAP = ("fcfs-first-fit", "edf-first-fit")


def cfg(out: Path, first: int = 0, last: int = 1, policies: tuple[str, ...] = CHEAP,
        workers: int = 1, ticks: int | None = 3) -> SuiteConfig:
    return SuiteConfig(first, last, "small", policies, workers, out, ticks=ticks,
                       command="test")


def lines(out: Path, name: str) -> list[dict[str, Any]]:
    return read_records(out / name)


# --- planning ----------------------------------------------------------------------------

def test_plan_is_every_seed_times_every_policy(tmp_path: Path) -> None:
    runs = plan(cfg(tmp_path, 3, 5))
    assert [(r.scenario, r.policy, r.seed) for r in runs[:2]] == [
        ("gen-small-3", "fcfs-first-fit", 3), ("gen-small-3", "edf-first-fit", 3)]
    assert len(runs) == 6 and {r.seed for r in runs} == {3, 4, 5}


def test_pending_skips_recorded_runs_and_tolerates_a_torn_line(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    done = {"scenario": "gen-small-0", "policy": "fcfs-first-fit", "seed": 0,
            "suite": {"ticks": 3}}
    other_ticks = {**done, "policy": "edf-first-fit", "suite": {"ticks": None}}
    (tmp_path / RUNS).write_text(json.dumps(done) + "\n" + json.dumps(other_ticks)
                                 + "\n{\"scenario\": \"gen-sm")
    todo = pending(plan(c), done_keys(tmp_path))
    assert [(r.scenario, r.policy) for r in todo] == [
        ("gen-small-0", "edf-first-fit"), ("gen-small-1", "fcfs-first-fit"),
        ("gen-small-1", "edf-first-fit")]


@pytest.mark.parametrize(("text", "want"), [("0-1", (0, 1)), ("7", (7, 7)),
                                            (" 2-2 ", (2, 2)), ("0-999", (0, 999))])
def test_parse_range(text: str, want: tuple[int, int]) -> None:
    assert parse_range(text) == want


@pytest.mark.parametrize("text", ["5-2", "a-b", "-1-3", "0-1000", "1-", ""])
def test_parse_range_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_range(text)


# --- real runs ---------------------------------------------------------------------------

def test_tiny_suite_runs_then_resumes_with_nothing_new(tmp_path: Path) -> None:
    said: list[str] = []
    first = run_suite(cfg(tmp_path), say=said.append)
    assert (first.planned, first.ran, first.failed) == (4, 4, 0)
    recs = lines(tmp_path, RUNS)
    assert len(recs) == 4
    assert {(r["scenario"], r["policy"]) for r in recs} == {
        (f"gen-small-{s}", p) for s in (0, 1) for p in CHEAP}
    assert all(r["suite"]["size"] == "small" and r["suite"]["scenario_seed"] == r["seed"]
               and r["suite"]["commit"] and r["suite"]["host"] and r["suite"]["cpus"] >= 1
               for r in recs)
    assert any(line.startswith("4/4 gen-small-") and " score " in line for line in said)
    assert HELD_OUT_NOTE not in said
    report = (tmp_path / REPORT).read_text()
    assert "| fcfs-first-fit | 2 |" in report and "wall time" in report

    again = run_suite(cfg(tmp_path), say=lambda _: None)
    assert (again.skipped, again.ran) == (4, 0)
    assert len(lines(tmp_path, RUNS)) == 4


def test_a_failing_run_is_recorded_and_the_suite_goes_on(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    real = suite.run_once

    def flaky(scenario: Any, policy: str, seed: int, **kw: Any) -> Any:
        if policy == "edf-first-fit":
            raise RuntimeError("boom " + "x" * 1000)
        return real(scenario, policy, seed, **kw)

    monkeypatch.setattr(suite, "run_once", flaky)
    out = run_suite(cfg(tmp_path), say=lambda _: None)
    assert (out.ran, out.failed) == (2, 2)
    fails = lines(tmp_path, FAILURES)
    assert {f["policy"] for f in fails} == {"edf-first-fit"}
    assert fails[0]["error"] == "RuntimeError" and len(fails[0]["message"]) == 500
    assert {r["policy"] for r in lines(tmp_path, RUNS)} == {"fcfs-first-fit"}
    # failures are not "done": a resumed suite tries them again
    monkeypatch.setattr(suite, "run_once", real)
    assert run_suite(cfg(tmp_path), say=lambda _: None).ran == 2


def test_two_workers_run_in_a_process_pool(tmp_path: Path) -> None:
    out = run_suite(cfg(tmp_path, 0, 0, workers=2, ticks=2), say=lambda _: None)
    assert (out.ran, out.failed) == (2, 0)
    assert {r["policy"] for r in lines(tmp_path, RUNS)} == set(CHEAP)


def test_summary_compares_to_koi_when_it_ran() -> None:
    recs = [{"scenario": f"gen-small-{s}", "policy": p, "seed": s,
             "metrics": {"overall_score": score + s}}
            for s in (0, 1, 2) for p, score in (("koi", 60.0), ("fcfs-first-fit", 50.0))]
    text = suite.summarise(recs, ("koi", "fcfs-first-fit"))
    assert "| koi | 3 | 61.00 |" in text and "| fcfs-first-fit | 3 | 51.00 |" in text
    assert "| fcfs-first-fit | 3 | 10 |" in text   # the paired comparison's row


# --- the CLI -----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--generated", "5-2"], ["--generated", "x"],
                                  ["--generated", "0-1", "--policies", "nope"],
                                  ["--generated", "0-1", "--workers", "17"],
                                  ["--generated", "0-1", "--size", "huge"]])
def test_cli_refuses_bad_input(args: list[str], tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["bench", "suite", "--out", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / RUNS).exists()


def test_cli_reminds_of_held_out_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    def stub(seed: int, size: str, policy: str, *_: Any) -> dict[str, Any]:
        return {"scenario": f"gen-{size}-{seed}", "policy": policy, "seed": seed,
                "wall_s": 0.1, "metrics": {"overall_score": 1.0},
                "suite": {"size": size, "scenario_seed": seed, "commit": "c", "ticks": 1}}

    monkeypatch.setattr(suite, "run_one", stub)
    res = CliRunner().invoke(app, ["bench", "suite", "--generated", "999-1000", "--size",
                                   "small", "--policies", "fcfs-first-fit", "--workers",
                                   "1", "--ticks", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "HELD OUT" in res.output and "2/2 gen-small-1000" in res.output
    assert "HELD OUT" in (tmp_path / REPORT).read_text()
