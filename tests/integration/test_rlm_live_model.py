"""A hypothesis round against a real model: the embedded llama-server with the default
small model (``language_model``), the compact prompt and the round's answer schema. The
server turns the schema into a grammar, so the answer is JSON whose names all come from
the fleet; whether its claims hold is the model's (the validity rate is measured, in
docs/RLM.md, not asserted). Few and short: one model call each."""

from __future__ import annotations

import pytest

from koi.rlm.client import ChatClient
from koi.rlm.hierarchy import RoundInputs, run_round
from koi.rlm.loop import RoundOutcome, round_events
from koi.rlm.settings import SMALL_MODEL_PROFILE, RlmSettings
from koi.rlm.tools import Toolbox, ToolContext
from support import rlm_fleet as F

pytestmark = pytest.mark.timeout(400)

INVENTED = ("hallucinated", "unknown job", "does not offer", "unknown edge")


def test_a_compact_round_with_the_embedded_model_ends_in_checked_hypotheses(
        language_model) -> None:
    base_url, model = language_model
    s = RlmSettings(**{**SMALL_MODEL_PROFILE, "enabled": True, "base_url": base_url,
                       "model": model})
    snap, cat, state = F.snapshot(), F.catalog(), F.state()
    inputs = RoundInputs.of(snap, cat, state, s)
    result = run_round(inputs, ChatClient(s), Toolbox(ToolContext(snap, cat, state,
                                                                  F.PLANNER)), s)
    assert result.ok, result.reason
    assert result.spend.calls == 1 and result.spend.failures == 0
    assert 0 < result.spend.prompt_tokens <= s.prompt_max_tokens
    assert 0 < result.spend.completion_tokens <= s.max_completion_tokens
    proposed = len(result.hypotheses) + len(result.dropped)
    assert proposed <= s.max_hypotheses
    # the grammar allowed only the fleet's parts, jobs and the graph's edges
    assert not [d.reason for d in result.dropped if any(w in d.reason for w in INVENTED)]
    head = round_events(RoundOutcome.of(result, model=model, enters_tick=F.TICK + 1))[0]
    assert head.attributes["proposed"] == str(proposed)
    assert float(head.attributes["seconds"]) > 0
