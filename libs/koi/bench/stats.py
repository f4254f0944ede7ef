"""Paired statistics for benchmark comparisons: is the reference policy really better?

Runs of two policies on the same (scenario, seed) see the same jobs and the same world
(the simulator draws them from streams seeded by the seed alone), so the difference of a
metric between them is a *paired* difference: most of the scenario's noise cancels.
``paired_differences`` forms reference − policy over the pairs both policies ran;
``bootstrap_ci`` gives a percentile-bootstrap interval of the mean difference;
``compare`` turns each policy's pairs into a ``Comparison`` (mean difference, interval,
win rate and a verdict), pooled or per scenario; ``format_comparisons`` renders them as
Markdown. A claim whose interval includes 0 is reported as "no difference". Beside each
interval stands the comparison's power: ``min_detectable_difference``, the smallest true
mean difference these pairs would find (two-sided, at the interval's confidence) with
probability ``POWER``. A "no difference" with an MDE of 3 points says nothing about a
1-point effect; one with an MDE of 0.5 does.

Records are the per-run objects of ``runs.jsonl`` (``koi.bench.report.run_json``):
``scenario``, ``policy``, ``seed`` at the top and the metrics under ``metrics``, with
non-finite numbers written as ``null``. Pure: numpy only, no files, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Record = Mapping[str, Any]
Key = tuple[str, int]                  # (scenario, seed)

ALL_SCENARIOS = "all"                  # ``Comparison.scenario`` when scenarios are pooled
METRIC_ALIASES: dict[str, str] = {"score": "overall_score"}
LOWER_IS_BETTER: frozenset[str] = frozenset(
    {"cost_per_token_usd", "spend_usd", "wall_s", "refused_actions"})
VERDICTS = ("better", "worse", "no difference")
POWER = 0.8                            # the power the minimum detectable difference is for
_CHUNK = 2_000_000                     # resampled values held at once by ``bootstrap_ci``


@dataclass(frozen=True, slots=True)
class PairedDiffs:
    """reference − policy on one metric, over the (scenario, seed) pairs both have run.

    Pairs missing on either side, or with a value that is null or not finite (``$/token``
    with nothing served), are dropped and counted, never imputed.
    """

    policy: str
    reference: str
    metric: str
    keys: tuple[Key, ...]       # (scenario, seed) of each kept pair, sorted
    diffs: tuple[float, ...]    # reference − policy, in ``keys`` order
    only_reference: int = 0     # (scenario, seed) the reference ran and the policy did not
    only_policy: int = 0        # (scenario, seed) the policy ran and the reference did not
    not_finite: int = 0         # pairs both ran, dropped for a null/inf/nan value

    @property
    def dropped(self) -> int:
        """Every (scenario, seed) seen for either side that did not make a pair."""
        return self.only_reference + self.only_policy + self.not_finite


@dataclass(frozen=True, slots=True)
class Comparison:
    """The reference against one policy, on one metric, over ``n`` paired runs.

    ``mean_diff`` is the mean of reference − policy (positive: the reference scored more);
    ``ci_low``/``ci_high`` bound it with a percentile bootstrap at ``confidence``;
    ``win_rate`` is the fraction of pairs in which the reference did better (a tie counts
    one half), "better" following ``higher_is_better``. ``verdict`` is "no difference"
    when the interval includes 0, else "better" or "worse" for the reference. With no
    pairs the figures are nan and the verdict "no difference": there is nothing to claim.
    """

    scenario: str               # ``ALL_SCENARIOS`` when pooled over scenarios
    policy: str
    reference: str
    metric: str
    n: int                      # pairs used
    mean_diff: float
    ci_low: float
    ci_high: float
    win_rate: float             # 0..1, of the reference
    verdict: str                # one of ``VERDICTS``
    confidence: float
    higher_is_better: bool
    dropped: int = 0            # ``PairedDiffs.dropped``
    mde: float = math.nan       # ``min_detectable_difference`` of these pairs (nan: n < 2)


# --- pairing -----------------------------------------------------------------------------

def metric_value(record: Record, metric: str) -> float | None:
    """``metric`` of one run: a top-level number or one under ``metrics`` (dots go deeper,
    ``score_terms.batch_progress``); ``score`` means ``overall_score``. None for a null or
    non-finite value; ``KeyError`` for a metric the record does not have (a typo must not
    silently drop every pair)."""
    key = METRIC_ALIASES.get(metric, metric)
    if key in record and key != "metrics":
        value = record[key]
    else:
        value = record["metrics"]
        for part in key.split("."):
            value = value[part]
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def values_by_run(records: Iterable[Record], metric: str, *,
                  missing_ok: bool = False) -> dict[str, dict[Key, float | None]]:
    """policy → (scenario, seed) → ``metric_value``; a run recorded twice is an error.
    ``missing_ok``: a record without the metric (an older run) gives None, not KeyError."""
    table: dict[str, dict[Key, float | None]] = {}
    for r in records:
        runs = table.setdefault(str(r["policy"]), {})
        key = (str(r["scenario"]), int(r["seed"]))
        if key in runs:
            raise ValueError(f"run recorded twice: {r['policy']} on {key[0]} seed {key[1]}")
        try:
            runs[key] = metric_value(r, metric)
        except KeyError:
            if not missing_ok:
                raise
            runs[key] = None
    return table


def _pair(ref: Mapping[Key, float | None], pol: Mapping[Key, float | None], policy: str,
          reference: str, metric: str) -> PairedDiffs:
    both = sorted(ref.keys() & pol.keys())
    kept: list[tuple[Key, float]] = []
    for k in both:
        a, b = ref[k], pol[k]
        if a is not None and b is not None:
            kept.append((k, a - b))
    return PairedDiffs(policy, reference, metric, tuple(k for k, _ in kept),
                       tuple(d for _, d in kept), only_reference=len(ref.keys() - pol.keys()),
                       only_policy=len(pol.keys() - ref.keys()),
                       not_finite=len(both) - len(kept))


def paired_differences(records: Iterable[Record], metric: str = "score",
                       reference: str = "koi") -> dict[str, PairedDiffs]:
    """For each policy other than ``reference`` (first-seen order), reference − policy.

    Raises ``ValueError`` if the reference has no runs or a run appears twice.
    """
    table = values_by_run(records, metric)
    if reference not in table:
        raise ValueError(f"no runs of the reference policy {reference!r}")
    ref = table[reference]
    return {p: _pair(ref, runs, p, reference, metric)
            for p, runs in table.items() if p != reference}


# --- the interval ------------------------------------------------------------------------

def _mean(d: np.ndarray) -> float:
    """The sample mean, exactly the value for a constant sample (no rounding drift)."""
    if d.size and np.all(d == d[0]):
        return float(d[0])
    return math.fsum(d.tolist()) / d.size


def bootstrap_ci(diffs: Sequence[float] | np.ndarray, confidence: float = 0.95,
                 resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``diffs`` at ``confidence``.

    Draws ``resamples`` samples with replacement from a generator seeded by ``seed`` (the
    same inputs give the same interval) and takes the central ``confidence`` quantiles of
    their means. The resampling is done on the centred data and the mean added back, so
    rounding cannot push the sample mean out of the interval. One element, or all equal:
    ``(d, d)``. Raises ``ValueError`` for no element or a non-finite one.
    """
    d = np.asarray(diffs, dtype=float).ravel()
    if d.size == 0:
        raise ValueError("bootstrap_ci needs at least one difference")
    if not np.all(np.isfinite(d)):
        raise ValueError("bootstrap_ci needs finite differences")
    if not 0.0 < confidence < 1.0 or resamples < 1:
        raise ValueError(f"need 0 < confidence < 1 and resamples ≥ 1 "
                         f"(got {confidence}, {resamples})")
    mean = _mean(d)
    if np.all(d == d[0]):
        return mean, mean
    centred = d - mean
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK // d.size)
    means = np.concatenate([
        centred[rng.integers(0, d.size, size=(min(rows, resamples - i), d.size))].mean(axis=1)
        for i in range(0, resamples, rows)])
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    # centred quantiles straddle 0, and float addition is monotone, so mean + lo ≤ mean
    return mean + float(lo), mean + float(hi)


