"""Scoped beliefs: Normal posteriors over log-space effects, and a KV-cliff position.

A ``Belief`` on (edge, scope) is a Normal posterior over θ = log(observed / predicted)
of the edge's outcome in that scope: prior N(0, τ²) (the predictor is right), each
observation r ~ N(θ, σ²/w) with known σ per outcome and w ∈ (0, 1] from the traffic
behind it. The posterior is kept in natural parameters split into prior and data parts,
so exponential forgetting (the data part's precision and precision-weighted sum decay
by γ = 2^(−1/half-life) per tick) pulls a stale belief back towards the prior and lets
it follow a world that shifts.

``ThresholdBelief`` is a grid posterior over where TPOT jumps as kv_pressure rises (or
that it does not jump at all), from the same residuals.

Pure math on frozen values; no I/O, no store logic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from koi.causal.graph import Edge
from koi.causal.scope import Scope


@dataclass(frozen=True, slots=True)
class BeliefConfig:
    """The belief model's numbers (docs/CAUSAL.md explains each)."""

    prior_sd: float = 0.5  # τ: a priori the predictor is within ×1.65 at 1σ
    noise_sd: tuple[tuple[str, float], ...] = (("ttft", 0.30), ("tpot", 0.15),
                                               ("throughput", 0.15))
    # a tick's p95 over ~100 requests is noisier than its mean; the tail factor's
    # residual is the p95's minus the mean's
    tail_noise_sd: tuple[tuple[str, float], ...] = (("ttft_p95", 0.35), ("tpot_p95", 0.20))
    half_life_ticks: float = 30.0
    full_weight_requests: float = 100.0  # a tick with this many requests counts fully
    material: float = math.log(1.15)     # |θ| to become a mechanism
    confidence: float = 0.90             # P(sign) to become a mechanism
    min_support: int = 5                 # observations to become a mechanism
    retire_material: float = math.log(1.10)  # hysteresis: retire below this |θ| ...
    retire_confidence: float = 0.80          # ... or below this P(sign)

    def noise(self, outcome: str) -> float:
        """σ of one observation's residual: a graph outcome's, or a p95's tail factor's."""
        return {**dict(self.noise_sd), **dict(self.tail_noise_sd)}[outcome]

    @property
    def decay(self) -> float:
        """γ: the per-tick factor on the data precision."""
        return 0.5 ** (1.0 / self.half_life_ticks)

    def obs_weight(self, requests: float) -> float:
        return min(max(requests / self.full_weight_requests, 0.0), 1.0)


MAX_SOURCES = 8  # enough to tell "one narrower scope" from "several"


def normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class Belief:
    """Posterior over the log effect θ on ``edge`` in ``scope``, as of tick ``as_of``.

    Posterior precision = prior_precision + data_precision, mean = (prior_sum +
    data_sum) / precision. ``prior_sum`` is the prior's precision-weighted mean: 0 (the
    predictor is right) unless a language-model hypothesis set a weak prior
    (``koi.rlm.adopt.with_priors``); it never decays and adds no support.
    ``weight`` is the decayed sum of observation weights (effective sample size);
    ``support`` the plain count of observations; ``last_confirmed`` the last tick an
    observation agreed in sign with the posterior after it.
    """

    edge: Edge
    scope: Scope
    prior_precision: float
    data_precision: float = 0.0
    data_sum: float = 0.0
    weight: float = 0.0
    support: int = 0
    first_seen: int = -1
    last_confirmed: int = -1
    as_of: int = 0
    sources: tuple[str, ...] = ()  # distinct deployment-scope keys behind it (≤ MAX_SOURCES)
    prior_sum: float = 0.0  # prior precision × prior mean; 0 = the predictor's prior

    @staticmethod
    def prior(edge: Edge, scope: Scope, config: BeliefConfig, tick: int = 0) -> Belief:
        return Belief(edge=edge, scope=scope, prior_precision=config.prior_sd ** -2, as_of=tick)

    @property
    def precision(self) -> float:
        return self.prior_precision + self.data_precision

    @property
    def mean(self) -> float:
        return (self.prior_sum + self.data_sum) / self.precision

    @property
    def seeded(self) -> bool:
        """Whether a hypothesis set its prior (a non-zero prior mean)."""
        return self.prior_sum != 0.0

    @property
    def sd(self) -> float:
        return self.precision ** -0.5

    @property
    def multiplier(self) -> float:
        return math.exp(self.mean)

    @property
    def confidence(self) -> float:
        """P(sign θ = sign of the posterior mean): how sure the direction is."""
        return normal_cdf(abs(self.mean) / self.sd)

    def decayed(self, tick: int, gamma: float) -> Belief:
        """The belief at ``tick``: its data part discounted by γ per tick since ``as_of``."""
        if tick <= self.as_of:
            return self
        f = gamma ** (tick - self.as_of)
        return replace(self, data_precision=self.data_precision * f,
                       data_sum=self.data_sum * f, weight=self.weight * f, as_of=tick)

    def observe(self, residual: float, noise_sd: float, weight: float, tick: int,
                source: str = "") -> Belief:
        """Conjugate Normal update with r ~ N(θ, noise_sd² / weight); call after decaying.

        ``source`` is the deployment scope's key: a general scope whose evidence all
        comes from one narrower scope is not a generalisation yet (see mechanisms).
        """
        return self.observe_many(((residual, noise_sd, weight, source),), tick)

    def observe_many(self, items: Iterable[tuple[float, float, float, str]],
                     tick: int) -> Belief:
        """``observe`` for each (residual, noise_sd, weight, source) in turn, built once."""
        dp, ds, wt, n, confirmed = (self.data_precision, self.data_sum, self.weight,
                                    self.support, self.last_confirmed)
        sources = set(self.sources)
        for residual, noise_sd, weight, source in items:
            prec = weight / noise_sd ** 2
            dp, ds, wt, n = dp + prec, ds + prec * residual, wt + weight, n + 1
            if source and len(sources) < MAX_SOURCES:
                sources.add(source)
            mean = (self.prior_sum + ds) / (self.prior_precision + dp)
            if mean != 0.0 and (residual > 0) == (mean > 0):
                confirmed = tick
        if n == self.support:
            return self
        return replace(self, data_precision=dp, data_sum=ds, weight=wt, support=n,
                       sources=tuple(sorted(sources)), last_confirmed=confirmed,
                       first_seen=tick if self.first_seen < 0 else self.first_seen, as_of=tick)


