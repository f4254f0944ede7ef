"""Token-length distributions for job prompts and outputs.

``LengthDist`` is a fixed length, a lognormal (canonical ``mean`` and ``sigma``; YAML may
give percentiles instead, solved by ``solve_lognormal``) or an empirical sample (e.g. a
trace's column). Samples are integers clipped to ``[min, max]``. Pure numpy; randomness
comes in as a ``numpy.random.Generator``. No YAML, file or transport code here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from koi.errors import InvalidSpecError
from koi.jobs._fields import check_bounds, meta, spec_field
from koi.jobs.bounds import MAX_BATCH_TOKENS, MAX_EMPIRICAL_VALUES, MAX_REQUEST_TOKENS

LENGTH_KINDS = ("fixed", "lognormal", "empirical")
DEFAULT_MIN_TOKENS = 1
DEFAULT_MAX_TOKENS = 131_072
MAX_TOKENS_LIMIT = MAX_REQUEST_TOKENS  # one request's tokens (koi.jobs.bounds)
_NORMAL = NormalDist()
Z99 = _NORMAL.inv_cdf(0.99)


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of token counts per request."""

    kind: str = field(metadata=meta("fixed | lognormal | empirical.", choices=LENGTH_KINDS))
    mean: float = spec_field(0.0, "Mean tokens; for lognormal, of the unclipped distribution.",
                             gt=0, le=MAX_TOKENS_LIMIT)
    sigma: float = spec_field(0.0, "Lognormal shape: standard deviation of ln(tokens).",
                              ge=0, le=5)
    min: int = spec_field(DEFAULT_MIN_TOKENS, "Smallest length a sample can take.", ge=1,
                          le=MAX_TOKENS_LIMIT)
    max: int = spec_field(DEFAULT_MAX_TOKENS, "Largest length a sample can take.",
                          ge=1, le=MAX_TOKENS_LIMIT)
    values: tuple[int, ...] = spec_field((), "Empirical samples (kind empirical).", repr=False)
    from_trace: bool = spec_field(False, "Empirical values are the job's trace column.")

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.min > self.max:
            raise InvalidSpecError("min", f"must be <= max={self.max} (got {self.min})")
        if self.kind == "fixed":
            if self.mean != int(self.mean):
                raise InvalidSpecError("mean", "a fixed length must be an integer"
                                               f" (got {self.mean})")
            if not self.min <= self.mean <= self.max:
                raise InvalidSpecError("mean", f"must lie in [min, max] = [{self.min}, {self.max}]"
                                               f" (got {self.mean:g})")
        elif self.kind == "lognormal" and self.sigma <= 0:
            raise InvalidSpecError("sigma", f"must be > 0 for a lognormal (got {self.sigma});"
                                            " use a fixed length instead")
        elif self.kind == "empirical":
            _check_values(self.values)
        if self.from_trace and self.kind != "empirical":
            raise InvalidSpecError("from_trace", "only an empirical distribution can come"
                                                 " from a trace")

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def fixed(cls, tokens: int) -> LengthDist:
        return cls("fixed", float(tokens))

    @classmethod
    def lognormal(cls, mean: float, sigma: float, *, min: int = DEFAULT_MIN_TOKENS,
                  max: int = DEFAULT_MAX_TOKENS) -> LengthDist:
        return cls("lognormal", float(mean), float(sigma), min, max)

    @classmethod
    def empirical(cls, values: np.ndarray | tuple[int, ...] | list[int], *,
                  from_trace: bool = False, min: int = DEFAULT_MIN_TOKENS,
                  max: int | None = None) -> LengthDist:
        """An empirical distribution; ``max`` defaults to cover every value given."""
        if len(values) > MAX_EMPIRICAL_VALUES:  # before copying them
            raise InvalidSpecError("values", f"at most {MAX_EMPIRICAL_VALUES} values"
                                             f" (got {len(values)})")
        vals = tuple(int(v) for v in np.asarray(values, dtype=np.int64).ravel())
        _check_values(vals)
        top = max if max is not None else _max_of(DEFAULT_MAX_TOKENS, vals)
        return cls("empirical", float(np.mean(vals)), 0.0, min, top, vals, from_trace)

    # --- statistics --------------------------------------------------------------------

    @property
    def mu(self) -> float:
        """Location of ln(tokens) for a lognormal (so that E[tokens] = mean)."""
        return math.log(self.mean) - self.sigma**2 / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths, clipped to ``[min, max]``."""
        if self.kind == "fixed":
            return np.full(n, int(self.mean), dtype=np.int64)
        if self.kind == "lognormal":
            raw = np.rint(rng.lognormal(self.mu, self.sigma, n))
        else:
            raw = rng.choice(self._array(), size=n)
        return np.clip(raw, self.min, self.max).astype(np.int64)

    def mean_value(self) -> float:
        """Expected sampled length (after clipping; rounding to integers is ignored)."""
        if self.kind == "fixed":
            return float(self.mean)
        if self.kind == "empirical":
            return float(np.clip(self._array(), self.min, self.max).mean())
        return _clipped_lognormal_mean(self.mu, self.sigma, self.min, self.max)

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (0 <= q <= 1) of the sampled length."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1] (got {q})")
        if self.kind == "fixed":
            return float(self.mean)
        if self.kind == "empirical":
            return float(np.quantile(np.clip(self._array(), self.min, self.max), q))
        if q in (0.0, 1.0):
            return float(self.min if q == 0.0 else self.max)
        value = math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(q))
        return float(min(max(value, self.min), self.max))

    def _array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)


def _check_values(values: tuple[int, ...]) -> None:
    if not values:
        raise InvalidSpecError("values", "an empirical distribution needs >= 1 value")
    if len(values) > MAX_EMPIRICAL_VALUES:
        raise InvalidSpecError("values", f"at most {MAX_EMPIRICAL_VALUES} values"
                                         f" (got {len(values)})")
    lo, hi = min(values), max(values)
    if lo < 1:
        raise InvalidSpecError("values", f"lengths must be >= 1 (got {lo})")
    if hi > MAX_TOKENS_LIMIT:
        raise InvalidSpecError("values", f"lengths must be <= {MAX_TOKENS_LIMIT} (got {hi})")


def _max_of(default: int, values: tuple[int, ...]) -> int:
    # A trace column may hold longer prompts than the default bound (Mooncake has 191k);
    # widen the bound rather than silently clipping the trace's own values.
    top = max(values)
    return top if top > default else default


def _clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ LogNormal(mu, sigma), in closed form."""
    a = (math.log(lo) - mu) / sigma
    b = (math.log(hi) - mu) / sigma
    cdf = _NORMAL.cdf
    inside = math.exp(mu + sigma**2 / 2) * (cdf(b - sigma) - cdf(a - sigma))
    return lo * cdf(a) + hi * (1.0 - cdf(b)) + inside