def min_detectable_difference(diffs: Sequence[float] | np.ndarray,
                              confidence: float = 0.95, power: float = POWER) -> float:
    """The smallest true mean of paired differences a two-sided test at ``confidence``
    finds with probability ``power``, given the spread of ``diffs``:
    (t₍₁₋α/2₎ + t₍power₎) · sd / √n with n − 1 degrees of freedom (the paired t-test's
    power, which the bootstrap interval follows for these sample sizes). nan for fewer
    than two differences; 0 when they are all equal."""
    from scipy.stats import t as student_t  # scipy is a dependency (HiGHS); import late

    d = np.asarray(diffs, dtype=float).ravel()
    if d.size < 2:
        return math.nan
    if not 0.0 < confidence < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"need 0 < confidence, power < 1 (got {confidence}, {power})")
    sd = float(np.std(d, ddof=1))
    dof = d.size - 1
    z = float(student_t.ppf(1.0 - (1.0 - confidence) / 2.0, dof) + student_t.ppf(power, dof))
    return z * sd / math.sqrt(d.size)


def pairs_for_mde(sd: float, target: float, confidence: float = 0.95,
                  power: float = POWER, most: int = 100_000) -> int | None:
    """How many pairs with paired differences of spread ``sd`` make the minimum
    detectable difference ``target`` or less (None: more than ``most``). Planning, not
    testing: ``sd`` is an estimate from pilot runs, so the answer is too."""
    from scipy.stats import t as student_t

    if target <= 0.0 or not math.isfinite(sd) or sd < 0.0:
        raise ValueError(f"need target > 0 and a finite sd ≥ 0 (got {target}, {sd})")
    lo, hi = 2, 2
    def mde(n: int) -> float:
        dof = n - 1
        z = student_t.ppf(1.0 - (1.0 - confidence) / 2.0, dof) + student_t.ppf(power, dof)
        return float(z) * sd / math.sqrt(n)
    while mde(hi) > target:  # the MDE falls with n: double, then bisect
        if hi >= most:
            return None
        lo, hi = hi, min(2 * hi, most)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if mde(mid) > target else (lo, mid)
    return hi