# --- the KV cliff ------------------------------------------------------------------------

CLIFF_GRID: tuple[float, ...] = tuple(round(0.60 + 0.05 * i, 2) for i in range(11))  # ..1.10
NO_CLIFF_PRIOR = 0.5  # prior mass on "TPOT does not jump anywhere on the grid"


def _log_marginal(n: float, s: float, q: float, sigma: float, tau: float) -> float:
    """log p(y) for y_i ~ N(μ, σ²), μ ~ N(0, τ²), from weighted n, Σy, Σy² (constants
    common to every hypothesis dropped)."""
    if n <= 1e-12:  # empty (or emptied by rounding when "below" = total − above)
        return 0.0
    s2, t2 = sigma * sigma, tau * tau
    return (-0.5 * math.log1p(n * t2 / s2)
            - (q - t2 * s * s / (s2 + n * t2)) / (2.0 * s2))


@dataclass(frozen=True, slots=True)
class ThresholdBelief:
    """Grid posterior over the kv_pressure at which TPOT jumps, in one scope.

    For each grid point c the TPOT log-residuals split into those with kv_pressure ≤ c
    and > c, each group with its own N(0, τ²) mean; "no cliff" is one group. The
    sufficient statistics (weighted n, Σr, Σr²) decay like a ``Belief``'s data.
    """

    scope: Scope
    n: float = 0.0
    s: float = 0.0
    q: float = 0.0
    n_above: tuple[float, ...] = field(default=(0.0,) * len(CLIFF_GRID))
    s_above: tuple[float, ...] = field(default=(0.0,) * len(CLIFF_GRID))
    q_above: tuple[float, ...] = field(default=(0.0,) * len(CLIFF_GRID))
    support: int = 0
    as_of: int = 0

    def decayed(self, tick: int, gamma: float) -> ThresholdBelief:
        if tick <= self.as_of:
            return self
        f = gamma ** (tick - self.as_of)
        return replace(self, n=self.n * f, s=self.s * f, q=self.q * f,
                       n_above=tuple(x * f for x in self.n_above),
                       s_above=tuple(x * f for x in self.s_above),
                       q_above=tuple(x * f for x in self.q_above), as_of=tick)

    def observe(self, kv_pressure: float, residual: float, weight: float,
                tick: int) -> ThresholdBelief:
        return self.observe_many(((kv_pressure, residual, weight),), tick)

    def observe_many(self, items: Iterable[tuple[float, float, float]],
                     tick: int) -> ThresholdBelief:
        """Add each (kv_pressure, TPOT log-residual, weight) in turn, built once."""
        n, s, q, count = self.n, self.s, self.q, self.support
        na, sa, qa = list(self.n_above), list(self.s_above), list(self.q_above)
        for kv, r, w in items:
            n, s, q, count = n + w, s + w * r, q + w * r * r, count + 1
            for i, c in enumerate(CLIFF_GRID):
                if kv > c:
                    na[i], sa[i], qa[i] = na[i] + w, sa[i] + w * r, qa[i] + w * r * r
        return replace(self, n=n, s=s, q=q, n_above=tuple(na), s_above=tuple(sa),
                       q_above=tuple(qa), support=count, as_of=tick)

    def posterior(self, noise_sd: float, prior_sd: float) -> tuple[float, ...]:
        """P(cliff at each grid point), then P(no cliff) last; sums to 1."""
        logs = []
        for na, sa, qa in zip(self.n_above, self.s_above, self.q_above, strict=True):
            below = _log_marginal(self.n - na, self.s - sa, self.q - qa, noise_sd, prior_sd)
            logs.append(below + _log_marginal(na, sa, qa, noise_sd, prior_sd)
                        + math.log((1.0 - NO_CLIFF_PRIOR) / len(CLIFF_GRID)))
        logs.append(_log_marginal(self.n, self.s, self.q, noise_sd, prior_sd)
                    + math.log(NO_CLIFF_PRIOR))
        top = max(logs)
        ps = [math.exp(x - top) for x in logs]
        total = sum(ps)
        return tuple(p / total for p in ps)

    def cliff(self, noise_sd: float, prior_sd: float) -> tuple[float, float]:
        """(posterior-mean cliff position given there is one, P(there is a cliff))."""
        post = self.posterior(noise_sd, prior_sd)
        p_cliff = 1.0 - post[-1]
        if p_cliff <= 0.0:
            return (float("nan"), 0.0)
        pos = sum(c * p for c, p in zip(CLIFF_GRID, post[:-1], strict=True)) / p_cliff
        return (pos, p_cliff)
