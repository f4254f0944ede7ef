"""The engine-metrics service on a real NATS, against pages served over HTTP.

The test plays the simulator: it serves two deployments' replica pages
(``SimulatedEngines`` behind a ``PageServer``, its URL in KV ``koi_sim/metrics`` as the
sim writes it), publishes snapshots, and reads the ``koi.telemetry.<n>`` batches the
service publishes. Checked: a first scrape is a baseline (an empty batch, never zeros),
the next tick's counters come back exactly, a replica whose page is gone leaves its
deployment out with a warning event while the other is read, a restarted service starts
from baselines again, an unreadable targets list still gives the tick a (empty) batch,
and with no source at all the service publishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
import pytest_asyncio

from koi import subjects
from koi.catalog import load_catalog
from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, DeploymentTelemetry
from koi.fleet.sim_pages import SimulatedEngines
from koi.sim.telemetry import build_telemetry
from koi.space import engine_default_config
from koi.v1 import events_pb2
from koi.wire import planning
from services.engine_metrics import main as engine_metrics
from services.runtime.app import ServiceContext
from services.runtime.bus import Bus
from services.runtime.connection import connect
from services.runtime.settings import ServiceSettings
from services.sim.metrics_http import PageServer

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]

CAT = load_catalog()


def _dep(dep_id: str, engine: str, ready: int) -> Deployment:
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", engine, CAT).with_(replicas=ready)
    offering = next(o.id for o in CAT.offerings.values() if o.accelerator == "h100-sxm")
    return Deployment(dep_id, f"job-{dep_id}", cfg, offering, DeploymentState.RUNNING,
                      ready, 0, 0.0)


DEPS = (_dep("d1", "vllm", 2), _dep("d2", "sglang", 1))


def _snap(tick: int) -> ClusterSnapshot:
    return ClusterSnapshot(tick, 60.0 * tick, 60.0, 3600.0, (), DEPS, ())


def _tick(tick: int, dep_id: str) -> DeploymentTelemetry:
    rng = np.random.default_rng(tick * 10 + len(dep_id))
    n = 80
    w = rng.uniform(0.5, 2.0, n)
    return build_telemetry(
        tick, dep_id, f"job-{dep_id}", 60.0,
        counts={"arrived": float(w.sum()), "dropped": 1.0, "prompt_tokens": 4e4 + tick,
                "gen_tokens": 1e4 + tick, "preemptions": 1.0, "replica_preemptions": 0,
                "gpu_seconds": 60.0, "cost_usd": 0.1},
        ttft=rng.lognormal(-1.5, 0.7, n), tpot=rng.lognormal(-3.5, 0.4, n), weights=w,
        means={"kv": 0.3, "running": 9.0, "waiting": 1.0},
        end={"running": 8.0, "waiting": 2.0})


@pytest_asyncio.fixture
async def service(bus: Bus, nats_url: str) -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """Start (or restart) engine-metrics' ``run`` in this loop on its own connection."""
    running: list[tuple[ServiceContext, asyncio.Task[None]]] = []

    async def stop_all() -> None:
        while running:
            ctx, task = running.pop()
            ctx.stopping.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
            await ctx.bus.close()

    async def go(**env: str) -> None:
        await stop_all()
        settings = ServiceSettings.from_env({"KOI_NATS_URL": nats_url, **env})
        own = await connect(nats_url, "test-engine-metrics", wait_s=10)
        ctx = ServiceContext(engine_metrics.NAME, settings, own, CAT)
        running.append((ctx, asyncio.create_task(engine_metrics.run(ctx))))

    yield go
    await stop_all()


