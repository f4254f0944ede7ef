"""Hypotheses: typed claims in the causal graph's terms, parsed and checked.

A language model's hypothesis says that an edge of the causal graph (cause → effect)
behaves differently in a scope than the predictor assumes — a direction and a size (a
multiplier on the effect, with a range) — cites the evidence it read (telemetry,
residuals, mechanism ids), and says how to test it: candidate ``DeploymentConfig``s for
named jobs, or an exploration (one knob over a few values for a job). It expires.

``parse_hypothesis`` turns one JSON object from a model into a ``Hypothesis`` (or a
problem); ``validate`` lists everything wrong with one against the graph, the catalog,
the jobs and what the fleet offers (``SearchSpace``); ``accept`` does both for a round's
answer and returns the accepted ones and the dropped ones with their reasons (the
caller turns those into events). ``koi.rlm.adopt`` turns accepted hypotheses into
candidates and weak priors. Nothing here calls a model or does I/O; a hypothesis is only
ever a proposal that the deterministic parts check and score.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from koi.catalog import Catalog
from koi.causal.graph import BELIEF_EDGES, EDGES, Edge
from koi.causal.scope import ANY, SIZE_CLASSES, Scope, size_class
from koi.cluster import ClusterSnapshot, DeploymentState, JobStatus
from koi.errors import InvalidConfigError
from koi.safe_text import printable
from koi.space import (
    KNOBS,
    DeploymentConfig,
    config_from_dict,
    config_to_dict,
    engine_default_config,
)
from koi.space import validate as validate_config

# every edge a claim may name: DESIGN §6's, and the belief edge it leaves implicit
KNOWN_EDGES: frozenset[Edge] = frozenset(EDGES) | frozenset(BELIEF_EDGES)
PARALLELISM_BUCKETS = ("tp1", "tp2", "tp4", "tp8+", "pp>1", "ep>1")
SCOPE_KEYS = ("accelerator", "family", "engine", "size_class", "parallelism", "model")
SIZE_CLASS_NAMES = tuple(name for _, name in SIZE_CLASSES)
_SIZE_ALIASES = {"<=10b": "≤10B", "10-40b": "10–40B", "40-100b": "40–100B"}
SIZE_RANGE = (0.1, 10.0)     # a multiplier outside this is not a serving effect
MIN_EFFECT = math.log(1.02)  # |log size| below this claims nothing
MAX_TESTS = 8                # candidate configs per hypothesis
MAX_EXPLORE_VALUES = 6
MAX_WHY = 12
TEXT_LIMIT = 300
# knobs an exploration may vary (the ones the proposer's grid does not cover finely)
EXPLORABLE = ("tp", "pp", "max_num_seqs", "max_batched_tokens", "gpu_mem_fraction",
              "weight_precision", "kv_dtype", "chunked_prefill", "prefix_caching",
              "spec_decode", "spec_tokens", "engine", "block_size", "scheduling_policy")


class Direction(StrEnum):
    INCREASE = "increase"  # the effect node's value goes up (size > 1)
    DECREASE = "decrease"  # it goes down (size < 1)


@dataclass(frozen=True, slots=True)
class CandidateTest:
    """A configuration to evaluate for a job (offering and replicas are chosen later)."""

    job_id: str
    config: DeploymentConfig


@dataclass(frozen=True, slots=True)
class Exploration:
    """Vary one knob of a job's running configuration (or the engine default on
    ``accelerator`` when it runs nowhere) over ``values``."""

    job_id: str
    knob: str
    values: tuple[Any, ...]
    accelerator: str = ""


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A claim on ``edge`` in ``scope``: the effect is ``size``× (``size_low``..
    ``size_high``) what the predictor says, in ``direction``; how to test it; its
    evidence; who said it; until when it holds."""

    edge: Edge
    scope: Scope
    direction: Direction
    size: float
    size_low: float
    size_high: float
    expires_tick: int
    source_model: str
    round_id: str
    why: tuple[str, ...] = ()
    tests: tuple[CandidateTest, ...] = ()
    explore: tuple[Exploration, ...] = ()
    statement: str = ""
    id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", hypothesis_id(self))

    def label(self) -> str:
        """Operator form: ``kv_pressure → tpot ×1.60 [1.30–2.00] on {l4, vllm}``."""
        return (f"{self.edge[0]} → {self.edge[1]} ×{self.size:.2f} "
                f"[{self.size_low:.2f}–{self.size_high:.2f}] on {self.scope.label()}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (transcripts, the bus later)."""
        return {"id": self.id, "cause": self.edge[0], "effect": self.edge[1],
                "scope": self.scope.key(), "direction": self.direction.value,
                "size": self.size, "size_low": self.size_low, "size_high": self.size_high,
                "expires_tick": self.expires_tick, "source_model": self.source_model,
                "round_id": self.round_id, "why": list(self.why),
                "tests": [{"job_id": t.job_id, "config": config_to_dict(t.config)}
                          for t in self.tests],
                "explore": [{"job_id": e.job_id, "knob": e.knob, "values": list(e.values),
                             "accelerator": e.accelerator} for e in self.explore],
                "statement": self.statement}


def hypothesis_id(h: Hypothesis) -> str:
    """A stable hash of what the hypothesis says (not of its wording)."""
    tests = sorted(f"{t.job_id}:{config_to_dict(t.config)}" for t in h.tests)
    explore = sorted(f"{e.job_id}:{e.knob}:{e.values}:{e.accelerator}" for e in h.explore)
    blob = repr((h.edge, h.scope.key(), h.direction.value, round(h.size, 6), tests, explore,
                 h.expires_tick, h.round_id))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SearchSpace:
    """What a hypothesis may name this tick: the parts the fleet offers, each job's
    running configuration, the playbook's mechanism ids and the config validator."""

    accelerators: frozenset[str]
    running: Mapping[str, DeploymentConfig] = field(default_factory=dict)
    mechanisms: frozenset[str] = frozenset()
    check: Callable[[DeploymentConfig, Catalog], list[InvalidConfigError]] = validate_config

    @staticmethod
    def of(snapshot: ClusterSnapshot, catalog: Catalog,
           mechanisms: Collection[str] = ()) -> SearchSpace:
        accels = frozenset(catalog.offering(c.offering).accelerator for c in snapshot.capacity
                           if c.total_gpus > 0)
        running: dict[str, DeploymentConfig] = {}
        for d in snapshot.deployments:
            if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING):
                running.setdefault(d.job_id, d.config.with_(offering="", replicas=1))
        return SearchSpace(accels, running, frozenset(mechanisms))


