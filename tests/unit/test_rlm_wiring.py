"""The hypothesis layer's wiring, without a model: the bus codec, the hypotheses in
force, the operator events, the language-model policies' checks and their refusal
without an endpoint, the settings table and the round record."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from koi import subjects
from koi.errors import InvalidSpecError
from koi.planner.tick import active_jobs
from koi.policies import default_policy_names, make_policy, model_endpoint_problem
from koi.rlm import direct
from koi.rlm.client import CHARS_PER_TOKEN, ChatReply, Spend
from koi.rlm.hypothesis import Dropped, SearchSpace, accept
from koi.rlm.loop import (
    HypothesisLoop,
    RoundOutcome,
    round_events,
    telemetry_latencies,
    tick_signals,
)
from koi.rlm.record import snapshot_from_json, snapshot_to_json
from koi.rlm.settings import ModelEndpointMissing, RlmSettings
from koi.v1 import hypotheses_pb2
from koi.wire.hypotheses import decode_hypotheses, encode_hypotheses
from koi.wire.planning import causal_state_to_proto
from services.runtime.permissions import permissions
from services.runtime.settings import ENV
from support import rlm_fleet as F

MODEL_POLICIES = ("koi-rlm", "llm-only", "llm-tools")


@pytest.fixture
def no_endpoint(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("KOI_RLM_"):
            monkeypatch.delenv(name)


def outcome(**kw) -> RoundOutcome:
    cat, snap = F.catalog(), F.snapshot()
    jobs = {j.id: j for j in active_jobs(snap)}
    explore = {"configs": [], "explore": [{"job_id": "chat-eu", "knob": "max_num_seqs",
                                           "values": [96, 128]}]}
    accepted, dropped = accept(
        [F.hypothesis_doc(), F.hypothesis_doc(test=explore, statement="explore seqs"),
         F.hypothesis_doc(scope={"accelerator": "h900"})],
        catalog=cat, jobs=jobs, space=SearchSpace.of(snap, cat), tick=F.TICK,
        source_model="m", round_id="r10-p0")
    base = dict(enters_tick=F.TICK + 2, round_id="r10-p0", round_tick=F.TICK, model="m",
                ok=True, hypotheses=accepted, dropped=dropped,
                spend=Spend(prompt_tokens=1000, completion_tokens=100, usd=0.01, calls=1,
                            seconds=0.5), triggers=("first round",))
    return RoundOutcome(**{**base, **kw})


# --- the bus codec ---------------------------------------------------------------------

def test_a_round_travels_losslessly() -> None:
    o = outcome()
    assert len(o.hypotheses) == 2 and len(o.dropped) == 1
    back = decode_hypotheses(encode_hypotheses(o))
    assert back == o
    assert [h.id for h in back.hypotheses] == [h.id for h in o.hypotheses]
    assert back.hypotheses[1].explore[0].values == (96, 128)
    failed = outcome(ok=False, reason="timeout after 5.0s", hypotheses=(), dropped=())
    assert decode_hypotheses(encode_hypotheses(failed)) == failed


@pytest.mark.parametrize(("change", "field"), [
    (lambda m: m.accepted[0].ClearField("edge"), "accepted[0].edge"),
    (lambda m: setattr(m.accepted[0], "direction", "sideways"), "accepted[0].direction"),
    (lambda m: setattr(m.accepted[1].explore[0], "values_json", '{"a": 1}'),
     "accepted[1].explore[0].values_json"),
    (lambda m: m.accepted[0].tests[0].ClearField("config"), "accepted[0].tests[0].config"),
    (lambda m: setattr(m, "round_id", ""), "round_id"),
])
def test_a_bad_round_message_is_refused_naming_the_field(change, field) -> None:
    msg = hypotheses_pb2.HypothesisRound.FromString(encode_hypotheses(outcome()))
    change(msg)
    with pytest.raises(InvalidSpecError) as err:
        decode_hypotheses(msg.SerializeToString())
    assert err.value.field == field


def test_the_subject_stage_and_who_may_publish_it() -> None:
    subject = subjects.tick_subject(7, subjects.HYPOTHESES)
    assert subject == "koi.tick.7.hypotheses"
    assert subjects.tick_filter(subjects.HYPOTHESES) in permissions("proposer").publish
    assert all(subjects.tick_filter(subjects.HYPOTHESES) not in permissions(r).publish
               for r in ("evaluator", "causal-store", "placer", "planner-api"))
    for reader in ("evaluator", "planner-api", "causal-store"):
        assert "koi.>" in permissions(reader).subscribe


def test_a_mechanism_says_where_its_belief_started_and_the_tick_its_error() -> None:
    store = F.state().beliefs
    msg = causal_state_to_proto(store, F.state().calibrator, 3, abs_error={"tpot_p95": 0.3})
    assert dict(msg.abs_error) == {"tpot_p95": 0.3}
    assert "source" in msg.DESCRIPTOR.fields_by_name["mechanisms"].message_type.fields_by_name


# --- the hypotheses in force, signals, events -------------------------------------------

def test_hypotheses_are_in_force_from_the_tick_they_enter_until_they_expire() -> None:
    o = outcome()
    loop = HypothesisLoop(RlmSettings())
    assert len(loop.adopt(o)) == 2 and loop.adopt(o) == []  # a repeat adds nothing
    assert loop.in_force(o.enters_tick - 1) == []
    assert len(loop.in_force(o.enters_tick)) == 2
    snap = replace(F.snapshot(), tick=o.enters_tick)
    extra = loop.extra_candidates(snap, F.catalog())
    labels = {(p.config.accelerator, p.config.max_num_seqs) for p in extra["chat-eu"]}
    assert {("l4", 96), ("h100-sxm", 96), ("h100-sxm", 128)} <= labels
    assert all(p.hypothesis.startswith("language-model hypothesis") for p in extra["chat-eu"])
    assert loop.active_priors(F.state().beliefs.config, o.enters_tick)
    expiry = o.hypotheses[0].expires_tick
    assert loop.in_force(expiry) == [] and loop.adopted == {}


def test_a_job_over_its_slo_is_a_breach_signal() -> None:
    snap = F.snapshot()
    slow = SimpleNamespace(job_id="chat-eu", requests_finished=100, ttft_p95_s=5.0,
                           tpot_p95_s=0.01)  # a DeploymentTelemetry's fields read here
    quiet = SimpleNamespace(**{**vars(slow), "requests_finished": 0})
    s = tick_signals(snap, telemetry_latencies([slow]), {"ttft_p95": 0.2})
    assert s.breaching == {"chat-eu"} and s.job_ids == {"chat-eu", "batch-sum"}
    assert tick_signals(snap, telemetry_latencies([quiet]), {}).breaching == frozenset()


def test_a_round_becomes_one_event_per_verdict() -> None:
    events = round_events(outcome())
    assert [(e.kind, e.severity, e.attributes.get("phase") or e.attributes["verdict"])
            for e in events] == [("rlm_round", "info", "finished"),
                                 ("hypothesis", "info", "accepted"),
                                 ("hypothesis", "info", "accepted"),
                                 ("hypothesis", "warning", "dropped")]
    assert "hallucinated accelerator" in events[-1].message
    assert events[1].job_id == "chat-eu" and len({e.key for e in events}) == 4
    # a dropped one names the job it was about, and what it claimed
    assert events[-1].job_id == "chat-eu" and events[-1].attributes["jobs"] == "chat-eu"
    assert "h900" in events[-1].attributes["claim"]
    failed = round_events(outcome(ok=False, reason="HTTP 429: rate limited", hypotheses=(),
                                  dropped=(Dropped(0, "x"),)))
    assert failed[0].severity == "warning" and "HTTP 429" in failed[0].message


def test_koi_explain_lists_a_jobs_hypotheses_accepted_and_dropped() -> None:
    from koi.rlm.loop import job_hypothesis_lines

    o = outcome()  # round r10-p0 at tick 10, entering 12; two accepted, one dropped
    lines = job_hypothesis_lines([o], "chat-eu", F.TICK + 2)
    assert [line.split(" ", 1)[0] for line in lines] == ["accepted", "accepted", "dropped"]
    assert "round r10-p0, in force, expires tick 30" in lines[0]
    assert "hallucinated accelerator" in lines[-1]
    assert "not in force" in job_hypothesis_lines([o], "chat-eu", F.TICK)[0]
    assert job_hypothesis_lines([o], "chat-eu", F.TICK - 1) == []  # not run yet
    assert job_hypothesis_lines([o], "batch-sum", F.TICK + 2) == []


def test_a_snapshot_travels_through_its_json_record() -> None:
    snap = F.snapshot()
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap)))) == snap


# --- llm-only / llm-tools: nothing the model says is trusted ------------------------------

def test_the_plan_a_model_answers_is_checked_entry_by_entry() -> None:
    cat, snap = F.catalog(), F.snapshot()
    menu = direct.menus(snap, cat)
    assert set(menu) == {"chat-eu", "batch-sum"}
    assert menu["chat-eu"][0].accelerator == "h100-sxm"  # the running one first
    l4 = next(i for i, c in enumerate(menu["batch-sum"]) if c.accelerator == "l4"
              and c.gpus_per_replica == 1)
    doc = {"plan": [
        {"job_id": "batch-sum", "option": l4, "offering": F.L4_OD, "replicas": 2},
        {"job_id": "chat-eu", "option": 0, "offering": "aws/us-east-1/b300/on_demand",
         "replicas": 2},
        {"job_id": "ghost", "option": 0, "offering": F.L4_OD, "replicas": 1},
        {"job_id": "batch-sum", "option": l4, "offering": F.L4_OD, "replicas": 1},
    ]}
    targets, dropped = direct.read_plan(doc, menu, snap, cat)
    assert [(t.job_id, t.offering, t.replicas) for t in targets] == [("batch-sum", F.L4_OD, 2)]
    assert any("b300" in d for d in dropped) and any("ghost" in d for d in dropped)
    assert any("named twice" in d for d in dropped)
    over = {"plan": [{"job_id": "batch-sum", "option": l4, "offering": F.L4_OD,
                      "replicas": 9}]}
    assert direct.read_plan(over, menu, snap, cat)[0] == []
    assert "do not fit" in direct.read_plan(over, menu, snap, cat)[1][0]
    kept, why = direct.read_plan(None, menu, snap, cat)
    assert kept == [] and "keeps what it has" in why[0]


class _Chat:
    """A chat port that records each request and answers ``content``."""

    def __init__(self, content: str) -> None:
        self.content, self.requests = content, []

    def complete(self, request, budget):
        self.requests.append(request)
        return ChatReply(self.content, prompt_tokens=100, completion_tokens=20)


def test_the_compact_question_fits_its_token_budget_and_names_only_the_ticks_own() -> None:
    cat, snap = F.catalog(), F.snapshot()
    small = RlmSettings(model="m", prompt="compact", tools=False, prompt_max_tokens=900)
    full = direct.menus(snap, cat)
    answer = {"plan": {"chat-eu": {"option": 0, "offering": F.L4_OD, "replicas": 1}}}
    chat = _Chat(json.dumps(answer))
    got = direct.ask(snap, cat, chat, small)
    (request,) = chat.requests
    assert request.chars() <= 900 * CHARS_PER_TOKEN
    user = request.messages[1]["content"]
    listed = json.loads(user[user.index("{"):user.rindex("}") + 1])["menus"]
    assert 1 <= max(map(len, listed.values())) < max(map(len, full.values()))
    plan = request.response_format["json_schema"]["schema"]["properties"]["plan"]
    assert plan["required"] == list(full) and not plan["additionalProperties"]  # each once
    place, _defer = plan["properties"]["batch-sum"]["anyOf"]
    assert F.L4_OD in place["properties"]["offering"]["enum"]
    assert place["properties"]["option"]["maximum"] == len(listed["batch-sum"]) - 1
    assert set(place["required"]) == {"option", "offering", "replicas"}
    # the running config (option 0) is on h100: an l4 offering is not one of its own
    assert got.targets == [] and "not one of the fleet's h100-sxm" in got.dropped[0]
    roomy = direct.ask(snap, cat, _Chat(json.dumps(answer)),
                       small.model_copy(update={"prompt_max_tokens": 4000}))
    assert roomy.dropped == got.dropped


@pytest.mark.parametrize("name", MODEL_POLICIES)
def test_model_policies_refuse_without_an_endpoint(no_endpoint, name) -> None:
    with pytest.raises(ModelEndpointMissing) as err:
        make_policy(name, catalog=F.catalog())
    assert "KOI_RLM_BASE_URL" in str(err.value) and "KOI_RLM_MODEL" in str(err.value)
    assert name not in default_policy_names()
    assert "KOI_RLM_MODEL" in (model_endpoint_problem([name, "koi"]) or "")
    assert model_endpoint_problem(["koi"]) is None


def test_with_an_endpoint_the_model_policies_are_in_the_default_set(monkeypatch) -> None:
    env = {"KOI_RLM_BASE_URL": "http://127.0.0.1:9/v1", "KOI_RLM_MODEL": "m"}
    assert set(MODEL_POLICIES) <= set(default_policy_names(env))
    assert RlmSettings.from_env(env).endpoint_configured
    assert not RlmSettings.from_env({"KOI_RLM_MODEL": "m"}).endpoint_configured
    assert RlmSettings.from_env({"KOI_RLM_MODEL": "m", "KOI_RLM_ENABLED": "1"}
                                ).endpoint_configured


def test_koi_bench_says_which_settings_a_model_policy_needs(no_endpoint, tmp_path) -> None:
    from koi.cli.main import app

    got = CliRunner().invoke(app, ["bench", "--scenario", "hetero-3h", "--policy", "llm-only",
                                   "--out", str(tmp_path)])
    assert got.exit_code == 2
    text = re.sub(r"\s+", " ", got.output)
    assert "KOI_RLM_BASE_URL" in text and "KOI_RLM_MODEL" in text


# --- settings and deployment files --------------------------------------------------------

def test_every_layer_setting_is_a_declared_variable_with_its_default() -> None:
    fields = {"KOI_RLM_" + n.upper(): f for n, f in RlmSettings.model_fields.items()}
    declared = {k for k in ENV if k.startswith("KOI_RLM_")}
    assert declared == set(fields) | {"KOI_RLM_API_KEY_FILE"}
    for name, f in fields.items():
        default = f.default.get_secret_value() if hasattr(f.default, "get_secret_value") \
            else f.default
        text = str(default).lower() if isinstance(default, bool) else str(default)
        if name != "KOI_RLM_BASE_URL":  # unset: no endpoint (the layer is off)
            assert ENV[name][0] == text, name


def test_the_key_reaches_the_proposer_as_a_file_only() -> None:
    from pathlib import Path

    import yaml
    root = Path(__file__).resolve().parents[2] / "compose"
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    env = compose["services"]["proposer"]["environment"]
    assert "KOI_RLM_API_KEY_FILE" in env and "KOI_RLM_API_KEY" not in env
    for path in [root / "docker-compose.yml", *(root / "k8s").glob("*.yaml")]:
        assert "KOI_RLM_API_KEY:" not in path.read_text(), path.name
    deployment = yaml.safe_load((root / "k8s" / "proposer.yaml").read_text())
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["rlm-api-key"]["secret"] == {"secretName": "koi-rlm-api-key",
                                                "optional": True, "defaultMode": 0o440}
