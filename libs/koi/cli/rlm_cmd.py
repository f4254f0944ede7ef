"""``koi rlm replay TRANSCRIPT``: run a recorded hypothesis round again, without a model.

A transcript written by ``koi-rlm`` or the proposer (``KOI_RLM_TRANSCRIPTS``) holds the
round's inputs and every request, response and tool call (``koi.rlm.record``). The
replay rebuilds the inputs, answers each request with the recorded response (after
checking it is the same request), runs the tools again and validates the answer: it
prints the accepted hypotheses and the dropped ones with their reasons, and whether they
are the ones recorded. Exit 0: the same; 1: the replay diverged or differs; 2: the file
cannot be read. Thin: the work is ``koi.rlm.record.replay_text``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

rlm_app = typer.Typer(help="The language-model hypothesis layer (docs/RLM.md).",
                      no_args_is_help=True)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The round's own log lines (structlog) only from warnings up, and on stderr."""
    import structlog

    before = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**before)


def _summary(result: Any) -> dict[str, Any]:
    return {"round_id": result.round_id, "tick": result.tick, "ok": result.ok,
            "reason": result.reason,
            "accepted": [{"id": h.id, "claim": h.label(), "statement": h.statement,
                          "tests": [f"{t.job_id}: {t.config.accelerator} tp{t.config.tp}"
                                    for t in h.tests],
                          "explore": [f"{e.job_id}: {e.knob} {list(e.values)}"
                                      for e in h.explore],
                          "expires_tick": h.expires_tick} for h in result.hypotheses],
            "dropped": [{"index": d.index, "reason": d.reason} for d in result.dropped]}


def same_as_recorded(result: Any, recorded: dict[str, Any]) -> bool:
    """Whether the replay ended as the recorded round did (hypotheses and drops)."""
    return (bool(recorded) and recorded.get("ok") == result.ok
            and recorded.get("accepted") == [h.id for h in result.hypotheses]
            and recorded.get("dropped") == [{"index": d.index, "reason": d.reason}
                                            for d in result.dropped])