@dataclass(frozen=True, slots=True)
class Dropped:
    """A hypothesis refused, with why (``index``: its place in the model's answer);
    ``job_ids``: the jobs its tests and explorations named, read from the answer even
    when it did not parse; ``claim``: what it said in operator form, when it parsed."""

    index: int
    reason: str
    hypothesis_id: str = ""
    job_ids: tuple[str, ...] = ()
    claim: str = ""


def claim_text(h: Hypothesis) -> str:
    """A parsed hypothesis in one operator line: label, statement, expiry, tests."""
    tests = [f"{t.job_id}: {t.config.accelerator} tp{t.config.tp} {t.config.engine}"
             for t in h.tests] + [f"{e.job_id}: {e.knob} {list(e.values)}" for e in h.explore]
    return printable(f"{h.label()} ({h.direction.value}, expires tick {h.expires_tick})"
                     + (f" — {h.statement}" if h.statement else "")
                     + (f"; tests {'; '.join(tests)}" if tests else ""), 600)


def named_jobs(doc: Any) -> tuple[str, ...]:
    """The job ids a hypothesis's JSON names in its tests and explorations, as far as its
    shape lets them be read (each capped, in order, without repeats)."""
    test = doc.get("test") if isinstance(doc, dict) else None
    if not isinstance(test, dict):
        return ()
    out: list[str] = []
    for part in ("configs", "explore"):
        items = test.get(part)
        for item in items[:MAX_TESTS] if isinstance(items, list) else ():
            job = item.get("job_id") if isinstance(item, dict) else None
            if isinstance(job, str) and job and printable(job, 200) not in out:
                out.append(printable(job, 200))
    return tuple(out)


# --- parsing ------------------------------------------------------------------------------

class Problem(ValueError):
    """What is wrong with something a model wrote (its text is safe to show)."""


def _text(value: Any, what: str, limit: int = TEXT_LIMIT) -> str:
    if not isinstance(value, str):
        raise Problem(f"{what} must be a string")
    return printable(value, limit)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Problem(f"{what} must be a number")
    return float(value)


