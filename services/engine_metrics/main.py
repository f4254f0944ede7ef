"""engine-metrics: the engines' own metrics → ``koi.telemetry.<n>``.

On each tick's snapshot (``koi.tick.<n>.snapshot``) it reads the fleet's engines and
publishes the window that just ended as ``koi.telemetry.<n>``, the batch the simulator
publishes when it reports telemetry itself, so telemetry-ingest does not know which one
it reads. Two sources (``KOI_METRICS_SOURCE``):

- ``scrape`` (default): the replica pages an ``http_sd`` document lists
  (``KOI_METRICS_TARGETS_URL``; empty = the sim's ``/targets`` when it serves pages,
  from KV ``koi_sim/metrics``), read ``KOI_SCRAPE_CONCURRENCY`` at a time within
  ``KOI_SCRAPE_TIMEOUT_S`` each, windowed against this process's previous scrape of each
  replica (``koi.fleet.scrape.ScrapeBook``: a first scrape, also after a restart, is a
  baseline);
- ``prometheus``: the same quantities from a Prometheus server's query API
  (``KOI_PROMETHEUS_URL``; ``koi.fleet.promql``), over the window of one tick.

A replica that cannot be read leaves its deployment out of that tick, with one warning
event per tick naming what failed; a targets list or a Prometheus that cannot be read
gives an empty batch and the event: the tick always goes on. With no source at all (the
sim publishes telemetry itself) it reads nothing and publishes nothing.

Idempotent: a tick whose telemetry is on the stream is skipped, and the batch goes out
with ``Nats-Msg-Id = telemetry-<n>``. A snapshot older than the clock is skipped too: the
pages already show a later tick. All decisions are in ``koi.fleet``; this is the I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from koi import subjects
from koi.catalog import Catalog
from koi.cluster import ClusterSnapshot, DeploymentTelemetry
from koi.fleet import promql
from koi.fleet.scrape import ScrapeBook, TargetsError, parse_targets
from koi.safe_text import printable
from koi.wire import planning
from services.engine_metrics import fetch
from services.runtime.app import ServiceContext, main
from services.runtime.consumer import Undecodable
from services.runtime.settings import redact_url
from services.runtime.ticks import clock_tick, subject_tick

NAME = "engine-metrics"
DURABLE = "engine-metrics"
KEY_SIM_METRICS = "metrics"   # koi_sim key: the sim's page server URL ("" = not serving)
EVENT_LIST_MAX = 20           # deployments named in one event


@dataclass
class Outcome:
    """One tick read: the telemetry, what failed, and what to keep once it is out."""

    telemetry: list[DeploymentTelemetry]
    failed: dict[str, str] = field(default_factory=dict)   # deployment → first error
    error: str = ""                                         # the whole read failed
    pages: int = 0
    baselines: int = 0
    commit: Callable[[], None] = lambda: None


class ScrapeSource:
    """Reads the replica pages the targets list names; keeps each replica's last scrape."""

    def __init__(self, ctx: ServiceContext, pool: ThreadPoolExecutor) -> None:
        self.ctx, self.pool = ctx, pool
        self.book = ScrapeBook()

    async def _targets_url(self) -> str | None:
        if self.ctx.settings.metrics_targets_url:
            return self.ctx.settings.metrics_targets_url
        got = await self.ctx.bus.kv_get(subjects.KV_SIM, KEY_SIM_METRICS)
        base = got[0].decode() if got else ""
        return f"{base}/targets" if base else None

    async def collect(self, snap: ClusterSnapshot) -> Outcome | None:
        url = await self._targets_url()
        if url is None:
            return None
        timeout = self.ctx.settings.scrape_timeout_s
        loop = asyncio.get_running_loop()
        try:
            doc = await loop.run_in_executor(self.pool, partial(
                fetch.get, url, timeout_s=timeout, max_bytes=fetch.MAX_TARGETS_BYTES))
            targets, _ = parse_targets(doc)
        except (fetch.FetchError, TargetsError) as e:
            return Outcome([], error=f"targets {redact_url(url)}: {printable(str(e), 300)}")
        results = await asyncio.gather(*(loop.run_in_executor(
            self.pool, partial(fetch.scrape, t.url, timeout_s=timeout)) for t in targets))
        collected, book = self.book.step(snap, list(zip(targets, results, strict=True)),
                                         self.ctx.catalog)

        def commit() -> None:
            self.book = book

        return Outcome(collected.telemetry, collected.failed, pages=collected.pages,
                       baselines=collected.baselines, commit=commit)


