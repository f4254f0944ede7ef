"""``koi bench report``: one current results document from the runs already made.

``load_run_files`` reads the ``runs.jsonl`` files that ``koi bench --out DIR`` and ``koi
bench suite --out DIR`` write (given as files, or directories searched for them) — the
only I/O here. ``render`` turns them into one Markdown document: where and when the runs
ran; per generated suite, each policy's mean score, Koi against each (paired by
scenario) and the issue's bar (``koi.bench.bar``), flagged when it holds held-out seeds;
per shipped scenario, the ``koi bench`` table.

Formatting only: the columns and their mean ± half-range are ``koi.bench.report``'s, the
paired statistics ``koi.bench.stats``'s, the records and the held-out rule
``koi.bench.suite``'s, the metrics what ``koi.metrics`` recorded. A value the runs did
not record is shown as missing, never filled in; nothing here runs anything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from koi.bench.bar import Bar, GapClosed, Medians, suite_bar
from koi.bench.report import COST_UNIT, churn_markdown, markdown_table, summarise_records
from koi.bench.scale import scale_markdown
from koi.bench.stats import Comparison, Record
from koi.bench.suite import HELD_OUT_FROM, REPORT, RUNS, read_records, record_key

NOT_RECORDED = "not recorded"
REQUIRED = ("scenario", "policy", "seed", "metrics")   # what makes a line a run record
SUITE_WALL = "- wall time:"
SUITE_MD_LINES = ("- machine:", SUITE_WALL)           # quoted from suite.md beside a suite


@dataclass(frozen=True, slots=True)
class RunFile:
    """One ``runs.jsonl``: its run records (a record repeated keeps its last line)."""

    path: str
    records: tuple[Record, ...]
    suite_md: tuple[str, ...] = ()  # suite.md's machine and wall-time lines, verbatim
    skipped: int = 0                # lines that are not run records, or repeat a run


@dataclass(frozen=True, slots=True)
class SuiteRuns:
    """One generated suite: one file's runs of one size (and tick cut)."""

    path: str
    size: str
    ticks: int | None
    records: tuple[Record, ...]
    suite_md: tuple[str, ...]

    @property
    def seeds(self) -> list[int]:
        return sorted({int(r["suite"]["scenario_seed"]) for r in self.records})

    @property
    def held_out(self) -> list[int]:
        return [s for s in self.seeds if s >= HELD_OUT_FROM]


# --- reading (the only I/O) --------------------------------------------------------------

def find_run_files(paths: Iterable[Path]) -> list[Path]:
    """Each path a file, or a directory searched (recursively, sorted) for ``runs.jsonl``;
    each file once. Raises ``FileNotFoundError`` for a path that does not exist."""
    found: dict[Path, Path] = {}
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such file or directory: {p}")
        for f in sorted(p.rglob(RUNS)) if p.is_dir() else [p]:
            found.setdefault(f.resolve(), f)
    return list(found.values())


def load_run_files(paths: Iterable[Path]) -> list[RunFile]:
    out = []
    for f in find_run_files(paths):
        lines = read_records(f)
        runs = {record_key(r): r for r in lines
                if isinstance(r, dict) and all(k in r for k in REQUIRED)}
        md = f.parent / REPORT
        quoted = tuple(line.strip() for line in md.read_text(encoding="utf-8").splitlines()
                       if line.startswith(SUITE_MD_LINES)) if md.is_file() else ()
        out.append(RunFile(str(f), tuple(runs.values()), quoted, len(lines) - len(runs)))
    return out


# --- grouping (pure) ---------------------------------------------------------------------

def split_runs(files: Sequence[RunFile]) -> tuple[list[SuiteRuns], dict[str, list[Record]]]:
    """Suite runs by (file, size, ticks); the other runs by scenario, a (scenario, policy,
    seed) seen in several files keeping the last one read."""
    suites: dict[tuple[str, str, int | None], list[Record]] = {}
    other: dict[tuple[str, str, int], Record] = {}
    md = {f.path: f.suite_md for f in files}
    for f in files:
        for r in f.records:
            s = r.get("suite")
            if s:
                suites.setdefault((f.path, str(s.get("size")), s.get("ticks")), []).append(r)
            else:
                other[(str(r["scenario"]), str(r["policy"]), int(r["seed"]))] = r
    by_scenario: dict[str, list[Record]] = {}
    for (scn, _, _), r in other.items():
        by_scenario.setdefault(scn, []).append(r)
    return ([SuiteRuns(p, size, ticks, tuple(recs), md[p])
             for (p, size, ticks), recs in suites.items()], by_scenario)