def scope_from_json(doc: Any, catalog: Catalog) -> Scope:
    """A scope from its JSON form; wildcards where a dimension is missing. A named model
    gives the size class; a named accelerator its family (as ``scope_of`` does)."""
    if doc is None:
        return Scope()
    if isinstance(doc, str) and doc.count("|") == 4:  # a scope key, as Koi writes them
        return Scope.from_key(doc)
    if not isinstance(doc, dict):
        raise Problem("scope must be an object")
    unknown = sorted(str(k) for k in doc if k not in SCOPE_KEYS)
    if unknown:
        raise Problem(f"scope has unknown dimension {printable(unknown[0], 40)!r}; known: "
                      f"{', '.join(SCOPE_KEYS)}")
    get = {k: _text(v, f"scope.{k}", 80) for k, v in doc.items() if v not in (None, "")}
    size = get.get("size_class", ANY)
    size = _SIZE_ALIASES.get(size.lower().replace(" ", ""), size)
    if "model" in get:
        if get["model"] not in catalog.models:
            raise Problem(f"scope names model {get['model']!r}, which the catalog does not"
                          " have (hallucinated model)")
        size = size_class(catalog.models[get["model"]].params_b)
    accel, family = get.get("accelerator", ANY), get.get("family", ANY)
    if accel != ANY and family == ANY and accel in catalog.accelerators:
        family = catalog.accelerators[accel].family
    return Scope(accelerator=accel, engine=get.get("engine", ANY), size_class=size,
                 parallelism=get.get("parallelism", ANY), family=family)


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(DeploymentConfig)}


def knob_type_problem(knob: str, value: Any) -> str | None:
    """Why ``value`` has the wrong JSON type for ``knob`` (None: it is fine); the
    config validator compares numbers and would choke on a string."""
    default = _DEFAULTS.get(knob)
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, kind = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value), "a number"
    else:
        ok, kind = isinstance(value, str), "a string"
    return None if ok else f"knob {knob} must be {kind}, not {printable(repr(value), 40)}"


def config_for_job(job_id: str, knobs: Any, jobs: Mapping[str, JobStatus],
                   catalog: Catalog) -> DeploymentConfig:
    """The job's model, an accelerator and engine from ``knobs``, the engine's defaults
    for the rest, ``knobs`` over them; offering and replicas left to the composer."""
    if isinstance(knobs, list):  # [{"knob": k, "value": v}, ...] also reads
        knobs = {str(k.get("knob")): k.get("value") for k in knobs if isinstance(k, dict)}
    if not isinstance(knobs, dict):
        raise Problem(f"config for job {printable(job_id, 80)!r} must be an object of knobs")
    unknown = sorted(str(k) for k in knobs if k not in KNOBS)
    if unknown:
        raise Problem(f"config for job {printable(job_id, 80)!r} has unknown knob"
                      f" {printable(unknown[0], 60)!r}")
    for k, v in knobs.items():
        wrong = knob_type_problem(k, v)
        if wrong:
            raise Problem(f"config for job {printable(job_id, 80)!r}: {wrong}")
    job = jobs.get(job_id)
    model = str(knobs.get("model") or (job.spec.model if job is not None else ""))
    accel = knobs.get("accelerator")
    if not isinstance(accel, str) or not accel:
        raise Problem(f"config for job {printable(job_id, 80)!r} names no accelerator")
    engine = str(knobs.get("engine") or "vllm")
    rest = {k: v for k, v in knobs.items()
            if k not in ("model", "accelerator", "engine", "offering", "replicas")}
    try:
        if model in catalog.models and accel in catalog.accelerators \
                and engine in catalog.engines:
            cfg = engine_default_config(model, accel, engine, catalog, **rest)
        else:  # validate() names what is unknown
            cfg = config_from_dict({**rest, "model": model, "accelerator": accel,
                                    "engine": engine})
    except InvalidConfigError as err:
        raise Problem(f"invalid config for job {printable(job_id, 80)!r}: {err}") from None
    except (TypeError, ValueError) as err:
        raise Problem(f"invalid config for job {printable(job_id, 80)!r}:"
                      f" {printable(str(err), 120)}") from None
    return cfg.with_(offering="", replicas=1)


