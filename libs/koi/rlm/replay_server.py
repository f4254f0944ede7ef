"""A real OpenAI-compatible chat server that replays scripted or recorded answers.

``ReplayServer(script)`` listens on 127.0.0.1 (a free port unless ``port`` is given) and
answers each ``POST /v1/chat/completions`` (non-streaming) with the next entry of
``script``; ``GET /v1/models`` lists one model. It records every request it gets (path,
headers, parsed body) in ``requests``. An entry is a dict with any of:

* ``"content"`` / ``"tool_calls"`` / ``"refusal"`` / ``"finish_reason"`` / ``"usage"``:
  a chat completion built by ``completion`` (``tool_call(name, args)`` builds one call);
* ``"body"``: a whole response body (a dict, sent as JSON) instead;
* ``"raw"``: bytes or text sent as they are with ``content-type: application/json`` (a
  malformed body);
* ``"status"``: the HTTP status (default 200; 500 and 429 send an OpenAI error body);
* ``"delay_s"``: wait this long before answering (cut short when the server stops);
* ``"wait"``: a ``threading.Event`` (in-memory scripts only) to wait for before
  answering, at most ``"wait_s"`` seconds (default 60): an answer that comes only once
  the test says so (e.g. once the planner has gone on for some ticks).

When the script runs out the server answers HTTP 500 ``script exhausted``, or, with
``repeat_last``, the last entry again. ``load_script`` reads a list of dicts, a JSONL
file of them, or a round's file as Koi writes it (``KOI_RLM_TRANSCRIPTS``,
``koi.rlm.record``): then its recorded responses, in order. The tests use it as a
model; ``koi rlm serve-replay`` serves one so that the services (``koi demo``) can be
pointed at it where no model is reachable. Stdlib HTTP only; no Koi imports.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def tool_call(name: str, args: Mapping[str, Any] | str, call_id: str = "") -> dict[str, Any]:
    """One OpenAI tool call (``args`` a dict, JSON-encoded, or a string sent verbatim)."""
    text = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id or f"call_{name}_{abs(hash(text)) % 10**8}", "type": "function",
            "function": {"name": name, "arguments": text}}


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, *,
               model: str = "replay-model", finish_reason: str | None = None,
               refusal: str | None = None, usage: Mapping[str, int] | None = None,
               serial: int = 0) -> dict[str, Any]:
    """A ``chat.completion`` body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if refusal is not None:
        message["refusal"] = refusal
    reason = finish_reason or ("tool_calls" if tool_calls else "stop")
    use = dict(usage or {"prompt_tokens": 1000, "completion_tokens": 100})
    use["total_tokens"] = use.get("prompt_tokens", 0) + use.get("completion_tokens", 0)
    return {"id": f"chatcmpl-replay-{serial}", "object": "chat.completion",
            "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reason,
                         "logprobs": None}],
            "usage": use}


def load_script(source: Iterable[Mapping[str, Any]] | str | Path) -> list[dict[str, Any]]:
    """Script entries from dicts, a JSONL file of entries, or a round's file (its
    ``response`` records, each as the entry that answers the same)."""
    if isinstance(source, str | Path):
        lines = Path(source).read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        if any(isinstance(r, dict) and "kind" in r and "seq" in r for r in records):
            return [_recorded(r) for r in records if r.get("kind") == "response"]
        return records
    return [dict(entry) for entry in source]


def _recorded(r: Mapping[str, Any]) -> dict[str, Any]:
    """The entry answering as a transcript's response record (``koi.rlm.transcript``):
    a failed call becomes an HTTP 500."""
    if "failed" in r:
        return {"status": 500, "message": str(r["failed"])}
    calls = [tool_call(c["name"], c["arguments"], c["id"]) for c in r.get("tool_calls", ())]
    return {"content": r.get("content"), "tool_calls": calls or None,
            "finish_reason": r.get("finish_reason"),
            "usage": {"prompt_tokens": int(r.get("prompt_tokens", 0)),
                      "completion_tokens": int(r.get("completion_tokens", 0))}}


class ReplayServer:
    """The server; a context manager that starts and stops it."""

    def __init__(self, script: Iterable[Mapping[str, Any]] | str | Path = (), *,
                 host: str = "127.0.0.1", port: int = 0, repeat_last: bool = False) -> None:
        self.script = load_script(script)
        self.repeat_last = repeat_last
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                server._models(self)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{name}:{port}/v1"

    @property
    def calls(self) -> int:
        return len(self.requests)

    def add(self, *entries: Mapping[str, Any]) -> None:
        with self._lock:
            self.script.extend(dict(e) for e in entries)

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # --- one request ------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw or b"null")
        except ValueError:
            body = raw.decode(errors="replace")
        with self._lock:
            self.requests.append({"path": h.path, "headers": dict(h.headers.items()),
                                  "body": body, "at": time.monotonic()})
            entry = self.script[self._next] if self._next < len(self.script) else (
                self.script[-1] if self.repeat_last and self.script else None)
            serial = self._next
            self._next += 1
        if h.path.rstrip("/") != "/v1/chat/completions":
            self._send(h, 404, _error("not found", "invalid_request_error"))
            return
        if entry is None:
            self._send(h, 500, _error("script exhausted", "server_error"))
            return
        if entry.get("delay_s"):
            self._stop.wait(float(entry["delay_s"]))
        gate = entry.get("wait")
        if gate is not None:
            deadline = time.monotonic() + float(entry.get("wait_s", 60.0))
            while not gate.wait(0.05) and not self._stop.is_set() \
                    and time.monotonic() < deadline:
                pass
        status = int(entry.get("status", 200))
        if "raw" in entry:
            data = entry["raw"]
            self._send(h, status, data.encode() if isinstance(data, str) else data)
        elif status >= 400:
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            self._send(h, status, _error(entry.get("message", f"scripted {status}"), kind))
        elif "body" in entry:
            self._send(h, status, json.dumps(entry["body"]).encode())
        else:
            self._send(h, status, json.dumps(completion(
                entry.get("content"), entry.get("tool_calls"),
                model=entry.get("model", "replay-model"),
                finish_reason=entry.get("finish_reason"), refusal=entry.get("refusal"),
                usage=entry.get("usage"), serial=serial)).encode())

    def _models(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.rstrip("/") != "/v1/models":
            self._send(h, 404, _error("not found", "invalid_request_error"))
            return
        self._send(h, 200, json.dumps({"object": "list", "data": [
            {"id": "replay-model", "object": "model", "created": 1_700_000_000,
             "owned_by": "koi-replay"}]}).encode())

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        try:
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


def _error(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": None,
                                 "param": None}}).encode()