def stamp(record: Record) -> Record:
    """Where a run ran: its ``suite`` block, or the ``bench`` block of ``koi bench``."""
    return record.get("suite") or record.get("bench") or {}


# --- rendering (pure) --------------------------------------------------------------------

def render(files: Sequence[RunFile], *, command: str, date: str,
           shipped: Sequence[str], needs_model: Sequence[str] = (),
           ticks: Sequence[Record] = ()) -> str:
    """The whole document. ``shipped``: the shipped scenarios' names, in table order;
    ``needs_model``: the registered policies that need a language-model endpoint (those
    the runs do not hold are listed as "needs an endpoint", never given a number);
    ``ticks``: `koi bench tick --out` records (``koi.bench.scale``), the Scale section."""
    suites, scenarios = split_runs(files)
    records = [r for f in files for r in f.records]
    parts = [_header(files, records, command, date)]
    ran = {str(r["policy"]) for r in records}
    missing = [p for p in needs_model if p not in ran]
    if missing:
        parts.append("**Needs an endpoint:** " + ", ".join(f"`{p}`" for p in missing)
                     + " plan with a language model (an OpenAI-compatible server named by "
                     "`KOI_RLM_BASE_URL` and `KOI_RLM_MODEL`, docs/RLM.md). None could be "
                     "reached from the machines these runs were made on, so these rows "
                     "have no numbers.\n")
    parts.append("## Suite summary\n")
    parts += [_suite(s) for s in suites] or ["No generated-suite runs (`koi bench suite`) "
                                             "in these files.\n"]
    parts.append("## Shipped scenarios\n")
    names = [s for s in shipped if s in scenarios]
    parts += [_scenario(n, scenarios[n]) for n in names] or [
        "No `koi bench` runs of a shipped scenario in these files.\n"]
    others = [n for n in scenarios if n not in shipped]
    if others:
        parts.append("## Other scenarios\n")
        parts += [_scenario(n, scenarios[n]) for n in others]
    parts += ["## Scale\n", scale_markdown(ticks)]
    return _blocks(parts)


def _header(files: Sequence[RunFile], records: Sequence[Record], command: str,
            date: str) -> str:
    lines = ["# Koi benchmark results", "",
             f"Generated by `{command}` on {date}, from the runs below: pure formatting of "
             "their records, so a number here is whatever the run recorded. Do not edit by "
             "hand; rerun the command. How each figure is measured: docs/BENCHMARKS.md.", ""]
    if not records:
        where = ", ".join(f"`{f.path}`" for f in files) or "none found"
        return "\n".join([*lines, f"**No runs yet** (runs.jsonl files: {where}).", ""])
    skipped = sum(f.skipped for f in files)
    lines += [
        "- runs: " + "; ".join(f"`{f.path}` ({len(f.records)})" for f in files)
        + (f"; {skipped} line(s) skipped (not a run record, or a run repeated)"
           if skipped else ""),
        "- commits the runs ran at: " + _tally(records, lambda r: _short(stamp(r).get("commit"))),
        "- machines: " + _tally(records, _machine),
        "- conventions: mean ± half-range over seeds (no ± for one seed); $/token in units "
        "of 1e-4 USD; **nan** where the runs recorded no value (or null: not finite, e.g. "
        "$/token with nothing served). Δ is koi − policy on the overall score, paired by "
        "(scenario, seed), positive when Koi scored more, with a 95 % percentile-bootstrap "
        "interval; an interval that includes 0 is **no difference**. MDE is the smallest "
        "true Δ those pairs would detect with 80 % power (paired t, two-sided 5 %): a "
        "**no difference** with an MDE above the effect asked about is no evidence either "
        "way. Koi's family "
        "(`koi*`) and the references (`oracle*`) are not counted as non-Koi policies.",
        ""]
    return "\n".join(lines)


