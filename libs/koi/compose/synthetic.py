"""Seeded synthetic composition ticks, for timing the composer and for its tests.

``synthetic_tick(seed, jobs, candidates_per_job)`` builds a contested tick with
plausible magnitudes: offerings of a few accelerators on on-demand and spot markets,
candidates with 1–8 GPUs per replica, goodput and price that grow with the GPUs, SLO risk,
spot preemption exposure, some jobs running already (with a current candidate and churn
on the others), online and batch jobs across priorities. Randomness comes only from the
seed. No I/O.
"""

from __future__ import annotations

import numpy as np

from koi.compose.types import CandidateTable, ComposeInput, JobDemand, JobKind

# accelerator: (relative speed, $/GPU-hour on demand)
ACCELERATORS = {"l4": (0.25, 0.8), "a100-80gb": (0.6, 1.9), "h100-sxm": (1.0, 3.0),
                "h200": (1.2, 3.8)}
MARKETS = {"on_demand": (1.0, 0.0), "spot": (0.4, 0.05)}   # price factor, preemptions/h


def synthetic_tick(seed: int = 0, jobs: int = 40, candidates_per_job: int = 200,
                   regions: int = 3, **kw: object) -> ComposeInput:
    rng = np.random.default_rng(seed)
    offerings = [(f"r{r}/{acc}/{mkt}", acc, mkt) for r in range(regions)
                 for acc in ACCELERATORS for mkt in MARKETS]
    capacity = {o: int(rng.choice([0, 4, 8, 16, 32])) for o, _, _ in offerings}
    n = jobs * candidates_per_job
    pick = rng.integers(0, len(offerings), n)
    speed = np.array([ACCELERATORS[offerings[i][1]][0] for i in pick])
    price = np.array([ACCELERATORS[offerings[i][1]][1] * MARKETS[offerings[i][2]][0]
                      for i in pick])
    preempt = np.array([MARKETS[offerings[i][2]][1] for i in pick])
    gpr = rng.choice([1, 2, 4, 8], n)
    goodput = 1500.0 * speed * gpr ** 0.85 * rng.uniform(0.5, 1.5, n)
    tok_per_req = rng.uniform(150, 600, jobs)
    job_idx = np.repeat(np.arange(jobs), candidates_per_job)
    current = np.zeros(n, dtype=bool)
    placed = rng.random(jobs) < 0.5
    for j in np.flatnonzero(placed).tolist():
        current[j * candidates_per_job + int(rng.integers(candidates_per_job))] = True
    table = CandidateTable(
        job_id=np.array([f"job{j:03d}" for j in job_idx], dtype=object),
        candidate_id=np.array([f"c{i}" for i in range(n)], dtype=object),
        offering=np.array([offerings[i][0] for i in pick], dtype=object),
        gpus_per_replica=gpr.astype(np.int64), goodput_tok_s=goodput,
        usd_per_hour=price * gpr, max_rate_rps=goodput / tok_per_req[job_idx],
        slo_risk=rng.beta(1, 12, n), preemption_exposure=preempt * rng.uniform(0.5, 1.5, n),
        is_current=current, migration_cost=np.where(placed[job_idx], rng.uniform(1, 20, n), 0),
        feasible_slo=rng.random(n) < 0.85)
    demands = []
    for j in range(jobs):
        replicas_worth = rng.uniform(0.5, 6.0) * 2000.0
        common = dict(priority=int(rng.integers(0, 10)), currently_placed=bool(placed[j]),
                      value_per_tok=float(rng.uniform(2e-5, 2e-4)))
        if rng.random() < 0.7:
            demands.append(JobDemand(f"job{j:03d}", JobKind.ONLINE,
                                     demand_rate_rps=replicas_worth / tok_per_req[j],
                                     output_tok_per_request=float(tok_per_req[j]),
                                     **common))  # type: ignore[arg-type]
        else:
            demands.append(JobDemand(f"job{j:03d}", JobKind.BATCH,
                                     required_tok_s=replicas_worth,
                                     deadline_s=float(rng.uniform(600, 36000)),
                                     **common))  # type: ignore[arg-type]
    return ComposeInput(jobs=demands, candidates=table, capacity=capacity,
                        **kw)  # type: ignore[arg-type]
