"""The language-model policies in bench runs, against a loopback OpenAI-compatible server
replaying scripted answers (``support.openai_replay``): ``koi-rlm`` with a valid
hypothesis, a hallucinated accelerator and a malformed answer, its transcript replayed
by ``koi rlm replay``; ``llm-only`` with a plan, a hallucinated offering and prose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from koi.bench.report import run_json
from koi.bench.runner import run_once
from koi.catalog import load_catalog
from koi.cli.main import app
from koi.sim.testing import online_job, tiny_scenario
from support import rlm_fleet as F
from support.openai_replay import ReplayServer

pytestmark = pytest.mark.timeout(120)

FLEET = {F.H100_OD: 16, F.L4_OD: 8}
VALID = F.hypothesis_doc(expires_tick=30)
HALLUCINATED = F.hypothesis_doc(scope={"accelerator": "h900", "engine": "vllm"},
                                statement="h900 is fast")


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    def point(srv: ReplayServer) -> None:
        monkeypatch.setenv("KOI_RLM_BASE_URL", srv.base_url)
        monkeypatch.setenv("KOI_RLM_MODEL", "replay-model")
        monkeypatch.setenv("KOI_RLM_TRANSCRIPTS", str(tmp_path / "rlm"))
        monkeypatch.setenv("KOI_RLM_CALL_TIMEOUT_S", "10")
    return point


def test_koi_rlm_runs_tests_the_accepted_hypothesis_and_its_round_replays(endpoint,
                                                                         tmp_path) -> None:
    jobs = [online_job("chat-eu", rate=3.0), online_job("chat-late", rate=1.0, submit_s=180)]
    scn = tiny_scenario(jobs, FLEET, horizon_s=360)
    script = [{"content": json.dumps({"hypotheses": [VALID, HALLUCINATED]})},  # tick 0
              {"content": "I would move chat-late to the b300s."},             # tick 3: prose
              {"content": "Still prose, sorry."}]                              # its repair
    with ReplayServer(script) as srv:
        endpoint(srv)
        result = run_once(scn, "koi-rlm", seed=1, catalog=load_catalog())
    assert result.policy_failures == () and result.refused_actions == 0
    assert [e.job_id for e in result.record.events if e.kind == "launch"][:1] == ["chat-eu"]
    spend = run_json(result)["model_spend"]
    assert spend["rounds"] == 2 and spend["rounds_failed"] == 1
    assert spend["hypotheses_accepted"] == 1 and spend["hypotheses_dropped"] == 1
    assert spend["calls"] == 3 and spend["tokens"] == 3300 and spend["candidates_tested"] >= 1

    run_dir = tmp_path / "rlm" / "tiny-s1"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    verdicts = [(e["kind"], e["attributes"].get("phase") or e["attributes"].get("verdict"))
                for e in events]
    assert verdicts == [("rlm_round", "started"), ("rlm_round", "finished"),
                        ("hypothesis", "accepted"), ("hypothesis", "dropped"),
                        ("rlm_round", "started"), ("rlm_round", "failed")]
    assert "hallucinated accelerator" in events[3]["message"]
    assert "not JSON" in events[5]["message"]

    got = CliRunner().invoke(app, ["rlm", "replay", str(run_dir / "tiny-s1-r0.jsonl"),
                                   "--json"])
    assert got.exit_code == 0, got.output
    replayed = json.loads(got.output)
    assert replayed["same_as_recorded"] and len(replayed["accepted"]) == 1
    assert "hallucinated accelerator" in replayed["dropped"][0]["reason"]
    text = CliRunner().invoke(app, ["rlm", "replay", str(run_dir / "tiny-s1-r0.jsonl")])
    assert text.exit_code == 0 and "same hypotheses as recorded" in text.output


def test_llm_only_plans_from_its_menu_and_keeps_the_plan_on_a_bad_answer(endpoint) -> None:
    scn = tiny_scenario([online_job("chat-eu", rate=3.0)], FLEET, horizon_s=180)
    plan = {"plan": [{"job_id": "chat-eu", "option": 0, "offering": F.H100_OD,
                      "replicas": 1}]}
    hallucinated = {"plan": [{"job_id": "chat-eu", "option": 0,
                              "offering": "aws/us-east-1/b300/on_demand", "replicas": 4}]}
    script = [{"content": json.dumps(plan)}, {"content": json.dumps(hallucinated)},
              {"content": "Scale everything up!"}]
    with ReplayServer(script) as srv:
        endpoint(srv)
        result = run_once(scn, "llm-only", seed=1, catalog=load_catalog())
        assert srv.calls == 3 and "tools" not in srv.requests[0]["body"]
    assert result.policy_failures == () and result.refused_actions == 0
    launches = [e for e in result.record.events if e.kind == "launch"]
    assert len(launches) == 1 and launches[0].job_id == "chat-eu"
    spend = run_json(result)["model_spend"]
    assert spend["ticks_asked"] == 3 and spend["entries_dropped"] == 1
    assert spend["fallbacks"] == 1  # prose is no plan: everything kept


def test_koi_explain_lists_the_hypotheses_about_the_job(endpoint) -> None:
    answers = Path(__file__).parents[2] / "examples" / "rlm" / "demo-answers.jsonl"
    with ReplayServer(answers, repeat_last=True) as srv:
        endpoint(srv)
        got = CliRunner().invoke(app, ["explain", "--scenario", "hetero-3h", "--job",
                                       "chat-us-8b", "--tick", "2", "--policy", "koi-rlm"],
                                 env={"COLUMNS": "240"})
    assert got.exit_code == 0, got.output
    text = got.output
    assert "hypotheses about chat-us-8b:" in text
    assert "accepted " in text and "in force, expires tick 60" in text
    assert "dropped #1 of round hetero-3h-s1-r0 (replay-model)" in text
    assert "hallucinated accelerator" in text