def solve_lognormal(*, mean: float | None = None, sigma: float | None = None,
                    p50: float | None = None, p99: float | None = None) -> tuple[float, float]:
    """Canonical (mean, sigma) from {mean, sigma}, {mean, p99}, {p50, p99} or {p50, sigma}.

    Raises ``InvalidSpecError`` naming the offending key when the pair is missing,
    over-determined or has no lognormal solution.
    """
    args = {"mean": mean, "sigma": sigma, "p50": p50, "p99": p99}
    given = {k for k, v in args.items() if v is not None}
    for key in sorted(given):
        if args[key] <= 0:  # type: ignore[operator]
            raise InvalidSpecError(key, f"must be > 0 (got {args[key]})")
    if given == {"mean", "sigma"}:
        return float(mean), float(sigma)  # type: ignore[arg-type]
    if given == {"p50", "sigma"}:
        return math.exp(math.log(p50) + sigma**2 / 2), float(sigma)  # type: ignore[arg-type, operator]
    if given == {"p50", "p99"}:
        assert p50 is not None and p99 is not None
        if p99 <= p50:
            raise InvalidSpecError("p99", f"must be > p50={p50:g} (got {p99:g})")
        s = math.log(p99 / p50) / Z99
        return math.exp(math.log(p50) + s**2 / 2), s
    if given == {"mean", "p99"}:
        assert mean is not None and p99 is not None
        return float(mean), _sigma_from_mean_p99(mean, p99)
    raise InvalidSpecError("kind", "a lognormal needs exactly one of {mean, sigma}, {mean, p99},"
                                   f" {{p50, p99}}, {{p50, sigma}} (got {sorted(given) or 'none'})")


def _sigma_from_mean_p99(mean: float, p99: float) -> float:
    # ln p99 = ln mean - s²/2 + z·s  ⇒  s = z - sqrt(z² - 2 ln(p99/mean)); the smaller
    # root is the one that shrinks to 0 as p99 → mean (the other is an absurd tail).
    if p99 <= mean:
        raise InvalidSpecError("p99", f"must be > mean={mean:g} for a lognormal (got {p99:g})")
    disc = Z99**2 - 2 * math.log(p99 / mean)
    if disc < 0:
        limit = math.exp(Z99**2 / 2)
        raise InvalidSpecError("p99", f"p99/mean = {p99 / mean:.2f} exceeds {limit:.2f}, the"
                                      " most any lognormal allows; give p50 and p99 instead")
    return Z99 - math.sqrt(disc)


def reach(dist: LengthDist) -> int:
    """The longest length ``dist`` can actually sample (an empirical list's largest value
    may sit below its clip bound)."""
    if dist.kind == "fixed":
        return int(dist.mean)
    if dist.kind == "empirical":
        return min(max(dist.values), dist.max)
    return dist.max


def check_request_tokens(input_len: LengthDist, output_len: LengthDist) -> None:
    """One request's prompt plus output must fit ``MAX_REQUEST_TOKENS``."""
    most = reach(input_len) + reach(output_len)
    if most > MAX_REQUEST_TOKENS:
        raise InvalidSpecError("output_len", f"a request may reach {most} tokens (input +"
                                             f" output); the most any model holds is"
                                             f" {MAX_REQUEST_TOKENS}: lower max")


def check_batch_tokens(num_requests: int, input_len: LengthDist,
                       output_len: LengthDist) -> None:
    """A batch job's total tokens must be processable by the largest fleet."""
    total = num_requests * (input_len.mean_value() + output_len.mean_value())
    if total > MAX_BATCH_TOKENS:
        raise InvalidSpecError("num_requests", f"the batch holds {total:.3g} tokens; the most"
                                               f" one job may hold is {MAX_BATCH_TOKENS:.0e}")
