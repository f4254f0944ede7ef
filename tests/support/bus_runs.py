"""What the bus-run tests share (tests/integration/test_*bus*.py, test_rlm_*.py): the
in-process reference a bus run is compared with, and reading back what a run stored."""

from __future__ import annotations

import dataclasses
import functools

from koi.catalog import load_catalog
from koi.cluster import PlanDecision
from koi.metrics import RunMetrics, metrics_for
from koi.policies import make_policy
from koi.scenario import load_scenario
from koi.sim.simulator import Simulator


async def stored_messages(url: str, subject: str) -> list[tuple[str, int, bytes]]:
    """Every message the run's streams hold on ``subject`` (a wildcard), oldest first:
    (subject, stream sequence, payload with any blob reference resolved)."""
    from services.runtime.bus import Bus
    from services.runtime.security import connect_nats

    nc = await connect_nats(url)
    bus = Bus(nc, "test")
    sub = await nc.jetstream().subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            out.append((msg.subject, msg.metadata.sequence.stream, await bus.resolve(msg)))
    except TimeoutError:   # nothing more stored
        pass
    finally:
        await nc.close()
    return out


def in_process(scenario: str, horizon_s: float, seed: int = 1
               ) -> tuple[dict[int, PlanDecision], RunMetrics]:
    """Koi on ``scenario`` cut to ``horizon_s``, in one process: each tick's decision and
    the run's metrics. The run is deterministic, so it is computed once per session and
    shared (several bus runs compare with the same reference); each caller gets its own
    dict, and the decisions and metrics are frozen (treat their ``notes`` as read-only)."""
    decisions, metrics = _in_process(scenario, horizon_s, seed)
    return dict(decisions), metrics


@functools.cache
def _in_process(scenario: str, horizon_s: float, seed: int
                ) -> tuple[dict[int, PlanDecision], RunMetrics]:
    cat = load_catalog()
    scn = dataclasses.replace(load_scenario(scenario), horizon_s=horizon_s)
    policy = make_policy("koi", catalog=cat, seed=seed)
    sim = Simulator(scn, seed=seed, catalog=cat)
    decisions: dict[int, PlanDecision] = {}
    telemetry: list = []
    while not sim.done:
        snap = sim.snapshot()
        decisions[snap.tick] = policy.decide(snap, telemetry)
        sim.apply(decisions[snap.tick])
        telemetry = sim.advance()
    return decisions, metrics_for(sim.record("koi"), scn, cat)
