"""``Scope`` ⇄ protobuf: the one rule for scopes on the wire.

A domain scope's wildcard ``"*"`` travels as the proto's empty string, and a domain
``""`` cannot travel (``InvalidSpecError``). No transport, no decisions.
"""

from __future__ import annotations

from koi.causal.scope import ANY, Scope
from koi.errors import InvalidSpecError
from koi.v1 import common_pb2

# domain Scope field → common.proto Scope field
SCOPE_FIELDS = (("accelerator", "accelerator"), ("engine", "engine"),
                ("size_class", "model_size_class"), ("parallelism", "parallelism_bucket"),
                ("family", "accelerator_family"))


def scope_to_proto(scope: Scope) -> common_pb2.Scope:
    """``"*"`` becomes the proto's wildcard ``""``; a domain ``""`` cannot travel."""
    values: dict[str, str] = {}
    for dom, pb in SCOPE_FIELDS:
        v = getattr(scope, dom)
        if v == "":
            raise InvalidSpecError(f"scope.{dom}", f"is empty; the wildcard is {ANY!r}")
        values[pb] = "" if v == ANY else v
    return common_pb2.Scope(**values)


def scope_from_proto(msg: common_pb2.Scope) -> Scope:
    return Scope(**{dom: getattr(msg, pb) or ANY for dom, pb in SCOPE_FIELDS})