def _tests(doc: Any, jobs: Mapping[str, JobStatus], catalog: Catalog
           ) -> tuple[tuple[CandidateTest, ...], tuple[Exploration, ...]]:
    if doc is None:
        return (), ()
    if not isinstance(doc, dict):
        raise Problem("test must be an object with configs and/or explore")
    configs, explore = doc.get("configs") or [], doc.get("explore") or []
    if not isinstance(configs, list) or not isinstance(explore, list):
        raise Problem("test.configs and test.explore must be lists")
    if len(configs) > MAX_TESTS or len(explore) > MAX_TESTS:
        raise Problem(f"more than {MAX_TESTS} test configs or explorations")
    tests = []
    for item in configs:
        if not isinstance(item, dict):
            raise Problem("each test config must be an object with job_id and config")
        job_id = _text(item.get("job_id"), "test.configs[].job_id", 200)
        tests.append(CandidateTest(job_id, config_for_job(job_id, item.get("config"), jobs,
                                                          catalog)))
    out = []
    for item in explore:
        if not isinstance(item, dict):
            raise Problem("each exploration must be an object with job_id, knob, values")
        values = item.get("values")
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_EXPLORE_VALUES:
            raise Problem(f"exploration values must be a list of 1..{MAX_EXPLORE_VALUES}")
        if any(not isinstance(v, str | int | float | bool) for v in values):
            raise Problem("exploration values must be plain strings, numbers or booleans")
        out.append(Exploration(_text(item.get("job_id"), "explore[].job_id", 200),
                               _text(item.get("knob"), "explore[].knob", 60), tuple(values),
                               _text(item.get("accelerator") or "", "explore[].accelerator",
                                     60)))
    return tuple(tests), tuple(out)


def parse_hypothesis(doc: Any, *, jobs: Mapping[str, JobStatus], catalog: Catalog,
                     source_model: str, round_id: str) -> Hypothesis | str:
    """One hypothesis from a model's JSON (``HYPOTHESIS_SCHEMA``), or what is wrong with
    its shape. Meaning is checked by ``validate``."""
    try:
        if not isinstance(doc, dict):
            raise Problem("a hypothesis must be an object")
        claim = doc.get("claim", doc)
        if not isinstance(claim, dict):
            raise Problem("claim must be an object")
        cause = _text(claim.get("cause"), "claim.cause", 60)
        effect = _text(claim.get("effect"), "claim.effect", 60)
        size = _number(claim.get("size"), "claim.size")
        low = _number(claim.get("size_low", size), "claim.size_low")
        high = _number(claim.get("size_high", size), "claim.size_high")
        direction_text = _text(claim.get("direction"), "claim.direction", 20).lower()
        if direction_text not in (d.value for d in Direction):
            raise Problem("claim.direction must be increase or decrease")
        expires = doc.get("expires_tick")
        if isinstance(expires, bool) or not isinstance(expires, int):
            raise Problem("expires_tick must be an integer tick")
        why = doc.get("why") or []
        if not isinstance(why, list) or len(why) > MAX_WHY:
            raise Problem(f"why must be a list of at most {MAX_WHY} citations")
        tests, explore = _tests(doc.get("test"), jobs, catalog)
        return Hypothesis(
            edge=(cause, effect), scope=scope_from_json(claim.get("scope"), catalog),
            direction=Direction(direction_text), size=size, size_low=low, size_high=high,
            expires_tick=expires, source_model=printable(source_model, 200),
            round_id=round_id, why=tuple(_text(w, "why[]", 120) for w in why),
            tests=tests, explore=explore,
            statement=_text(doc.get("statement") or "", "statement"))
    except Problem as problem:
        return str(problem)


# --- validation ---------------------------------------------------------------------------

