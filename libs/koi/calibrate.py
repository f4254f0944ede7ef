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

Immutable (``update`` returns the next calibrator); no I/O; the tick is passed in.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from koi.predictor.types import Prediction

FORMAT = "koi.calibrate/1"
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
    window: int = 200            # residuals kept per outcome
    prior_radius: float = 0.5    # before there is evidence: ×1.65 either way
    outcomes: tuple[str, ...] = OUTCOMES
    tick: int = 0
    version: int = 0
    residuals: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    hits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # 1 = was covered

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

    def update(self, batch: Iterable[Mapping[str, float]], tick: int) -> DroCalibrator:
        """Add one tick's residual dicts (outcome → log residual; unknown keys ignored).

        Every residual of the tick is scored against the radius before the tick.
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
        return replace(self, tick=tick, version=self.version + 1,
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
        doc: dict[str, Any] = {"format": FORMAT, **asdict(self)}
        return zlib.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 1)

    @staticmethod
    def from_bytes(data: bytes) -> DroCalibrator:
        doc = json.loads(zlib.decompress(data))
        if doc.pop("format", None) != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        return DroCalibrator(
            coverage=doc["coverage"], window=doc["window"], prior_radius=doc["prior_radius"],
            outcomes=tuple(doc["outcomes"]), tick=doc["tick"], version=doc["version"],
            residuals={k: tuple(v) for k, v in doc["residuals"].items()},
            hits={k: tuple(v) for k, v in doc["hits"].items()})