# --- comparisons -------------------------------------------------------------------------

def _win_rate(d: np.ndarray, higher_is_better: bool) -> float:
    wins = np.sum(d > 0) if higher_is_better else np.sum(d < 0)
    return float(wins + 0.5 * np.sum(d == 0)) / d.size


def _verdict(low: float, high: float, mean: float, higher_is_better: bool) -> str:
    if low <= 0.0 <= high:
        return "no difference"
    return "better" if (mean > 0) == higher_is_better else "worse"


def _comparison(p: PairedDiffs, scenario: str, higher_is_better: bool, confidence: float,
                resamples: int, seed: int) -> Comparison:
    d = np.asarray(p.diffs, dtype=float)
    head = (scenario, p.policy, p.reference, p.metric, d.size)
    tail = (confidence, higher_is_better, p.dropped)
    if d.size == 0:
        return Comparison(*head, math.nan, math.nan, math.nan, math.nan, "no difference",
                          *tail)
    low, high = bootstrap_ci(d, confidence, resamples, seed)
    mean = _mean(d)
    return Comparison(*head, mean, low, high, _win_rate(d, higher_is_better),
                      _verdict(low, high, mean, higher_is_better), *tail,
                      mde=min_detectable_difference(d, confidence))


def compare(records: Iterable[Record], metric: str = "score", reference: str = "koi", *,
            by_scenario: bool = False, higher_is_better: bool | None = None,
            confidence: float = 0.95, resamples: int = 10_000,
            seed: int = 0) -> list[Comparison]:
    """The reference against every other policy, pooled or one row per scenario.

    ``higher_is_better=None`` takes the metric's direction: lower for the names in
    ``LOWER_IS_BETTER`` (``$/token``, spend, wall time, refused actions), higher otherwise.
    With ``by_scenario`` the rows come scenario by scenario (first-seen order); scenarios
    without a reference run are skipped.
    """
    recs = list(records)
    hib = (METRIC_ALIASES.get(metric, metric) not in LOWER_IS_BETTER
           if higher_is_better is None else higher_is_better)
    groups = group_by_scenario(recs) if by_scenario else {ALL_SCENARIOS: recs}
    out: list[Comparison] = []
    for scenario, group in groups.items():
        if by_scenario and not any(r["policy"] == reference for r in group):
            continue
        for p in paired_differences(group, metric, reference).values():
            out.append(_comparison(p, scenario, hib, confidence, resamples, seed))
    return out


