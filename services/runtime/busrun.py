"""One scenario run through the bus, start to finish: what the integration tests, the
parity check and the overhead benchmark share.

``BusRun`` starts the services (supervised child processes) against a NATS (and
optionally Redis) it is given, lets the sim service run the scenario, and collects the
``RunSummary`` and every tick's actions from the tick stream. ``chaos`` hooks let a
test kill a service or the cache at a given tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from koi import subjects
from koi.cluster import PlanDecision
from koi.v1 import bus_pb2, work_pb2
from koi.wire import planning
from services.runtime.bus import Bus
from services.runtime.launcher import Supervisor, services_for
from services.runtime.permissions import ADMIN
from services.runtime.security import Security, connect_nats
from services.runtime.settings import NatsAuth

TickHook = Callable[[int, Supervisor], None]


@dataclass
class BusRunResult:
    summary: work_pb2.RunSummary
    wall_s: float
    decisions: dict[int, PlanDecision]
    restarts: dict[str, int]
    log_dir: Path
    # "service-replica" → peak resident MiB when the run's summary arrived
    peak_rss_mib: dict[str, float] = field(default_factory=dict)


@dataclass
class BusRun:
    nats_url: str
    log_dir: Path
    scenario: str = "hetero-3h"
    seed: int = 1
    horizon_s: float | None = None
    redis_url: str = ""
    replicas: dict[str, int] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # a ``Security`` (a secure NATS): each service then runs as its own NATS user, and
    # this run reads the results back as admin
    security: Security | None = None
    # "bus": the sim publishes telemetry; "http": it serves engine /metrics pages and the
    # engine-metrics service scrapes them (DESIGN §9)
    telemetry: str = "bus"

    def __post_init__(self) -> None:
        if self.telemetry not in ("bus", "http"):
            raise ValueError(f"telemetry {self.telemetry!r}: bus or http")
        if self.security is not None:
            for name, own in self.security.service_env(self.services()).items():
                self.service_env[name] = {**own, **self.service_env.get(name, {})}

    def _auth(self) -> NatsAuth | None:
        return self.security.auth(ADMIN) if self.security is not None else None

    def env(self) -> dict[str, str]:
        return {"KOI_NATS_URL": self.nats_url, "KOI_REDIS_URL": self.redis_url,
                "KOI_SCENARIO": self.scenario, "KOI_SEED": str(self.seed),
                "KOI_HORIZON_S": "" if self.horizon_s is None else repr(self.horizon_s),
                "KOI_GRPC_ADDR": "127.0.0.1:0", "KOI_LOG_LEVEL": "info",
                **({"KOI_SIM_METRICS_PORT": "0"} if self.telemetry == "http" else {}),
                **self.extra_env}

    def services(self) -> tuple[str, ...]:
        return services_for(self.env())

    def run(self, on_tick: TickHook | None = None) -> BusRunResult:
        with Supervisor(self.env(), self.log_dir, dict(self.replicas),
                        service_env=dict(self.service_env)) as sup:
            t0 = time.perf_counter()
            sup.start(self.services())
            sup.watch(0.2)
            summary = asyncio.run(self._wait(sup, on_tick))
            wall = time.perf_counter() - t0
            peak = sup.peak_rss_mib()
            decisions = asyncio.run(self._decisions(summary.ticks))
            restarts = {f"{c.service}-{c.replica}": c.restarts for c in sup.children}
        return BusRunResult(summary, wall, decisions, restarts, self.log_dir, peak)

    async def _wait(self, sup: Supervisor, on_tick: TickHook | None) -> work_pb2.RunSummary:
        nc = await connect_nats(self.nats_url, self._auth(), connect_timeout=10)
        seen: set[int] = set()

        async def on_status(msg) -> None:
            tick = bus_pb2.SimStatus.FromString(msg.data).tick
            if on_tick is not None and tick not in seen:
                seen.add(tick)
                await asyncio.to_thread(on_tick, tick, sup)

        await nc.subscribe(subjects.SIM_STATUS, cb=on_status)
        js = nc.jetstream()
        deadline = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    kv = await js.key_value(subjects.KV_SIM)
                    entry = await kv.get("summary")
                    return work_pb2.RunSummary.FromString(entry.value)
                await asyncio.sleep(0.2)
        finally:
            await nc.close()
        raise TimeoutError(f"no run summary within {self.timeout_s:g} s; logs in "
                           f"{self.log_dir}")

    async def _decisions(self, ticks: int) -> dict[int, PlanDecision]:
        nc = await connect_nats(self.nats_url, self._auth(), connect_timeout=10)
        js, bus = nc.jetstream(), Bus(nc, "busrun")  # bus: resolves blob references
        out = {}
        try:
            for n in range(ticks):
                with contextlib.suppress(Exception):
                    msg = await js.get_last_msg(subjects.STREAM_TICKS,
                                                subjects.tick_subject(n, "actions"))
                    out[n] = planning.decode_actions(await bus.resolve(msg))[0]
        finally:
            await nc.close()
        return out
