"""An OpenAI-compatible chat client with budgets, a cache and no exceptions out.

``ChatClient.complete(request, budget)`` sends one chat completion through the ``openai``
package (any OpenAI-compatible server: vLLM, SGLang, Ollama, a hosted API) and returns a
``ChatReply`` or a ``RoundFailed(reason)`` — a timeout, a refusal, an HTTP error, a
malformed or oversized body, a spent budget: never an exception. Before each call it
checks the round's and the hour's budgets for tokens, dollars and calls, the round's wall
time and the recursion depth; identical requests (the hash of model, messages, tools and
schema) are answered from a bounded cache at no cost. ``Spend`` is the accounting
(tokens, dollars, calls, seconds, cache hits); the caller owns the per-round
``RoundBudget``, the client the per-hour window.

The API key lives in the settings' ``SecretStr`` and in the ``openai`` client; it is in
no repr, log line, reason or transcript. Time comes from an injected clock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from koi.rlm.jsontext import canonical
from koi.rlm.settings import RlmSettings
from koi.safe_text import printable

log = structlog.get_logger(__name__)

MAX_BODY_CHARS = 2_000_000   # a larger response body is refused unread
CHARS_PER_TOKEN = 3.0        # conservative prompt estimate before the server counts
HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class RoundFailed:
    """Why a call (and so its round) failed, in words safe to log."""

    reason: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    response_format: Mapping[str, Any] | None = None
    depth: int = 0

    def key(self, model: str) -> str:
        """Hash of everything the answer depends on (the cache key, the replay check)."""
        blob = canonical({"model": model, "messages": list(self.messages),
                          "tools": list(self.tools), "format": self.response_format})
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def chars(self) -> int:
        return len(canonical(list(self.messages))) + len(canonical(list(self.tools)))


@dataclass(frozen=True, slots=True)
class ChatReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached: bool = False


@dataclass(slots=True)
class Spend:
    """What calls cost: tokens, dollars, calls made, wall seconds, cache hits."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    calls: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    failures: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Spend) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.usd += other.usd
        self.calls += other.calls
        self.seconds += other.seconds
        self.cache_hits += other.cache_hits
        self.failures += other.failures

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "usd": round(self.usd, 6), "calls": self.calls,
                "seconds": round(self.seconds, 3), "cache_hits": self.cache_hits,
                "failures": self.failures}


@dataclass
class RoundBudget:
    """One round's allowance and what it has spent; ``deadline`` on the client's clock."""

    deadline: float
    max_tokens: int
    max_usd: float
    max_calls: int
    max_tool_calls: int
    spent: Spend = field(default_factory=Spend)
    tool_calls: int = 0

    @staticmethod
    def start(settings: RlmSettings, now: float) -> RoundBudget:
        return RoundBudget(deadline=now + settings.round_wall_s,
                           max_tokens=settings.max_tokens_per_round,
                           max_usd=settings.max_usd_per_round,
                           max_calls=settings.max_calls_per_round,
                           max_tool_calls=settings.max_tool_calls_per_round)


class ChatPort(Protocol):
    """What a round talks to: the HTTP client, or a transcript being replayed. The
    round's wall-time deadline is on the port's own ``clock`` (the client checks it)."""

    model: str

    def clock(self) -> float:
        ...

    def complete(self, request: ChatRequest, budget: RoundBudget) -> ChatReply | RoundFailed:
        ...


def cost_usd(settings: RlmSettings, prompt_tokens: float, completion_tokens: float) -> float:
    return (prompt_tokens * settings.usd_per_1k_prompt_tokens
            + completion_tokens * settings.usd_per_1k_completion_tokens) / 1000.0


