"""The DRO calibrator: a per-outcome radius from recent residuals, and robust predictions.

For each outcome the calibrator keeps the last ``window`` log-residuals log(observed /
corrected prediction) (after the belief store's correction, so the radius measures what
the learnt model still gets wrong). Robustness is one-sided: only a latency above its
prediction, or a throughput below it, hurts a plan, so the radius is the split-conformal
quantile of the *adverse* part a = max(r, 0) (throughput: max(−r, 0)): the ⌈(n+1)·q⌉-th
smallest of n, which bounds a new exchangeable residual's adverse part with probability
≥ q; with too few residuals for that rank it is max(prior radius, max a). The robust
prediction is the worst case inside the radius: latencies × e^r, throughput × e^−r, and
it covers an outcome when the outcome is no worse than it. Each residual is scored
against the radius *before* it joins the window, so ``realised_coverage`` is honest
out-of-sample coverage. A window of counts, not ticks: as residuals shrink the radius
shrinks within a window, and after a world shift it grows as soon as more than 1 − q of
the window is new.

Given the observations behind a tick's residuals and the model as it is *after* learning
from them (``update(..., observations=, rescore=)``), the calibrator keeps the last
``window`` observations and rebuilds every residual window from them under that model:
the radius then measures what the current model gets wrong on recent data, not what the
model of each residual's own tick got wrong. Without it, the first ticks of evidence
are counted twice — the beliefs learn a bias away while the window still holds it, and
the plan is shrunk for an error already corrected (BENCHMARKS (q)). The beliefs have
seen those observations, so the rebuilt radius is in-sample; the coverage record stays
out-of-sample (each residual is still scored before its own tick's learning).

Immutable (``update`` returns the next calibrator); no I/O; the tick is passed in.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from koi.causal.observe import OutcomeObservation
from koi.causal.scope import Scope
from koi.compress import inflate

# the documents keep the module's old name: stored states and the wire carry it
FORMAT = "koi.calibrate/2"
FORMATS_READ = ("koi.calibrate/1", FORMAT)  # /1: no observation window
OUTCOMES: tuple[str, ...] = ("ttft", "ttft_p95", "tpot", "tpot_p95", "throughput")
HIGHER_BETTER = frozenset({"throughput"})
# the SLO outcomes (p95 targets) and the observed (mean, p95) that give a tick's spread
SLO_OUTCOMES: dict[str, tuple[str, str]] = {"ttft_p95": ("ttft_ms", "ttft_p95_ms"),
                                            "tpot_p95": ("tpot_ms", "tpot_p95_ms")}
Z95 = 1.6448536269514722      # the standard normal's 95th percentile
MIN_SPREAD = 0.05             # log-σ floor: a tick whose p95 is at its mean is not exact
# a job's own SLO risk is shrunk towards the pooled one as if the pool were this many of
# its observations (``DroCalibrator.slo_risk``)
POOL_WEIGHT = 8.0


def adverse(outcome: str, residual: float) -> float:
    """How much worse than predicted a log residual log(observed / predicted) is:
    r for a latency, −r for throughput (negative = better than predicted)."""
    return -residual if outcome in HIGHER_BETTER else residual


def conformal_radius(scores: Iterable[float], coverage: float,
                     prior_radius: float) -> float:
    """The ⌈(n+1)·q⌉-th smallest of n non-negative scores, or max(prior, max score) when
    that rank exceeds n."""
    a = sorted(scores)
    n = len(a)
    k = math.ceil(round((n + 1) * coverage, 9))  # round: 20 × 0.9 must be 18, not 18.0…01
    if k > n:
        return max(prior_radius, a[-1]) if a else prior_radius
    return a[k - 1]


def tail_spread(mean: float, p95: float) -> float:
    """Log-σ of the lognormal with this mean and p95 (log(p95 / mean) = z·σ − σ²/2, the
    smaller root), floored at ``MIN_SPREAD``; NaN when either is missing. A p95 more than
    e^(z²/2) ≈ 3.9× the mean is heavier-tailed than any lognormal: σ is capped at z."""
    if not (mean > 0 and p95 > 0 and math.isfinite(mean) and math.isfinite(p95)):
        return math.nan
    ell = min(max(math.log(p95 / mean), 0.0), Z95 * Z95 / 2)
    return max(Z95 - math.sqrt(Z95 * Z95 - 2 * ell), MIN_SPREAD)


def miss_share(residual: float, spread: float, radius: float) -> float:
    """Expected share of requests over an SLO planned at ``radius`` above the corrected
    p95 prediction, for a tick whose p95 came out ``residual`` (log) above that
    prediction with log-spread ``spread``: the lognormal tail above SLO = p95_obs ·
    e^(radius − residual), i.e. 1 − Φ(z + (radius − residual) / σ)."""
    return 0.5 * math.erfc((Z95 + (radius - residual) / spread) / math.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class DroCalibrator:
    """Per-outcome residual windows, coverage records and the radius they give."""

    coverage: float = 0.9        # target share of outcomes inside the radius
    window: int = 200            # residuals kept per outcome (observations, re-scoring)
    prior_radius: float = 0.5    # before there is evidence: ×1.65 either way
    outcomes: tuple[str, ...] = OUTCOMES
    tick: int = 0
    version: int = 0
    residuals: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    hits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # 1 = was covered
    # per SLO outcome, aligned with its residuals: each tick's observed log-spread
    # (``tail_spread``; NaN when its mean was not measured). Only re-scored windows have
    # them (the observations are needed); without them SLO risk is unknown
    spreads: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # per SLO outcome, aligned with its residuals: the job each came from
    jobs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the last ``window`` observations, oldest first, when residuals are re-scored
    observations: tuple[OutcomeObservation, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 < self.coverage < 1.0:
            raise ValueError("coverage must be in (0, 1)")
        if self.window < 1:
            raise ValueError("window must be ≥ 1")

    def radius(self, outcome: str) -> float:
        """DRO radius (log space) of ``outcome`` now."""
        self._known(outcome)
        return conformal_radius((max(adverse(outcome, r), 0.0)
                                 for r in self.residuals.get(outcome, ())),
                                self.coverage, self.prior_radius)

    def radii(self) -> dict[str, float]:
        return {o: self.radius(o) for o in self.outcomes}

    def radius_at(self, outcome: str, coverage: float, job: str | None = None) -> float:
        """The radius ``outcome`` would have at another coverage target; with ``job``,
        on that job's own residuals when it has enough of them for the rank (else on
        all)."""
        own = self._own(outcome, job)
        if own:
            scores = [max(adverse(outcome, r), 0.0) for r, _ in own]
            if math.ceil(round((len(scores) + 1) * coverage, 9)) <= len(scores):
                return conformal_radius(scores, coverage, self.prior_radius)
        return replace(self, coverage=coverage).radius(outcome)

    def slo_risk(self, outcome: str, radius: float, job: str | None = None) -> float | None:
        """Expected share of requests missing ``outcome``'s SLO (a p95 target) when a
        replica is planned so that its corrected p95 prediction × e^radius meets it:
        ``miss_share`` averaged over the window (None without spreads). With ``job``,
        that job's own ticks, shrunk towards all of them: (n·own + k·pooled) / (n + k),
        k = ``POOL_WEIGHT`` (a job's traffic shapes its tail beyond its scope's)."""
        pooled = self._pairs(outcome)
        if not pooled:
            return None
        risk = sum(miss_share(r, s, radius) for r, s in pooled) / len(pooled)
        own = self._own(outcome, job)
        if own:
            mine = sum(miss_share(r, s, radius) for r, s in own)
            risk = (mine + POOL_WEIGHT * risk) / (len(own) + POOL_WEIGHT)
        return risk

    def _pairs(self, outcome: str, job: str | None = None) -> list[tuple[float, float]]:
        """(residual, spread) of ``outcome``'s window (only ``job``'s ticks if given)."""
        res, spread = self.residuals.get(outcome, ()), self.spreads.get(outcome, ())
        if len(res) != len(spread):
            return []
        jobs = self.jobs.get(outcome, ())
        if job is not None and len(jobs) != len(res):
            return []
        return [(r, s) for k, (r, s) in enumerate(zip(res, spread, strict=True))
                if math.isfinite(s) and (job is None or jobs[k] == job)]

    def _own(self, outcome: str, job: str | None) -> list[tuple[float, float]]:
        return self._pairs(outcome, job) if job is not None else []

    def update(self, batch: Iterable[Mapping[str, float]], tick: int, *,
               observations: Sequence[OutcomeObservation] = (),
               rescore: Callable[[OutcomeObservation], Mapping[str, float]] | None = None
               ) -> DroCalibrator:
        """Add one tick's residual dicts (outcome → log residual under the model the tick
        was planned with; unknown keys ignored).

        Every residual of the tick is scored against the radius before the tick. With
        ``rescore`` (the model after learning from the tick: observation → residual
        dict), ``observations`` (those behind ``batch``) join the observation window and
        every residual window is rebuilt from it under ``rescore``.
        """
        if tick < self.tick:
            raise ValueError(f"tick {tick} is before the calibrator's tick {self.tick}")
        before = self.radii()
        res = {o: list(self.residuals.get(o, ())) for o in self.outcomes}
        hits = {o: list(self.hits.get(o, ())) for o in self.outcomes}
        for item in batch:
            for o in self.outcomes:
                r = item.get(o)
                if r is None or not math.isfinite(r):
                    continue
                hits[o].append(int(adverse(o, r) <= before[o]))
                res[o].append(float(r))
        window = self.observations
        spreads: dict[str, list[float]] = {}
        jobs: dict[str, list[str]] = {}
        if rescore is not None:
            window = (*window, *observations)[-self.window:]
            res = {o: [] for o in self.outcomes}
            spreads = {o: [] for o in SLO_OUTCOMES if o in self.outcomes}
            jobs = {o: [] for o in spreads}
            for obs in window:
                for o, r in rescore(obs).items():
                    if o in res and math.isfinite(r):
                        res[o].append(float(r))
                        if o in spreads:
                            mean, p95 = SLO_OUTCOMES[o]
                            spreads[o].append(tail_spread(obs.observed.get(mean, math.nan),
                                                          obs.observed.get(p95, math.nan)))
                            jobs[o].append(obs.job_id)
        return replace(self, tick=tick, version=self.version + 1, observations=window,
                       residuals={o: tuple(v[-self.window:]) for o, v in res.items() if v},
                       hits={o: tuple(v[-self.window:]) for o, v in hits.items() if v},
                       spreads={o: tuple(v) for o, v in spreads.items() if v},
                       jobs={o: tuple(v) for o, v in jobs.items() if v})

    def realised_coverage(self, outcome: str) -> float:
        """Share of the last ``window`` residuals that fell inside the radius in force
        when they arrived (NaN before any)."""
        self._known(outcome)
        h = self.hits.get(outcome, ())
        return sum(h) / len(h) if h else float("nan")

    def robust(self, outcome: str, predicted: float) -> float:
        """Worst case inside the radius: latency × e^r, throughput × e^−r."""
        r = self.radius(outcome)
        return predicted * math.exp(-r if outcome in HIGHER_BETTER else r)

    def _known(self, outcome: str) -> None:
        if outcome not in self.outcomes:
            raise KeyError(f"unknown outcome {outcome!r}; known: {', '.join(self.outcomes)}")

    # --- serialisation ----------------------------------------------------------------

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {"format": FORMAT, "coverage": self.coverage,
                               "window": self.window, "prior_radius": self.prior_radius,
                               "outcomes": list(self.outcomes), "tick": self.tick,
                               "version": self.version,
                               "residuals": {k: list(v) for k, v in self.residuals.items()},
                               "hits": {k: list(v) for k, v in self.hits.items()},
                               "spreads": {k: [None if math.isnan(x) else x for x in v]
                                           for k, v in self.spreads.items()},
                               "jobs": {k: list(v) for k, v in self.jobs.items()},
                               "observations": [_obs_doc(o) for o in self.observations]}
        return zlib.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 1)

    @staticmethod
    def from_bytes(data: bytes) -> DroCalibrator:
        """Reads this format and ``koi.calibrate/1`` (which kept no observations)."""
        doc = json.loads(inflate(data))
        if doc.pop("format", None) not in FORMATS_READ:
            raise ValueError(f"not a {FORMAT} document")
        return DroCalibrator(
            coverage=doc["coverage"], window=doc["window"], prior_radius=doc["prior_radius"],
            outcomes=tuple(doc["outcomes"]), tick=doc["tick"], version=doc["version"],
            residuals={k: tuple(v) for k, v in doc["residuals"].items()},
            hits={k: tuple(v) for k, v in doc["hits"].items()},
            spreads={k: tuple(math.nan if x is None else x for x in v)
                     for k, v in doc.get("spreads", {}).items()},
            jobs={k: tuple(v) for k, v in doc.get("jobs", {}).items()},
            observations=tuple(_obs_from_doc(d) for d in doc.get("observations", ())))


_OBS_FIELDS = tuple(f.name for f in fields(OutcomeObservation))


def _obs_doc(obs: OutcomeObservation) -> dict[str, Any]:
    doc = {name: getattr(obs, name) for name in _OBS_FIELDS}
    return {**doc, "scope": obs.scope.key(), "predicted": dict(obs.predicted),
            "observed": dict(obs.observed),
            "curves": {k: list(v) for k, v in obs.curves.items()}}


def _obs_from_doc(doc: Mapping[str, Any]) -> OutcomeObservation:
    # a document from before pass curves has none
    curves = {k: tuple(v) for k, v in doc.get("curves", {}).items()}
    return OutcomeObservation(**{**doc, "scope": Scope.from_key(doc["scope"]),
                                 "curves": curves})
