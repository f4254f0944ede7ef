"""Scenario benchmark: runner determinism and fault tolerance, report, plots, CLI.

Runs use a tiny scenario built here (two 8B jobs on 24 H100s, 10 minutes of 60 s ticks)
so the whole module stays within a few seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from koi.bench import runner as runner_mod
from koi.bench.plots import plot_paths, write_plots
from koi.bench.report import (
    COLUMNS,
    csv_text,
    markdown_table,
    results_json,
    rich_table,
    run_json,
    stat,
    summarise,
    summarise_records,
)
from koi.bench.runner import RunProgress, RunResult, run_matrix, run_once
from koi.cli.main import app
from koi.policies import make_policy
from koi.scenario import Scenario, scenario_to_dict
from koi.sim.testing import batch_job, online_job, tiny_scenario

POLICY = "fcfs-first-fit"
METRIC_KEYS = {"batch_progress_pct", "admit_online_pct", "admit_batch_pct",
               "cost_per_token_usd", "ttft_met_pct", "tpot_met_pct", "goodput_tok_s",
               "overall_score", "offered_goodput_tok_s"}   # koi bench report's (d) reads it


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    jobs = [online_job("chat-8b", rate=3.0), batch_job("batch-8b", num_requests=300,
                                                       deadline_s=500)]
    return tiny_scenario(jobs, horizon_s=600, tick_s=60, name="bench-tiny")


@pytest.fixture(scope="module")
def result(scenario: Scenario) -> RunResult:
    return run_once(scenario, POLICY, seed=1)


@pytest.fixture(scope="module")
def two_seeds(scenario: Scenario) -> tuple[list[RunResult], list[RunProgress]]:
    seen: list[RunProgress] = []
    return run_matrix([scenario], [POLICY], [1, 2], progress=seen.append), seen


@pytest.fixture(scope="module")
def scenario_file(scenario: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scn") / "bench-tiny.yaml"
    path.write_text(yaml.safe_dump(scenario_to_dict(scenario), sort_keys=False))
    return path


# --- runner ---------------------------------------------------------------------------------

def test_run_once_fills_the_result(result: RunResult, scenario: Scenario) -> None:
    assert (result.scenario, result.policy, result.seed) == ("bench-tiny", POLICY, 1)
    assert result.wall_s > 0 and result.record.wall_s == result.wall_s
    assert len(result.record.timeline) == 10
    assert result.policy_failures == ()
    assert result.metrics.admit_online_pct == 100.0   # a fleet this size fits both jobs
    assert 0.0 <= result.metrics.overall_score <= 100.0


def test_same_seed_gives_identical_metrics(scenario: Scenario, result: RunResult) -> None:
    again = run_once(scenario, POLICY, seed=1)
    a, b = result.metrics.to_dict(), again.metrics.to_dict()
    assert a == b
    assert again.record.events == result.record.events
    assert again.record.timeline == result.record.timeline


def test_a_policy_that_raises_does_not_stop_the_run(scenario: Scenario,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    class Flaky:
        name = "flaky"

        def __init__(self) -> None:
            self.inner = make_policy(POLICY, seed=1)

        def decide(self, snapshot, telemetry):  # type: ignore[no-untyped-def]
            if snapshot.tick in (2, 3):
                raise RuntimeError("boom")
            return self.inner.decide(snapshot, telemetry)

    monkeypatch.setattr(runner_mod, "make_policy", lambda *a, **k: Flaky())
    res = run_once(scenario, POLICY, seed=1)
    assert [f.tick for f in res.policy_failures] == [2, 3]
    assert "boom" in res.policy_failures[0].error
    assert len(res.record.timeline) == 10   # every tick still ran


def test_run_matrix_order_and_progress(two_seeds: tuple[list[RunResult], list[RunProgress]]
                                      ) -> None:
    results, seen = two_seeds
    assert [(r.policy, r.seed) for r in results] == [(POLICY, 1), (POLICY, 2)]
    assert seen[0].tick == 0 and seen[0].run_index == 0 and seen[0].runs == 2
    assert seen[-1].tick == seen[-1].ticks == 10 and seen[-1].run_index == 1


def test_unknown_policy_raises_with_known_names(scenario: Scenario) -> None:
    with pytest.raises(ValueError, match="known policies"):
        run_once(scenario, "no-such-policy", seed=1)


# --- report ---------------------------------------------------------------------------------

def test_stat_is_mean_and_half_range() -> None:
    s = stat([1.0, 2.0, 6.0])
    assert s.mean == pytest.approx(3.0) and s.spread == pytest.approx(2.5)
    assert s.text(".1f") == "3.0 ± 2.5"
    assert stat([4.0]).text(".1f") == "4.0"
    assert stat([1.0, math.inf]).text(".1f") == "inf"


def test_json_has_the_required_keys(result: RunResult) -> None:
    one = results_json([result])
    assert isinstance(one, dict)
    assert {"scenario", "policy", "seed", "wall_s", "metrics"} <= one.keys()
    assert one["metrics"].keys() >= METRIC_KEYS
    json.dumps(one, allow_nan=False)   # strict JSON: no inf/nan
    assert isinstance(results_json([result, result]), list)


def test_table_renders_mean_and_spread(two_seeds: tuple[list[RunResult], list[RunProgress]]
                                       ) -> None:
    rows = summarise(two_seeds[0])
    assert len(rows) == 1 and rows[0].seeds == (1, 2)
    md = markdown_table(rows)
    assert "±" in md and "$/token (×1e-4 $)" in md and "half-range" in md
    assert md.count("\n| bench-tiny |") == 1
    lines = csv_text(rows).splitlines()
    assert len(lines) == 2 and "score_halfrange" in lines[0]
    table = rich_table(rows)
    assert [c.header for c in table.columns][2:2 + len(COLUMNS)] == [c.header for c in COLUMNS]


def test_the_table_read_back_from_runs_jsonl_is_the_same(
        two_seeds: tuple[list[RunResult], list[RunProgress]]) -> None:
    results = two_seeds[0]
    records = [json.loads(json.dumps(run_json(r))) for r in results]
    assert markdown_table(summarise_records(records)) == markdown_table(summarise(results))
    records[0]["metrics"]["goodput_tok_s"] = None      # a null stays missing, not averaged away
    row = summarise_records(records)[0]
    assert row.stats["goodput_tok_s"].text(".0f") == "nan" and row.stats["score"].n == 2


# --- plots ----------------------------------------------------------------------------------

def test_plots_are_written(result: RunResult, tmp_path: Path) -> None:
    paths = write_plots(result, tmp_path)
    assert paths == plot_paths(result, tmp_path)
    assert sorted(p.name for p in paths.values()) == [
        f"bench-tiny-{POLICY}-s1-{k}.png" for k in ("cost", "gpus", "slo")]
    for p in paths.values():
        assert p.is_file() and p.stat().st_size > 1000


# --- CLI ------------------------------------------------------------------------------------

def test_cli_unknown_policy_exits_2() -> None:
    res = CliRunner().invoke(app, ["bench", "--scenario", "hetero-3h", "--policy", "nope"])
    assert res.exit_code == 2
    assert "fcfs-first-fit" in res.output


def test_cli_unknown_scenario_exits_2() -> None:
    res = CliRunner().invoke(app, ["bench", "--scenario", "no-such", "--policy", POLICY])
    assert res.exit_code == 2
    assert "hetero-3h" in res.output


def test_cli_single_run_writes_json_table_and_plots(scenario_file: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["bench", "--scenario", str(scenario_file), "--policy",
                                   POLICY, "--seed", "3", "--json", str(out / "run.json"),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    obj = json.loads((out / "run.json").read_text())
    assert obj["seed"] == 3 and obj["metrics"].keys() >= METRIC_KEYS
    assert (out / "table.md").read_text().count("| bench-tiny |") == 1
    assert (out / "table.csv").is_file()
    assert len(list(out.glob("bench-tiny-*-s3-*.png"))) == 3


def test_cli_matrix_writes_a_list(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["bench", "--scenarios", str(scenario_file), "--policies",
                                   POLICY, "--seeds", "1,2", "--json",
                                   str(out / "runs.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads((out / "runs.json").read_text())
    assert isinstance(runs, list) and [r["seed"] for r in runs] == [1, 2]
    stamp = json.loads((out / "runs.jsonl").read_text().splitlines()[0])["bench"]
    assert stamp["commit"] and stamp["host"] and stamp["cpus"] >= 1   # for koi bench report
    assert "±" in (out / "table.md").read_text()
    assert not list(out.glob("*.png"))   # plots only on request for a matrix


# --- per job (--jobs) --------------------------------------------------------------------

def test_job_activity_counts_gpu_hours_by_family_and_events() -> None:
    """Two 30-minute ticks then a last one cut at the horizon (15 minutes): a job with 8
    hopper GPUs, then 4 hopper + 2 ampere, then none; its events counted by kind; a job
    that only has events (rejected) still gets a row."""
    from koi.bench.jobs import job_activity
    from koi.records import EventRecord, JobOutcome, RunRecord, TickRecord

    record = RunRecord(
        "s", "p", 1, horizon_s=4500.0, tick_s=1800.0, spend_usd=0.0,
        jobs=(JobOutcome("a", "online", "m", True, True, False),
              JobOutcome("b", "batch", "m", True, False, True)),
        timeline=(TickRecord(0, 0.0, 0.0, gpus_by_job={"a": {"hopper": 8}}),
                  TickRecord(1, 1800.0, 0.0, gpus_by_job={"a": {"hopper": 4, "ampere": 2}}),
                  TickRecord(2, 3600.0, 0.0, gpus_by_job={})),
        events=(EventRecord(0.0, 0, "launch", "a"), EventRecord(1800.0, 1, "swap", "a"),
                EventRecord(1800.0, 1, "scale", "a"), EventRecord(1900.0, 1, "scale", "a"),
                EventRecord(0.0, 0, "reject", "b")))
    got = job_activity(record)
    assert got["a"].gpu_hours == pytest.approx({"hopper": 8 * 0.5 + 4 * 0.5, "ampere": 1.0})
    assert got["a"].total_gpu_hours == pytest.approx(7.0)
    assert got["a"].events == {"launch": 1, "scale": 2, "swap": 1}
    assert got["a"].moves() == "swap 1 · scale 2"
    assert got["b"].gpu_hours == {} and got["b"].events == {"reject": 1}


def test_cli_jobs_writes_a_per_job_table_csv_and_json(scenario_file: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["bench", "--scenario", str(scenario_file), "--policy",
                                   POLICY, "--jobs", "--no-plots", "--json",
                                   str(out / "run.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Per job" in res.output and "chat-8b" in res.output
    lines = (out / "jobs.csv").read_text().splitlines()
    assert lines[0].startswith("scenario,policy,seed,job,kind")
    assert sorted(line.split(",")[3] for line in lines[1:]) == ["batch-8b", "chat-8b"]
    jobs = {j["job_id"]: j for j in json.loads((out / "run.json").read_text())["metrics"]["jobs"]}
    assert jobs.keys() == {"batch-8b", "chat-8b"}
    chat = jobs["chat-8b"]
    assert chat["events"].get("launch") == 1 and sum(chat["gpu_hours_by_family"].values()) > 0
    # without --jobs the JSON has no per-job rows (the default output is unchanged)
    plain = tmp_path / "plain"
    CliRunner().invoke(app, ["bench", "--scenario", str(scenario_file), "--policy", POLICY,
                             "--no-plots", "--json", str(plain / "run.json"), "--out",
                             str(plain)])
    assert "jobs" not in json.loads((plain / "run.json").read_text())["metrics"]
    assert not (plain / "jobs.csv").exists()