class ChatClient:
    """The HTTP side. One per process: the hour's budget and the cache live here."""

    def __init__(self, settings: RlmSettings, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._sleep = sleep
        self.model = settings.model
        self.clock = clock
        self.total = Spend()
        self._hour: deque[tuple[float, int, float]] = deque()  # (at, tokens, usd) per call
        self._cache: OrderedDict[str, ChatReply] = OrderedDict()
        self._openai: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChatClient(model={self.model!r}, calls={self.total.calls})"

    # --- budgets ----------------------------------------------------------------------

    def hour_spend(self) -> tuple[int, float, int]:
        """(tokens, dollars, calls) of the last hour."""
        now = self.clock()
        while self._hour and self._hour[0][0] <= now - HOUR_S:
            self._hour.popleft()
        return (sum(t for _, t, _ in self._hour), sum(u for _, _, u in self._hour),
                len(self._hour))

    def refusal(self, request: ChatRequest, budget: RoundBudget) -> str | None:
        """Why this call must not be made now (None: it may)."""
        s = self.settings
        if request.depth > s.max_depth:
            return f"recursion depth {request.depth} is beyond the limit of {s.max_depth}"
        now = self.clock()
        if now >= budget.deadline:
            return "round wall-time budget spent"
        tokens = int(request.chars() / CHARS_PER_TOKEN) + s.max_completion_tokens
        usd = cost_usd(s, tokens - s.max_completion_tokens, s.max_completion_tokens)
        if tokens > s.max_tokens_per_call:
            return f"request of ~{tokens} tokens exceeds the per-call budget of" \
                   f" {s.max_tokens_per_call}"
        if budget.spent.calls >= budget.max_calls:
            return f"call budget of the round spent ({budget.max_calls})"
        if budget.spent.tokens + tokens > budget.max_tokens:
            return f"token budget of the round spent ({budget.spent.tokens} of" \
                   f" {budget.max_tokens}, next call ~{tokens})"
        if budget.spent.usd + usd > budget.max_usd:
            return f"dollar budget of the round spent (${budget.spent.usd:.4f} of" \
                   f" ${budget.max_usd:.4f})"
        h_tokens, h_usd, h_calls = self.hour_spend()
        if h_calls >= s.max_calls_per_hour:
            return f"call budget of the hour spent ({s.max_calls_per_hour})"
        if h_tokens + tokens > s.max_tokens_per_hour:
            return f"token budget of the hour spent ({h_tokens} of {s.max_tokens_per_hour})"
        if h_usd + usd > s.max_usd_per_hour:
            return f"dollar budget of the hour spent (${h_usd:.4f} of ${s.max_usd_per_hour})"
        return None

    # --- the call ---------------------------------------------------------------------

    def complete(self, request: ChatRequest, budget: RoundBudget) -> ChatReply | RoundFailed:
        """One completion (or the cached answer to the same request), never raising."""
        key = request.key(self.model)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is not None:
            budget.spent.cache_hits += 1
            self.total.cache_hits += 1
            log.info("rlm_call_cached", depth=request.depth, key=key)
            return replace(hit, cached=True, seconds=0.0)
        why = self.refusal(request, budget)
        if why is not None:
            log.warning("rlm_call_refused", depth=request.depth, reason=why)
            return RoundFailed(why)
        reply = self._attempts(request, budget)
        if isinstance(reply, RoundFailed):
            return reply
        log.info("rlm_call", depth=request.depth, prompt_tokens=reply.prompt_tokens,
                 completion_tokens=reply.completion_tokens, seconds=round(reply.seconds, 3),
                 tool_calls=len(reply.tool_calls))
        if self.settings.cache_entries > 0:
            with self._lock:
                self._cache[key] = reply
                while len(self._cache) > self.settings.cache_entries:
                    self._cache.popitem(last=False)
        return reply

    def _attempts(self, request: ChatRequest, budget: RoundBudget) -> ChatReply | RoundFailed:
        """The call, retried after an HTTP 5xx or a refused connection (a small local
        server answers 500 while it is busy or still loading) with doubling waits, while
        the round's wall time and call budget allow. Each attempt is accounted."""
        wait = self.settings.retry_backoff_s
        for attempt in range(self.settings.retries + 1):
            timeout = max(min(self.settings.call_timeout_s, budget.deadline - self.clock()),
                          0.01)
            start = self.clock()
            outcome = self._call_with_deadline(request, timeout)
            seconds = self.clock() - start
            reply = outcome if isinstance(outcome, RoundFailed) \
                else _reply(outcome, seconds, request)
            self._account(reply, budget, seconds)
            if not isinstance(reply, RoundFailed):
                return reply
            log.warning("rlm_call_failed", depth=request.depth, reason=reply.reason,
                        seconds=round(seconds, 3), attempt=attempt + 1)
            last = attempt == self.settings.retries
            if last or not retriable(reply) or budget.spent.calls >= budget.max_calls \
                    or self.clock() + wait >= budget.deadline:
                return reply
            self._sleep(wait)
            wait *= 2
        raise AssertionError("unreachable")

    def _account(self, reply: ChatReply | RoundFailed, budget: RoundBudget,
                 seconds: float) -> None:
        if isinstance(reply, RoundFailed):
            spend = Spend(calls=1, seconds=seconds, failures=1)
        else:
            spend = Spend(prompt_tokens=reply.prompt_tokens,
                          completion_tokens=reply.completion_tokens,
                          usd=cost_usd(self.settings, reply.prompt_tokens,
                                       reply.completion_tokens),
                          calls=1, seconds=seconds)
        budget.spent.add(spend)
        self.total.add(spend)
        self._hour.append((self.clock(), spend.tokens, spend.usd))

    def _client(self) -> Any:
        if self._openai is None:
            import openai  # imported here: the rest of Koi never needs it

            s = self.settings
            self._openai = openai.OpenAI(base_url=s.base_url,
                                         api_key=s.api_key_value or "not-needed",
                                         max_retries=0, timeout=s.call_timeout_s)
        return self._openai

    def _call_with_deadline(self, request: ChatRequest, timeout: float
                            ) -> dict[str, Any] | RoundFailed:
        """The HTTP call in a worker thread, abandoned at ``timeout`` (the ``openai``
        client's own timeout is per read, so a server trickling bytes could hold it)."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["ok"] = self._post(request, timeout)
            except BaseException as err:  # reported below, never raised
                box["err"] = err

        worker = threading.Thread(target=work, name="koi-rlm-call", daemon=True)
        worker.start()
        worker.join(timeout + 0.5)
        if worker.is_alive():
            return RoundFailed(f"timeout after {timeout:.1f}s")
        if "err" in box:
            return _failure(box["err"], timeout)
        return box["ok"]

    def _post(self, request: ChatRequest, timeout: float) -> dict[str, Any] | RoundFailed:
        s = self.settings
        kwargs: dict[str, Any] = {"model": s.model, "messages": list(request.messages),
                                  "temperature": s.temperature, "timeout": timeout,
                                  "max_completion_tokens": s.max_completion_tokens}
        if request.tools:
            kwargs["tools"] = list(request.tools)
        if request.response_format is not None and s.structured_output:
            kwargs["response_format"] = dict(request.response_format)
        raw = self._client().chat.completions.with_raw_response.create(**kwargs)
        text = raw.http_response.text
        if len(text) > MAX_BODY_CHARS:
            return RoundFailed(f"response body of {len(text)} characters is over the limit")
        try:
            body = json.loads(text)
        except ValueError:
            return RoundFailed("malformed response: the body is not JSON")
        return body if isinstance(body, dict) else RoundFailed("malformed response: not an"
                                                               " object")


def retriable(failure: RoundFailed) -> bool:
    """Whether a failed call is worth trying again: the server erred (5xx) or was not
    reachable; a timeout is not (the next would take as long), nor a 4xx."""
    r = failure.reason
    return r.startswith("HTTP 5") or r == "cannot connect to the model server"


def _failure(err: BaseException, timeout: float) -> RoundFailed:
    """An exception from the HTTP call as a reason (type and status only: a message may
    quote the request)."""
    import openai

    if isinstance(err, openai.APITimeoutError):
        return RoundFailed(f"timeout after {timeout:.1f}s")
    if isinstance(err, openai.RateLimitError):
        return RoundFailed("HTTP 429: rate limited")
    if isinstance(err, openai.APIStatusError):
        return RoundFailed(f"HTTP {err.status_code} from the model server")
    if isinstance(err, openai.APIConnectionError):
        return RoundFailed("cannot connect to the model server")
    return RoundFailed(f"unexpected {type(err).__name__} from the model call")


def _reply(body: dict[str, Any] | RoundFailed, seconds: float, request: ChatRequest
           ) -> ChatReply | RoundFailed:
    """A reply from a chat-completion body read defensively (any field may be missing,
    of the wrong type or hostile). Without usage figures the tokens are estimated from
    the characters, so that budgets still bind."""
    if isinstance(body, RoundFailed):
        return body
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return RoundFailed("malformed response: no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return RoundFailed("malformed response: no message")
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) else "stop"
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        return RoundFailed(f"the model refused: {printable(refusal, 200)}")
    if finish == "content_filter":
        return RoundFailed("the model's answer was filtered (content_filter)")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return RoundFailed("malformed response: content is not text")
    calls: list[ToolCall] = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            return RoundFailed("malformed response: a tool call without a function")
        name, args, cid = fn.get("name"), fn.get("arguments"), c.get("id")
        calls.append(ToolCall(id=printable(str(cid or f"call-{len(calls)}"), 64),
                              name=printable(str(name), 64),
                              arguments=args if isinstance(args, str) else json.dumps(args)))
    usage: dict[str, Any] = body["usage"] if isinstance(body.get("usage"), dict) else {}
    written = len(content or "") + sum(len(c.arguments) + len(c.name) for c in calls)
    prompt = _count(usage.get("prompt_tokens")) or int(request.chars() / CHARS_PER_TOKEN)
    completion = _count(usage.get("completion_tokens")) or int(written / CHARS_PER_TOKEN) + 1
    return ChatReply(content=content, tool_calls=tuple(calls), finish_reason=finish,
                     prompt_tokens=prompt, completion_tokens=completion, seconds=seconds)


def _count(x: Any) -> int:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 10**9 else 0