def _suite(s: SuiteRuns) -> str:
    seeds, held = s.seeds, s.held_out
    ticks = f", first {s.ticks} ticks only (smoke run)" if s.ticks is not None else ""
    title = f"### gen-{s.size}, seeds {_ranges(seeds)} ({_n(len(seeds), 'scenario')}){ticks}"
    if held:
        flag = (f"> **HELD OUT:** {len(held)} of these {len(seeds)} scenarios have seeds ≥ "
                f"{HELD_OUT_FROM} ({_ranges(held)}). Report them; no default may be chosen "
                "by looking at them.")
    else:
        flag = f"> Development seeds only (all < {HELD_OUT_FROM}); no held-out seed."
    facts = "\n".join([
        f"- runs: `{s.path}` ({len(s.records)})",
        "- commit: " + _tally(s.records, lambda r: _short(stamp(r).get("commit"))),
        "- machine: " + _tally(s.records, _machine),
        *(f"- suite.md beside it: {line[2:]}" for line in s.suite_md)])
    wall = next((f"{line[2:]} (suite.md)" for line in s.suite_md
                 if line.startswith(SUITE_WALL)), None)
    b = suite_bar(s.records)
    churn = ("Churn (`koi.churn`; totals per run, mean ± half-range over the scenarios; "
             "moves summed over them):\n\n" + churn_markdown(s.records, by_scenario=False))
    return _blocks([title, flag, facts, _scores_table(b), _bar_lines(b, wall), churn])


