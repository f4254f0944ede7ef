"""Request arrival processes for online jobs: constant-rate Poisson, diurnal, trace replay.

``Arrival`` answers three questions: the instantaneous rate at a time, the mean rate,
and the arrival times (plus per-request lengths) in a window. Rate and diurnal arrivals
are (non-homogeneous) Poisson processes; a trace is replayed as recorded, stretched by
``time_scale`` and optionally looped. Times are seconds on the scenario clock; a trace's
first request replays at ``origin_s`` (its job's submit time). Randomness comes in as a
``numpy.random.Generator``. No YAML, no transport; the only I/O is loading a named trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from koi.errors import InvalidSpecError
from koi.jobs import bounds as B
from koi.jobs._fields import check_bounds, meta, spec_field
from koi.jobs.lengths import LengthDist
from koi.jobs.trace import Trace, load_trace, resolve_trace_path

ARRIVAL_KINDS = ("rate", "diurnal", "trace")
# Fields that belong to each kind; the others must keep their defaults.
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "rate": ("rate_rps",),
    "diurnal": ("mean_rps", "peak_to_trough", "period_s", "phase_s"),
    "trace": ("trace_path", "time_scale", "loop"),
}
RATE_WINDOW_S = 60.0  # window over which a trace's instantaneous rate is measured


@dataclass(frozen=True, slots=True)
class Arrival:
    """How an online job's requests arrive."""

    kind: str = field(metadata=meta("rate | diurnal | trace.", choices=ARRIVAL_KINDS))
    rate_rps: float = spec_field(0.0, "Constant Poisson rate, requests/s (kind rate).", gt=0,
                                 le=B.MAX_RATE_RPS)
    mean_rps: float = spec_field(0.0, "Mean rate over a period, requests/s (kind diurnal).",
                                 gt=0, le=B.MAX_RATE_RPS)
    peak_to_trough: float = spec_field(1.0, "Peak rate ÷ trough rate (kind diurnal).", ge=1,
                                       le=1000)
    period_s: float = spec_field(86400.0, "Length of one cycle, s (kind diurnal).", ge=1,
                                 le=B.MAX_HORIZON_S)
    phase_s: float = spec_field(0.0, "Time of the peak on the scenario clock, s (diurnal).",
                                ge=-B.MAX_HORIZON_S, le=B.MAX_HORIZON_S)
    trace_path: str = spec_field("", "Trace CSV in the traces directory, or 'shared:<name>'"
                                     " in the shared data directory (kind trace).")
    time_scale: float = spec_field(1.0, "Replayed time = trace time × time_scale; 0.5 replays"
                                        " twice as fast (kind trace).", ge=B.MIN_TIME_SCALE,
                                   le=B.MAX_TIME_SCALE)
    loop: bool = spec_field(True, "Start the trace over when it ends (kind trace).")
    trace: Trace | None = field(default=None, compare=False, repr=False,
                                metadata=meta("Loaded trace rows (kind trace)."))

    def __post_init__(self) -> None:
        check_bounds(self, ("kind",))
        check_bounds(self, KIND_FIELDS[self.kind])
        self._check_unused_fields()
        if self.kind == "trace" and self.trace is None:
            if not self.trace_path:
                raise InvalidSpecError("trace_path", "a trace arrival needs a trace file")
            # Frozen, so load once here: a bad file fails at construction, not mid-run.
            trace = load_trace(resolve_trace_path(self.trace_path))
            object.__setattr__(self, "trace", trace)
        if self.kind == "trace" and self.mean_rate() > B.MAX_RATE_RPS:
            raise InvalidSpecError("time_scale", f"the trace replays at {self.mean_rate():.4g}"
                                                 f" req/s; at most {B.MAX_RATE_RPS:g} req/s"
                                                 " per job: raise time_scale")

    def _check_unused_fields(self) -> None:
        # Another kind's fields would be silently ignored yet still change equality and
        # hashing (and so prediction-cache keys); refuse them instead.
        for f in fields(self):
            if f.name in ("kind", "trace") or f.name in KIND_FIELDS[self.kind]:
                continue
            if getattr(self, f.name) != f.default:
                owner = next(k for k, names in KIND_FIELDS.items() if f.name in names)
                raise InvalidSpecError(f.name, f"only applies to kind {owner}, not {self.kind}")

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def poisson(cls, rate_rps: float) -> Arrival:
        return cls("rate", rate_rps=float(rate_rps))

    @classmethod
    def diurnal(cls, mean_rps: float, peak_to_trough: float, *, period_s: float = 86400.0,
                phase_s: float = 0.0) -> Arrival:
        return cls("diurnal", mean_rps=float(mean_rps), peak_to_trough=float(peak_to_trough),
                   period_s=float(period_s), phase_s=float(phase_s))

    @classmethod
    def replay(cls, trace: Trace, *, time_scale: float = 1.0, loop: bool = True) -> Arrival:
        return cls("trace", trace_path=trace.path, time_scale=float(time_scale), loop=loop,
                   trace=trace)

    # --- rates -------------------------------------------------------------------------

    @property
    def _amplitude(self) -> float:
        # rate(t) = mean·(1 + a·cos(...)); peak/trough = (1+a)/(1-a) ⇒ a = (r-1)/(r+1).
        return (self.peak_to_trough - 1.0) / (self.peak_to_trough + 1.0)

    def rate_at(self, t_s: float, origin_s: float = 0.0) -> float:
        """Instantaneous rate (req/s) at ``t_s``; for a trace, over a 60 s window."""
        if self.kind == "rate":
            return self.rate_rps
        if self.kind == "diurnal":
            angle = 2.0 * math.pi * (t_s - self.phase_s) / self.period_s
            return self.mean_rps * (1.0 + self._amplitude * math.cos(angle))
        half = RATE_WINDOW_S / 2
        times, _ = self._replay(t_s - half, t_s + half, origin_s)
        return times.size / RATE_WINDOW_S

    def mean_rate(self) -> float:
        """Long-run mean rate (req/s); for a trace, rows ÷ span ÷ time_scale."""
        if self.kind == "rate":
            return self.rate_rps
        if self.kind == "diurnal":
            return self.mean_rps
        return self._trace.mean_rate / self.time_scale

    def peak_rate(self) -> float:
        """Highest instantaneous rate (req/s); for a trace, the busiest 60 s window."""
        if self.kind == "rate":
            return self.rate_rps
        if self.kind == "diurnal":
            return self.mean_rps * (1.0 + self._amplitude)
        ts = self._trace.ts_s * self.time_scale
        ends = np.searchsorted(ts, ts + RATE_WINDOW_S, side="left")
        return float((ends - np.arange(ts.size)).max()) / RATE_WINDOW_S

    # --- arrivals ----------------------------------------------------------------------

    def arrivals(self, rng: np.random.Generator | None, start_s: float, end_s: float,
                 origin_s: float = 0.0) -> np.ndarray:
        """Sorted arrival times in ``[start_s, end_s)``; ``rng`` may be None for a trace."""
        if end_s <= start_s:
            return np.empty(0, dtype=np.float64)
        if self.kind == "trace":
            return self._replay(start_s, end_s, origin_s)[0]
        if rng is None:
            raise ValueError(f"a {self.kind} arrival needs a numpy Generator")
        if self.kind == "rate":
            return _poisson(rng, self.rate_rps, start_s, end_s)
        return self._thinned(rng, start_s, end_s)

    def sample_requests(self, rng: np.random.Generator | None, start_s: float, end_s: float,
                        input_len: LengthDist | None = None,
                        output_len: LengthDist | None = None,
                        origin_s: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times, input lengths, output lengths) of the requests in ``[start_s, end_s)``.

        A trace supplies each row's own lengths unless a length distribution that is not
        the trace's is given; other kinds sample the given distributions.
        """
        if self.kind == "trace":
            times, idx = self._replay(start_s, end_s, origin_s) if end_s > start_s else (
                np.empty(0), np.empty(0, dtype=np.int64))
            trace = self._trace
            ins = _lengths(rng, input_len, trace.input_tokens, idx)
            outs = _lengths(rng, output_len, trace.output_tokens, idx)
            return times, ins, outs
        if rng is None or input_len is None or output_len is None:
            raise ValueError(f"a {self.kind} arrival needs a Generator and both length dists")
        times = self.arrivals(rng, start_s, end_s, origin_s)
        return times, input_len.sample(rng, times.size), output_len.sample(rng, times.size)

    @property
    def _trace(self) -> Trace:
        assert self.trace is not None, "trace arrivals load their trace at construction"
        return self.trace

    def _thinned(self, rng: np.random.Generator, start_s: float, end_s: float) -> np.ndarray:
        # Lewis–Shedler thinning: a homogeneous process at the peak rate, each point kept
        # with probability rate(t)/peak, is the non-homogeneous Poisson process rate(t).
        peak = self.peak_rate()
        cand = _poisson(rng, peak, start_s, end_s)
        angle = 2.0 * np.pi * (cand - self.phase_s) / self.period_s
        rate = self.mean_rps * (1.0 + self._amplitude * np.cos(angle))
        keep = rng.random(cand.size) * peak < rate
        return cand[keep]

    def _replay(self, start_s: float, end_s: float,
                origin_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Replayed times in the window and the trace row each one came from."""
        trace = self._trace
        rel = (trace.ts_s - trace.ts_s[0]) * self.time_scale
        lo, hi = start_s - origin_s, end_s - origin_s
        if not self.loop:
            sel = np.flatnonzero((rel >= lo) & (rel < hi))
            return origin_s + rel[sel], sel
        period = trace.loop_period_s * self.time_scale
        first = max(0, math.floor(lo / period))
        last = max(-1, math.ceil(hi / period))
        if last < first:
            return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
        # Every pass k at once, pass-major (as the passes replay): the bounded rate keeps
        # passes × rows near the window's request count, and a short trace replayed fast
        # needs many passes per tick, which a Python loop made slow.
        shifted = rel[None, :] + (np.arange(first, last + 1) * period)[:, None]
        sel = np.flatnonzero(((shifted >= lo) & (shifted < hi)).ravel())
        return origin_s + shifted.ravel()[sel], sel % rel.size


def _poisson(rng: np.random.Generator, rate: float, start_s: float, end_s: float) -> np.ndarray:
    # Given the count, Poisson arrival times are i.i.d. uniform on the window.
    n = rng.poisson(rate * (end_s - start_s))
    return np.sort(rng.uniform(start_s, end_s, n))


def _lengths(rng: np.random.Generator | None, dist: LengthDist | None, column: np.ndarray,
             idx: np.ndarray) -> np.ndarray:
    if dist is None or dist.from_trace:
        out = column[idx]
        if dist is not None:
            out = np.clip(out, dist.min, dist.max)
        return out.astype(np.int64)
    if rng is None:
        raise ValueError("sampling lengths that are not the trace's needs a numpy Generator")
    return dist.sample(rng, idx.size)
