"""Profile one replica in the simulated world, as a team benchmarks a GPU before planning.

What Mélange and its users do with real hardware, done to the hidden world: for a
deployment configuration and a request shape (a job's mean prompt and answer lengths
and its prefix-cache share),

* **saturated throughput** — a backlog of ``BACKLOG_SEQS × max_num_seqs`` requests fed to
  one replica as fast as it takes them, the way the cluster feeds a batch job
  (``jobstate.batch_group``): output tokens/s over the run;
* **a load sweep** — Poisson arrivals at each ``LOAD_GRID`` share of the saturated request
  rate, ``POINT_REQUESTS`` timed requests a point, giving p95 TTFT and p95 TPOT; the sweep
  stops at the first point where the replica falls behind (more than ``BEHIND_SHARE`` of
  the point's requests still queued when the last one arrives);
* **the highest rate under an SLO** — the sweep is read up to its first point that misses
  the SLO; the last point before it is then *soaked* (``SOAK_REQUESTS`` timed requests,
  the replica filled to its saturated concurrency first) when it is at ``SOAK_FROM`` of
  saturation or more, and stepped down until a soak meets the SLO too. Near saturation a
  replica takes long to reach its steady batch, and a short point passes loads that an
  hour does not (gen-medium-0: p95 TPOT 20-45 % low at 80-100 % of saturation, one grid
  step too high). 0 when the lightest load misses it.

Every point's timed requests arrive mid-stream: before them come enough requests to fill
the replica to its steady state and after them as many again, so they finish under load.
How many is Little's law: the rate × the mean latency of the point below (× ``FILL_MARGIN``)
for a sweep point, the share of the sequences the saturated replica held for the first
point and for a soak. The fill travels in spread groups (as the simulator thins online
traffic), the timed requests one by one.

The replica is a nominal one: the world's step noise is on (a benchmark is noisy; the
random streams are fixed, so a profile is deterministic for a seed), but no straggler,
throttled node or slow region, which are facts of one node at run time that a profile
does not see, and clients in the replica's region. Measurements are cached per
(configuration, shape), so jobs of the same model and shape share them, and measured
lazily: a tight SLO stops the sweep early. ``runs`` counts replica runs (the cost).

Reads the world by design (it is what is being measured); never imports
``koi.predictor``. No clocks, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from koi.catalog import Catalog
from koi.jobs import JobSpec
from koi.scenario.world import WorldParams
from koi.sim.fleet import replica_spec
from koi.sim.jobstate import batch_group
from koi.sim.replica import Completion, Replica, ReplicaSpec, Req
from koi.sim.world_check import span_s
from koi.space import DeploymentConfig

LOAD_GRID: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""Sweep loads as shares of the saturated request rate. Not past it: a Poisson stream can
outrun a backlog whose KV cache thrashes (vLLM, SGLang), but that close to a replica's
limit a benchmark passes loads that a long run, or a slower node, does not sustain
(gen-medium-0: 1.4× passed a 6 s TTFT SLO at p95 0.2 s and met it for 1 % of the run's
requests)."""

