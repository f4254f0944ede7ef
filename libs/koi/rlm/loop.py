"""Running hypothesis rounds beside a planner: signals, the hypotheses in force, events.

What both hosts of the layer share — the ``koi-rlm`` bench policy (a round between two
ticks, in-process) and the proposer service (a round on a worker thread; a tick never
waits for it) — as plain data and functions:

* ``tick_signals`` — what a tick tells the triggers: its active jobs, those whose
  measured p95 latency broke their SLO, the median |log residual| per outcome;
* ``start_round`` — one round over a tick's snapshot and planner state (the tools see
  the same state), returning the ``RoundResult``;
* ``RoundOutcome`` — what a finished round hands on (the bus's ``HypothesisRound``):
  accepted and dropped hypotheses, spend, why it ran, the tick it enters first;
* ``HypothesisLoop`` — trigger state and the accepted hypotheses in force: ``due`` says
  whether a round should start, ``adopt`` takes a finished round's outcome,
  ``extra_candidates`` / ``active_priors`` are what the hypotheses in force change
  (``koi.rlm.adopt``);
* ``round_started`` / ``round_events`` — a round's operator events (started, finished or
  failed with the reason, each accepted and each dropped hypothesis with its reason) as
  ``EventSpec`` data for the host to emit.

No I/O here besides the chat port a caller hands to ``start_round``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from koi.catalog import Catalog
from koi.causal.beliefs import BeliefConfig
from koi.causal.observe import OutcomeObservation
from koi.cluster import ClusterSnapshot, DeploymentTelemetry
from koi.planner.explain import Explanation
from koi.planner.propose import Proposal
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState, active_jobs
from koi.rlm.adopt import HypothesisPrior, candidate_proposals, priors
from koi.rlm.client import ChatPort, Spend
from koi.rlm.hierarchy import RoundInputs, RoundResult, run_round
from koi.rlm.hypothesis import Dropped, Hypothesis, SearchSpace
from koi.rlm.settings import RlmSettings
from koi.rlm.tools import Toolbox, ToolContext
from koi.rlm.triggers import TickSignals, TriggerState, ran, triggers
from koi.safe_text import printable

MESSAGE_CHARS = 400
# (job id, measured p95 TTFT ms, measured p95 TPOT ms); None = not measured
Latency = tuple[str, float | None, float | None]


# --- what a tick says -------------------------------------------------------------------

def telemetry_latencies(telemetry: Iterable[DeploymentTelemetry]) -> list[Latency]:
    """Each deployment's measured p95s (in-process: the simulator's telemetry)."""
    return [(t.job_id, t.ttft_p95_s * 1000.0, t.tpot_p95_s * 1000.0) for t in telemetry
            if t.requests_finished > 0]


def observation_latencies(observations: Iterable[OutcomeObservation]) -> list[Latency]:
    """Each observed deployment's measured p95s (on the bus: the tick's observations)."""
    return [(o.job_id, o.observed.get("ttft_p95_ms"), o.observed.get("tpot_p95_ms"))
            for o in observations]


def tick_signals(snapshot: ClusterSnapshot, latencies: Iterable[Latency],
                 abs_error: Mapping[str, float]) -> TickSignals:
    """The triggers' view of a tick: an online job breaches when a deployment of it
    measured a p95 above its SLO."""
    jobs = {j.id: j for j in active_jobs(snapshot)}
    breaching = set()
    for job_id, ttft, tpot in latencies:
        job = jobs.get(job_id)
        if job is None or not job.is_online:
            continue
        slo = job.spec.slo  # type: ignore[union-attr]
        if (ttft is not None and ttft > slo.ttft_ms) or (tpot is not None and tpot > slo.tpot_ms):
            breaching.add(job_id)
    return TickSignals(snapshot.tick, frozenset(jobs), frozenset(breaching), dict(abs_error))


# --- one round ----------------------------------------------------------------------------

def round_id_for(snapshot: ClusterSnapshot, serial: int) -> str:
    """``r<tick>-<serial>``: unique within a host's run (a transcript file's name)."""
    return f"r{snapshot.tick}-{serial}"


def start_round(snapshot: ClusterSnapshot, catalog: Catalog, state: KoiState,
                planner: KoiSettings, settings: RlmSettings, chat: ChatPort, *,
                round_id: str, explanations: Sequence[Explanation] = (),
                events: Sequence[str] = ()) -> tuple[RoundInputs, Toolbox, RoundResult]:
    """One round at ``snapshot`` over the planner's ``state`` (beliefs and calibrator);
    the tools score and predict with ``planner``'s settings. Never raises."""
    inputs = RoundInputs.of(snapshot, catalog, state, settings, events=events,
                            round_id=round_id)
    toolbox = Toolbox(ToolContext(snapshot, catalog, state, planner,
                                  {e.job_id: e for e in explanations}))
    return inputs, toolbox, run_round(inputs, chat, toolbox, settings)