class Sim:
    """The test's stand-in for the sim: pages served, snapshots published."""

    def __init__(self, bus: Bus, server: PageServer) -> None:
        self.bus, self.server = bus, server
        self.engines = SimulatedEngines()

    async def tick(self, n: int, telemetry: list[DeploymentTelemetry], *,
                   gone: tuple[str, ...] = (), wait_s: float = 15.0
                   ) -> list[DeploymentTelemetry] | None:
        snap = _snap(n)
        self.engines.update(snap, telemetry)
        pages = {p: b for p, b in self.engines.pages().items() if p not in gone}
        self.server.publish(pages, self.engines.targets(self.server.address))
        await self.bus.publish(subjects.tick_subject(n, "snapshot"),
                               planning.encode_snapshot(snap), msg_id=f"snapshot-{n}")
        data = await self.bus.wait_for(subjects.telemetry_subject(n), wait_s)
        if data is None:
            return None
        tick, batch = planning.decode_telemetry(data)
        assert tick == n
        return list(batch)


async def _warning(bus: Bus, tick: int) -> events_pb2.OperatorEvent:
    """The service's warning of ``tick`` (sent just after the tick's batch)."""
    for _ in range(100):
        raw = await bus.wait_for(subjects.event_subject("warning", "service"), 5.0)
        assert raw is not None, "no warning event"
        ev = events_pb2.OperatorEvent.FromString(raw)
        if ev.tick == tick:
            return ev
        await asyncio.sleep(0.05)
    raise AssertionError(f"no warning event for tick {tick}")


async def test_baselines_windows_failures_and_a_restart(bus: Bus, service) -> None:
    with PageServer() as server:
        await bus.kv_put(subjects.KV_SIM, engine_metrics.KEY_SIM_METRICS,
                         f"http://{server.address}".encode())
        sim = Sim(bus, server)
        await service()
        assert await sim.tick(0, []) == []            # first scrapes: baselines only
        sent = [_tick(0, "d1"), _tick(0, "d2")]
        got = {t.deployment_id: t for t in await sim.tick(1, sent)}
        assert sorted(got) == ["d1", "d2"]
        for want in sent:
            have = got[want.deployment_id]
            for f in ("requests_finished", "prompt_tokens", "generation_tokens",
                      "num_running_end", "kv_cache_usage", "ttft_mean_s"):
                assert getattr(have, f) == pytest.approx(getattr(want, f), rel=1e-9), f
            # the pages' gauges are the queue at the window's end
            assert have.num_running == pytest.approx(want.num_running_end, rel=1e-9)
        # one of d1's two replicas stops answering: d1 is left out, d2 is read
        batch = await sim.tick(2, [_tick(1, "d1"), _tick(1, "d2")],
                               gone=("/replicas/d1/1/metrics",))
        assert [t.deployment_id for t in batch] == ["d2"]
        ev = await _warning(bus, 2)
        assert ev.attributes["phase"] == "scrape_failed"
        assert ev.attributes["deployments"] == "d1" and "HTTP 404" in ev.message
        # a restarted service has no previous scrapes: a tick of baselines, then windows
        await service()
        assert await sim.tick(3, [_tick(2, "d1"), _tick(2, "d2")]) == []
        batch = await sim.tick(4, [_tick(3, "d1"), _tick(3, "d2")])
        assert [t.deployment_id for t in batch] == ["d1", "d2"]
        assert batch[0].prompt_tokens == pytest.approx(_tick(3, "d1").prompt_tokens)


async def test_unreadable_targets_still_give_the_tick_a_batch(bus: Bus, service) -> None:
    with PageServer() as server:
        sim = Sim(bus, server)
        await service(KOI_METRICS_TARGETS_URL="http://127.0.0.1:1/targets",
                      KOI_SCRAPE_TIMEOUT_S="1")
        assert await sim.tick(0, []) == []
        ev = await _warning(bus, 0)
        assert "no telemetry read" in ev.message


async def test_with_no_source_it_publishes_nothing(bus: Bus, service) -> None:
    with PageServer() as server:
        await bus.kv_put(subjects.KV_SIM, engine_metrics.KEY_SIM_METRICS, b"")  # sim: off
        await service()
        assert await Sim(bus, server).tick(0, [], wait_s=2.0) is None
