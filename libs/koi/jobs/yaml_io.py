"""Job YAML files: reading them, and pointing errors at the offending line.

A file holds one job (a mapping) or ``jobs: [...]``. The document is composed once to
map every dotted field path (``jobs[2].slo.ttft_ms``) to its line, so validation errors
read ``file.yaml:14: jobs[2].slo.ttft_ms: must be > 0 (got -5)``. Relative trace paths
resolve against the file's directory. Parsing rules live in ``parse``; no transport here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from koi.errors import InvalidSpecError
from koi.jobs.parse import Ctx, parse_job_in, parse_jobs_in
from koi.jobs.spec import JobSpec


def load_job_yaml(path: str | Path, *, catalog: Any = None) -> JobSpec:
    """The one job in a YAML file (a job mapping, or ``jobs:`` with exactly one entry)."""
    ctx, data = _read(path, catalog)
    if isinstance(data, dict) and "jobs" in data:
        jobs = parse_jobs_in(ctx, data)
        if len(jobs) != 1:
            raise ctx.error("jobs", f"holds {len(jobs)} jobs; use load_jobs_yaml for several")
        return jobs[0]
    return parse_job_in(ctx, data)


def load_jobs_yaml(path: str | Path, *, catalog: Any = None) -> list[JobSpec]:
    """Every job in a YAML file: one job mapping, or ``jobs: [...]`` (ids must be unique)."""
    ctx, data = _read(path, catalog)
    return parse_jobs_in(ctx, data)


def _read(path: str | Path, catalog: Any) -> tuple[Ctx, Any]:
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidSpecError("file", f"job file not found: {p}", source=source) from None
    except OSError as e:
        raise InvalidSpecError("file", f"cannot read {p}: {e.strerror}", source=source) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise InvalidSpecError("yaml", f"not valid YAML: {e.problem or e}", source=where) from None
    except yaml.YAMLError as e:
        raise InvalidSpecError("yaml", f"not valid YAML: {e}", source=source) from None
    if node is None or data is None:
        raise InvalidSpecError("file", "is empty; expected a job mapping or jobs: [...]",
                               source=source)
    lines: dict[str, int] = {}
    index_lines(node, "", lines, source)
    return Ctx(source, p.parent, lines, catalog=catalog), data


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
