"""The language-model hypothesis layer (domain half): claims, context, client, round.

A hierarchy of reasoning models proposes *hypotheses* about the fleet — typed claims on
the causal graph's edges with the configurations that would test them — and Koi's
deterministic parts check everything it says:

* ``hypothesis`` — the ``Hypothesis`` type, parsing and ``validate``/``accept``;
* ``adopt`` — accepted hypotheses as extra candidates (``widen``) and weak priors
  (``with_priors``);
* ``context`` — the bounded fleet context, every outside string quoted as data;
* ``client`` — the OpenAI-compatible client with budgets, a cache, ``RoundFailed``;
* ``tools`` / ``hierarchy`` — the tools over Koi's predictor and planner, the round,
  recursion, transcripts and ``replay``; ``triggers`` — when a round is due;
* ``settings`` — ``RlmSettings`` (``KOI_RLM_*``); ``prompts`` — what the models are told.

Domain code plus the ``openai`` client: no NATS, gRPC or Redis imports. docs/RLM.md.
"""

from __future__ import annotations

from koi.rlm.adopt import HypothesisPrior, candidate_proposals, priors, widen, with_priors
from koi.rlm.client import ChatClient, RoundFailed, Spend
from koi.rlm.context import FleetContext, build_context
from koi.rlm.hierarchy import RoundInputs, RoundResult, replay, run_round
from koi.rlm.hypothesis import Dropped, Hypothesis, SearchSpace, accept, validate
from koi.rlm.settings import RlmSettings
from koi.rlm.tools import Toolbox, ToolContext
from koi.rlm.transcript import Transcript
from koi.rlm.triggers import TickSignals, TriggerState, ran, triggers

__all__ = [
    "ChatClient",
    "Dropped",
    "FleetContext",
    "Hypothesis",
    "HypothesisPrior",
    "RlmSettings",
    "RoundFailed",
    "RoundInputs",
    "RoundResult",
    "SearchSpace",
    "Spend",
    "TickSignals",
    "ToolContext",
    "Toolbox",
    "Transcript",
    "TriggerState",
    "accept",
    "build_context",
    "candidate_proposals",
    "priors",
    "ran",
    "replay",
    "run_round",
    "triggers",
    "validate",
    "widen",
    "with_priors",
]
