"""Hypothesis strategies for protobuf messages, built by walking ``DESCRIPTOR.fields``.

``messages(descriptor)`` draws whole messages of any generated type with extreme field
values — NaN, ±inf, ±1e308 and subnormal doubles; 0, ±1 and the type's bounds for
integers; unknown enum numbers; empty, odd and 20,000-character strings; thousands of
copies of one repeated element — so a schema change is fuzzed without touching the
tests. ``mutated(seed)`` takes a *valid* message and replaces one field anywhere in its
tree by such a value, which reaches the checks behind the "required field" ones that a
random message rarely passes. ``DOCUMENT_LEAVES`` does the same for JSON/YAML documents.
Test helpers only: no assertions here.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

FD = FieldDescriptor
HUGE_TEXT = ("x" * 20_000, "é\n" * 10_000, "\x00\x1b[2J" * 3_000)
ODD_TEXT = ("", " ", "*", "-1", "nan", "a\nb", "\u202e", "../../etc/passwd", "x.y.z")
FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1e-12, 1.0,
          -1.0, 0.5, 1e9, -1e9, 2.0**53)
_INT_RANGES = {
    FD.TYPE_INT32: (-2**31, 2**31 - 1), FD.TYPE_SINT32: (-2**31, 2**31 - 1),
    FD.TYPE_SFIXED32: (-2**31, 2**31 - 1), FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1), FD.TYPE_INT64: (-2**63, 2**63 - 1),
    FD.TYPE_SINT64: (-2**63, 2**63 - 1), FD.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}
MAX_DEPTH = 4


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (lo, hi, 0, 1, -1, 2, 10**9, -10**9, 2**31 - 1, -2**31, 2**53)
                    if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(max(lo, -5), min(hi, 200)),
                     st.integers(lo, hi))


def doubles(width: int = 64) -> st.SearchStrategy[float]:
    edges = [f for f in FLOATS if width == 64 or not math.isfinite(f) or abs(f) < 3e38]
    return st.one_of(st.sampled_from(edges), st.floats(width=width),
                     st.floats(0, 1e4, width=width))


def texts(pool: Sequence[str] = ()) -> st.SearchStrategy[str]:
    """Mostly ``pool`` (ids the decoders look up), else odd, random and huge text."""
    options = [st.sampled_from(ODD_TEXT), st.text(st.characters(codec="utf-8"), max_size=12),
               st.sampled_from(HUGE_TEXT)]
    if pool:
        options.insert(0, st.sampled_from(sorted(set(pool))))
    return st.one_of(*options)


def scalar(f: FieldDescriptor, pool: Sequence[str]) -> st.SearchStrategy[Any]:
    """A value for one non-message field."""
    if f.type in _INT_RANGES:
        return integers(*_INT_RANGES[f.type])
    if f.type == FD.TYPE_DOUBLE:
        return doubles()
    if f.type == FD.TYPE_FLOAT:
        return doubles(32)
    if f.type == FD.TYPE_BOOL:
        return st.booleans()
    if f.type == FD.TYPE_STRING:
        return texts(pool)
    if f.type == FD.TYPE_BYTES:
        return st.one_of(st.binary(max_size=48), st.just(b"\x00" * 20_000))
    if f.type == FD.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from(known),
                         integers(-2**31, 2**31 - 1))
    raise NotImplementedError(f"field {f.full_name} of type {f.type}")


def _is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def _repeated(element: st.SearchStrategy[Any], copies: int) -> st.SearchStrategy[list[Any]]:
    """A few elements, or one element copied up to ``copies`` times."""
    return st.one_of(st.lists(element, max_size=3),
                     st.tuples(element, st.integers(copies // 10, copies))
                     .map(lambda p: [p[0]] * p[1]))


def field_value(f: FieldDescriptor, pool: Sequence[str], depth: int) -> st.SearchStrategy[Any]:
    if _is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        values = (messages(value.message_type, pool, depth + 1) if value.message_type
                  else scalar(value, pool))
        return st.dictionaries(scalar(key, pool), values, max_size=3)
    element = (messages(f.message_type, pool, depth + 1) if f.message_type is not None
               else scalar(f, pool))
    if not f.is_repeated:
        return element
    # thousands of numbers, but few copies of a message: nested repeats multiply
    return _repeated(element, 3000 if f.message_type is None else 40 if depth == 0 else 3)


def messages(descriptor: Descriptor, pool: Sequence[str] = (), depth: int = 0
             ) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type: any subset of fields set, to extreme values."""
    cls = message_factory.GetMessageClass(descriptor)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    optional = {f.name: st.deferred(lambda f=f: field_value(f, pool, depth))
                for f in descriptor.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: build(cls, kw))


def build(cls: type[Message], values: dict[str, Any]) -> Message:
    msg = cls()
    for name, value in values.items():
        assign(msg, msg.DESCRIPTOR.fields_by_name[name], value)
    return msg


def assign(msg: Message, f: FieldDescriptor, value: Any) -> None:
    """Set field ``f`` of ``msg`` to ``value`` (a list for repeated, a dict for maps)."""
    target = getattr(msg, f.name)
    if _is_map(f):
        target.clear()
        message_values = f.message_type.fields_by_name["value"].message_type is not None
        for k, v in value.items():
            if message_values:
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif f.is_repeated:
        del target[:]
        target.extend(value)
    elif f.message_type is not None:
        target.CopyFrom(value)
    else:
        setattr(msg, f.name, value)


def _slots(msg: Message, out: list[tuple[Message, FieldDescriptor]]) -> None:
    """Every (message, field) in ``msg``'s tree, set or not (one level into unset ones)."""
    for f in msg.DESCRIPTOR.fields:
        out.append((msg, f))
        if f.message_type is None or _is_map(f):
            continue
        if f.is_repeated:
            for child in getattr(msg, f.name):
                _slots(child, out)
        elif msg.HasField(f.name):
            _slots(getattr(msg, f.name), out)


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[Message], pool: Sequence[str] = ()) -> Message:
    """One of ``seeds`` with one to three fields anywhere in its tree set to extremes."""
    msg = draw(st.sampled_from(seeds))
    out = type(msg)()
    out.CopyFrom(msg)
    for _ in range(draw(st.integers(1, 3))):
        slots: list[tuple[Message, FieldDescriptor]] = []
        _slots(out, slots)
        parent, f = draw(st.sampled_from(slots))
        assign(parent, f, draw(field_value(f, pool, MAX_DEPTH - 1)))
    return out


# a leaf of a JSON or YAML document replaced by one of these
DOCUMENT_LEAVES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 10**30, -10**30, "", "nan", "-3h", "1e400",
                     [], {}, [None], {"": None}]),
    st.sampled_from(FLOATS), st.sampled_from(HUGE_TEXT), st.integers(),
    st.text(max_size=12))


def leaf_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path (keys and indices) of every value in a nested dict/list document."""
    paths = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            paths.extend(leaf_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            paths.extend(leaf_paths(v, (*prefix, i)))
    return paths


def replace_at(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


@st.composite
def mutated_document(draw: st.DrawFn, doc: Any) -> Any:
    """A deep copy of ``doc`` with one to three values replaced (or keys removed)."""
    out = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = leaf_paths(out)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        if draw(st.integers(0, 4)) == 0 and isinstance(_parent(out, path), dict):
            del _parent(out, path)[path[-1]]
        else:
            # a copy: sampled_from hands out the same [] / {} each time, and one put
            # inside itself would make a cycle
            replace_at(out, path, copy.deepcopy(draw(DOCUMENT_LEAVES)))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc
