"""The simulated fleet read back through its engines' ``/metrics`` pages
(``koi.fleet.simulated.PageReader``, ``koi bench --telemetry pages``): what the pages carry
comes back as the simulator recorded it, arrivals included (estimated, as from a real
engine, from finished + aborted + the change in the queue gauges)."""

from __future__ import annotations

import dataclasses

import pytest

from koi.bench.runner import run_once
from koi.catalog import load_catalog
from koi.fleet.simulated import PageReader
from koi.policies import make_policy
from koi.scenario import load_scenario
from koi.sim.simulator import Simulator

CATALOG = load_catalog()


def _short(horizon_s: float = 900.0):
    return dataclasses.replace(load_scenario("hetero-3h"), horizon_s=horizon_s)


def test_pages_give_each_online_jobs_arrivals_and_completions_back() -> None:
    sim = Simulator(_short(), seed=1, catalog=CATALOG)
    policy = make_policy("edf-first-fit", catalog=CATALOG, seed=1)
    reader = PageReader(CATALOG)
    online = {j.id for j in sim.snapshot().jobs if not j.is_batch}
    totals: dict[str, list[float]] = {}
    read, telemetry = 0, []
    while not sim.done:
        sim.apply(policy.decide(sim.snapshot(), telemetry))
        records = sim.advance()
        telemetry = reader.read(sim.snapshot(), records)
        got = {t.deployment_id: t for t in telemetry}
        for r in records:
            g = got.get(r.deployment_id)
            if g is None:   # a deployment's first window is the pages' baseline
                continue
            read += 1
            assert g.requests_finished == pytest.approx(r.requests_finished, rel=1e-9)
            assert g.generation_tokens == pytest.approx(r.generation_tokens, rel=1e-9)
            assert g.num_running == pytest.approx(r.num_running_end, rel=1e-9, abs=1e-9)
            if r.job_id in online:
                acc = totals.setdefault(r.job_id, [0.0, 0.0])
                acc[0] += r.requests_arrived
                acc[1] += g.requests_arrived
    assert read > 50 and len(totals) >= 5
    for job, (recorded, from_pages) in totals.items():
        assert from_pages == pytest.approx(recorded, rel=0.01), job


def test_a_bench_run_can_read_its_telemetry_from_the_pages() -> None:
    scn = _short(600.0)
    res = run_once(scn, "koi", 1, catalog=CATALOG, telemetry_path="pages")
    assert len(res.record.timeline) == 10 and not res.policy_failures
    assert 0.0 < res.metrics.overall_score <= 100.0
    with pytest.raises(ValueError, match="telemetry path"):
        run_once(scn, "koi", 1, catalog=CATALOG, telemetry_path="prometheus")
