"""Telemetry read from the engines' pages over HTTP against telemetry on the bus.

The services run hetero-3h for eight ticks with the sim serving every replica's engine
``/metrics`` page (``KOI_SIM_METRICS_PORT=0``) instead of publishing its telemetry, and
the engine-metrics service scraping them. The reference is the in-process run, which
makes exactly the decisions of the bus run with the sim's own telemetry
(``test_bus_run.py::test_bus_run_matches_in_process``; running that again here would
double this file's time).

What may differ: the pages carry what a real engine shows, so p95s come from the
engines' bucket bounds (SGLang's are coarse), the arrivals are estimated from finished +
aborted + the change in running + waiting (engines count no arrivals), and GPU-seconds
come from the snapshot. Counters, means and gauges come back exactly (see
tests/unit/test_engine_metrics_adapter.py). So the first ticks, whose telemetry no
deployment is steady enough to be learnt from, decide identically, later ones may not,
and the score stays within a point.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from koi import subjects
from koi.wire import planning
from services.runtime.busrun import BusRun
from services.runtime.security import connect_nats
from support import bus_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCENARIO = "hetero-3h"
HORIZON_S = 480.0          # eight ticks of a minute
UNLEARNT_TICKS = 4         # ticks 0-3: no deployment is steady yet (two running snapshots)


def in_process(horizon_s: float, seed: int = 1):
    return bus_runs.in_process(SCENARIO, horizon_s, seed)


def _telemetry_batches(url: str) -> dict[int, list]:
    async def go() -> dict[int, list]:
        nc = await connect_nats(url)
        sub = await nc.jetstream().subscribe(f"{subjects.TELEMETRY_PREFIX}.>",
                                             ordered_consumer=True)
        out = {}
        try:
            while True:
                msg = await sub.next_msg(timeout=1.0)
                tick, batch = planning.decode_telemetry(msg.data)
                out[tick] = batch
        except Exception:  # nats' TimeoutError: the stream is read
            pass
        await nc.close()
        return out
    return asyncio.run(go())


def test_http_telemetry_decides_as_the_bus_up_to_bucket_quantisation(nats_for_run, redis_url,
                                                                      tmp_path, capsys):
    with ThreadPoolExecutor(1) as pool:   # the reference runs while the services start
        reference_run = pool.submit(in_process, HORIZON_S)
        run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, HORIZON_S, redis_url,
                     telemetry="http").run()
        local, local_metrics = reference_run.result()
    assert sorted(run.decisions) == sorted(local)
    same = [t for t in local if run.decisions[t].actions == local[t].actions]
    score, reference = run.summary.metrics["overall_score"], local_metrics.overall_score
    with capsys.disabled():
        print(f"\nHTTP telemetry: identical decisions on {len(same)}/{len(local)} ticks "
              f"(differ: {sorted(set(local) - set(same))}); score {score:.2f} vs "
              f"{reference:.2f} with telemetry on the bus")
    assert set(range(UNLEARNT_TICKS)) <= set(same)
    assert abs(score - reference) <= 1.0

    # the telemetry came from the engines' pages, every tick, nothing left unread
    lines = [json.loads(x) for x in (run.log_dir / "engine-metrics-0.log").read_text()
             .splitlines() if x.startswith("{")]
    read = {x["tick"]: x for x in lines if x["event"] == "telemetry_read"}
    assert sorted(read) == list(range(run.summary.ticks))
    assert not [x for x in lines if x["event"] == "engine_metrics_unread"]
    assert read[1]["pages"] > 0 and read[1]["deployments"] == 0   # first scrapes: baselines
    batches = _telemetry_batches(nats_for_run)
    assert all(batches[t] for t in range(2, run.summary.ticks)), "a tick read no deployment"
