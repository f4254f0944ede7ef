"""What one replica of a configuration really serves in the hidden world.

The true oracle's predictor (``koi.policies.oracle``): instead of a model of the
simulator, the simulator itself. ``WorldTruth`` runs one ``Replica`` — the same
engine model, step-time physics, KV cliff, engine drift and noise distribution the
fleet uses — on a job's own request-length distribution, on one offering (its region's
step multiplier and its client latency), with a replica's *expected* straggler and
throttling slowdown (which replica draws one is chance, as is each step's noise). It
measures:

* ``saturated_tok_s`` — output tokens/s of a replica kept full (a batch job's rate);
* ``max_rate_rps`` — the highest Poisson request rate at which the replica's p95 TTFT
  and p95 TPOT both meet the job's SLO (bisection on the rate; 0 when even a trickle
  misses it).

Each answer is cached by (configuration, job, offering class), so a run pays for a
configuration once. Deterministic: fixed random streams per measurement. Reads the
world by design (it is the world); no ``koi.predictor`` import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from koi.catalog import Catalog, Offering
from koi.jobs import JobSpec, OnlineJob
from koi.scenario.world import WorldParams
from koi.sim.fleet import replica_spec
from koi.sim.replica import Replica, Req
from koi.sim.world_check import span_s
from koi.space import DeploymentConfig

REQUESTS = 400        # requests per measured point (after WARMUP)
WARMUP = 50           # first requests of a point, not timed (the replica starts empty)
BISECT_STEPS = 7      # max rate to within (1/2)^7 of the saturated rate
P95 = 95.0


def expected_slowdown(world: WorldParams, accelerator: str) -> float:
    """A replica's expected straggler × throttling step multiplier on ``accelerator``."""
    straggle = 1.0 + world.straggler_prob * (world.straggler_slowdown - 1.0)
    throttle = 1.0 + world.throttle_share.get(accelerator, 0.0) * (world.throttle_slowdown - 1.0)
    return straggle * throttle


def client_latency_s(world: WorldParams, job: JobSpec, offering: Offering) -> float:
    """Network time added to each TTFT when ``job``'s clients use ``offering``."""
    here = f"{offering.cloud}/{offering.region}"
    remote = isinstance(job, OnlineJob) and job.client_region and job.client_region != here
    return (world.cross_region_latency_ms if remote else world.same_region_latency_ms) / 1e3


@dataclass(frozen=True, slots=True)
class Point:
    """One measured load: output tok/s, p95 TTFT and TPOT (s) of the timed requests."""

    tok_s: float
    ttft_p95_s: float
    tpot_p95_s: float


@dataclass
class WorldTruth:
    """Measured replica capacities in one world (see the module docstring)."""

    world: WorldParams
    catalog: Catalog
    requests: int = REQUESTS
    _sat: dict[tuple, float] = field(default_factory=dict)
    _rate: dict[tuple, float] = field(default_factory=dict)
    measured: int = 0   # replica runs so far (the cost)

    def _key(self, cfg: DeploymentConfig, job: JobSpec, offering: Offering) -> tuple:
        region = self.world.slow_regions.get(f"{offering.cloud}/{offering.region}", 1.0)
        net = client_latency_s(self.world, job, offering)
        return (cfg.with_(offering="", replicas=1), job.id, region, net)

    def saturated_tok_s(self, cfg: DeploymentConfig, job: JobSpec,
                        offering: Offering) -> float:
        key = self._key(cfg, job, offering)
        if key not in self._sat:
            self._sat[key] = self._point(cfg, job, offering, rate=math.inf).tok_s
        return self._sat[key]

    def max_rate_rps(self, cfg: DeploymentConfig, job: JobSpec, offering: Offering) -> float:
        """The highest request rate one replica serves within the job's p95 SLOs (a job
        without an SLO: the saturated request rate)."""
        key = self._key(cfg, job, offering)
        if key in self._rate:
            return self._rate[key]
        sat_rps = self.saturated_tok_s(cfg, job, offering) / max(job.output_len.mean_value(), 1.0)
        if not isinstance(job, OnlineJob) or sat_rps <= 0:
            self._rate[key] = sat_rps
            return sat_rps
        slo = (job.slo.ttft_ms / 1e3, job.slo.tpot_ms / 1e3)

        def meets(rate: float) -> bool:
            p = self._point(cfg, job, offering, rate)
            return p.ttft_p95_s <= slo[0] and p.tpot_p95_s <= slo[1]

        lo, hi = 0.0, sat_rps
        if meets(hi):
            lo = hi
        else:
            for _ in range(BISECT_STEPS):
                mid = 0.5 * (lo + hi)
                if meets(mid):
                    lo = mid
                else:
                    hi = mid
        self._rate[key] = lo
        return lo

    def _point(self, cfg: DeploymentConfig, job: JobSpec, offering: Offering,
               rate: float) -> Point:
        """One replica run at Poisson ``rate`` req/s (``inf``: everything queued at once)."""
        self.measured += 1
        spec = replica_spec(cfg, self.catalog, self.world, offering=offering,
                            slow=expected_slowdown(self.world, cfg.accelerator),
                            prefix_share=getattr(job, "prefix_share", 0.0))
        rng = np.random.default_rng(0)
        n = self.requests + WARMUP
        inp = job.input_len.sample(rng, n)
        out = job.output_len.sample(rng, n)
        net = client_latency_s(self.world, job, offering)
        rep = Replica(spec, np.random.default_rng(1), 0.0)
        # rate inf: everything queued at once (the saturated point)
        arrivals = np.zeros(n) if math.isinf(rate) else np.cumsum(rng.exponential(1.0 / rate, n))
        for k in range(n):
            rep.add_arrival(Req(k, float(arrivals[k]), int(inp[k]), int(out[k]), 1.0, net))
        rep.run_until(1e9)
        done = [c for c in rep.take_stats().done if c.job >= WARMUP]
        if not done:
            return Point(0.0, math.inf, math.inf)
        tok = sum(c.out for c in done) / span_s(done)
        return Point(tok, float(np.percentile([c.ttft for c in done], P95)),
                     float(np.percentile([c.tpot for c in done], P95)))
