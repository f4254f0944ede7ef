"""Calibration: a per-outcome DRO radius from recent residuals, and robust predictions.

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
from koi.predictor.types import Prediction

FORMAT = "koi.calibrate/2"
FORMATS_READ = ("koi.calibrate/1", FORMAT)  # /1: no observation window
OUTCOMES: tuple[str, ...] = ("ttft", "ttft_p95", "tpot", "tpot_p95", "throughput")
HIGHER_BETTER = frozenset({"throughput"})


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


def widen(prediction: Prediction, radii: Mapping[str, float]) -> Prediction:
    """The worst case inside ``radii`` (log-space radius by outcome): latencies × e^r,
    throughput × e^−r, cost per token × e^r; a p95 without its own radius takes its
    mean's. The one rule for robust outcomes (the planner-api's what-if uses it too)."""
    def up(name: str, fallback: str = "") -> float:
        return math.exp(radii.get(name, radii.get(fallback, 0.0)))

    t, t95, p, p95 = up("ttft"), up("ttft_p95", "ttft"), up("tpot"), up("tpot_p95", "tpot")
    x = up("throughput")
    return replace(
        prediction, ttft_ms=prediction.ttft_ms * t, ttft_p50_ms=prediction.ttft_p50_ms * t,
        ttft_p95_ms=prediction.ttft_p95_ms * t95, tpot_ms=prediction.tpot_ms * p,
        tpot_p50_ms=prediction.tpot_p50_ms * p, tpot_p95_ms=prediction.tpot_p95_ms * p95,
        output_throughput_tok_s=prediction.output_throughput_tok_s / x,
        total_throughput_tok_s=prediction.total_throughput_tok_s / x,
        cost_per_mtok_usd=prediction.cost_per_mtok_usd * x)


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
        if rescore is not None:
            window = (*window, *observations)[-self.window:]
            res = {o: [] for o in self.outcomes}
            for obs in window:
                for o, r in rescore(obs).items():
                    if o in res and math.isfinite(r):
                        res[o].append(float(r))
        return replace(self, tick=tick, version=self.version + 1, observations=window,
                       residuals={o: tuple(v[-self.window:]) for o, v in res.items() if v},
                       hits={o: tuple(v[-self.window:]) for o, v in hits.items() if v})

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

    def robust_prediction(self, prediction: Prediction) -> Prediction:
        """``prediction`` (already belief-corrected) at its worst case inside the radii."""
        return widen(prediction, {o: self.radius(o) for o in self.outcomes})

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
                               "observations": [_obs_doc(o) for o in self.observations]}
        return zlib.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 1)

    @staticmethod
    def from_bytes(data: bytes) -> DroCalibrator:
        """Reads this format and ``koi.calibrate/1`` (which kept no observations)."""
        doc = json.loads(zlib.decompress(data))
        if doc.pop("format", None) not in FORMATS_READ:
            raise ValueError(f"not a {FORMAT} document")
        return DroCalibrator(
            coverage=doc["coverage"], window=doc["window"], prior_radius=doc["prior_radius"],
            outcomes=tuple(doc["outcomes"]), tick=doc["tick"], version=doc["version"],
            residuals={k: tuple(v) for k, v in doc["residuals"].items()},
            hits={k: tuple(v) for k, v in doc["hits"].items()},
            observations=tuple(_obs_from_doc(d) for d in doc.get("observations", ())))


_OBS_FIELDS = tuple(f.name for f in fields(OutcomeObservation))


def _obs_doc(obs: OutcomeObservation) -> dict[str, Any]:
    doc = {name: getattr(obs, name) for name in _OBS_FIELDS}
    return {**doc, "scope": obs.scope.key(), "predicted": dict(obs.predicted),
            "observed": dict(obs.observed)}


def _obs_from_doc(doc: Mapping[str, Any]) -> OutcomeObservation:
    return OutcomeObservation(**{**doc, "scope": Scope.from_key(doc["scope"])})
