"""``koi bench suite``: every policy on every generated scenario, resumable, in parallel.

A suite is the (scenario seed, policy) grid over generated scenarios ``gen-<size>-<seed>``
(``koi.scenario.generate``), each run with run seed = scenario seed. ``plan`` lists the
grid, ``done_keys`` reads what ``<out>/runs.jsonl`` already holds so an interrupted suite
resumes where it stopped, and ``run_suite`` runs the rest — in-process for one worker,
else in a process pool whose workers generate each scenario themselves from (seed, size),
so only ints cross the process boundary. Only the parent writes: one ``runs.jsonl`` line
per finished run (``koi.bench.report.run_json`` plus a ``suite`` block: size, scenario
seed, commit, ticks, host and CPU count), one ``failures.jsonl`` line per run that
raised, and ``suite.md`` at the end.

Seeds >= ``HELD_OUT_FROM`` are held out for evaluation: no default may be tuned on them,
so a suite reaching them says so and every record carries the git commit it ran at.
No metric or simulation logic here; statistics come from ``koi.bench.stats``.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from koi.bench.runner import run_once
from koi.bench.stats import compare, format_comparisons, metric_value

HELD_OUT_FROM = 1000        # generated seeds from here on are for evaluation only
MAX_SCENARIOS = 1000        # one suite's range, at most
MAX_ERROR_CHARS = 500       # a failure line's message is cut to this
RUNS, FAILURES, REPORT = "runs.jsonl", "failures.jsonl", "suite.md"
HELD_OUT_NOTE = (f"note: seeds >= {HELD_OUT_FROM} are HELD OUT — report them, never choose "
                 "a default by looking at them")

Key = tuple[str, str, int, int | None]   # (scenario, policy, seed, ticks)
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """One planned run: ``policy`` on ``gen-<size>-<seed>`` with run seed ``seed``."""

    seed: int
    size: str
    policy: str
    ticks: int | None = None    # only the first N ticks (a smoke run), None: the whole

    @property
    def scenario(self) -> str:
        return scenario_name(self.size, self.seed)

    @property
    def key(self) -> Key:
        return (self.scenario, self.policy, self.seed, self.ticks)


@dataclass(frozen=True, slots=True)
class SuiteConfig:
    """What ``koi bench suite`` was asked for (the CLI has validated it)."""

    first: int                  # scenario seeds first..last, inclusive
    last: int
    size: str = "medium"
    policies: tuple[str, ...] = ()
    workers: int = 2            # 1: in-process, no pool
    out: Path = Path("out/suite")
    sample_fraction: float | None = None
    ticks: int | None = None    # cut every scenario to its first N ticks (smoke runs)
    command: str = ""           # the command line, for suite.md


@dataclass(frozen=True, slots=True)
class SuiteOutcome:
    """What one ``run_suite`` call did, and the summary it wrote."""

    planned: int
    skipped: int                # already in runs.jsonl
    ran: int
    failed: int
    wall_s: float
    summary: str                # the Markdown summary (also in suite.md)


# --- planning (pure) ---------------------------------------------------------------------

def scenario_name(size: str, seed: int) -> str:
    return f"gen-{size}-{seed}"


def parse_range(text: str) -> tuple[int, int]:
    """``"A-B"`` → ``(A, B)``: integers, ``0 <= A <= B``, at most ``MAX_SCENARIOS`` seeds.
    Raises ``ValueError`` with a one-line message."""
    first, sep, last = text.strip().partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise ValueError(f"expected A-B with integers A <= B (got {text!r})") from None
    if not 0 <= a <= b:
        raise ValueError(f"expected A-B with 0 <= A <= B (got {text!r})")
    if b - a + 1 > MAX_SCENARIOS:
        raise ValueError(f"at most {MAX_SCENARIOS} scenarios per suite (got {b - a + 1})")
    return a, b


def reaches_held_out(last: int) -> bool:
    return last >= HELD_OUT_FROM


def plan(cfg: SuiteConfig) -> list[SuiteRun]:
    """Every (scenario seed, policy), scenario by scenario, policies in the given order."""
    return [SuiteRun(seed, cfg.size, p, cfg.ticks)
            for seed in range(cfg.first, cfg.last + 1) for p in cfg.policies]


def record_key(record: Mapping[str, Any]) -> Key:
    suite = record.get("suite") or {}
    return (str(record["scenario"]), str(record["policy"]), int(record["seed"]),
            suite.get("ticks"))


def pending(runs: Sequence[SuiteRun], done: set[Key]) -> list[SuiteRun]:
    return [r for r in runs if r.key not in done]


# --- files -------------------------------------------------------------------------------

def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if absent); a torn last line, left by an
    interrupted write, is skipped so the suite can resume."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def done_keys(out: Path) -> set[Key]:
    return {record_key(r) for r in read_records(out / RUNS)}


def append_line(path: Path, obj: Mapping[str, Any]) -> None:
    """One JSON object as one line, flushed, so a killed suite loses at most this run."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj) + "\n")
        fh.flush()


