"""Settings of the language-model hypothesis layer: endpoint, budgets, triggers.

One pydantic model, ``RlmSettings``: every field has a default, a description and its
bounds; ``RlmSettings.from_env()`` reads ``KOI_RLM_<FIELD>`` variables (e.g.
``KOI_RLM_BASE_URL``, ``KOI_RLM_MODEL``, ``KOI_RLM_API_KEY`` or ``KOI_RLM_API_KEY_FILE``)
and refuses bad values naming the variable. The API key is a ``SecretStr``: it never
appears in a repr, a log line or an error message. No I/O beyond reading the
environment (and the key file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

ENV_PREFIX = "KOI_RLM_"


class RlmSettings(BaseModel):
    """The layer's knobs. Off by default: nothing calls a model unless ``enabled``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Run hypothesis rounds at all.")
    base_url: str = Field("http://localhost:8000/v1", min_length=1, max_length=2000,
                          description="OpenAI-compatible endpoint (vLLM :8000/v1, Ollama "
                                      ":11434/v1, a hosted API).")
    model: str = Field("", max_length=200, description="Model name the endpoint serves.")
    api_key: SecretStr = Field(SecretStr(""), description="Bearer key; empty for local "
                                                          "servers that need none.")
    structured_output: bool = Field(True, description="Ask for the answer through "
                                    "response_format json_schema (off for servers without it;"
                                    " the tolerant parser reads plain text either way).")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    prompt: Literal["full", "compact"] = Field(
        "full", description="The root's instructions: 'full' (the causal graph, the tools, "
                            "every rule) or 'compact' (a few hundred tokens with one worked "
                            "example, and an answer schema that lists the fleet's own "
                            "accelerators and jobs: for a small model).")
    tools: bool = Field(True, description="Offer the tools to the root model (off: one call "
                                          "per round and no tool schemas in the prompt, "
                                          "~700 tokens saved).")
    retries: int = Field(2, ge=0, le=10, description="Retries of a call that met an HTTP "
                                                     "5xx or a refused connection.")
    retry_backoff_s: float = Field(1.0, ge=0.0, le=60.0,
                                   description="Wait before the first retry; doubled each "
                                               "time (within the round's wall time).")
    # --- budgets ----------------------------------------------------------------------
    call_timeout_s: float = Field(60.0, gt=0.0, le=600.0,
                                  description="Wall-clock limit of one HTTP call.")
    round_wall_s: float = Field(180.0, gt=0.0, le=3600.0,
                                description="Wall-clock limit of a whole round, tool calls "
                                            "and sub-models included.")
    max_completion_tokens: int = Field(2048, ge=16, le=65536,
                                       description="Completion tokens one call may produce.")
    prompt_max_tokens: int = Field(12_000, ge=512, le=1_000_000,
                                   description="Tokens the root's prompt may hold (system, "
                                               "tools, task and fleet context, estimated at "
                                               "3 characters a token): the fleet context "
                                               "gets what the rest leaves.")
    max_tokens_per_call: int = Field(32_000, ge=256, le=2_000_000,
                                     description="Prompt + completion tokens of one call.")
    max_tokens_per_round: int = Field(120_000, ge=256, le=10_000_000,
                                      description="Tokens a round may spend, all depths.")
    max_tokens_per_hour: int = Field(600_000, ge=256, le=100_000_000,
                                     description="Tokens the layer may spend per hour.")
    usd_per_1k_prompt_tokens: float = Field(0.0, ge=0.0, le=10.0,
                                            description="Price of 1k prompt tokens ($).")
    usd_per_1k_completion_tokens: float = Field(0.0, ge=0.0, le=10.0,
                                                description="Price of 1k completion tokens.")
    max_usd_per_round: float = Field(1.0, ge=0.0, le=1000.0,
                                     description="Dollars a round may spend.")
    max_usd_per_hour: float = Field(5.0, ge=0.0, le=10_000.0,
                                    description="Dollars the layer may spend per hour.")
    max_calls_per_round: int = Field(16, ge=1, le=256,
                                     description="Model calls a round may make, all depths.")
    max_calls_per_hour: int = Field(240, ge=1, le=100_000,
                                    description="Model calls the layer may make per hour.")
    max_tool_calls_per_round: int = Field(24, ge=0, le=512,
                                          description="Tool calls a round may answer.")
    max_depth: int = Field(2, ge=0, le=2, description="Deepest sub-model (recurse) level; "
                                                       "the root model is depth 0.")
    cache_entries: int = Field(128, ge=0, le=100_000,
                               description="Replies kept for identical requests.")
    # --- what a round sees and may say ------------------------------------------------
    context_max_chars: int = Field(24_000, ge=2_000, le=1_000_000,
                                   description="Size cap of the fleet context (JSON chars).")
    max_hypotheses: int = Field(8, ge=1, le=64,
                                description="Hypotheses a round may propose; more are "
                                            "dropped.")
    max_ttl_ticks: int = Field(120, ge=1, le=100_000,
                               description="Furthest a hypothesis may expire after the "
                                           "round's tick.")
    max_candidates_per_job: int = Field(8, ge=0, le=256,
                                        description="Extra candidates hypotheses may add "
                                                    "per job and tick.")
    # --- triggers ---------------------------------------------------------------------
    trigger_period_ticks: int = Field(30, ge=1, le=100_000,
                                      description="Run a round at least every K ticks.")
    breach_streak_ticks: int = Field(3, ge=1, le=10_000,
                                     description="Consecutive SLO-breaching ticks of a job "
                                                 "that trigger a round.")
    residual_shift: float = Field(0.25, gt=0.0, le=10.0,
                                  description="Change of a median |log residual| since the "
                                              "last round that triggers one.")
    cooldown_ticks: int = Field(3, ge=0, le=100_000,
                                description="Ticks after a round before the next may run.")
    # --- records ----------------------------------------------------------------------
    transcripts: str = Field("", max_length=4000,
                             description="Directory each round's transcript (JSON lines, "
                                         "replayable with `koi rlm replay`) is written to; "
                                         "empty = none (koi bench: <out>/rlm).")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v

    @property
    def endpoint_configured(self) -> bool:
        """Whether a model is named and its endpoint given: ``KOI_RLM_MODEL`` and
        ``KOI_RLM_BASE_URL`` set (or ``KOI_RLM_ENABLED=true``, which takes the default
        URL). Without it the proposer runs no rounds and the model policies refuse."""
        return bool(self.model) and (self.enabled or "base_url" in self.model_fields_set)

    @property
    def api_key_value(self) -> str:
        """The key for the HTTP client; never log or store it."""
        return self.api_key.get_secret_value()

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> RlmSettings:
        """Settings from ``KOI_RLM_*`` variables (unset or empty = the default)."""
        source = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in RlmSettings.model_fields:
            raw = source.get(ENV_PREFIX + name.upper())
            if raw:
                values[name] = raw
        key_file = source.get(ENV_PREFIX + "API_KEY_FILE")
        if key_file:
            if "api_key" in values:
                raise ValueError("set KOI_RLM_API_KEY or KOI_RLM_API_KEY_FILE, not both")
            try:
                values["api_key"] = Path(key_file).read_text().strip()
            except OSError as err:
                raise ValueError(f"KOI_RLM_API_KEY_FILE={key_file!r} cannot be read "
                                 f"({type(err).__name__})") from None
        try:
            return RlmSettings(**values)
        except ValidationError as err:
            raise ValueError(_env_errors(err)) from None


