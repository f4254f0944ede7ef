"""Error types shared across the domain library.

Every error a user can cause carries the name of the thing that is wrong (a knob, a
field, a file and line) so that the message is actionable. No I/O here.
"""

from __future__ import annotations


class KoiError(Exception):
    """Base class for errors Koi reports to users."""


class InvalidConfigError(KoiError, ValueError):
    """A deployment configuration that an engine would refuse or that cannot run."""

    def __init__(self, knob: str, reason: str) -> None:
        self.knob = knob
        self.reason = reason
        super().__init__(f"{knob}: {reason}")


class InvalidSpecError(KoiError, ValueError):
    """A job specification (YAML or protobuf) that cannot be accepted."""

    def __init__(self, field: str, reason: str, *, source: str = "") -> None:
        self.field = field
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {reason}")


# What one error may show of each part, whatever the input held: a field path, the
# reason (which may quote a value) and the source (a file name, a subject).
MAX_FIELD_CHARS, MAX_REASON_CHARS, MAX_SOURCE_CHARS = 200, 600, 300


def bounded_spec_error(field: str, reason: str, source: str = "") -> InvalidSpecError:
    """An ``InvalidSpecError`` whose message is one line of bounded length (control
    characters escaped, each part capped): what every loader and decoder raises."""
    from koi.safe_text import printable

    return InvalidSpecError(printable(field, MAX_FIELD_CHARS),
                            printable(reason, MAX_REASON_CHARS),
                            source=printable(source, MAX_SOURCE_CHARS))


def bounded(e: InvalidSpecError) -> InvalidSpecError:
    """``e`` made one bounded line (``bounded_spec_error``)."""
    return bounded_spec_error(e.field, e.reason, e.source)
