"""Policies with a language model in them: ``koi-rlm``, ``llm-only``, ``llm-tools``.

* ``koi-rlm`` — Koi with the hypothesis hierarchy (docs/RLM.md). In-process there is no
  bus, so a round runs between two ticks, when the triggers say so: after tick n's plan,
  over tick n's snapshot and learnt state; what it accepts enters tick n+1 — its test
  configurations widen the candidates (``koi.rlm.adopt.widen``) and its weak priors go
  on the beliefs (``with_priors``) until it expires. Each round's transcript (with its
  inputs: ``koi rlm replay`` re-runs it) and its events are written under
  ``KOI_RLM_TRANSCRIPTS`` (``koi bench``: ``<out>/rlm``), one directory per run.
* ``llm-only`` — the model picks each job's configuration, offering and replicas from a
  menu every tick, with no tools; ``llm-tools`` — the same with ``predict`` and
  ``score`` (no playbook, no beliefs). Their answers are checked (``koi.rlm.direct``);
  what fails keeps the current plan.

All three need an endpoint (``KOI_RLM_BASE_URL`` and ``KOI_RLM_MODEL``) and refuse to
start without one (``ModelEndpointMissing``); the bench leaves them out of its default
set then (``default_policy_names``). ``model_spend()`` is what their calls cost, for the
run's JSON. They make network calls and write files: unlike the other policies they
are not pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

import structlog

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry, PlanDecision
from koi.lifecycle import job_finished
from koi.planner.propose import Proposal
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState, TickReport, place_targets, plan_tick
from koi.policies.base import Policy, register
from koi.policies.koi import _KoiBase
from koi.rlm.adopt import widen, with_priors
from koi.rlm.client import ChatClient, Spend
from koi.rlm.direct import ask, spend_dict
from koi.rlm.loop import (
    EventSpec,
    HypothesisLoop,
    RoundOutcome,
    round_events,
    round_started,
    start_round,
    telemetry_latencies,
    tick_signals,
)
from koi.rlm.record import inputs_record, round_text
from koi.rlm.settings import require_endpoint
from koi.rlm.tools import Toolbox, ToolContext
from koi.scenario.types import Scenario

log = structlog.get_logger(__name__)


@register("koi-rlm")
class KoiRlm(_KoiBase):
    """Koi, and a hypothesis round between ticks when one is due."""

    needs_model: ClassVar[bool] = True
    settings = KoiSettings()

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog, seed)
        self.rlm = require_endpoint(f"policy {self.name}")
        self.chat = ChatClient(self.rlm)
        self.loop = HypothesisLoop(self.rlm)
        self.run_tag = f"s{seed}"
        self.events: list[EventSpec] = []
        self.outcomes: list[RoundOutcome] = []
        self.tested: list[tuple[int, Proposal]] = []   # hypothesis candidates evaluated
        self.spend = Spend()
        self._seeded = False  # a prior was ever set: keep taking expired ones off

    def prepare(self, scenario: Scenario, seed: int) -> None:
        self.run_tag = f"{scenario.name}-s{seed}"

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        tick, state = snapshot.tick, self.state
        if self._seeded:
            active = self.loop.active_priors(state.beliefs.config, tick)
            state = replace(state, beliefs=with_priors(state.beliefs, active, tick))
        extra = self.loop.extra_candidates(snapshot, self.catalog)

        def widened(proposals: list[Proposal]) -> list[Proposal]:
            out, mine = widen(proposals, extra), {id(p) for p in proposals}
            self.tested += [(tick, p) for p in out if id(p) not in mine]
            return out

        decision, report, self.state = plan_tick(snapshot, telemetry, state, self.settings,
                                                 self.catalog,
                                                 widen=widened if extra else None)
        self.reports.append(report)
        signals = tick_signals(snapshot, telemetry_latencies(telemetry), report.abs_error)
        reasons = self.loop.due(signals)
        if reasons:
            self.loop.started(signals)
            self._round(snapshot, report, reasons)
        return decision

    def _round(self, snapshot: ClusterSnapshot, report: TickReport,
               reasons: list[str]) -> None:
        round_id = f"{self.run_tag}-r{snapshot.tick}"
        started = round_started(round_id, snapshot.tick, self.rlm.model, reasons)
        self.events.append(started)
        _, _, result = start_round(snapshot, self.catalog, self.state, self.settings, self.rlm,
                                   self.chat, round_id=round_id,
                                   explanations=report.explanations)
        outcome = RoundOutcome.of(result, model=self.rlm.model, enters_tick=snapshot.tick + 1,
                                  triggers=reasons)
        self._seeded |= bool(self.loop.adopt(outcome))
        self.outcomes.append(outcome)
        self.spend.add(result.spend)
        events = round_events(outcome)
        self.events += events
        if self.rlm.transcripts:
            inputs = inputs_record(snapshot, self.state, self.rlm, round_id=round_id,
                                   backend=self.settings.backend,
                                   explanations=report.explanations)
            self._write(f"{round_id}.jsonl", round_text(inputs, result.transcript),
                        [started, *events])

    def _write(self, name: str, text: str, events: list[EventSpec]) -> None:
        directory = Path(self.rlm.transcripts) / self.run_tag
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text, encoding="utf-8")
            with (directory / "events.jsonl").open("a", encoding="utf-8") as fh:
                for e in events:
                    fh.write(json.dumps({**asdict(e), "attributes": dict(e.attributes)})
                             + "\n")
        except OSError as err:  # a record lost must not stop the run
            log.warning("rlm_transcript_not_written", dir=str(directory),
                        error=type(err).__name__)

    def model_spend(self) -> dict[str, Any]:
        return spend_dict(self.spend, rounds=len(self.outcomes),
                          rounds_failed=sum(not o.ok for o in self.outcomes),
                          hypotheses_accepted=sum(len(o.hypotheses) for o in self.outcomes),
                          hypotheses_dropped=sum(len(o.dropped) for o in self.outcomes),
                          candidates_tested=len(self.tested))


class _ModelPlanner(Policy):
    """A language model picks every job's configuration (``koi.rlm.direct``)."""

    needs_model: ClassVar[bool] = True
    with_tools: ClassVar[bool] = False
    placement = KoiSettings()
    # the tools' planner: the predictor and evaluator alone, no beliefs, no robustness
    nominal = replace(KoiSettings(), use_beliefs=False, learn=False, use_dro=False)

    def __init__(self, catalog: Catalog | None = None, seed: int = 0) -> None:
        super().__init__(catalog, seed)
        self.rlm = require_endpoint(f"policy {self.name}")
        self.chat = ChatClient(self.rlm)
        self.spend = Spend()
        self.ticks = self.fallbacks = self.dropped = 0

    def decide(self, snapshot: ClusterSnapshot,
               telemetry: Sequence[DeploymentTelemetry]) -> PlanDecision:
        toolbox = Toolbox(ToolContext(snapshot, self.catalog, KoiState.initial(self.nominal),
                                      self.nominal)) if self.with_tools else None
        answer = ask(snapshot, self.catalog, self.chat, self.rlm, toolbox=toolbox)
        self.ticks += 1
        self.spend.add(answer.spend)
        self.dropped += len(answer.dropped)
        notes = {"model": self.rlm.model, "dropped": str(len(answer.dropped))}
        if answer.failed:
            self.fallbacks += 1
            notes["kept"] = f"the model call failed ({answer.failed}): current plan kept"
            log.info("llm_plan_kept", policy=self.name, tick=snapshot.tick,
                     reason=answer.failed)
        for reason in answer.dropped[:5]:
            log.info("llm_plan_entry_dropped", policy=self.name, tick=snapshot.tick,
                     reason=reason)
        finished = [j for j in snapshot.jobs if job_finished(j, snapshot.time_s)]
        targets = [t for t in answer.targets if t.job_id not in {j.id for j in finished}]
        return place_targets(targets, notes, snapshot, self.placement)

    def model_spend(self) -> dict[str, Any]:
        return spend_dict(self.spend, ticks_asked=self.ticks, fallbacks=self.fallbacks,
                          entries_dropped=self.dropped)


@register("llm-only")
class LlmOnly(_ModelPlanner):
    with_tools = False


@register("llm-tools")
class LlmTools(_ModelPlanner):
    with_tools = True
