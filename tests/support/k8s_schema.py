"""A small structural validator for Kubernetes manifests, over a stored schema subset.

``validate(manifest)`` checks a Deployment, Service or LeaderWorkerSet (as a dict, the
way the API server takes it) against ``tests/data/k8s/openapi-subset.json``
(definitions from the Kubernetes OpenAPI v3 spec and the LeaderWorkerSet CRD; see
``tests/data/k8s/SOURCE.md``) and returns every problem with its path:

- types (object, array, string, integer, number, boolean; a bool is not an integer)
  and int32/int64 ranges;
- required fields;
- unknown fields (a property the definition does not have, unless it allows any);
- ``$ref`` resolution (a reference to a definition not in the subset is an error);
- ``oneOf`` / ``anyOf`` (IntOrString, Quantity), ``enum``.

Not a replacement for the API server's validation (names, label syntax, cross-field
rules are checked elsewhere, by the tests themselves). No third-party dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

SUBSET = Path(__file__).resolve().parents[1] / "data" / "k8s" / "openapi-subset.json"
ROOTS = {
    ("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"):
        "io.x-k8s.leaderworkerset.v1.LeaderWorkerSet",
}
RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@cache
def definitions() -> dict[str, Any]:
    return json.loads(SUBSET.read_text(encoding="utf-8"))["definitions"]


def validate(manifest: Mapping[str, Any]) -> list[str]:
    """Every schema violation of ``manifest`` ("path: problem"); empty when valid."""
    root = ROOTS.get((manifest.get("apiVersion"), manifest.get("kind")))
    if root is None:
        return [f"$: no stored schema for {manifest.get('apiVersion')} {manifest.get('kind')}"]
    errors: list[str] = []
    _check(manifest, {"$ref": root}, "$", errors)
    return errors


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if "$ref" in schema:
        target = definitions().get(schema["$ref"])
        if target is None:
            errors.append(f"{path}: {schema['$ref']} is not in the stored subset")
            return
        _check(value, target, path, errors)
        return
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            errors.append(f"{path}: expected an integer or a string, got {_kind(value)}")
        return
    for key in ("oneOf", "anyOf"):
        if key in schema:
            fits = sum(not _errors_of(value, s, path) for s in schema[key])
            if fits == 0 or (key == "oneOf" and fits > 1):
                errors.append(f"{path}: matches {fits} of the {key} alternatives")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    kind = schema.get("type")
    if kind is None:
        return
    if not _is(value, kind):
        errors.append(f"{path}: expected {kind}, got {_kind(value)}")
        return
    if kind == "integer" and schema.get("format") in RANGES:
        lo, hi = RANGES[schema["format"]]
        if not lo <= value <= hi:
            errors.append(f"{path}: {value} out of {schema['format']} range")
    if kind == "array":
        for i, item in enumerate(value):
            _check(item, schema.get("items", {}), f"{path}[{i}]", errors)
    elif kind == "object":
        _check_object(value, schema, path, errors)


def _check_object(value: Mapping[str, Any], schema: Mapping[str, Any], path: str,
                  errors: list[str]) -> None:
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    for name in schema.get("required", ()):
        if name not in value:
            errors.append(f"{path}: missing required field {name!r}")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    for key, item in value.items():
        sub = f"{path}.{key}"
        if props is not None and key in props:
            _check(item, props[key], sub, errors)
        elif isinstance(extra, Mapping):
            _check(item, extra, sub, errors)
        elif props is not None or extra is False:
            errors.append(f"{sub}: unknown field")


def _errors_of(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    out: list[str] = []
    _check(value, schema, path, out)
    return out


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, {"object": dict, "array": list, "string": str,
                              "boolean": bool}.get(kind, object))


def _kind(value: Any) -> str:
    return type(value).__name__
