"""The layer fitted to a small, slow model, over real HTTP against the replay server:
the compact prompt within its token budget, the round's answer schema naming only the
fleet's own parts and jobs, retries after a 5xx with backoff, and the round's measures
(tokens in and out, seconds, validity) in its events."""

from __future__ import annotations

import json

import pytest

from koi.rlm.client import CHARS_PER_TOKEN, ChatClient
from koi.rlm.compact import COMPACT_SYSTEM_PROMPT, EXAMPLE_ANSWER
from koi.rlm.hierarchy import RoundInputs, run_round
from koi.rlm.loop import RoundOutcome, round_events
from koi.rlm.settings import SMALL_MODEL_PROFILE, RlmSettings
from koi.rlm.tools import Toolbox, ToolContext
from support import rlm_fleet as F
from support.openai_replay import ReplayServer

pytestmark = pytest.mark.timeout(60)


def small(srv: ReplayServer, **kw) -> RlmSettings:
    base = {**SMALL_MODEL_PROFILE, "enabled": True, "base_url": srv.base_url,
            "model": "replay-model", "call_timeout_s": 5.0, "round_wall_s": 20.0}
    return RlmSettings(**{**base, **kw})


def run(srv: ReplayServer, s: RlmSettings):
    snap, cat, state = F.snapshot(), F.catalog(), F.state()
    inputs = RoundInputs.of(snap, cat, state, s)
    return inputs, run_round(inputs, ChatClient(s), Toolbox(ToolContext(snap, cat, state,
                                                                        F.PLANNER)), s)


def compact_doc() -> dict:
    """The compact prompt's example, with this fleet's job: what a small model that
    copies the example's shape writes."""
    doc = json.loads(json.dumps(EXAMPLE_ANSWER["hypotheses"][0]))
    doc["why"] = ["residual:chat-eu/tpot_p95"]
    doc["test"]["configs"][0]["job_id"] = "chat-eu"
    doc["test"]["configs"][0]["config"]["tp"] = 1
    doc["expires_tick"] = F.TICK + 20
    return doc


def test_the_compact_round_is_one_short_call_with_the_fleets_names_in_its_schema() -> None:
    answer = json.dumps({"hypotheses": [compact_doc()]})
    with ReplayServer([{"content": answer}]) as srv:
        s = small(srv)
        inputs, result = run(srv, s)
    assert result.ok, result.reason
    assert len(result.hypotheses) == 1 and srv.calls == 1
    body = srv.requests[0]["body"]
    assert "tools" not in body and body["max_completion_tokens"] == 384
    system, user = body["messages"]
    assert system["content"] == COMPACT_SYSTEM_PROMPT
    prompt_chars = len(system["content"]) + len(user["content"])
    assert prompt_chars <= s.prompt_max_tokens * CHARS_PER_TOKEN
    schema = body["response_format"]["json_schema"]["schema"]
    item = schema["properties"]["hypotheses"]["items"]
    assert schema["properties"]["hypotheses"]["maxItems"] == 2
    config = item["properties"]["test"]["properties"]["configs"]["items"]
    assert config["properties"]["job_id"]["enum"] == sorted(inputs.jobs)
    assert config["properties"]["config"]["properties"]["accelerator"]["enum"] == [
        "h100-sxm", "l4"]
    ticks = item["properties"]["expires_tick"]
    assert (ticks["minimum"], ticks["maximum"]) == (F.TICK + 1, F.TICK + s.max_ttl_ticks)
    edges = {(c["properties"]["cause"]["const"], c["properties"]["effect"]["const"])
             for c in item["properties"]["claim"]["anyOf"]}
    assert ("kv_pressure", "tpot") in edges and len(edges) == 8


def test_a_tight_token_budget_trims_the_context_and_keeps_the_jobs() -> None:
    with ReplayServer([{"content": '{"hypotheses": []}'}], repeat_last=True) as srv:
        wide, _ = run(srv, small(srv, prompt_max_tokens=4000))
        tight, result = run(srv, small(srv, prompt_max_tokens=600))
    assert result.ok and tight.context.chars < wide.context.chars
    assert tight.context.dropped and tight.context.data["jobs"]


def test_a_5xx_is_retried_with_backoff_and_then_answers() -> None:
    answer = json.dumps({"hypotheses": [compact_doc()]})
    script = [{"status": 500}, {"status": 500}, {"content": answer}]
    with ReplayServer(script) as srv:
        _, result = run(srv, small(srv, retries=2, retry_backoff_s=0.01))
    assert result.ok and len(result.hypotheses) == 1 and srv.calls == 3
    assert result.spend.failures == 2 and result.spend.calls == 3
    with ReplayServer([{"status": 500}, {"content": answer}]) as srv:
        _, once = run(srv, small(srv, retries=0))
    assert not once.ok and "HTTP 500" in once.reason and srv.calls == 1


def test_a_4xx_is_not_retried() -> None:
    with ReplayServer([{"status": 429}, {"content": '{"hypotheses": []}'}]) as srv:
        _, result = run(srv, small(srv, retries=3, retry_backoff_s=0.01))
    assert not result.ok and "HTTP 429" in result.reason and srv.calls == 1


def test_the_rounds_event_carries_tokens_seconds_and_validity() -> None:
    bad = compact_doc()
    bad["claim"]["size"] = 0.5  # says "increase": contradicts its direction
    answer = json.dumps({"hypotheses": [compact_doc(), bad]})
    usage = {"prompt_tokens": 900, "completion_tokens": 210}
    with ReplayServer([{"content": answer, "usage": usage}]) as srv:
        _, result = run(srv, small(srv))
    outcome = RoundOutcome.of(result, model="replay-model", enters_tick=F.TICK + 1)
    head = round_events(outcome)[0]
    assert head.attributes["prompt_tokens"] == "900"
    assert head.attributes["completion_tokens"] == "210"
    assert (head.attributes["proposed"], head.attributes["accepted"]) == ("2", "1")
    assert float(head.attributes["seconds"]) > 0
    assert "1 accepted, 1 dropped (1 of 2 valid)" in head.message
    assert "900 tokens in, 210 out" in head.message
