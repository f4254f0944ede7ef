"""Logging for every Koi service, configured in this one place (STYLE: structlog).

``configure_logging("placer")`` makes ``structlog.get_logger(__name__)`` write one JSON
object per line to stderr: ISO-8601 UTC ``timestamp``, ``level``, ``service``, ``event``
and the bound keys (``log.info("plan_published", tick=n, jobs=k)``). ``fmt="console"``
renders the same events for a human at a terminal. Records from libraries that use the
standard ``logging`` module (nats-py) go through the same renderer.

No service logic here, and nothing that reads the environment: the caller passes the
level and format (``ServiceSettings.log_level`` / ``log_format``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("json", "console")


_LEADING = ("timestamp", "level", "service", "event")


def _leading_keys(_logger: Any, _name: str,
                  event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Put timestamp, level, service and event first on each JSON line, for the eye."""
    ordered = {key: event.pop(key) for key in _LEADING if key in event}
    ordered.update(event)
    return ordered


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
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        # a traceback as one string field: no frame locals (payloads, credentials) in logs
        shared_tail: list[Any] = [structlog.processors.format_exc_info, _leading_keys]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        shared_tail = []

    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *shared_tail,
                    structlog.processors.UnicodeDecoder(), renderer],
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