def exploration_configs(e: Exploration, jobs: Mapping[str, JobStatus], space: SearchSpace,
                        catalog: Catalog) -> tuple[list[DeploymentConfig], list[str]]:
    """The configurations an exploration stands for, and the problems in making them."""
    job = jobs.get(e.job_id)
    if job is None:
        return [], [f"exploration names unknown job {printable(e.job_id, 80)!r}"]
    if e.knob not in EXPLORABLE:
        return [], [f"exploration knob {printable(e.knob, 60)!r} is not one of "
                    f"{', '.join(EXPLORABLE)}"]
    base = space.running.get(e.job_id)
    if base is None:
        if not e.accelerator:
            return [], [f"job {e.job_id!r} runs nowhere: an exploration needs an accelerator"]
        try:
            base = engine_default_config(job.spec.model, e.accelerator, "vllm", catalog)
        except (KeyError, InvalidConfigError):
            return [], [f"hallucinated accelerator {printable(e.accelerator, 60)!r} (not in"
                        " the catalog)"]
    out, problems = [], []
    for v in e.values:
        wrong = knob_type_problem(e.knob, v)
        if wrong:
            problems.append(f"exploration for job {e.job_id!r}: {wrong}")
            continue
        try:
            out.append(config_from_dict({**config_to_dict(base), e.knob: v}))
        except InvalidConfigError as err:
            problems.append(f"exploration of {e.knob} for job {e.job_id!r}: {err}")
    return out, problems


def _scope_problems(scope: Scope, catalog: Catalog) -> list[str]:
    problems = []
    families = {a.family for a in catalog.accelerators.values()}
    if scope.accelerator != ANY and scope.accelerator not in catalog.accelerators:
        problems.append(f"scope names accelerator {printable(scope.accelerator, 60)!r}, which"
                        " the catalog does not have (hallucinated accelerator)")
    elif scope.accelerator != ANY and scope.family not in (
            ANY, catalog.accelerators[scope.accelerator].family):
        problems.append(f"scope family {scope.family!r} is not {scope.accelerator}'s")
    if scope.family != ANY and scope.family not in families:
        problems.append(f"scope names accelerator family {printable(scope.family, 60)!r},"
                        " which the catalog does not have")
    if scope.engine != ANY and scope.engine not in catalog.engines:
        problems.append(f"scope names engine {printable(scope.engine, 60)!r}, which the"
                        " catalog does not have")
    if scope.size_class not in (ANY, *SIZE_CLASS_NAMES):
        problems.append(f"scope size class {printable(scope.size_class, 60)!r} is not one of"
                        f" {', '.join(SIZE_CLASS_NAMES)}")
    if scope.parallelism not in (ANY, *PARALLELISM_BUCKETS):
        problems.append(f"scope parallelism {printable(scope.parallelism, 60)!r} is not one"
                        f" of {', '.join(PARALLELISM_BUCKETS)}")
    return problems


def _size_problems(h: Hypothesis) -> list[str]:
    lo, hi = SIZE_RANGE
    sizes = (h.size, h.size_low, h.size_high)
    if not all(math.isfinite(x) for x in sizes):
        return ["size is not a finite number"]
    problems = []
    if not all(lo <= x <= hi for x in sizes):
        problems.append(f"size ×{h.size:g} [{h.size_low:g}, {h.size_high:g}] is outside the"
                        f" sane range ×{lo:g}..×{hi:g}")
    if not h.size_low <= h.size <= h.size_high:
        problems.append("size must lie within [size_low, size_high]")
    if h.size > 0 and abs(math.log(h.size)) < MIN_EFFECT:
        problems.append("size ×1 claims no effect")
    elif (h.direction == Direction.INCREASE) != (h.size > 1.0):
        problems.append(f"direction {h.direction.value} contradicts size ×{h.size:g}")
    return problems


def _test_problems(h: Hypothesis, catalog: Catalog, jobs: Mapping[str, JobStatus],
                   space: SearchSpace) -> list[str]:
    problems: list[str] = []
    if not h.tests and not h.explore:
        problems.append("no test: give candidate configs or an exploration")
    configs: list[tuple[str, DeploymentConfig]] = []
    for t in h.tests:
        if t.job_id not in jobs:
            problems.append(f"test names unknown job {printable(t.job_id, 80)!r}")
            continue
        if t.config.model != jobs[t.job_id].spec.model:
            problems.append(f"test config for job {t.job_id!r} serves"
                            f" {printable(t.config.model, 60)!r}, not the job's model"
                            f" {jobs[t.job_id].spec.model!r}")
            continue
        configs.append((t.job_id, t.config))
    for e in h.explore:
        made, trouble = exploration_configs(e, jobs, space, catalog)
        problems += trouble
        configs += [(e.job_id, c) for c in made]
    for job_id, cfg in configs:
        if cfg.accelerator not in catalog.accelerators:
            problems.append(f"test config for job {job_id!r} names accelerator"
                            f" {printable(cfg.accelerator, 60)!r}, which the catalog does"
                            " not have (hallucinated accelerator)")
        elif cfg.accelerator not in space.accelerators:
            problems.append(f"test config for job {job_id!r} needs {cfg.accelerator}, which"
                            " the fleet does not offer")
        else:
            problems += [f"invalid config for job {job_id!r}: {err}"
                         for err in space.check(cfg, catalog)[:3]]
    return problems