def git_commit() -> str:
    """``git rev-parse HEAD`` of the checkout this code runs from, or ``"unknown"``."""
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return proc.stdout.strip() or "unknown"


def machine() -> dict[str, Any]:
    """The machine runs ran on, for their records: ``{"host": name, "cpus": count}``."""
    return {"host": platform.node(), "cpus": os.cpu_count()}


# --- one run (runs in a worker) ----------------------------------------------------------

def run_one(seed: int, size: str, policy: str, sample_fraction: float | None,
            ticks: int | None, commit: str) -> dict[str, Any]:
    """Generate ``gen-<size>-<seed>``, run ``policy`` on it with run seed ``seed`` and
    return its ``runs.jsonl`` record. Takes plain values so a pool can pickle it."""
    from koi.bench.report import run_json
    from koi.catalog import load_catalog
    from koi.scenario import parse_scenario
    from koi.scenario.generate import first_ticks, generate_scenario

    cat = load_catalog()
    data = generate_scenario(seed, size, cat)
    if ticks is not None:
        data = first_ticks(data, ticks)
    scenario = parse_scenario(data, source=scenario_name(size, seed), catalog=cat)
    result = run_once(scenario, policy, seed, sample_fraction=sample_fraction, catalog=cat)
    record = run_json(result)
    record["suite"] = {"size": size, "scenario_seed": seed, "commit": commit, "ticks": ticks,
                       **machine()}
    return record


def failure_record(run: SuiteRun, exc: BaseException, commit: str) -> dict[str, Any]:
    return {"scenario": run.scenario, "policy": run.policy, "seed": run.seed,
            "error": type(exc).__name__, "message": str(exc)[:MAX_ERROR_CHARS],
            "suite": {"size": run.size, "scenario_seed": run.seed, "commit": commit,
                      "ticks": run.ticks}}


def _args(run: SuiteRun, cfg: SuiteConfig, commit: str) -> tuple[Any, ...]:
    return (run.seed, run.size, run.policy, cfg.sample_fraction, run.ticks, commit)


def _execute(todo: Sequence[SuiteRun], cfg: SuiteConfig,
             commit: str) -> Iterable[tuple[SuiteRun, dict[str, Any] | BaseException]]:
    """Each run's record or the exception it raised, in the order they finish."""
    if cfg.workers <= 1:
        for run in todo:
            try:
                yield run, run_one(*_args(run, cfg, commit))
            except Exception as exc:  # one broken run must not end the suite
                yield run, exc
        return
    # spawn, not fork: a forked child inherits the parent's threads' locks (numba, BLAS)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=ctx) as pool:
        futures: dict[Future[dict[str, Any]], SuiteRun] = {
            pool.submit(run_one, *_args(run, cfg, commit)): run for run in todo}
        for fut in as_completed(futures):
            try:
                yield futures[fut], fut.result()
            except Exception as exc:
                yield futures[fut], exc


# --- the suite ---------------------------------------------------------------------------

