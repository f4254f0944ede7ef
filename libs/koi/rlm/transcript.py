"""A round's transcript: every request, response, tool call and result, as JSON lines.

``Transcript`` collects records while a round runs; ``to_jsonl``/``from_jsonl`` write and
read them (the caller does the file I/O). ``ReplayChat`` is a ``ChatPort`` that answers
a round's requests with the recorded responses, in order, after checking that each
request is the one recorded (same hash): with the same inputs, a replayed round makes
the same tool calls, gets the same results and ends with the same hypotheses — no
model needed. Records hold no settings, so no key; message text is what the models saw.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koi.rlm.client import ChatReply, ChatRequest, RoundBudget, RoundFailed, ToolCall

FORMAT = "koi.rlm.transcript/1"


@dataclass
class Transcript:
    records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, "seq": len(self.records), **fields})

    def to_jsonl(self) -> str:
        return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n"
                       for r in self.records)

    @staticmethod
    def from_jsonl(text: str | Iterable[str]) -> Transcript:
        lines = text.splitlines() if isinstance(text, str) else list(text)
        return Transcript([json.loads(line) for line in lines if line.strip()])

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


def request_record(request: ChatRequest, key: str) -> dict[str, Any]:
    return {"depth": request.depth, "key": key, "messages": list(request.messages),
            "tools": [t["function"]["name"] for t in request.tools],
            "structured": request.response_format is not None}


def reply_record(reply: ChatReply | RoundFailed) -> dict[str, Any]:
    if isinstance(reply, RoundFailed):
        return {"failed": reply.reason}
    return {"content": reply.content, "finish_reason": reply.finish_reason,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                           for c in reply.tool_calls],
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens, "cached": reply.cached}


def reply_from_record(r: Mapping[str, Any]) -> ChatReply | RoundFailed:
    if "failed" in r:
        return RoundFailed(str(r["failed"]))
    return ChatReply(content=r.get("content"), finish_reason=r.get("finish_reason", "stop"),
                     tool_calls=tuple(ToolCall(c["id"], c["name"], c["arguments"])
                                      for c in r.get("tool_calls", ())),
                     prompt_tokens=int(r.get("prompt_tokens", 0)),
                     completion_tokens=int(r.get("completion_tokens", 0)),
                     cached=bool(r.get("cached", False)))


class ReplayChat:
    """A ``ChatPort`` serving a transcript's responses to the same requests, in order
    (no time passes: its clock stands at 0)."""

    def __init__(self, transcript: Transcript, model: str = "") -> None:
        starts = transcript.of_kind("round_start")
        self.model = model or (starts[0].get("model", "") if starts else "")
        self._pairs = list(zip(transcript.of_kind("request"), transcript.of_kind("response"),
                               strict=False))
        self._next = 0

    @staticmethod
    def clock() -> float:
        return 0.0

    def complete(self, request: ChatRequest, budget: RoundBudget) -> ChatReply | RoundFailed:
        if self._next >= len(self._pairs):
            return RoundFailed("replay: the transcript has no more responses")
        recorded, response = self._pairs[self._next]
        self._next += 1
        if recorded.get("key") != request.key(self.model):
            return RoundFailed(f"replay diverged at request {self._next}: the request is"
                               " not the one recorded")
        reply = reply_from_record(response)
        if not isinstance(reply, RoundFailed):
            budget.spent.calls += 1
            budget.spent.prompt_tokens += reply.prompt_tokens
            budget.spent.completion_tokens += reply.completion_tokens
        return reply
