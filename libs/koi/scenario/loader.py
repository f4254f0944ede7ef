"""Scenario files: reading, validating and writing back the YAML format of docs/SCENARIOS.md.

``load_scenario`` takes a shipped name (``hetero-3h`` → ``scenario/data/hetero-3h.yaml``)
or a path; ``parse_scenario`` validates the dict form; ``scenario_to_dict`` is its inverse.
Every problem is an ``InvalidSpecError`` naming the file, the line and the dotted field
(``hetero-3h.yaml line 42: fleet[3].offering: unknown offering ...``), one line of
bounded length whatever the file holds; jobs are parsed by
``koi.jobs`` in the same context, so their errors read the same way. World overrides are
checked against the world's schema (``koi.scenario.world``). No simulation here.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from koi.catalog import Catalog, load_catalog
from koi.errors import InvalidSpecError, bounded
from koi.jobs import JobSpec, job_to_dict
from koi.jobs.parse import Ctx, boolean, check_keys, mapping, number, parse_job_in
from koi.jobs.yaml_io import index_lines, read_yaml_text
from koi.scenario._ctx import ScenarioCtx, duration, integer, relined, show, text
from koi.scenario.durations import format_duration
from koi.scenario.fleet import parse_capacity_events, parse_fleet
from koi.scenario.types import Scenario
from koi.scenario.world import validate_world_overrides

SCENARIO_DIR = Path(__file__).resolve().parent / "data"
TOP_KEYS = ("name", "description", "horizon", "tick", "seed", "sample_fraction",
            "randomize_world", "world", "fleet", "capacity_events", "jobs")
DEFAULT_TICK_S = 60.0
# Per-job sugar: a duration under the short key becomes seconds under the koi.jobs key.
JOB_TIME_KEYS = {"submit": "submit_s", "deadline": "deadline_s", "end": "end_s"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# the shipped scenarios are at most 5 levels deep and 1,600 nodes; a file far beyond
# that is a mistake or an attack (see _check_shape)
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 200_000


# --- public API ------------------------------------------------------------------------

def list_scenarios() -> list[str]:
    """Names of the shipped scenarios (``scenario/data/*.yaml``), sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name_or_path: str | Path) -> Path:
    """The file a scenario name or path refers to (a bare name is a shipped scenario)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1 or p.is_file():
        return p
    shipped = SCENARIO_DIR / f"{p.name}.yaml"
    if shipped.is_file():
        return shipped
    names = list_scenarios()
    close = difflib.get_close_matches(str(name_or_path), names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    raise InvalidSpecError("scenario", f"unknown scenario {str(name_or_path)!r}; {hint}"
                                       f"shipped: {', '.join(names)} (or give a .yaml path)")


def load_scenario(name_or_path: str | Path, *, catalog: Catalog | None = None) -> Scenario:
    """Read, validate and build a scenario from a shipped name or a YAML file."""
    try:
        p = scenario_path(name_or_path)
        source = str(p)
        data, lines = _read(p, source)
        ctx = ScenarioCtx(source, p.parent, lines, catalog=catalog or load_catalog())
        return _parse(ctx, data, default_name=p.stem)
    except InvalidSpecError as e:
        raise bounded(e) from None


def parse_scenario(data: dict[str, Any], *, source: str = "<dict>",
                   base_dir: Path | None = None, catalog: Catalog | None = None) -> Scenario:
    """Validate a scenario dict (the YAML form). Trace references resolve in the traces
    directory or as ``shared:<name>`` (``koi.jobs.trace.resolve_trace_path``), never
    relative to a file; ``base_dir`` is accepted for older callers and not used."""
    ctx = ScenarioCtx(source, base_dir, {}, catalog=catalog or load_catalog())
    try:
        return _parse(ctx, data, default_name=None)
    except InvalidSpecError as e:
        raise bounded(e) from None


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The canonical dict form: ``parse_scenario(scenario_to_dict(s), source=s.source) == s``.

    Fleet entries use offering ids, times are seconds, events are in time order.
    """
    out: dict[str, Any] = {
        "name": s.name, "description": s.description, "horizon": s.horizon_s,
        "tick": s.tick_s, "seed": s.seed,
        "randomize_world": s.randomize_world, "world": copy.deepcopy(s.world),
        "fleet": [{"offering": f.offering, "gpus": f.gpus} for f in s.fleet],
    }
    if s.sample_fraction is not None:
        out["sample_fraction"] = s.sample_fraction
    if s.capacity_events:
        out["capacity_events"] = [
            {"at": e.t_s, "offering": e.offering, "delta_gpus": e.delta_gpus,
             **({"note": e.note} if e.note else {})}
            for e in s.capacity_events]
    out["jobs"] = [job_to_dict(j) for j in s.jobs]
    return out


# --- reading ---------------------------------------------------------------------------

def _read(p: Path, source: str) -> tuple[Any, dict[str, int]]:
    # a binary file or one over 1 MiB is refused before YAML sees it (fuzzing found a
    # non-UTF-8 byte raising UnicodeDecodeError here)
    content = read_yaml_text(p, source, what="scenario file")
    loader: yaml.SafeLoader | None = None
    try:
        # constructing the loader already reads the text: a control character fails here
        loader = yaml.SafeLoader(content)
        node = loader.get_single_node()  # one parse gives both the lines and the data
        if node is not None:
            _check_shape(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source} line {mark.line + 1}" if mark else source
        raise InvalidSpecError("yaml", f"not valid YAML: {_one_line(e.problem or e)}",
                               source=where) from None
    except yaml.YAMLError as e:  # e.g. yaml.reader.ReaderError: a character YAML refuses
        raise InvalidSpecError("yaml", f"not valid YAML: {_one_line(e)}",
                               source=source) from None
    except RecursionError:  # "[[[[…" thousands deep
        raise InvalidSpecError("yaml", "not valid YAML: nested too deeply",
                               source=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None or data is None:
        raise InvalidSpecError("file", "is empty; expected a scenario mapping", source=source)
    lines: dict[str, int] = {}
    try:
        index_lines(node, "", lines, source)
    except InvalidSpecError as e:  # a duplicate key: same message, our "line N" form
        raise InvalidSpecError(e.field, e.reason, source=relined(e.source, source)) from None
    return data, lines


def _check_shape(root: yaml.Node, source: str) -> None:
    """Refuse a document nested deeper than ``MAX_YAML_DEPTH`` or whose aliases expand it
    past ``MAX_YAML_NODES`` nodes (or into itself): what reads it next (line indexing,
    the world's deep copy, job parsing) recurses through every path and would overflow
    the stack or walk for hours. Iterative, and stops at the first excess."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    walked = 0
    while stack:
        node, depth = stack.pop()
        walked += 1
        if walked > MAX_YAML_NODES:
            raise InvalidSpecError("yaml", f"expands to more than {MAX_YAML_NODES:,} nodes"
                                           " (aliases?)", source=source)
        if depth > MAX_YAML_DEPTH:
            raise InvalidSpecError("yaml", f"nested more than {MAX_YAML_DEPTH} levels deep",
                                   source=source)
        if isinstance(node, yaml.MappingNode):
            stack.extend((n, depth + 1) for pair in node.value for n in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((n, depth + 1) for n in node.value)


def _one_line(problem: object) -> str:
    """PyYAML's messages span lines ("…\n  in "<unicode string>", position 0")."""
    return " ".join(str(problem).split())


# --- the document ----------------------------------------------------------------------

def _parse(ctx: Ctx, data: Any, *, default_name: str | None) -> Scenario:
    if not isinstance(data, dict):
        raise ctx.error("", f"a scenario must be a mapping of fields (got {show(data)})")
    check_keys(ctx, data, TOP_KEYS)
    name = _name(ctx, data, default_name)
    horizon_s, tick_s = _clock(ctx, data)
    seed = integer(ctx, data, "seed", 0)
    if seed < 0:
        raise ctx.error("seed", f"must be >= 0 (got {seed})")
    fraction: float | None = None
    if data.get("sample_fraction") is not None:
        fraction = number(ctx, data, "sample_fraction", 1.0)
        if not 0 < fraction <= 1:
            raise ctx.error("sample_fraction", f"must be in (0, 1] (got {fraction:g})")
    world = _world(ctx, data.get("world"))
    fleet = parse_fleet(ctx.at("fleet"), _required(ctx, data, "fleet"), ctx.catalog)
    events = parse_capacity_events(ctx.at("capacity_events"), data.get("capacity_events"),
                                   fleet, horizon_s, ctx.catalog)
    jobs = _parse_jobs(ctx.at("jobs"), _required(ctx, data, "jobs"), horizon_s)
    return Scenario(name=name, description=text(ctx, data, "description", ""),
                    horizon_s=horizon_s, tick_s=tick_s, seed=seed, fleet=fleet, jobs=jobs,
                    capacity_events=events, world=world,
                    randomize_world=boolean(ctx, data, "randomize_world", False),
                    sample_fraction=fraction, source=ctx.source)


def _required(ctx: Ctx, data: dict[str, Any], key: str) -> Any:
    if data.get(key) is None:
        raise ctx.error(key, "missing (required)")
    return data[key]


def _name(ctx: Ctx, data: dict[str, Any], default: str | None) -> str:
    name = text(ctx, data, "name", default)
    if name is None:
        raise ctx.error("name", "missing (required)")
    if not _NAME.fullmatch(name):
        raise ctx.error("name", f"{name!r} must be 1-63 letters, digits, '.', '_' or '-',"
                                " starting with a letter or digit")
    return name


def _clock(ctx: Ctx, data: dict[str, Any]) -> tuple[float, float]:
    horizon_s = duration(ctx, data, "horizon")
    if horizon_s <= 0:
        raise ctx.error("horizon", f"must be > 0 (got {format_duration(horizon_s)})")
    tick_s = duration(ctx, data, "tick", DEFAULT_TICK_S)
    if tick_s <= 0:
        raise ctx.error("tick", f"must be > 0 (got {format_duration(tick_s)})")
    if tick_s > horizon_s:
        raise ctx.error("tick", f"{format_duration(tick_s)} is longer than the horizon"
                                f" {format_duration(horizon_s)}")
    ticks = horizon_s / tick_s
    if abs(ticks - round(ticks)) > 1e-9 * ticks:
        near = format_duration(_nearest_divisor(horizon_s, tick_s))
        raise ctx.error("tick", f"{format_duration(tick_s)} does not divide the horizon"
                                f" {format_duration(horizon_s)} ({ticks:.2f} ticks); e.g."
                                f" {near}")
    return horizon_s, tick_s


def _nearest_divisor(horizon_s: float, tick_s: float) -> float:
    """A round tick near ``tick_s`` that divides the horizon (for the error's hint)."""
    nice = [d for d in (1, 5, 10, 15, 20, 30, 60, 120, 180, 300, 600, 900, 1800, 3600)
            if d <= horizon_s and (horizon_s / d) == int(horizon_s / d)]
    if nice:
        return min(nice, key=lambda d: abs(d - tick_s))
    return horizon_s / max(1, round(horizon_s / tick_s))


def _world(ctx: Ctx, data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    mapping(ctx.at("world"), data)
    for key in data:
        if not isinstance(key, str):
            raise ctx.at("world").error(str(key), f"keys must be strings (got {show(key)})")
    world = copy.deepcopy(data)
    problems = validate_world_overrides(world)
    if problems:
        path, reason = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ctx.at("world").error(path, reason + more)
    return world


def _parse_jobs(ctx: Ctx, data: Any, horizon_s: float) -> tuple[JobSpec, ...]:
    if not isinstance(data, list) or not data:
        raise ctx.error("", f"must be a non-empty list of jobs (got {show(data)})")
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(data):
        item_ctx = ctx.at(f"[{i}]")
        job = parse_job_in(item_ctx, _job_times(item_ctx, item))
        if job.id in seen:
            raise item_ctx.error("id", f"duplicate job id {job.id!r} (also"
                                       f" {ctx.path(f'[{seen[job.id]}]')})")
        seen[job.id] = i
        if job.submit_s >= horizon_s:
            key = "submit" if isinstance(item, dict) and "submit" in item else "submit_s"
            raise item_ctx.error(key, f"{format_duration(job.submit_s)} is not before the"
                                      f" horizon {format_duration(horizon_s)}; the job would"
                                      " never appear")
        jobs.append(job)
    return tuple(jobs)


def _job_times(ctx: Ctx, item: Any) -> Any:
    """``submit: 2h`` → ``submit_s: 7200`` (likewise deadline, end); the line moves too."""
    if not isinstance(item, dict) or not JOB_TIME_KEYS.keys() & item.keys():
        return item
    out: dict[str, Any] = {}
    for key, value in item.items():
        target = JOB_TIME_KEYS.get(key)
        if target is None:
            out[key] = value
            continue
        if target in item:
            raise ctx.error(key, f"give {key} or {target}, not both")
        seconds = duration(ctx, item, key, None)
        if seconds is not None and seconds < 0:
            raise ctx.error(key, f"must be >= 0 (got {format_duration(seconds)})")
        out[target] = seconds
        # Errors koi.jobs raises for the seconds field point at the line the user wrote.
        line = ctx.lines.get(ctx.path(key))
        if line is not None:
            ctx.lines.setdefault(ctx.path(target), line)
    return out
