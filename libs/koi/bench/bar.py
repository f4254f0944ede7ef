"""The issue's bar on one generated suite, computed from its ``runs.jsonl`` records.

``suite_bar(records)`` gives, for the runs of one suite: each policy's mean score and
``koi`` against it (``koi.bench.stats.compare`` on the overall score, paired by
scenario), then (a) on how many scenarios Koi scored above every non-Koi policy, (b) its
paired gain over the strongest of them (the highest mean score), (c) its score as a share
of the oracle's, (d) the share of the goodput gap that it closes, (e) its median $/token
against the strongest's, (f) each ablation against it, and (g) its wall time per run.

Koi's family is every policy whose name starts with ``koi`` (``koi-*`` are its
ablations) and the references are ``oracle*``: neither counts as "non-Koi". A figure the
records cannot give (no oracle ran, no offered goodput recorded) is None and counted as
such, never filled in. Pure: records in, numbers out; rendering is ``koi.bench.results``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koi.bench.stats import Comparison, Key, Record, compare, values_by_run

KOI = "koi"
ORACLE = "oracle"
Values = Mapping[Key, float | None]     # (scenario, seed) → a metric, None where missing


def is_baseline(policy: str) -> bool:
    """A non-Koi policy: neither Koi's family (``koi*``) nor a reference (``oracle*``)."""
    return not policy.startswith((KOI, ORACLE))


def is_ablation(policy: str) -> bool:
    return policy.startswith(f"{KOI}-")


@dataclass(frozen=True, slots=True)
class PolicyScore:
    """One policy's mean overall score over the scenarios it has a score on."""

    policy: str
    scenarios: int
    mean: float                     # nan with no scenario
    vs_koi: Comparison | None       # koi − policy; None for koi itself or without koi


@dataclass(frozen=True, slots=True)
class Count:
    """``hits`` of ``of`` scenarios (those on which every policy needed has a value)."""

    hits: int
    of: int


@dataclass(frozen=True, slots=True)
class OracleShare:
    mean_pct: float                 # mean over scenarios of 100 × Koi ÷ oracle
    scenarios: int
    oracle_at_least_koi: int
    oracle_zero: int = 0            # scenarios left out: the oracle scored 0


@dataclass(frozen=True, slots=True)
class GapClosed:
    """Per scenario (Koi − baseline) ÷ (offered − baseline) goodput, and its median."""

    median: float                   # nan with no scenario
    scenarios: int                  # scenarios with a gap to close
    no_gap: int                     # the baseline met the offered goodput: nothing to close
    not_recorded: int               # offered goodput (or a goodput) missing from the runs


@dataclass(frozen=True, slots=True)
class Medians:
    koi: float
    other: float
    scenarios: int


@dataclass(frozen=True, slots=True)
class WallTimes:
    median_s: float
    max_s: float
    runs: int


@dataclass(frozen=True, slots=True)
class Bar:
    """The bar on one suite; each figure None where no run can give it."""

    scores: tuple[PolicyScore, ...]
    baselines: tuple[str, ...]      # non-Koi policies that ran
    koi_ran: bool
    above_all: Count | None         # (a); None without koi or without a baseline
    strongest: str | None           # (b) the non-Koi policy with the highest mean score
    gain: Comparison | None         # (b) koi − strongest
    oracle: OracleShare | None      # (c); None when no ``oracle`` ran with koi
    gap: GapClosed | None           # (d) against the strongest
    cost: Medians | None            # (e) $/token, Koi's and the strongest's
    ablations: tuple[Comparison, ...]   # (f) koi − each koi-*
    koi_wall: WallTimes | None      # (g)


def suite_bar(records: Sequence[Record], *, resamples: int = 10_000) -> Bar:
    """The bar over ``records`` (one suite's runs, each (policy, scenario, seed) once)."""
    scores = values_by_run(records, "score")
    policies = list(scores)
    koi_ran = KOI in scores
    comps = ({c.policy: c for c in compare(records, "score", KOI, resamples=resamples)}
             if koi_ran and len(policies) > 1 else {})
    rows = tuple(PolicyScore(p, len(_present(scores[p])), _mean(scores[p]), comps.get(p))
                 for p in policies)
    baselines = tuple(p for p in policies if is_baseline(p))
    ranked = [r for r in rows if r.policy in baselines and r.scenarios]
    strongest = max(ranked, key=lambda r: r.mean).policy if ranked else None
    if not koi_ran:
        return Bar(rows, baselines, False, None, strongest, None, None, None, None, (),
                   None)
    koi = scores[KOI]
    return Bar(
        rows, baselines, True,
        above_all(koi, [scores[p] for p in baselines]) if baselines else None,
        strongest, comps.get(strongest) if strongest else None,
        oracle_share(koi, scores[ORACLE]) if ORACLE in scores else None,
        gap_closed(records, strongest) if strongest else None,
        cost_medians(records, strongest) if strongest else None,
        tuple(comps[p] for p in policies if is_ablation(p)),
        wall_times(records))


