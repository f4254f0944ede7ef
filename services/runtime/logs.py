"""Logging for every Koi service, configured in this one place (STYLE: structlog).

``configure_logging("placer")`` makes ``structlog.get_logger(__name__)`` write one JSON
object per line to stderr: ISO-8601 UTC ``timestamp``, ``level``, ``service``, ``event``
and the bound keys (``log.info("plan_published", tick=n, jobs=k)``). ``fmt="console"``
renders the same events for a human at a terminal. Records from libraries that use the
standard ``logging`` module (nats-py) go through the same renderer.

Every line is one line of bounded length, whatever the values hold: the JSON renderer
escapes control characters itself, and in the console format ``_safe_values`` escapes
them (``koi.safe_text.printable``: a job id with CR/LF cannot forge a second line, an ESC
cannot rewrite the terminal); in both, a string value is cut at ``VALUE_CHARS``.
Tracebacks are plain text without frame locals (payloads, credentials) in both formats.

No service logic here, and nothing that reads the environment: the caller passes the
level and format (``ServiceSettings.log_level`` / ``log_format``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from koi.safe_text import printable

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("json", "console")


_LEADING = ("timestamp", "level", "service", "event")


def _leading_keys(_logger: Any, _name: str,
                  event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Put timestamp, level, service and event first on each JSON line, for the eye."""
    ordered = {key: event.pop(key) for key in _LEADING if key in event}
    ordered.update(event)
    return ordered


VALUE_CHARS = 2000        # a longer string value is cut, with its length said
TRACEBACK_CHARS = 20_000  # a traceback keeps its lines, each escaped and capped
_SCALARS = (int, float, bool, type(None))
_MULTILINE = ("exception", "stack")  # printed under the line by the console renderer


def _cap_values(_logger: Any, _name: str,
                event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """JSON format: cut long string values (json.dumps already escapes control
    characters, so escaping here would only double the backslashes)."""
    for key, value in event.items():
        if key in _MULTILINE and isinstance(value, str):
            if len(value) > TRACEBACK_CHARS:  # keep its newlines: json escapes them once
                event[key] = f"{value[:TRACEBACK_CHARS]}…[{len(value):,} chars]"
        elif isinstance(value, str) and len(value) > VALUE_CHARS:
            event[key] = printable(value, VALUE_CHARS)
    return event


def _safe_values(_logger: Any, _name: str,
                 event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Console format: every key and value as escaped, capped text, so that no value can
    end the line or send terminal escapes (the console renderer prints strings raw).
    A traceback stays on its own lines, each indented under a ``|`` and escaped."""
    safe: dict[str, Any] = {}
    for key, value in event.items():
        name = printable(str(key), 100)
        if key in _MULTILINE and isinstance(value, str):
            lines = printable(value, TRACEBACK_CHARS).split("\\n")
            safe[name] = "\n".join(f"  | {line}" for line in lines)
        elif isinstance(value, _SCALARS):
            safe[name] = value
        else:
            text = value if isinstance(value, str) else repr(value)
            safe[name] = printable(text, VALUE_CHARS)
    return safe


# library warnings that say nothing an operator can act on: shown at debug only
_NOISE = {
    # nats-py's protocol returns True from eof_received; over TLS asyncio ignores it
    # and warns on every connection closed by the other side
    "asyncio": ("returning true from eof_received() has no effect when using ssl",),
}


class _Demote(logging.Filter):
    """Turns a known, harmless library warning into a debug record (kept only when the
    process logs at debug)."""

    def __init__(self, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and record.getMessage().startswith(self.messages):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def quiet_library_noise() -> None:
    """Install ``_Demote`` on the loggers of ``_NOISE`` (once; safe to call again)."""
    for name, messages in _NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Demote) for f in logger.filters):
            logger.addFilter(_Demote(messages))


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    """Route structlog and stdlib logging to stderr as JSON lines (or console text)."""
    level = level.lower()
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    numeric = logging.getLevelName(level.upper())

    def add_service(_logger: Any, _name: str,
                    event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("service", service)
        return event

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
    ]
    renderer: Any
    # a traceback as one string field: no frame locals (payloads, credentials) in logs;
    # the console renderer's own (rich) formatter would print every frame's locals
    shared_tail: list[Any] = [structlog.processors.format_exc_info,
                              structlog.processors.UnicodeDecoder()]
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        shared_tail += [_leading_keys, _cap_values]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        shared_tail += [_safe_values]

    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *shared_tail,
                    renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,  # a later configure_logging() must take effect
    )

    # Libraries log through the stdlib: render their records the same way.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared, *shared_tail],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_koi", False)]:
        root.removeHandler(old)
    handler._koi = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    quiet_library_noise()