# What a small model on a few CPU cores needs (the embedded default, docs/RLM.md §19):
# one short call per round, a prompt of ~1,200 tokens, a bounded answer, a patient
# timeout. The embedded launcher applies these where the environment sets nothing.
SMALL_MODEL_PROFILE: dict[str, str] = {
    "prompt": "compact", "tools": "false", "prompt_max_tokens": "1200",
    "max_completion_tokens": "384", "max_hypotheses": "2", "call_timeout_s": "150",
    "round_wall_s": "300", "max_calls_per_round": "3"}


class ModelEndpointMissing(ValueError):
    """A policy or command that needs a language model found none configured."""


def require_endpoint(who: str, environ: Mapping[str, str] | None = None) -> RlmSettings:
    """The settings from the environment, or ``ModelEndpointMissing`` naming what to set
    (``who``: the policy or command asking)."""
    settings = RlmSettings.from_env(environ)
    if not settings.endpoint_configured:
        raise ModelEndpointMissing(
            f"{who} needs a language-model endpoint: set KOI_RLM_BASE_URL and KOI_RLM_MODEL"
            " (e.g. KOI_RLM_BASE_URL=http://localhost:11434/v1 KOI_RLM_MODEL=qwen3:8b for"
            " Ollama; docs/RLM.md §10)")
    return settings


def endpoint_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names a model endpoint (bad values count as none)."""
    try:
        return RlmSettings.from_env(environ).endpoint_configured
    except ValueError:
        return False


def env_table() -> dict[str, tuple[str, str]]:
    """``KOI_RLM_*`` name → (default as the environment spells it, meaning): the services'
    one list of variables (``services.runtime.settings.ENV``) takes these from here, so
    each knob is defined once. ``KOI_RLM_BASE_URL`` shows as empty: unset, the layer has
    no endpoint (the field's default URL is used only with ``KOI_RLM_ENABLED``)."""
    out: dict[str, tuple[str, str]] = {}
    for name, f in RlmSettings.model_fields.items():
        default = f.default
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        text = str(default).lower() if isinstance(default, bool) else str(default)
        out[ENV_PREFIX + name.upper()] = ("" if name == "base_url" else text,
                                          f.description or "")
    out[ENV_PREFIX + "API_KEY_FILE"] = ("", "File holding the API key (a mounted Secret).")
    return out


def _env_errors(err: ValidationError) -> str:
    """One line per bad variable; values are left out (one may be the key)."""
    parts = []
    for e in err.errors(include_input=False, include_url=False):
        field = str(e["loc"][0]) if e["loc"] else "?"
        parts.append(f"{ENV_PREFIX}{field.upper()}: {e['msg']}")
    return "; ".join(parts)