def above_all(koi: Values, others: Sequence[Values]) -> Count:
    """Scenarios on which Koi scored strictly above every other policy, of those on
    which Koi and all of them have a score."""
    keys = [k for k, v in koi.items()
            if v is not None and all(o.get(k) is not None for o in others)]
    hits = sum(all(koi[k] > o[k] for o in others) for k in keys)  # type: ignore[operator]
    return Count(hits, len(keys))


def oracle_share(koi: Values, oracle: Values) -> OracleShare:
    """The mean of Koi ÷ oracle over the scenarios both scored (× 100), and on how many
    of them the oracle scored at least as much as Koi."""
    pairs = [(k, o) for key, k in koi.items()
             if k is not None and (o := oracle.get(key)) is not None]
    ratios = [100.0 * k / o for k, o in pairs if o > 0]
    return OracleShare(statistics.fmean(ratios) if ratios else math.nan, len(ratios),
                       sum(o >= k for k, o in pairs if o > 0),
                       sum(o <= 0 for _, o in pairs))


def gap_closed(records: Sequence[Record], baseline: str) -> GapClosed:
    """Median over scenarios of (Koi − baseline) ÷ (offered − baseline) goodput, the
    offered goodput being the one Koi's run recorded (it is the scenario's, the same for
    every policy). A scenario whose baseline met the offer has no gap and is counted
    apart; one without a recorded offered goodput too."""
    good = values_by_run(records, "goodput_tok_s", missing_ok=True)
    base = good.get(baseline, {})
    offered = values_by_run(records, "offered_goodput_tok_s", missing_ok=True).get(KOI, {})
    shares: list[float] = []
    no_gap = not_recorded = 0
    for key, k in good.get(KOI, {}).items():
        if key not in base:
            continue
        b, o = base[key], offered.get(key)
        if k is None or b is None or o is None:
            not_recorded += 1
        elif o - b <= 0:
            no_gap += 1
        else:
            shares.append((k - b) / (o - b))
    return GapClosed(statistics.median(shares) if shares else math.nan, len(shares),
                     no_gap, not_recorded)


def cost_medians(records: Sequence[Record], other: str) -> Medians:
    """Median $/token of Koi and of ``other`` over the scenarios both served (a null,
    nothing served, leaves the scenario out)."""
    cost = values_by_run(records, "cost_per_token_usd", missing_ok=True)
    koi, oth = cost.get(KOI, {}), cost.get(other, {})
    pairs = [(k, o) for key, k in koi.items()
             if k is not None and (o := oth.get(key)) is not None]
    if not pairs:
        return Medians(math.nan, math.nan, 0)
    return Medians(statistics.median(k for k, _ in pairs),
                   statistics.median(o for _, o in pairs), len(pairs))


def wall_times(records: Sequence[Record]) -> WallTimes | None:
    """Koi's wall seconds per run (``wall_s``: set-up, planning and simulation)."""
    walls = _present(values_by_run(records, "wall_s", missing_ok=True).get(KOI, {}))
    return WallTimes(statistics.median(walls), max(walls), len(walls)) if walls else None


def _present(values: Values) -> list[float]:
    return [v for v in values.values() if v is not None]


def _mean(values: Values) -> float:
    vals = _present(values)
    return statistics.fmean(vals) if vals else math.nan


__all__ = [
    "KOI",
    "ORACLE",
    "Bar",
    "Count",
    "GapClosed",
    "Medians",
    "OracleShare",
    "PolicyScore",
    "WallTimes",
    "above_all",
    "cost_medians",
    "gap_closed",
    "is_ablation",
    "is_baseline",
    "oracle_share",
    "suite_bar",
    "wall_times",
]