@dataclass(frozen=True)
class RoundOutcome:
    """A finished round as the planner takes it up (``koi.tick.<n>.hypotheses``)."""

    enters_tick: int
    round_id: str
    round_tick: int
    model: str
    ok: bool
    reason: str = ""
    hypotheses: tuple[Hypothesis, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    spend: Spend = field(default_factory=Spend)
    triggers: tuple[str, ...] = ()

    @property
    def proposed(self) -> int:
        """Hypotheses the model wrote (accepted and dropped)."""
        return len(self.hypotheses) + len(self.dropped)

    def measures(self) -> dict[str, str]:
        """The round's figures as event attributes: tokens in and out, model seconds,
        calls, dollars, hypotheses proposed and accepted (validity = accepted/proposed)."""
        s = self.spend
        return {"prompt_tokens": str(s.prompt_tokens),
                "completion_tokens": str(s.completion_tokens), "tokens": str(s.tokens),
                "seconds": f"{s.seconds:.3f}", "calls": str(s.calls), "usd": f"{s.usd:.6f}",
                "proposed": str(self.proposed), "accepted": str(len(self.hypotheses))}

    @staticmethod
    def of(result: RoundResult, *, model: str, enters_tick: int,
           triggers: Sequence[str] = ()) -> RoundOutcome:
        return RoundOutcome(enters_tick, result.round_id, result.tick, model, result.ok,
                            result.reason, result.hypotheses, result.dropped, result.spend,
                            tuple(triggers))


# --- the hypotheses in force --------------------------------------------------------------

@dataclass
class HypothesisLoop:
    """Trigger state and the accepted hypotheses, each in force from the tick its round
    entered until it expires."""

    settings: RlmSettings
    trigger_state: TriggerState = field(default_factory=TriggerState)
    adopted: dict[str, tuple[int, Hypothesis]] = field(default_factory=dict)
    rounds: int = 0

    def due(self, signals: TickSignals) -> list[str]:
        """Why a round should start at this tick (empty: not now)."""
        reasons, self.trigger_state = triggers(self.trigger_state, signals, self.settings)
        return reasons

    def started(self, signals: TickSignals) -> None:
        """A round started at ``signals.tick``: the triggers restart from here."""
        self.trigger_state = ran(self.trigger_state, signals)
        self.rounds += 1

    def adopt(self, outcome: RoundOutcome) -> list[Hypothesis]:
        """Take a finished round's accepted hypotheses (a repeat keeps its first entry);
        returns the new ones."""
        new = [h for h in outcome.hypotheses if h.id not in self.adopted]
        for h in new:
            self.adopted[h.id] = (outcome.enters_tick, h)
        return new

    def in_force(self, tick: int) -> list[Hypothesis]:
        """The hypotheses that hold at ``tick``, in the order they were adopted (expired
        ones are forgotten)."""
        for hid in [k for k, (_, h) in self.adopted.items() if h.expires_tick <= tick]:
            del self.adopted[hid]
        return [h for enters, h in self.adopted.values() if enters <= tick]

    def extra_candidates(self, snapshot: ClusterSnapshot, catalog: Catalog
                         ) -> dict[str, list[Proposal]]:
        """Per job, the configurations the hypotheses in force would test."""
        hypotheses = self.in_force(snapshot.tick)
        if not hypotheses:
            return {}
        jobs = {j.id: j for j in active_jobs(snapshot)}
        return candidate_proposals(hypotheses, jobs, SearchSpace.of(snapshot, catalog),
                                   catalog, per_job=self.settings.max_candidates_per_job)

    def active_priors(self, config: BeliefConfig, tick: int) -> tuple[HypothesisPrior, ...]:
        """The weak priors of the hypotheses in force (``adopt.with_priors`` sets them)."""
        return priors(self.in_force(tick), config)


# --- operator events ----------------------------------------------------------------------

@dataclass(frozen=True)
class EventSpec:
    """An operator event as data (``ServiceContext.event`` takes these fields)."""

    kind: str            # "rlm_round" | "hypothesis"
    severity: str        # "info" | "warning"
    message: str
    key: str             # stable per round and item: re-emitting is de-duplicated
    job_id: str = ""
    mechanism_ids: tuple[str, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)


def round_started(round_id: str, tick: int, model: str, reasons: Sequence[str]) -> EventSpec:
    why = printable("; ".join(reasons), 240)
    return EventSpec("rlm_round", "info",
                     printable(f"hypothesis round {round_id} started at tick {tick}"
                               f" ({model}): {why}", MESSAGE_CHARS),
                     f"{round_id}:started", attributes={"phase": "started", "round": round_id})


def round_events(outcome: RoundOutcome) -> list[EventSpec]:
    """The events of a finished round: finished or failed, then each accepted and each
    dropped hypothesis."""
    o, s = outcome, outcome.spend
    rid = o.round_id
    cost = (f"{s.prompt_tokens} tokens in, {s.completion_tokens} out, {s.seconds:.1f} s,"
            f" ${s.usd:.4f}, {s.calls} calls")
    attrs = {"round": rid, "round_tick": str(o.round_tick), "enters_tick": str(o.enters_tick),
             **o.measures()}
    if o.ok:
        head = EventSpec("rlm_round", "info", printable(
            f"hypothesis round {rid} (tick {o.round_tick}) finished: {len(o.hypotheses)}"
            f" accepted, {len(o.dropped)} dropped ({len(o.hypotheses)} of {o.proposed}"
            f" valid); {cost};"
            f" enters tick {o.enters_tick}",
            MESSAGE_CHARS), f"{rid}:finished", attributes={**attrs, "phase": "finished"})
    else:
        head = EventSpec("rlm_round", "warning", printable(
            f"hypothesis round {rid} (tick {o.round_tick}) failed: {o.reason}; {cost}",
            MESSAGE_CHARS), f"{rid}:failed",
            attributes={**attrs, "phase": "failed", "reason": printable(o.reason, 200)})
    out = [head]
    for h in o.hypotheses:
        cited = tuple(w.partition(":")[2].strip() for w in h.why
                      if w.partition(":")[0].strip() == "mechanism")
        job = h.tests[0].job_id if h.tests else (h.explore[0].job_id if h.explore else "")
        text = f"accepted hypothesis {h.id} ({h.source_model}): {h.label()}" + (
            f" — {h.statement}" if h.statement else "")
        out.append(EventSpec("hypothesis", "info", printable(text, MESSAGE_CHARS),
                             f"{rid}:{h.id}", job_id=job, mechanism_ids=cited,
                             attributes={"verdict": "accepted", "round": rid,
                                         "hypothesis": h.id,
                                         "expires_tick": str(h.expires_tick)}))
    for d in o.dropped:
        attrs = {"verdict": "dropped", "round": rid, "hypothesis": d.hypothesis_id,
                 "reason": printable(d.reason, 200)}
        if d.job_ids:
            attrs["jobs"] = printable(",".join(d.job_ids), 200)
        if d.claim:
            attrs["claim"] = printable(d.claim, 300)
        out.append(EventSpec("hypothesis", "warning", printable(
            f"dropped hypothesis #{d.index} of round {rid}: {d.reason}", MESSAGE_CHARS),
            f"{rid}:dropped:{d.index}", job_id=d.job_ids[0] if d.job_ids else "",
            attributes=attrs))
    return out


def job_hypothesis_lines(outcomes: Sequence[RoundOutcome], job_id: str, tick: int,
                         limit: int = 8) -> list[str]:
    """Operator lines for the hypotheses of the rounds run by ``tick`` whose tests or
    explorations name ``job_id``: accepted (in force at ``tick`` or not) and dropped with
    the reason, newest round first (``koi explain``; planner-api's Explain does the same
    over the bus's rounds)."""
    lines: list[str] = []
    for o in sorted((o for o in outcomes if o.round_tick <= tick),
                    key=lambda o: -o.round_tick):
        for h in o.hypotheses:
            if job_id in {t.job_id for t in h.tests} | {e.job_id for e in h.explore}:
                state = "in force" if o.enters_tick <= tick < h.expires_tick else \
                    "not in force"
                lines.append(printable(
                    f"accepted {h.id} ({h.source_model}, round {o.round_id}, {state},"
                    f" expires tick {h.expires_tick}): {h.label()}"
                    + (f" — {h.statement}" if h.statement else ""), MESSAGE_CHARS))
        lines += [printable(f"dropped #{d.index} of round {o.round_id} ({o.model}):"
                            f" {d.reason}", MESSAGE_CHARS)
                  for d in o.dropped if job_id in d.job_ids]
    return lines[:limit]