@rlm_app.command("replay")
def replay(
    transcript: Annotated[Path, typer.Argument(help="A round's transcript (JSON lines).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Re-run a recorded round against its recorded answers (no model) and print the
    hypotheses it accepts and drops, with the reasons."""
    from koi.catalog import load_catalog
    from koi.rlm.record import replay_text

    console = Console(highlight=False)
    try:
        text = transcript.read_text(encoding="utf-8")
        with _quiet_logs():  # stdout is the answer (JSON with --json)
            rec, result = replay_text(text, load_catalog())
    except (OSError, ValueError) as err:
        console.print(f"[red]error:[/] {escape(str(transcript))}: {escape(str(err))}")
        raise typer.Exit(2) from None
    same = same_as_recorded(result, rec.recorded_end)
    if as_json:
        print(json.dumps({**_summary(result), "same_as_recorded": same}))
        raise typer.Exit(0 if same else 1)
    s = _summary(result)
    head = "ok" if result.ok else f"failed: {result.reason}"
    console.print(f"round {escape(s['round_id'])} at tick {s['tick']} "
                  f"({escape(rec.transcript.of_kind('round_start')[0].get('model', '?'))}):"
                  f" {escape(head)}")
    for h in s["accepted"]:
        console.print(f"  accepted {h['id']}: {escape(h['claim'])}"
                      + (f" — {escape(h['statement'])}" if h["statement"] else ""))
        for t in [*h["tests"], *h["explore"]]:
            console.print(f"      test {escape(t)}")
    for d in s["dropped"]:
        console.print(f"  dropped #{d['index']}: {escape(d['reason'])}")
    spent = rec.recorded_end.get("spend") or {}
    if spent:
        proposed = len(s["accepted"]) + len(s["dropped"])
        console.print(f"  recorded: {spent.get('prompt_tokens', 0)} tokens in, "
                      f"{spent.get('completion_tokens', 0)} out, "
                      f"{spent.get('seconds', 0):.1f} s, {spent.get('calls', 0)} calls; "
                      f"{len(s['accepted'])} of {proposed} valid")
    console.print("same hypotheses as recorded" if same else
                  "[red]differs from the recorded round[/]")
    raise typer.Exit(0 if same else 1)


@rlm_app.command("serve-replay")
def serve_replay(
    script: Annotated[Path, typer.Argument(
        help="Answers to serve: a JSONL file of script entries (koi.rlm.replay_server) or"
             " a round's file written by Koi (its recorded responses).")],
    port: Annotated[int, typer.Option(help="Port (0: any free one).", min=0, max=65535)] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    repeat_last: Annotated[bool, typer.Option(
        help="When the answers run out, give the last one again (else HTTP 500).")] = True,
) -> None:
    """Serve recorded answers as an OpenAI-compatible endpoint (POST /v1/chat/completions,
    GET /v1/models), one per request in order, until interrupted: a stand-in model for
    `koi demo` and the services where no model is reachable."""
    import signal
    import threading

    from koi.rlm.replay_server import ReplayServer

    console = Console(highlight=False, stderr=True)
    try:
        server = ReplayServer(script, host=host, port=port, repeat_last=repeat_last)
    except (OSError, ValueError) as err:
        console.print(f"[red]error:[/] {escape(str(script))}: {escape(str(err))}")
        raise typer.Exit(2) from None
    if not server.script:
        console.print(f"[red]error:[/] {escape(str(script))} holds no answers")
        raise typer.Exit(2)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with server:
        # stdout: the endpoint alone, so a script can read it
        print(server.base_url, flush=True)
        console.print(f"serving {len(server.script)} answers"
                      f"{' (the last one repeated)' if repeat_last else ''} at"
                      f" {server.base_url}; point Koi at it with\n"
                      f"  KOI_RLM_BASE_URL={server.base_url} KOI_RLM_MODEL=replay-model")
        served = 0
        while not stop.wait(0.5):
            if server.calls != served:
                served = server.calls
                console.print(f"answered {served} request(s)")
    console.print(f"stopped after {server.calls} request(s)")


@rlm_app.command("stats")
def stats(
    paths: Annotated[list[Path], typer.Argument(
        help="Round transcripts, or directories of them (searched for *.jsonl).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Per round and in all: tokens in and out, model seconds, hypotheses proposed and
    accepted (the validity rate), and why the dropped ones were dropped."""
    from koi.rlm.stats import round_row, summary
    from koi.rlm.transcript import Transcript

    console = Console(highlight=False)
    files = sorted({f for p in paths for f in (p.rglob("*.jsonl") if p.is_dir() else [p])})
    rows = []
    for f in files:
        try:
            row = round_row(Transcript.from_jsonl(f.read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            console.print(f"[red]error:[/] {escape(str(f))}: {escape(str(err))}")
            raise typer.Exit(2) from None
        if row is not None:
            rows.append(row)
    total = summary(rows)
    if as_json:
        print(json.dumps({"rounds": [{**r.__dict__, "drop_reasons": list(r.drop_reasons)}
                                     for r in rows], "summary": total}))
        return
    for r in rows:
        state = "ok" if r.ok else f"failed: {r.reason}"
        console.print(f"{escape(r.round_id)} ({escape(r.model)}, tick {r.tick}): "
                      f"{r.prompt_tokens} tokens in, {r.completion_tokens} out, "
                      f"{r.seconds:.1f} s, {r.calls} calls; {r.accepted} of {r.proposed} "
                      f"valid; {escape(state)}")
    v = total["validity"]
    console.print(f"{total['rounds']} rounds, {total['ok']} ok; {total['accepted']} of "
                  f"{total['proposed']} hypotheses valid"
                  + (f" ({100 * v:.0f} %)" if v is not None else "")
                  + (f"; mean {total['mean_prompt_tokens']:.0f} tokens in, "
                     f"{total['mean_completion_tokens']:.0f} out, "
                     f"{total['mean_seconds']:.1f} s a round" if total["ok"] else ""))
    if total["accepted_copies_of_the_example"]:
        console.print(f"  {total['accepted_copies_of_the_example']} of the valid ones repeat"
                      " the prompt's worked example")
    for reason, n in total["drop_reasons"].items():
        console.print(f"  dropped {n}×: {escape(reason)}")
    for reason, n in total["failures"].items():
        console.print(f"  failed {n}×: {escape(reason)}")