def _scores_table(b: Bar) -> str:
    lines = ["| policy | scenarios | mean score | Δ koi − policy | 95 % CI | MDE | Koi wins | "
             "verdict for Koi |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in b.scores:
        c = p.vs_koi
        cells = (["—"] * 5 if c is None else [_signed(c.mean_diff), _ci(c), _mde(c),
                                              _pct(c.win_rate),
                                              f"{c.verdict} ({_n(c.n, 'pair')})"])
        lines.append(f"| {p.policy} | {p.scenarios} | {_num(p.mean, '.2f')} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bar_lines(b: Bar, suite_wall: str | None) -> str:
    if not b.koi_ran:
        return "Koi (`koi`) did not run in this suite: no bar.\n"
    lines = [_line_a(b)]
    if b.strongest is None or b.gain is None:
        lines.append("- (b), (d), (e): no non-Koi policy has a score, so there is no "
                     "strongest baseline to measure against.")
    else:
        g = b.gain
        lines.append(f"- (b) strongest non-Koi policy (highest mean score): **{b.strongest}**;"
                     f" Koi's mean paired gain over it {_signed(g.mean_diff)} {_ci(g)}: "
                     f"**{g.verdict}** ({_n(g.n, 'pair')}, MDE {_mde(g)}).")
    lines.append(_line_c(b))
    if b.strongest is not None and b.gap is not None and b.cost is not None:
        lines += [_line_d(b.strongest, b.gap), _line_e(b.strongest, b.cost)]
    lines.append("- (f) ablations, koi − ablation: " + "; ".join(
        f"{c.policy} {_signed(c.mean_diff)} {_ci(c)}, {c.verdict} ({_n(c.n, 'pair')}, "
        f"MDE {_mde(c)})" for c in b.ablations) + "."
        if b.ablations else "- (f) no ablation (`koi-*`) ran.")
    w = b.koi_wall
    lines.append("- (g) Koi's wall time per run: "
                 + (NOT_RECORDED if w is None else
                    f"median {w.median_s:.0f} s, max {w.max_s:.0f} s ({_n(w.runs, 'run')})")
                 + f"; the suite's: {suite_wall or NOT_RECORDED}.")
    return "The bar:\n\n" + "\n".join(lines) + "\n"


def _line_a(b: Bar) -> str:
    if b.above_all is None:
        return "- (a) no non-Koi policy ran: nothing to be above."
    return (f"- (a) Koi scored above every non-Koi policy ({', '.join(b.baselines)}) on "
            f"**{b.above_all.hits} of {b.above_all.of}** scenarios (those on which Koi and "
            "all of them have a score).")


def _line_c(b: Bar) -> str:
    o = b.oracle
    if o is None:
        return "- (c) no `oracle` runs in this suite: Koi's share of the oracle not measured."
    if o.scenarios == 0:
        return "- (c) no scenario on which both Koi and the oracle have a positive score."
    zero = f"; {o.oracle_zero} with an oracle score of 0 left out" if o.oracle_zero else ""
    return (f"- (c) Koi's score is **{o.mean_pct:.1f} %** of the oracle's (mean of "
            f"per-scenario ratios over {_n(o.scenarios, 'scenario')}{zero}); the oracle scored "
            f"≥ Koi on {o.oracle_at_least_koi} of {o.scenarios}.")


def _line_d(strongest: str, g: GapClosed) -> str:
    if g.scenarios == 0 and g.no_gap == 0:
        why = (f"offered goodput {NOT_RECORDED} in the runs ({_n(g.not_recorded, 'scenario')})"
               if g.not_recorded else f"no scenario on which both Koi and {strongest} ran")
        return f"- (d) goodput gap closed: not measured, {why}."
    left = [f"{g.no_gap} where {strongest} already met the offer"] if g.no_gap else []
    left += [f"{g.not_recorded} without a recorded goodput"] if g.not_recorded else []
    return (f"- (d) Koi closes a median **{_pct(g.median)}** of the gap between "
            f"{strongest}'s goodput and the offered goodput (over {_n(g.scenarios, 'scenario')}"
            + (f"; left out: {', '.join(left)}" if left else "") + ").")


def _line_e(strongest: str, c: Medians) -> str:
    if c.scenarios == 0:
        return (f"- (e) $/token: no scenario on which both Koi and {strongest} served "
                "tokens.")
    ratio = c.koi / c.other if c.other else math.nan
    return (f"- (e) $/token, median over the {_n(c.scenarios, 'scenario')} both served: Koi "
            f"{c.koi / COST_UNIT:.3f} against {strongest} {c.other / COST_UNIT:.3f} "
            f"(×1e-4 $); Koi ÷ {strongest} = {_num(ratio, '.2f')}.")


def _scenario(name: str, records: Sequence[Record]) -> str:
    commits = _tally(records, lambda r: _short(stamp(r).get("commit")))
    return _blocks([f"### {name}", markdown_table(summarise_records(records)),
                    "Churn (`koi.churn`):\n\n" + churn_markdown(records),
                    f"Commit: {commits}. Machine: {_tally(records, _machine)}."])


# --- small formatting helpers ------------------------------------------------------------

def _blocks(parts: Iterable[str]) -> str:
    """Markdown blocks, one blank line between them."""
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _machine(record: Record) -> str | None:
    s = stamp(record)
    if not s.get("host"):
        return None
    return f"{s['host']}, {s['cpus']} CPUs" if s.get("cpus") else str(s["host"])


def _short(commit: object) -> str | None:
    return str(commit)[:12] if commit and commit != "unknown" else None


def _tally(records: Iterable[Record], key: Callable[[Record], str | None]) -> str:
    """``a (3 runs), b (1 run)``, a None key counted as "not recorded"."""
    counts = Counter(key(r) for r in records)
    return ", ".join(f"{k if k is not None else NOT_RECORDED} ({_n(n, 'run')})"
                     for k, n in counts.most_common())


def _ranges(seeds: Sequence[int]) -> str:
    """[0, 1, 2, 5, 1000, 1001] → ``0–2, 5, 1000–1001``."""
    spans: list[list[int]] = []
    for s in sorted(seeds):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in spans)


def _num(x: float, fmt: str) -> str:
    return "nan" if math.isnan(x) else format(x, fmt)


def _signed(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:+.2f}"


def _ci(c: Comparison) -> str:
    return f"[{_signed(c.ci_low)}, {_signed(c.ci_high)}]"


def _mde(c: Comparison) -> str:
    """The comparison's minimum detectable difference (``stats.POWER``), unsigned."""
    return "nan" if math.isnan(c.mde) else f"{c.mde:.2f}"


def _pct(frac: float) -> str:
    return "nan" if math.isnan(frac) else f"{frac * 100:.0f} %"


__all__ = [
    "RunFile",
    "SuiteRuns",
    "find_run_files",
    "load_run_files",
    "render",
    "split_runs",
    "stamp",
]
