"""Lines printed for operators stay one line of bounded length, whatever text they carry.

A job id or message with CR/LF must not forge a second event or log line, an ESC must
not reach the terminal, a 10,000-character id must not make a 20,000-character line,
and a logged traceback must not print frame locals (where credentials live). Covers
``koi.safe_text.printable``, ``event_line`` and both formats of ``configure_logging``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from koi.safe_text import printable
from koi.wire.planning import event_line, make_event
from services.runtime.logs import VALUE_CHARS, configure_logging

FORGED = "chat-a\r\n00:00:01 CRITICAL service             -: forged line\x1b[2J\x1b]0;t\x07"
CONTROLS = "\r\n\x1b\x07\x00\x7f\x85\u2028\u2029\u202e\x0b\x0c"


def _no_control(text: str) -> bool:
    return not any(ch in text for ch in CONTROLS)


@pytest.mark.parametrize("text, shown", [
    ("plain", "plain"),
    ("a\nb", "a\\nb"),
    ("a\r\nb", "a\\r\\nb"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("x\x85y\u2028z\u202e", "x\\x85y\\u2028z\\u202e"),
    ("tab\there", "tab\\there"),
])
def test_printable_escapes_control_characters(text: str, shown: str):
    assert printable(text) == shown


def test_printable_caps_length_and_never_cuts_an_escape():
    assert printable("x" * 10_000, 50) == "x" * 50 + "…[10,000 chars]"
    cut = printable("\n" * 100, 9)  # 4 whole escapes fit in 9 characters, not a fifth half
    assert cut == "\\n" * 4 + "…[100 chars]"
    assert printable("abc", 3) == "abc"


def test_event_line_is_one_line_whatever_the_event_holds():
    ev = make_event(kind="rejection", severity="warning", service="placer",
                    message=f"job {FORGED} refused:\nreason\x1b[1m", tick=1, job_id=FORGED,
                    mechanism_ids=(FORGED, "m-2"), event_id="e1")
    line = event_line(ev)
    assert len(line.splitlines()) == 1 and _no_control(line)
    assert "chat-a\\r\\n00:00:01 CRITICAL" in line  # shown, escaped, not hidden


def test_event_line_caps_a_huge_job_id_and_message():
    huge = "j" * 10_000
    ev = make_event(kind="admission", severity="info", service="placer", tick=1,
                    job_id=huge, message=f"admitted {huge}", event_id="e2",
                    mechanism_ids=[f"m-{i}" * 40 for i in range(50)])
    line = event_line(ev)
    assert len(line) <= 1_000 and "10,000 chars" in line and "+44 more" in line


def test_event_line_with_a_non_finite_clock_still_prints():
    ev = make_event(kind="admission", severity="info", service="placer", message="m",
                    tick=1, event_id="e3", scenario_time_s=float("nan"))
    assert event_line(ev).startswith("--:--:--")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_koi", False)]:
        root.removeHandler(handler)


def _log_everything() -> None:
    log = structlog.get_logger("test")
    log.info(f"job_seen{FORGED}", job=FORGED, message=FORGED, big="y" * 10_000,
             listed=[FORGED], **{FORGED: 1})
    logging.getLogger("nats").warning("library says %s", FORGED)


def test_console_log_lines_are_escaped_and_capped(capsys, restore_logging):
    configure_logging("placer", "info", "console")
    _log_everything()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines  # one per call: no forged line
    assert all(_no_control(line) for line in lines)
    assert all(len(line) < 3 * VALUE_CHARS + 2_000 for line in lines)
    assert "10,000 chars" in lines[0]


def test_json_log_lines_parse_and_are_capped(capsys, restore_logging):
    configure_logging("placer", "info", "json")
    _log_everything()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["job"] == FORGED  # json escaped it: the value survives exactly
    assert len(first["big"]) < VALUE_CHARS + 50 and first["big"].endswith("10,000 chars]")
    assert json.loads(lines[1])["event"] == f"library says {FORGED}"


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_logged_traceback_has_no_frame_locals(fmt: str, capsys, restore_logging):
    configure_logging("placer", "info", fmt)
    password = "hunter2-" + "s3cr3t"  # a local of the failing frame
    try:
        raise ValueError(f"bad\n{FORGED}")
    except ValueError:
        structlog.get_logger("test").exception("handler_failed", length=len(password))
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and "Traceback" in err
    if fmt == "console":  # a traceback keeps its lines, each marked as part of it
        first, *rest = err.splitlines()
        assert "handler_failed" in first and rest
        assert all(line.startswith("  | ") and _no_control(line) for line in rest)
