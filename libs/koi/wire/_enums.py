"""Domain ``StrEnum`` ⇄ proto enum number, by naming convention; small proto helpers.

A domain member ``KvDtype.FP8`` maps to the proto value ``KV_DTYPE_FP8`` (the proto
enum's name in UPPER_SNAKE as prefix, as buf's ENUM_VALUE_PREFIX requires); ``0`` is
always ``<PREFIX>_UNSPECIFIED`` and is never a valid decoded value. The mapping is
checked complete when a codec is built, so a schema and a domain enum that drift apart
fail at import, not mid-run. No other conversion logic here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

E = TypeVar("E", bound=StrEnum)


def upper_snake(camel: str) -> str:
    """``KvDtype`` → ``KV_DTYPE``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


def has_field(msg: Message, name: str) -> bool:
    """``msg.HasField`` for a field named at run time (the stubs only accept literals)."""
    return msg.HasField(name)


class EnumCodec(Generic[E]):
    """Two-way mapping between one domain enum and one generated proto enum."""

    def __init__(self, domain: type[E], proto_enum: Any) -> None:
        self.domain = domain
        self.proto_name = proto_enum.DESCRIPTOR.full_name
        self.prefix = upper_snake(proto_enum.DESCRIPTOR.name) + "_"
        names = {v.name: v.number for v in proto_enum.DESCRIPTOR.values}
        self._to: dict[E, int] = {}
        for member in domain:
            number = names.pop(self.prefix + member.name, None)
            if number is None:
                raise RuntimeError(f"{self.proto_name} lacks {self.prefix}{member.name}"
                                   f" for {domain.__name__}.{member.name}")
            self._to[member] = number
        names.pop(self.prefix + "UNSPECIFIED", None)
        if names:
            raise RuntimeError(f"{self.proto_name} has values with no {domain.__name__}"
                               f" member: {', '.join(sorted(names))}")
        self._from: dict[int, E] = {n: m for m, n in self._to.items()}

    def to_proto(self, value: E | str) -> Any:
        """The proto number of a member (or of its string value): an ``int``, typed
        ``Any`` because each generated enum has its own ``ValueType``."""
        return self._to[self.domain(value)]

    def from_proto(self, number: int, field: str,
                   error: Callable[[str, str], Exception]) -> E:
        """The member for ``number``; UNSPECIFIED or an unknown number raises ``error``."""
        member = self._from.get(number)
        if member is not None:
            return member
        allowed = ", ".join(self.prefix + m.name for m in self.domain)
        what = f"{self.prefix}UNSPECIFIED (0)" if number == 0 else f"unknown value {number}"
        raise error(field, f"{what} of {self.proto_name}; required: one of {allowed}")
