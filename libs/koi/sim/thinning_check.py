"""What thinning costs in accuracy: a scenario run at f = 1 and at the thinned fraction.

``thinning_error`` reports the median absolute difference of per-job SLO attainment and
throughput between the two runs, so the benchmark can state the error thinning adds.
It runs the simulator, which itself reads ``thinning`` for the fraction: this module sits
above both.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from koi.records import JobOutcome, RunRecord
from koi.scenario.types import Scenario
from koi.sim.simulator import run
from koi.sim.thinning import auto_sample_fraction


def _job_metrics(rec: RunRecord) -> dict[str, tuple[float, float, float]]:
    """Per served online job: (TTFT met share, TPOT met share, output tok/s)."""
    out = {}
    for j in rec.jobs:
        if j.kind == "online" and j.served_requests > 0:
            out[j.job_id] = (j.ttft_met_requests / j.served_requests,
                             j.tpot_met_requests / j.served_requests,
                             j.served_output_tokens / rec.horizon_s)
    return out


def _batch_tok_s(j: JobOutcome, horizon: float) -> float:
    return j.tokens_processed / horizon


def thinning_error(scenario: Scenario, policy_factory: Callable[[], Any],
                   seeds: Sequence[int] = (0,), fraction: float | None = None
                   ) -> dict[str, float]:
    """Median absolute difference between full (f = 1) and thinned runs, over online jobs
    and seeds: ``ttft_met``/``tpot_met`` in share points (0..1), ``throughput`` relative,
    plus ``batch_throughput`` (relative) and the fraction used."""
    f = fraction if fraction is not None else auto_sample_fraction(scenario)
    d_ttft, d_tpot, d_thr, d_batch = [], [], [], []
    for seed in seeds:
        full = run(scenario, policy_factory(), seed=seed, sample_fraction=1.0)
        thin = run(scenario, policy_factory(), seed=seed, sample_fraction=f)
        a, b = _job_metrics(full), _job_metrics(thin)
        for job in sorted(set(a) & set(b)):
            d_ttft.append(abs(a[job][0] - b[job][0]))
            d_tpot.append(abs(a[job][1] - b[job][1]))
            d_thr.append(abs(a[job][2] - b[job][2]) / max(a[job][2], 1e-9))
        tb = {j.job_id: j for j in thin.jobs}
        for j in full.jobs:
            if j.kind == "batch" and j.tokens_processed > 0:
                d_batch.append(abs(j.tokens_processed - tb[j.job_id].tokens_processed)
                               / j.tokens_processed)

    def med(x: list[float]) -> float:
        return statistics.median(x) if x else 0.0

    return {"fraction": f, "ttft_met": med(d_ttft), "tpot_met": med(d_tpot),
            "throughput": med(d_thr), "batch_throughput": med(d_batch),
            "jobs_compared": float(len(d_thr))}
