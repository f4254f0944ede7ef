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