def group_by_scenario(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records split by ``scenario``, in first-seen order."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(str(r["scenario"]), []).append(r)
    return groups


@dataclass(frozen=True, slots=True)
class Power:
    """What a comparison's pairs can see: their spread, today's MDE, and the pairs a
    target MDE would take at that spread."""

    policy: str
    n: int
    mean_diff: float
    sd: float                   # of the paired differences (nan: n < 2)
    mde: float                  # with these n pairs
    target: float
    pairs_needed: int | None    # for ``mde <= target`` (None: beyond reach, or n < 2)


def power_table(records: Iterable[Record], target: float = 1.0, metric: str = "score",
                reference: str = "koi", confidence: float = 0.95) -> list[Power]:
    """One ``Power`` per policy paired with the reference, pooled over scenarios."""
    out = []
    for name, p in sorted(paired_differences(records, metric, reference).items()):
        d = np.asarray(p.diffs, dtype=float)
        sd = float(np.std(d, ddof=1)) if d.size >= 2 else math.nan
        out.append(Power(name, d.size, _mean(d) if d.size else math.nan, sd,
                         min_detectable_difference(d, confidence), target,
                         pairs_for_mde(sd, target, confidence) if d.size >= 2 else None))
    return out


def format_power(rows: Sequence[Power]) -> str:
    """A Markdown table of ``power_table``."""
    if not rows:
        return ""
    t = rows[0].target
    lines = [f"| policy | pairs | mean Δ | sd of Δ | MDE now | pairs for MDE ≤ {t:g} |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        need = "—" if r.pairs_needed is None else str(r.pairs_needed)
        lines.append(f"| {r.policy} | {r.n} | {_num(r.mean_diff)} | {_num(r.sd)} | "
                     f"{_num(r.mde)} | {need} |")
    return "\n".join(lines) + "\n"


# --- rendering ---------------------------------------------------------------------------

def _num(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4g}"


def format_comparisons(comparisons: Sequence[Comparison]) -> str:
    """A Markdown table, one row per comparison; a scenario column when not pooled."""
    if not comparisons:
        return ""
    c0 = comparisons[0]
    per_scenario = any(c.scenario != ALL_SCENARIOS for c in comparisons)
    head = ["policy", "pairs", "mean Δ (ref − policy)", f"{c0.confidence * 100:g} % CI",
            f"MDE ({POWER * 100:g} % power)", "win rate", "verdict"]
    head = ["scenario", *head] if per_scenario else head
    better = "higher" if c0.higher_is_better else "lower"
    lines = [f"<!-- {c0.metric}: reference {c0.reference} against each policy over paired "
             f"(scenario, seed) runs; {better} is better; MDE: the smallest true difference these "
             f"pairs would detect; win rate counts ties as ½ -->",
             "| " + " | ".join(head) + " |",
             "|" + "---|" * (1 + per_scenario) + "---:|" * 5 + "---|"]
    for c in comparisons:
        win = "nan" if math.isnan(c.win_rate) else f"{c.win_rate * 100:.0f} %"
        cells = [c.policy, str(c.n), _num(c.mean_diff),
                 f"[{_num(c.ci_low)}, {_num(c.ci_high)}]", _num(c.mde), win, c.verdict]
        cells = [c.scenario, *cells] if per_scenario else cells
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = [
    "ALL_SCENARIOS",
    "LOWER_IS_BETTER",
    "METRIC_ALIASES",
    "POWER",
    "VERDICTS",
    "Comparison",
    "PairedDiffs",
    "Power",
    "bootstrap_ci",
    "compare",
    "format_comparisons",
    "format_power",
    "group_by_scenario",
    "metric_value",
    "min_detectable_difference",
    "paired_differences",
    "pairs_for_mde",
    "power_table",
    "values_by_run",
]