POINT_REQUESTS = 120    # timed requests per sweep point
SOAK_REQUESTS = 480     # timed requests of a soak
SOAK_FROM = 0.6         # share of saturation from which a point is soaked before it counts
WARMUP = 20             # the least fill on either side of the timed requests
FILL_MARGIN = 1.5       # a sweep point's fill: its rate × this × the point below's latency
FILL_GROUPS = 25        # the fill on either side travels in about this many groups
BACKLOG_SEQS = 4        # the saturating backlog holds this many × max_num_seqs requests
BEHIND_SHARE = 0.1      # queued share of a point's requests at its last arrival: overload
P95 = 95.0
NEVER = 1e9             # run a replica until it is idle (simulated seconds)
STREAM_ARRIVALS, STREAM_NOISE, STREAM_BACKLOG, STREAM_SOAK = 1, 2, 3, 4
TIMED, FILLER = 1, 0    # ``Req.job`` of a timed request and of the fill


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What a profile is measured for: fixed prompt and answer lengths (a job's means)."""

    input_len: int
    output_len: int
    prefix_share: float = 0.0

    @classmethod
    def of(cls, job: JobSpec) -> RequestShape:
        return cls(max(1, round(job.input_len.mean_value())),
                   max(1, round(job.output_len.mean_value())),
                   float(getattr(job, "prefix_share", 0.0)))

    def label(self) -> str:
        share = f" prefix {self.prefix_share:.0%}" if self.prefix_share else ""
        return f"{self.input_len}/{self.output_len}{share}"


@dataclass(frozen=True, slots=True)
class Saturation:
    """A replica kept full: output tok/s, the request rate that is, and the p95s it saw."""

    tok_s: float
    rps: float
    ttft_p95_s: float
    tpot_p95_s: float
    running: float     # sequences it held on average (weighted)


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One measured load: the offered Poisson rate and the p95s of its timed requests."""

    rate_rps: float
    ttft_p95_s: float
    tpot_p95_s: float
    kept_up: bool      # False: the queue grew through the point (an overload)
    latency_mean_s: float   # arrival to last token, mean of the timed requests

    def meets(self, ttft_s: float, tpot_s: float) -> bool:
        return self.kept_up and self.ttft_p95_s <= ttft_s and self.tpot_p95_s <= tpot_s


def leading_run(points: Iterable[LoadPoint], ttft_s: float, tpot_s: float) -> int:
    """How many of the sweep's first points meet the SLO (it is read up to the first miss,
    so a noisy point that passes again above a failing one is not believed)."""
    n = 0
    for p in points:
        if not p.meets(ttft_s, tpot_s):
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class ReplicaProfile:
    """A configuration's whole sweep for one shape (up to the first point that fell
    behind)."""

    config: DeploymentConfig
    shape: RequestShape
    saturation: Saturation
    points: tuple[LoadPoint, ...]


@dataclass
class Profiler:
    """Profiles of replicas in one world, cached per (configuration, shape)."""

    world: WorldParams
    catalog: Catalog
    seed: int = 0
    grid: tuple[float, ...] = LOAD_GRID
    requests: int = POINT_REQUESTS
    soak_requests: int = SOAK_REQUESTS
    runs: int = 0       # replica runs so far (the cost)
    _sat: dict[tuple, Saturation] = field(default_factory=dict)
    _points: dict[tuple, list[LoadPoint]] = field(default_factory=dict)
    _soaks: dict[tuple, LoadPoint] = field(default_factory=dict)

    # --- what the planners ask --------------------------------------------------------

    def saturation(self, cfg: DeploymentConfig, shape: RequestShape) -> Saturation:
        key = _key(cfg, shape)
        if key not in self._sat:
            self._sat[key] = self._saturate(cfg, shape)
        return self._sat[key]

    def max_rate_under_slo(self, cfg: DeploymentConfig, shape: RequestShape, ttft_s: float,
                           tpot_s: float) -> tuple[float, LoadPoint | None]:
        """(highest rate meeting the SLO, the measurement that says so), measuring the
        sweep only as far as the SLO needs; ``(0, None)`` when the first point misses.
        See the module docstring for the soak."""
        k = leading_run(self._sweep(cfg, shape), ttft_s, tpot_s) - 1
        while k >= 0:
            point = self._points[_key(cfg, shape)][k]
            if self.grid[k] >= SOAK_FROM:
                point = self._soak(cfg, shape, k)
            if point.meets(ttft_s, tpot_s):
                return point.rate_rps, point
            k -= 1
        return 0.0, None

    def profile(self, cfg: DeploymentConfig, shape: RequestShape) -> ReplicaProfile:
        """The whole sweep: up to the first point that fell behind, or the grid's end."""
        points = []
        for p in self._sweep(cfg, shape):
            points.append(p)
            if not p.kept_up:
                break
        return ReplicaProfile(_base(cfg), shape, self.saturation(cfg, shape), tuple(points))

    # --- measuring ----------------------------------------------------------------------

    def _sweep(self, cfg: DeploymentConfig, shape: RequestShape) -> Iterator[LoadPoint]:
        """The sweep's points in order, each measured the first time it is asked for."""
        key = _key(cfg, shape)
        done = self._points.setdefault(key, [])
        sat = self.saturation(cfg, shape)
        if sat.rps <= 0:
            return
        for k, share in enumerate(self.grid):
            if k == len(done):
                held = (share * sat.running if not done
                        else FILL_MARGIN * share * sat.rps * done[-1].latency_mean_s)
                done.append(self._poisson(cfg, shape, share, held, self.requests,
                                          [self.seed, STREAM_ARRIVALS, k]))
            yield done[k]

    def _soak(self, cfg: DeploymentConfig, shape: RequestShape, k: int) -> LoadPoint:
        key = (*_key(cfg, shape), k)
        if key not in self._soaks:
            share = self.grid[k]
            held = share * self.saturation(cfg, shape).running
            self._soaks[key] = self._poisson(cfg, shape, share, held, self.soak_requests,
                                             [self.seed, STREAM_SOAK, k])
        return self._soaks[key]

    def _spec(self, cfg: DeploymentConfig, shape: RequestShape) -> ReplicaSpec:
        return replica_spec(cfg, self.catalog, self.world, prefix_share=shape.prefix_share)

    def _saturate(self, cfg: DeploymentConfig, shape: RequestShape) -> Saturation:
        self.runs += 1
        spec = self._spec(cfg, shape)
        rep = Replica(spec, np.random.default_rng([self.seed, STREAM_BACKLOG]), 0.0)
        inp, out = shape.input_len, shape.output_len
        left = [float(BACKLOG_SEQS * spec.max_seqs)]
        group = batch_group(spec, inp, out)

        def feed(r: Replica) -> None:
            while r.w_wait < r.s.max_seqs and left[0] > 0:
                w = min(group, left[0])
                left[0] -= w
                r.enqueue(Req(0, r.now, inp, out, w, 0.0))

        rep.feeder = feed
        rep.run_until(NEVER)
        stats = rep.take_stats()
        if not stats.done:  # nothing finished: the replica cannot serve this shape
            return Saturation(0.0, 0.0, math.inf, math.inf, 0.0)
        span = span_s(stats.done)  # not stats.span: that counts the idle end too
        tok_s = sum(c.w * c.out for c in stats.done) / span
        ttft, tpot = _p95s(stats.done)
        return Saturation(tok_s, tok_s / out, ttft, tpot, stats.busy_run / span)

    def _poisson(self, cfg: DeploymentConfig, shape: RequestShape, share: float, held: float,
                 timed: int, stream: list[int]) -> LoadPoint:
        """Poisson arrivals at ``share`` of the saturated rate: ``timed`` requests between
        two fills of ``held`` requests (the same random stream for every configuration, so
        they are compared on the same requests)."""
        self.runs += 1
        rate = share * self.saturation(cfg, shape).rps
        fill = max(WARMUP, math.ceil(held))
        n = 2 * fill + timed
        rep = Replica(self._spec(cfg, shape),
                      np.random.default_rng([self.seed, STREAM_NOISE, *stream[1:]]), 0.0)
        arrivals = np.cumsum(np.random.default_rng(stream).exponential(1.0 / rate, n)).tolist()
        net = self.world.same_region_latency_ms / 1e3
        per = max(1, fill // FILL_GROUPS)
        groups = [*_chunks(0, fill, per), *_chunks(fill, fill + timed, 1),
                  *_chunks(fill + timed, n, per)]
        for lo, hi in groups:
            rep.add_arrival(_arrival(arrivals[lo:hi], shape, net, timed=fill <= lo < fill + timed))
        rep.run_until(arrivals[-1])
        kept_up = rep.w_wait <= BEHIND_SHARE * n
        rep.run_until(NEVER)
        done = [c for c in rep.take_stats().done if c.job == TIMED]
        if not done:
            return LoadPoint(rate, math.inf, math.inf, False, math.inf)
        ttft, tpot = _p95s(done)
        latency = sum(c.ttft + (c.out - 1) * c.tpot for c in done) / len(done)
        return LoadPoint(rate, ttft, tpot, kept_up, latency)


def _chunks(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, hi)) for i in range(lo, hi, size)]


def _arrival(times: list[float], shape: RequestShape, net: float, timed: bool) -> Req:
    """A timed request, or a fill group whose members arrive at ``times`` (as the simulator
    thins online traffic: prompts released member by member)."""
    r = Req(TIMED if timed else FILLER, times[0], shape.input_len, shape.output_len,
            float(len(times)), net)
    if len(times) > 1:
        r.members([shape.input_len] * len(times))
        r.spread([t - times[0] for t in times])
    return r


def _base(cfg: DeploymentConfig) -> DeploymentConfig:
    return cfg.with_(offering="", replicas=1)


def _key(cfg: DeploymentConfig, shape: RequestShape) -> tuple:
    return (_base(cfg), shape)


def _p95s(done: list[Completion]) -> tuple[float, float]:
    return (float(np.percentile([c.ttft for c in done], P95)),
            float(np.percentile([c.tpot for c in done], P95)))
