"""One hypothesis round: a root model, its tools, sub-models, and the hypotheses it ends with.

``run_round(inputs, chat, toolbox, settings)``: the root model reads the fleet context
(``ROOT_SYSTEM_PROMPT`` + the quoted ``<fleet_data>`` block) and may call tools —
``predict``, ``score``, ``playbook``, ``explain`` (``koi.rlm.tools``) and ``recurse``:
a sub-model on a sub-context of some jobs, itself allowed tools, at most
``settings.max_depth`` (≤ 2) levels below the root; deeper is refused. Unknown tools and
bad arguments are answered with an error for the model to read. The round ends with the
root's JSON answer, read tolerantly (one repair request if it is not JSON), parsed and
validated (``hypothesis.accept``): accepted hypotheses and dropped ones with reasons.

Whatever happens — a timeout, an HTTP error, a spent budget, a hostile answer, a bug —
the result is a ``RoundResult`` (``ok=False`` with a reason), never an exception. Every
request, response, tool call and result goes into the ``Transcript``; ``replay`` runs
the same round against it without a model and ends with the same hypotheses.
Triggers are in ``koi.rlm.triggers``. No I/O besides the chat port; time from a clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, JobStatus
from koi.planner.tick import KoiState, active_jobs
from koi.rlm.client import ChatPort, ChatRequest, RoundBudget, RoundFailed, Spend, ToolCall
from koi.rlm.compact import context_chars, root_format, root_system_prompt, root_tools
from koi.rlm.context import COMPACT_TRIM_ORDER, TRIM_ORDER, FleetContext, build_context
from koi.rlm.hypothesis import Dropped, Hypothesis, SearchSpace, accept
from koi.rlm.jsontext import extract_json, quote_data
from koi.rlm.prompts import (
    QUESTION_CLOSE,
    QUESTION_OPEN,
    REPAIR_PROMPT,
    ROOT_TASK,
    SUB_SYSTEM_PROMPT,
    SUB_TASK,
    SUB_TOOLS,
)
from koi.rlm.settings import RlmSettings
from koi.rlm.tools import Toolbox, error
from koi.rlm.transcript import ReplayChat, Transcript, reply_record, request_record
from koi.safe_text import printable

log = structlog.get_logger(__name__)

MAX_TOOL_CALLS_PER_TURN = 8
MAX_QUESTION_CHARS = 2000
MAX_ANSWER_CHARS = 4000


@dataclass(frozen=True)
class RoundInputs:
    """Everything a round reads: its id and tick, the root context, how to build a
    sub-context, and what hypotheses are checked against."""

    round_id: str
    tick: int
    context: FleetContext
    catalog: Catalog
    jobs: Mapping[str, JobStatus]
    space: SearchSpace
    subcontext: Callable[[Sequence[str]], FleetContext]
    system: str                                 # the root's system prompt
    tools: tuple[Mapping[str, Any], ...]        # the root's tools (none: one call)
    response_format: Mapping[str, Any] | None   # the root's answer schema

    @staticmethod
    def of(snapshot: ClusterSnapshot, catalog: Catalog, state: KoiState,
           settings: RlmSettings, *, events: Sequence[str] = (),
           round_id: str = "") -> RoundInputs:
        """The inputs of a round at ``snapshot`` over the planner's ``state``."""
        order = COMPACT_TRIM_ORDER if settings.prompt == "compact" else TRIM_ORDER

        def context(job_ids: Sequence[str] | None, max_chars: int) -> FleetContext:
            return build_context(snapshot, catalog, beliefs=state.beliefs,
                                 calibrator=state.calibrator, events=events,
                                 job_ids=job_ids, max_chars=max_chars, trim_order=order)

        budget = context_chars(settings)
        root = context(None, budget)
        jobs = {j.id: j for j in active_jobs(snapshot)}
        space = SearchSpace.of(snapshot, catalog, state.beliefs.mechanisms)
        return RoundInputs(
            round_id=round_id or f"r{snapshot.tick}-{root.sha[:8]}", tick=snapshot.tick,
            context=root, catalog=catalog, jobs=jobs, space=space,
            subcontext=lambda ids: context(ids, max(budget // 2, 2000)),
            system=root_system_prompt(settings), tools=tuple(root_tools(settings)),
            response_format=root_format(settings, accelerators=space.accelerators,
                                        job_ids=jobs, tick=snapshot.tick))


@dataclass(frozen=True)
class RoundResult:
    round_id: str
    tick: int
    ok: bool
    reason: str = ""
    hypotheses: tuple[Hypothesis, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    spend: Spend = field(default_factory=Spend)
    transcript: Transcript = field(default_factory=Transcript)


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Round:
    def __init__(self, inputs: RoundInputs, chat: ChatPort, toolbox: Toolbox,
                 settings: RlmSettings, budget: RoundBudget, transcript: Transcript) -> None:
        self.inputs, self.chat, self.toolbox = inputs, chat, toolbox
        self.settings, self.budget, self.transcript = settings, budget, transcript

    def converse(self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]],
                 response_format: Mapping[str, Any] | None, depth: int
                 ) -> tuple[str, list[dict[str, Any]]]:
        """Talk until the model answers without tool calls: (its answer, the messages)."""
        msgs = list(messages)
        for _ in range(self.settings.max_calls_per_round + 1):
            request = ChatRequest(tuple(msgs), tuple(tools), response_format, depth)
            self.transcript.add("request", **request_record(request,
                                                            request.key(self.chat.model)))
            reply = self.chat.complete(request, self.budget)
            self.transcript.add("response", depth=depth, **reply_record(reply))
            if isinstance(reply, RoundFailed):
                raise _Abort(reply.reason)
            if not reply.tool_calls:
                return reply.content or "", msgs
            calls = reply.tool_calls
            msgs.append({"role": "assistant", "content": reply.content,
                         "tool_calls": [{"id": c.id, "type": "function", "function": {
                             "name": c.name, "arguments": c.arguments}} for c in calls]})
            for i, call in enumerate(calls):
                result = self.tool(call, depth) if i < MAX_TOOL_CALLS_PER_TURN else error(
                    f"more than {MAX_TOOL_CALLS_PER_TURN} tool calls in one turn")
                self.transcript.add("tool", depth=depth, id=call.id, name=call.name,
                                    arguments=call.arguments, result=result)
                msgs.append({"role": "tool", "tool_call_id": call.id, "content": result})
        raise _Abort(f"no answer after {self.settings.max_calls_per_round} calls")

    def tool(self, call: ToolCall, depth: int) -> str:
        if self.budget.tool_calls >= self.budget.max_tool_calls:
            return error(f"the round's {self.budget.max_tool_calls} tool calls are spent:"
                         " answer now")
        self.budget.tool_calls += 1
        if call.name != "recurse":
            return self.toolbox.call(call.name, call.arguments)
        return self.recurse(call.arguments, depth)

    def recurse(self, arguments: str, depth: int) -> str:
        if depth + 1 > self.settings.max_depth:
            return error(f"recurse refused: recursion beyond depth {self.settings.max_depth}"
                         f" (this model is at depth {depth})")
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return error("recurse: arguments are not JSON")
        question, job_ids = (args.get("question"), args.get("job_ids")) \
            if isinstance(args, dict) else (None, None)
        if not isinstance(question, str) or not question.strip():
            return error("recurse: question must be a non-empty string")
        if not isinstance(job_ids, list) or not 1 <= len(job_ids) <= 8 \
                or not all(isinstance(j, str) for j in job_ids):
            return error("recurse: job_ids must be a list of 1..8 job ids")
        unknown = [j for j in job_ids if j not in self.inputs.jobs]
        if unknown:
            return error(f"recurse: unknown job {printable(unknown[0], 80)!r}")
        sub = self.inputs.subcontext(job_ids)
        quoted = f"{QUESTION_OPEN}\n{quote_data(question[:MAX_QUESTION_CHARS])}\n{QUESTION_CLOSE}"
        messages = [{"role": "system", "content": SUB_SYSTEM_PROMPT},
                    {"role": "user", "content": SUB_TASK.format(question=quoted,
                                                                data=sub.block)}]
        answer, _ = self.converse(messages, SUB_TOOLS, None, depth + 1)
        return quote_data({"answer": printable(answer, MAX_ANSWER_CHARS)})

    def root(self) -> Any:
        """The root's answer as JSON (one repair request if it is not)."""
        task = ROOT_TASK.format(tick=self.inputs.tick,
                                max_hypotheses=self.settings.max_hypotheses,
                                data=self.inputs.context.block)
        messages = [{"role": "system", "content": self.inputs.system},
                    {"role": "user", "content": task}]
        answer, msgs = self.converse(messages, self.inputs.tools,
                                     self.inputs.response_format, 0)
        parsed = extract_json(answer)
        if parsed is None:
            self.transcript.add("repair", reason="the answer is not JSON")
            msgs += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": REPAIR_PROMPT}]
            answer, _ = self.converse(msgs, (), self.inputs.response_format, 0)
            parsed = extract_json(answer)
        if parsed is None:
            raise _Abort("the answer is not JSON (after one repair request)")
        items = parsed.get("hypotheses") if isinstance(parsed, dict) else parsed
        if not isinstance(items, list):
            raise _Abort("the answer has no list of hypotheses")
        return items


def run_round(inputs: RoundInputs, chat: ChatPort, toolbox: Toolbox,
              settings: RlmSettings) -> RoundResult:
    """One round; always returns (``ok=False`` with a reason when it failed). Its
    wall-time deadline is on ``chat``'s clock, which checks it."""
    transcript = Transcript()
    transcript.add("round_start", round_id=inputs.round_id, tick=inputs.tick,
                   model=chat.model, context_sha=inputs.context.sha,
                   context_chars=inputs.context.chars, max_depth=settings.max_depth)
    budget = RoundBudget.start(settings, chat.clock())
    hypotheses: tuple[Hypothesis, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    reason = ""
    try:
        items = _Round(inputs, chat, toolbox, settings, budget, transcript).root()
        hypotheses, dropped = accept(
            items, catalog=inputs.catalog, jobs=inputs.jobs, space=inputs.space,
            tick=inputs.tick, source_model=chat.model, round_id=inputs.round_id,
            max_hypotheses=settings.max_hypotheses, max_ttl_ticks=settings.max_ttl_ticks)
    except _Abort as abort:
        reason = abort.reason
    except Exception as err:  # a round never raises: a bug here fails the round, loudly
        reason = f"internal error: {type(err).__name__}"
        log.exception("rlm_round_crashed", round=inputs.round_id)
    ok = not reason
    transcript.add("round_end", ok=ok, reason=reason, accepted=[h.id for h in hypotheses],
                   hypotheses=[h.to_dict() for h in hypotheses],
                   dropped=[{"index": d.index, "reason": d.reason} for d in dropped],
                   spend=budget.spent.as_dict(), tool_calls=budget.tool_calls)
    log.info("rlm_round_done", round=inputs.round_id, tick=inputs.tick, ok=ok,
             reason=reason, accepted=len(hypotheses), dropped=len(dropped),
             tokens=budget.spent.tokens, usd=round(budget.spent.usd, 6),
             calls=budget.spent.calls)
    return RoundResult(inputs.round_id, inputs.tick, ok, reason, hypotheses, dropped,
                       budget.spent, transcript)


def replay(inputs: RoundInputs, transcript: Transcript, toolbox: Toolbox,
           settings: RlmSettings) -> RoundResult:
    """The round again from its transcript, without a model: the same inputs give the
    same requests, tool results and hypotheses (a divergence fails the replay)."""
    return run_round(inputs, ReplayChat(transcript), toolbox, settings)