def validate(h: Hypothesis, graph: Collection[Edge], catalog: Catalog,
             jobs: Mapping[str, JobStatus], space: SearchSpace, *, tick: int,
             max_ttl_ticks: int = 120) -> list[str]:
    """Everything wrong with ``h`` (empty = acceptable): an edge not in ``graph``; a scope
    naming accelerators, families, engines, size classes or parallelism buckets that do
    not exist; a size outside ``SIZE_RANGE``, ×1, or against its direction; an expiry
    not after ``tick`` or beyond ``max_ttl_ticks``; tests naming unknown jobs, another
    model, parts the catalog lacks or the fleet does not offer, or configurations
    ``space.check`` refuses; citations of mechanisms the playbook does not have, or of
    residuals of jobs the fleet does not have."""
    problems: list[str] = []
    if h.edge not in graph:
        problems.append(f"unknown edge {printable(h.edge[0], 60)} → {printable(h.edge[1], 60)}"
                        " (not in the causal graph)")
    problems += _scope_problems(h.scope, catalog)
    problems += _size_problems(h)
    if h.expires_tick <= tick:
        problems.append(f"expired: expires at tick {h.expires_tick}, now is tick {tick}")
    elif h.expires_tick > tick + max_ttl_ticks:
        problems.append(f"expires at tick {h.expires_tick}, more than {max_ttl_ticks} ticks"
                        f" after tick {tick}")
    if not h.why:
        problems.append("cites no evidence (why is empty)")
    for w in h.why:
        kind, _, ref = w.partition(":")
        if kind.strip() == "mechanism" and ref.strip() not in space.mechanisms:
            problems.append(f"cites mechanism {printable(ref.strip(), 40)!r}, which the"
                            " playbook does not have")
        cited_job = ref.partition("/")[0].strip()
        if kind.strip() == "residual" and cited_job not in jobs:
            # a small model copies the prompt's worked example ("residual:chat-8b/...")
            problems.append(f"cites a residual of job {printable(cited_job, 60)!r}, which"
                            " is not in the fleet")
    problems += _test_problems(h, catalog, jobs, space)
    return problems


def accept(answer: Sequence[Any], *, catalog: Catalog, jobs: Mapping[str, JobStatus],
           space: SearchSpace, tick: int, source_model: str, round_id: str,
           graph: Collection[Edge] = KNOWN_EDGES, max_hypotheses: int = 8,
           max_ttl_ticks: int = 120) -> tuple[tuple[Hypothesis, ...], tuple[Dropped, ...]]:
    """Parse and validate a round's hypotheses (JSON objects, in the model's order):
    (accepted, dropped with reasons). Past ``max_hypotheses`` the rest are dropped;
    a repeat of an accepted hypothesis is dropped as a duplicate."""
    accepted: list[Hypothesis] = []
    dropped: list[Dropped] = []
    seen: set[str] = set()
    for i, doc in enumerate(answer):
        jobs_named = named_jobs(doc)
        if i >= max_hypotheses:
            dropped.append(Dropped(i, f"over the limit of {max_hypotheses} hypotheses a"
                                      " round", job_ids=jobs_named))
            continue
        h = parse_hypothesis(doc, jobs=jobs, catalog=catalog, source_model=source_model,
                             round_id=round_id)
        if isinstance(h, str):
            dropped.append(Dropped(i, h, job_ids=jobs_named))
            continue
        problems = validate(h, graph, catalog, jobs, space, tick=tick,
                            max_ttl_ticks=max_ttl_ticks)
        if problems:
            dropped.append(Dropped(i, "; ".join(problems[:4]), h.id, jobs_named,
                                   claim_text(h)))
        elif h.id in seen:
            dropped.append(Dropped(i, "duplicate of an accepted hypothesis", h.id,
                                   jobs_named, claim_text(h)))
        else:
            seen.add(h.id)
            accepted.append(h)
    return tuple(accepted), tuple(dropped)
