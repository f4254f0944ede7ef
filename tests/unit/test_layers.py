"""Imports run one way: the layers of Koi, from the bottom up.

1. **the domain** — every ``koi.*`` module not named below: catalog, space, jobs,
   cluster, lifecycle, shapes, predictor, causal, dro, compose, planner (and its
   settings and variants), sim, scenario, metrics, rlm, fleet, wire, …
2. ``koi.policies`` — the benchmark's registry of planning policies: the baselines and
   Koi's variants wrapped as policies. Above the domain: it imports the planner, the
   predictor and the simulator; nothing in the domain may import it (the planner's
   settings and variants are ``koi.planner.settings``, job state is ``koi.lifecycle``,
   fitting shapes are ``koi.shapes``).
3. ``koi.bench`` — runs the registered policies through scenarios and reports.
4. ``koi.cli`` — the domain's command line (it runs the bench).
5. ``services`` — the processes on the bus, and the ``koi`` entry point
   (``services.koi_command``) that adds the bus commands to ``koi.cli``'s app. Nothing
   under ``libs/koi`` imports it.

A module may import its own layer and those below it, never one above. Imports inside
functions count: a lazy import is still a dependency. Besides, only ``koi.wire`` (the
codec) and the generated ``koi.v1`` touch protobuf, and the library never imports the
transport (nats, grpc, redis): DESIGN §3, STYLE "Layout".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIBS = Path(__file__).resolve().parents[2] / "libs"
LAYERS = ("koi.policies", "koi.bench", "koi.cli")  # above the domain, bottom to top
TRANSPORT = ("nats", "grpc", "redis", "services")


def _layer(module: str) -> int:
    """0 for the domain, 1.. for the layers above it, len(LAYERS) + 1 for services."""
    if module == "services" or module.startswith("services."):
        return len(LAYERS) + 1
    for i, name in enumerate(LAYERS, start=1):
        if module == name or module.startswith(name + "."):
            return i
    return 0


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((LIBS / "koi").rglob("*.py")):
        parts = path.relative_to(LIBS).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not name.startswith("koi.v1"):  # generated protobuf code
            out.append((name, path))
    return out


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every absolute import, and relative ones resolved."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # `from koi import policies` names a module too
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names
                    if target in ("koi", "services")]
    return out


MODULES = _modules()


def test_the_walk_sees_the_library() -> None:
    names = {m for m, _ in MODULES}
    assert {"koi.planner.tick", "koi.policies.koi", "koi.bench.runner",
            "koi.cli.main", "koi.lifecycle"} <= names


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_import_from_a_layer_above(module: str, path: Path) -> None:
    own = _layer(module)
    upward = [f"line {line}: {target}" for line, target in _imports(module, path)
              if target.split(".")[0] in ("koi", "services") and _layer(target) > own]
    assert not upward, (f"{module} (layer {own}) imports from a layer above it: "
                        f"{'; '.join(upward)} (see this test's docstring)")


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_transport_or_protobuf_in_the_library(module: str, path: Path) -> None:
    wrong = []
    for line, target in _imports(module, path):
        root = target.split(".")[0]
        if root in TRANSPORT:
            wrong.append(f"line {line}: {target}")
        pb = target.startswith(("koi.v1", "google.protobuf")) or target.endswith("_pb2")
        if pb and not module.startswith("koi.wire"):
            wrong.append(f"line {line}: {target}")
    assert not wrong, f"{module} imports the transport or protobuf: {'; '.join(wrong)}"
