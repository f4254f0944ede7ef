"""Job YAML files: reading them, and pointing errors at the offending line.

A file holds one job (a mapping) or ``jobs: [...]``. The document is composed once to
map every dotted field path (``jobs[2].slo.ttft_ms``) to its line, so validation errors
read ``file.yaml:14: jobs[2].slo.ttft_ms: must be > 0 (got -5)``. Relative trace paths
name files in the traces directory (``trace``). A file is refused at once, with a one-line
reason, when it is larger than ``MAX_YAML_BYTES``, is not UTF-8 text, or its aliases
expand past ``MAX_YAML_NODES`` nodes (an alias bomb). Parsing rules live in ``parse``;
no transport here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from koi.errors import InvalidSpecError, bounded
from koi.jobs.bounds import MAX_YAML_BYTES, MAX_YAML_NODES
from koi.jobs.parse import Ctx, parse_job_in, parse_jobs_in
from koi.jobs.spec import JobSpec
from koi.safe_text import printable


def load_job_yaml(path: str | Path, *, catalog: Any = None) -> JobSpec:
    """The one job in a YAML file (a job mapping, or ``jobs:`` with exactly one entry).
    Every error is one line of bounded length, whatever the file holds."""
    try:
        ctx, data = _read(path, catalog)
        if isinstance(data, dict) and "jobs" in data:
            jobs = parse_jobs_in(ctx, data)
            if len(jobs) != 1:
                raise ctx.error("jobs", f"holds {len(jobs)} jobs; use load_jobs_yaml for several")
            return jobs[0]
        return parse_job_in(ctx, data)
    except InvalidSpecError as e:
        raise bounded(e) from None


def load_jobs_yaml(path: str | Path, *, catalog: Any = None) -> list[JobSpec]:
    """Every job in a YAML file: one job mapping, or ``jobs: [...]`` (ids must be unique).
    Every error is one line of bounded length, whatever the file holds."""
    try:
        ctx, data = _read(path, catalog)
        return parse_jobs_in(ctx, data)
    except InvalidSpecError as e:
        raise bounded(e) from None


def _one_line(e: object) -> str:
    return printable(" ".join(str(e).split()), 300)


def _read(path: str | Path, catalog: Any) -> tuple[Ctx, Any]:
    p = Path(path)
    source = str(p)
    text = read_yaml_text(p, source)
    try:
        node, data = _compose(text, source)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise InvalidSpecError("yaml", f"not valid YAML: {_one_line(e.problem or e)}",
                               source=where) from None
    except yaml.YAMLError as e:  # e.g. ReaderError (a control character): text of two lines
        raise InvalidSpecError("yaml", f"not valid YAML: {_one_line(e)}",
                               source=source) from None
    except RecursionError:
        raise InvalidSpecError("yaml", "nested too deeply", source=source) from None
    except InvalidSpecError:
        raise
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise InvalidSpecError("yaml", f"not valid YAML: {type(e).__name__}",
                               source=source) from None
    if node is None or data is None:
        raise InvalidSpecError("file", "is empty; expected a job mapping or jobs: [...]",
                               source=source)
    lines: dict[str, int] = {}
    index_lines(node, "", lines, source)
    return Ctx(source, p.parent, lines, catalog=catalog), data


def read_yaml_text(p: Path, source: str, what: str = "job file") -> str:
    """The file's text: at most ``MAX_YAML_BYTES``, UTF-8 (refused at once otherwise);
    ``what`` names the file in the errors (the scenario loader reads through it too)."""
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise InvalidSpecError("file", f"{what} not found: {p}", source=source) from None
    except OSError as e:
        raise InvalidSpecError("file", f"cannot read {p}: {e.strerror}", source=source) from None
    if len(raw) > MAX_YAML_BYTES:
        raise InvalidSpecError("file", f"is larger than {MAX_YAML_BYTES} bytes, the most a {what}"
                                       " may hold", source=source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidSpecError("file", f"is not UTF-8 text (byte {e.start}; a binary file?)",
                               source=source) from None


def _compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph (for lines) and its data, parsed once (libyaml when
    present); the graph's expanded size is checked before anything walks the tree."""
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_expansion(node, source)
        return node, loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand it past ``MAX_YAML_NODES`` nodes, or refer
    to themselves: a few hundred bytes of nested aliases otherwise take minutes to walk."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise InvalidSpecError("yaml", "an alias refers to itself", source=source)
        active.add(key)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                raise InvalidSpecError("yaml", f"holds more than {MAX_YAML_NODES} YAML nodes,"
                                               " counting what aliases repeat: the most a"
                                               " job file may", source=source)
        active.discard(key)
        sizes[key] = total
        return total

    size(root)


def index_lines(node: yaml.Node, prefix: str, out: dict[str, int], source: str) -> None:
    """Record the 1-based line of every key (and list item) under its dotted path."""
    out.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if path in out:
                # safe_load silently keeps the last duplicate; a spec should not mean two things
                raise InvalidSpecError(path, f"duplicate key (first on line {out[path]})",
                                       source=f"{source}:{line}")
            out[path] = line
            index_lines(value_node, path, out, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}[{i}]"
            out[path] = item.start_mark.line + 1
            index_lines(item, path, out, source)
