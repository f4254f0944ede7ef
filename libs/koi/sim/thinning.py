"""Thinned simulation: how many requests to simulate, and what a burst of them does.

``auto_sample_fraction`` picks the share of online requests to simulate so a run stays
near ``TARGET_REQUESTS`` simulated requests; each kept request then carries weight 1/f.
``thinning_check.thinning_error`` measures what that costs in accuracy; ``burst_probe``
shows, on one replica, what a group of w requests does to latency (``koi bench
thinning``). No fleet logic here; no ``koi.predictor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from koi.catalog import Catalog, load_catalog
from koi.jobs import OnlineJob
from koi.jobs.lengths import LengthDist
from koi.scenario.types import Scenario
from koi.space import DeploymentConfig, kv_capacity_tokens

TARGET_REQUESTS = 200_000   # online requests per run; batch groups add ~tens of thousands
MIN_FRACTION = 0.005
# A thinned group's members arrive within this many seconds of each other at most, so a
# low-rate job on many replicas still sees its group served within about a tick.
MAX_SPREAD_S = 60.0


def member_offsets(rng: np.random.Generator, members: int, span: float) -> list[float]:
    """Arrival offsets of a thinned group's members, the first at 0 and the rest uniform
    over ``span`` (capped at ``MAX_SPREAD_S``): the Poisson stream, conditioned on its
    count, that the group stands for on the replica it was routed to.

    With systematically thinned groups (``JobState.arrivals``) and ``span`` the time to the
    replica's next group, the members tile that replica's time as its real requests
    would, instead of arriving in bursts of ``w`` (``koi bench thinning``).
    """
    rest = np.sort(rng.uniform(0.0, min(max(span, 0.0), MAX_SPREAD_S), members - 1))
    return [0.0, *rest.tolist()]


def expected_online_requests(scenario: Scenario) -> float:
    total = 0.0
    for job in scenario.jobs:
        if isinstance(job, OnlineJob):
            end = scenario.horizon_s if job.end_s is None else min(job.end_s, scenario.horizon_s)
            total += job.arrival.mean_rate() * max(end - job.submit_s, 0.0)
    return total


def auto_sample_fraction(scenario: Scenario, target: float = TARGET_REQUESTS) -> float:
    """Share of online requests to simulate: 1 when the run is small enough already."""
    n = expected_online_requests(scenario)
    if n <= target:
        return 1.0
    return max(round(target / n, 4), MIN_FRACTION)


@dataclass(frozen=True, slots=True)
class BurstRow:
    """One replica under Poisson load with arrivals thinned to groups of ``weight``."""

    weight: float
    ttft_mean_ms: float
    ttft_p95_ms: float
    tpot_mean_ms: float
    tpot_p95_ms: float


def burst_probe(config: DeploymentConfig, *, rate_rps: float, input_len: LengthDist,
                output_len: LengthDist, weights: Sequence[float] = (1.0, 6.0, 36.0),
                prefix_hit: float = 0.0, requests: int = 2000, seed: int = 0,
                spread: bool = True, catalog: Catalog | None = None) -> list[BurstRow]:
    """What thinning does to one replica: the same offered load, simulated as single
    requests (``weight`` 1) and as groups of ``weight`` requests as a thinned run
    simulates them: every w-th arrival with its members spread up to the next kept one
    (``spread``), or, with ``spread=False``, each arrival kept with probability
    1/w and its group arriving all at once (the simulator before 2026-11-30). Noise off;
    the first tenth of completions is warm-up. Weighted means; p95s over the simulated
    (unweighted) completions."""
    from koi.sim.physics import step_coef  # physics imports the world; keep this module light
    from koi.sim.replica import Replica, ReplicaSpec, Req
    from koi.sim.world import load_world

    cat = catalog or load_catalog()
    world = replace(load_world(), noise_sigma=0.0)
    engine = cat.engine(config.engine)
    cap = kv_capacity_tokens(cat.model(config.model), cat.accelerator(config.accelerator),
                             config, engine)
    rows = []
    for w in weights:
        spec = ReplicaSpec(step_coef(config, cat, world), cap, config.max_num_seqs,
                           config.max_batched_tokens, config.chunked_prefill,
                           prefix_hit=prefix_hit, reserve_full=engine.reserves_full_kv,
                           ttft_overhead=world.ttft_overhead_ms / 1e3)
        rep = Replica(spec, np.random.default_rng(seed), 0.0)
        n = max(int(requests / w), 300)
        rng = np.random.default_rng(seed + 1)
        members = round(w)
        if spread:  # every w-th arrival of the Poisson stream, its members spread out
            times = np.cumsum(rng.gamma(w, 1.0 / rate_rps, n))
        else:       # each arrival kept with probability 1/w, arriving all at once
            times = np.cumsum(rng.exponential(w / rate_rps, n))
        prompts = input_len.sample(rng, n * members).reshape(n, members)
        outs = output_len.sample(rng, n * members).reshape(n, members)
        if not spread:  # one request's lengths stand for the group
            prompts, outs = prompts[:, :1], outs[:, :1]
        spans = np.diff(times, append=times[-1] + w / rate_rps)
        for t, a, b, span in zip(times, prompts.tolist(), outs.tolist(), spans, strict=True):
            r = Req(0, float(t), round(sum(a) / len(a)), max(round(sum(b) / len(b)), 1),
                    float(w), 0.0)
            if len(a) > 1:  # as JobState.arrivals and Simulator._spread make them
                r.members(a)
                r.spread(member_offsets(rng, members, float(span)))
            rep.add_arrival(r)
        rep.run_until(float(times[-1]) + 3600.0)
        done = rep.take_stats().done[n // 10:]
        wt = np.array([c.w for c in done])
        ttft = np.array([c.ttft for c in done]) * 1e3
        dec = [c for c in done if c.out > 1]
        tpot, wd = np.array([c.tpot for c in dec]) * 1e3, np.array([c.w for c in dec])
        rows.append(BurstRow(w, float((ttft * wt).sum() / wt.sum()),
                             float(np.quantile(ttft, 0.95)),
                             float((tpot * wd).sum() / wd.sum()),
                             float(np.quantile(tpot, 0.95))))
    return rows