async def prometheus_telemetry(base_url: str, snap: ClusterSnapshot, *, window_s: float,
                               at: float, catalog: Catalog, timeout_s: float,
                               pool: ThreadPoolExecutor) -> list[DeploymentTelemetry]:
    """The window of ``window_s`` ending at Unix time ``at``, from a Prometheus server
    (``koi.fleet.promql``'s queries, sent at once on ``pool``). Raises ``FetchError`` or
    ``PromQLError``."""
    qs = promql.queries(window_s)
    loop = asyncio.get_running_loop()
    answers = await asyncio.gather(*(loop.run_in_executor(pool, partial(
        fetch.query, base_url, q.promql, at=at, timeout_s=timeout_s)) for q in qs))
    return promql.telemetry({q.key: a for q, a in zip(qs, answers, strict=True)}, snap,
                            window_s, catalog)


class PrometheusSource:
    """Asks a Prometheus server for the window of one tick (``snapshot.tick_s``) ending
    now: the fleet's clock is taken to be wall time, as a real fleet's is."""

    def __init__(self, ctx: ServiceContext, pool: ThreadPoolExecutor) -> None:
        self.ctx, self.pool = ctx, pool
        if not ctx.settings.prometheus_url:
            raise SystemExit("KOI_METRICS_SOURCE=prometheus needs KOI_PROMETHEUS_URL")

    async def collect(self, snap: ClusterSnapshot) -> Outcome:
        s = self.ctx.settings
        try:
            telemetry = await prometheus_telemetry(
                s.prometheus_url, snap, window_s=snap.tick_s, at=time.time(),
                catalog=self.ctx.catalog, timeout_s=s.scrape_timeout_s, pool=self.pool)
        except (fetch.FetchError, promql.PromQLError) as e:
            return Outcome([], error=f"prometheus: {printable(str(e), 300)}")
        return Outcome(telemetry, pages=len(promql.queries(snap.tick_s)))


async def _report(ctx: ServiceContext, snap: ClusterSnapshot, out: Outcome) -> None:
    """One warning event per tick saying what could not be read."""
    if not out.failed and not out.error:
        return
    deps = sorted(out.failed)
    named = ", ".join(deps[:EVENT_LIST_MAX]) + (f" and {len(deps) - EVENT_LIST_MAX} more"
                                                if len(deps) > EVENT_LIST_MAX else "")
    first = out.error or out.failed[deps[0]]
    what = (f"no telemetry read ({first})" if out.error else
            f"{len(deps)} deployment(s) left out, a replica could not be read: {named} "
            f"(first error: {first})")
    ctx.log.warning("engine_metrics_unread", tick=snap.tick, deployments=len(deps),
                    error=first)
    await ctx.event(kind="service", severity="warning", tick=snap.tick, key="unread",
                    scenario_time_s=snap.time_s, message=f"tick {snap.tick}: {what}",
                    attributes={"phase": "scrape_failed", "deployments": ",".join(deps[:50]),
                                "error": first[:500]})


async def run(ctx: ServiceContext) -> None:
    pool = ThreadPoolExecutor(max_workers=ctx.settings.scrape_concurrency,
                              thread_name_prefix="engine-metrics")
    source: ScrapeSource | PrometheusSource = (
        PrometheusSource(ctx, pool) if ctx.settings.metrics_source == "prometheus"
        else ScrapeSource(ctx, pool))

    async def handle(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        try:
            snap = planning.decode_snapshot(data)
        except Exception as exc:
            raise Undecodable(f"snapshot: {exc}") from exc
        n = snap.tick
        if subject_tick(subject) != n:
            ctx.log.warning("snapshot_tick_mismatch", subject=subject, tick=n)
            return
        if await ctx.bus.has(subjects.telemetry_subject(n)):
            return  # done before (a redelivery), or the sim reports it itself
        clock = await clock_tick(ctx.bus)
        if clock is not None and clock > n:
            ctx.log.info("stale_snapshot_skipped", tick=n, clock=clock)
            return
        t0 = time.perf_counter()
        try:
            out = await source.collect(snap)
        except Exception as exc:  # a reading gone wrong must not hold the tick up
            ctx.log.exception("engine_metrics_failed", tick=n)
            out = Outcome([], error=f"reading failed ({type(exc).__name__})")
        if out is None:
            return
        await ctx.bus.publish(subjects.telemetry_subject(n),
                              planning.encode_telemetry(n, out.telemetry),
                              msg_id=f"telemetry-{n}")
        out.commit()
        ctx.log.info("telemetry_read", tick=n, deployments=len(out.telemetry), pages=out.pages,
                     baselines=out.baselines, failed=len(out.failed),
                     seconds=round(time.perf_counter() - t0, 3))
        await _report(ctx, snap, out)

    consumer = await ctx.bus.consume(subjects.STREAM_TICKS, DURABLE,
                                     subjects.tick_filter("snapshot"), handle, service=NAME)
    try:
        await ctx.stopping.wait()
    finally:
        await consumer.stop()
        pool.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main(NAME, run)
