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

import importlib
from typing import Any

# what each name is, and where it lives: loaded on first use, so reading the settings
# (services.runtime.settings does, in every process) does not import the predictor,
# the planner and the openai client behind the round
_WHERE = {
    "ChatClient": "client",
    "Dropped": "hypothesis",
    "FleetContext": "context",
    "Hypothesis": "hypothesis",
    "HypothesisPrior": "adopt",
    "RlmSettings": "settings",
    "RoundFailed": "client",
    "RoundInputs": "hierarchy",
    "RoundResult": "hierarchy",
    "SearchSpace": "hypothesis",
    "Spend": "client",
    "TickSignals": "triggers",
    "ToolContext": "tools",
    "Toolbox": "tools",
    "Transcript": "transcript",
    "TriggerState": "triggers",
    "accept": "hypothesis",
    "build_context": "context",
    "candidate_proposals": "adopt",
    "priors": "adopt",
    "ran": "triggers",
    "replay": "hierarchy",
    "run_round": "hierarchy",
    "triggers": "triggers",
    "validate": "hypothesis",
    "widen": "adopt",
    "with_priors": "adopt",
}

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'koi.rlm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"koi.rlm.{_WHERE[name]}"), name)