def run_suite(cfg: SuiteConfig, say: Say = print) -> SuiteOutcome:
    """Run what ``<out>/runs.jsonl`` lacks of the plan, then summarise and write suite.md."""
    t0 = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    runs = plan(cfg)
    todo = pending(runs, done_keys(cfg.out))
    if reaches_held_out(cfg.last):
        say(HELD_OUT_NOTE)
    say(f"suite: {len(runs)} runs planned, {len(runs) - len(todo)} already in "
        f"{cfg.out / RUNS}, {len(todo)} to run on {cfg.workers} worker(s); commit {commit}")
    failed = 0
    for n, (run, got) in enumerate(_execute(todo, cfg, commit), start=1):
        head = f"{n}/{len(todo)} {run.scenario} {run.policy}"
        if isinstance(got, BaseException):
            failed += 1
            append_line(cfg.out / FAILURES, failure_record(run, got, commit))
            say(f"{head} FAILED {type(got).__name__}: {str(got)[:200]}")
            continue
        append_line(cfg.out / RUNS, got)
        say(f"{head} score {_fmt(metric_value(got, 'score'))} wall {got['wall_s']:.1f} s")
    wall = time.perf_counter() - t0
    records = planned_records(runs, read_records(cfg.out / RUNS))
    summary = summarise(records, cfg.policies)
    say(summary)
    (cfg.out / REPORT).write_text(report_text(cfg, summary, commit, wall, len(todo)),
                                  encoding="utf-8")
    say(f"suite: {cfg.out / REPORT}; runs: {cfg.out / RUNS}"
        + (f"; {failed} failed: {cfg.out / FAILURES}" if failed else ""))
    return SuiteOutcome(len(runs), len(runs) - len(todo), len(todo) - failed, failed, wall,
                        summary)


def planned_records(runs: Sequence[SuiteRun],
                    records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of this plan (a reused ``--out`` may hold others), one per run."""
    keys = {r.key for r in runs}
    kept = {record_key(r): r for r in records if record_key(r) in keys}
    return list(kept.values())


def summarise(records: Sequence[dict[str, Any]], policies: Sequence[str]) -> str:
    """Markdown: each policy's mean score over its scenarios, and koi against each other
    policy (paired bootstrap) when koi ran."""
    lines = ["| policy | scenarios | mean score |", "|---|---:|---:|"]
    for p in policies:
        scores = [s for r in records if r["policy"] == p
                  if (s := metric_value(r, "score")) is not None]
        mean = sum(scores) / len(scores) if scores else math.nan
        lines.append(f"| {p} | {len(scores)} | {_fmt(mean)} |")
    text = "\n".join(lines) + "\n"
    if "koi" in policies and len(policies) > 1 and any(r["policy"] == "koi" for r in records):
        text += "\n" + format_comparisons(compare(records, metric="score", reference="koi"))
    return text


def report_text(cfg: SuiteConfig, summary: str, commit: str, wall_s: float,
                ran_now: int) -> str:
    held = f"\n{HELD_OUT_NOTE}\n" if reaches_held_out(cfg.last) else ""
    ticks = f", first {cfg.ticks} ticks" if cfg.ticks is not None else ""
    return (f"# Generated suite: gen-{cfg.size}-{cfg.first}..{cfg.last}{ticks}\n{held}\n"
            f"- command: `{cfg.command}`\n- commit: {commit}\n"
            f"- machine: {platform.node()}, {os.cpu_count()} CPUs, {cfg.workers} worker(s)\n"
            f"- wall time: {wall_s:.1f} s for the {ran_now} run(s) of this call (earlier "
            f"calls' runs were resumed from {RUNS})\n\n{summary}")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}"


__all__ = [
    "HELD_OUT_FROM",
    "HELD_OUT_NOTE",
    "MAX_SCENARIOS",
    "SuiteConfig",
    "SuiteOutcome",
    "SuiteRun",
    "done_keys",
    "git_commit",
    "machine",
    "parse_range",
    "pending",
    "plan",
    "run_one",
    "run_suite",
    "summarise",
]
