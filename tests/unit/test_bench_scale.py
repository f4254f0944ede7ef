"""`koi bench tick --out` records and the Scale section `koi bench report` makes of them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from koi.bench import scale
from koi.cli.main import app
from koi.scenario import scenario_to_dict
from koi.sim.testing import batch_job, online_job, tiny_scenario


def _record(name: str, gpus: int, total: float, p90: float, commit: str = "abc",
            over: int = 0) -> dict:
    return {"scenario": name, "gpus": gpus, "jobs": 3, "ticks": 6, "policy": "koi", "seed": 1,
            "stages": {"propose": [0.1, 0.2], "evaluate": [0.2, 0.3], "compose": [0.3, 0.4],
                       "total": [total, p90]},
            "offerings_over_capacity": over, "peak_rss_mib": 100.0, "commit": commit,
            "machine": {"host": "h", "cpus": 2}}


def test_the_scale_table_compares_each_size_with_hetero_12h_at_the_same_commit() -> None:
    text = scale.scale_markdown([
        _record("hetero-12h", 800, 0.4, 0.5), _record("hetero-12h", 800, 0.6, 0.7),
        _record("gen-xlarge-42", 8363, 2.5, 4.0, over=1),
        _record("gen-xlarge-42", 8363, 9.9, 9.9, commit="other")])
    rows = {line.split("|")[1].strip() + line.split("|")[4].strip(): line
            for line in text.splitlines() if line.startswith("| gen") or line.startswith("| het")}
    hetero = rows["hetero-12h`abc`"].split("|")
    assert hetero[5].strip() == "2 × 6" and hetero[9].strip() == "0.50"  # median of 0.4, 0.6
    xl = rows["gen-xlarge-42`abc`"].split("|")
    assert xl[11].strip() == "5.0"          # 2.5 / 0.5, same commit
    assert xl[13].strip() == "1"            # a plan over capacity is counted, not hidden
    assert rows["gen-xlarge-42`other`"].split("|")[11].strip() == "–"  # no reference there


def test_bench_tick_out_writes_a_record_that_the_report_shows(tmp_path: Path) -> None:
    scn = tiny_scenario([online_job("chat-8b", rate=3.0), batch_job("b-8b", num_requests=200,
                                                                    deadline_s=500)],
                        horizon_s=600, tick_s=60, name="scale-tiny")
    path = tmp_path / "scale-tiny.yaml"
    path.write_text(yaml.safe_dump(scenario_to_dict(scn), sort_keys=False))
    res = CliRunner().invoke(app, ["bench", "tick", "--scenario", str(path), "--ticks", "3",
                                   "--out", str(tmp_path / "scale")])
    assert res.exit_code == 0, res.output
    (line,) = (tmp_path / "scale" / scale.TICKS).read_text().splitlines()
    rec = json.loads(line)
    assert rec["scenario"] == "scale-tiny" and rec["ticks"] == 3 and len(rec["tick_total_s"]) == 3
    assert rec["gpus"] == scn.total_gpus and rec["offerings_over_capacity"] == 0
    assert set(rec["stages"]) >= {"propose", "evaluate", "compose", "total"}
    (tmp_path / "scale" / scale.TICKS).open("a").write("not json\n")
    report = CliRunner().invoke(app, ["bench", "report", str(tmp_path), "-o", "-"])
    assert report.exit_code == 0, report.output
    section = report.output.split("## Scale", 1)[1]
    assert "| scale-tiny |" in section and "1 × 3" in section
