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

Within a layer, no circles: no file imports, through any chain of files, a file that
imports it back (lazy and ``TYPE_CHECKING`` imports count: a circle hidden inside a
function is still one), and no folder imports a folder that imports it back. A circle
is broken by moving the shared piece down into a leaf both can import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / "libs"
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


# --- circles --------------------------------------------------------------------------

def _all_files() -> dict[str, Path]:
    """Every module of the library and the services, by dotted name."""
    out = dict(MODULES)
    for path in sorted((ROOT / "services").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _file_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module → the modules it imports. ``from pkg import a, b`` is an edge to ``pkg.a``
    and ``pkg.b`` where those are modules, else to ``pkg`` (its ``__init__``)."""
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = (package.rsplit(".", node.level - 1)[0] if node.level > 1
                            else package)
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names
                        if f"{target}.{a.name}" in files]
                targets = subs if len(subs) == len(node.names) else [target, *subs]
            else:
                continue
            graph[module] |= {t for t in targets if t in files and t != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


FILES = _all_files()
GRAPH = _file_graph(FILES)


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_files() -> None:
    assert {"services.runtime.app", "koi.planner.settings"} <= set(FILES)
    circles = _circles(GRAPH)
    assert not circles, ("files that import each other, through any chain: "
                         + "; ".join(" ⇄ ".join(c) for c in circles))


def test_no_import_circle_between_folders() -> None:
    def folder(module: str) -> str:
        return module if FILES[module].name == "__init__.py" else module.rpartition(".")[0]

    def nested(a: str, b: str) -> bool:  # a package and its subpackages are one room
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")

    graph: dict[str, set[str]] = {folder(m): set() for m in FILES}
    for module, targets in GRAPH.items():
        graph[folder(module)] |= {folder(t) for t in targets
                                  if not nested(folder(module), folder(t))}
    circles = _circles(graph)
    assert not circles, ("folders that import each other: "
                         + "; ".join(" ⇄ ".join(c) for c in circles))
