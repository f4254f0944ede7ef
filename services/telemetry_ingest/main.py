"""telemetry-ingest: ``koi.telemetry.<n>`` → ``koi.tick.<n>.observations``.

For each tick's telemetry batch it refuses windows that cannot be true
(``koi.plausibility``: non-finite or negative counters, negative latencies, a window
not of this tick, output above the hardware's roofline), each with an ``implausible``
event, before anything is observed from them (so none moves a belief); it keeps the
deployments that were in steady state (fully running at the two snapshots before, read
back from the tick stream, so nothing here is per-process state), predicts each at the load it saw
(``koi.planner.tick.observe``) and publishes the observations. It also tells the
operators about online jobs whose window p95 broke their objective: one event when a
job's breach starts, sparse summaries while it lasts, one when it is over
(``services.telemetry_ingest.breaches``, derived from the last ticks of telemetry, so
a restart or a redelivery tells the same story with the same event ids).
"""

from __future__ import annotations

from collections.abc import Mapping

from koi import subjects
from koi.cluster import ClusterSnapshot, DeploymentTelemetry
from koi.jobs import OnlineJob, Slo
from koi.planner.settings import settings_for
from koi.planner.tick import observe, steady_deployments
from koi.plausibility import basic_reason, implausible_window
from koi.wire import planning
from services.runtime.app import ServiceContext, main
from services.runtime.bus import Bus
from services.runtime.consumer import Undecodable
from services.runtime.plausible import EVENT_KIND, check_tick, refuse
from services.runtime.ticks import TickReader, clock_tick, subject_tick
from services.telemetry_ingest.breaches import (
    BreachPolicy,
    JobWindow,
    breach_events,
    job_windows,
)

NAME = "telemetry-ingest"
# telemetry may be one tick ahead of the latest snapshot: an engine adapter (DESIGN §9)
# can report a tick before the fleet backend's snapshot of it lands; the handler then
# waits for that snapshot, as it always has
TICKS_AHEAD = 1


def plausible(t: DeploymentTelemetry) -> bool:
    """A window whose counters could have been measured (the checks that need no
    snapshot: used for the stored windows of the breach history)."""
    return basic_reason(t) is None


async def refuse_windows(ctx: ServiceContext, tick: int, snapshot: ClusterSnapshot,
                         telemetry: list[DeploymentTelemetry]) -> list[DeploymentTelemetry]:
    """The windows that could be true; each other one is refused with an ``implausible``
    event (id by tick and deployment, so a redelivery repeats it, not adds to it)."""
    deps = {d.id: d for d in snapshot.deployments}
    kept = []
    for t in telemetry:
        reason = implausible_window(t, tick, snapshot.tick_s, deps.get(t.deployment_id),
                                    ctx.catalog)
        if reason is None:
            kept.append(t)
            continue
        ctx.log.warning("telemetry_implausible", tick=tick, deployment=t.deployment_id,
                        reason=reason)
        await ctx.event(kind=EVENT_KIND, severity="error", tick=tick,
                        key=f"telemetry-{t.deployment_id}", job_id=t.job_id,
                        deployment_id=t.deployment_id, scenario_time_s=snapshot.time_s,
                        message=f"refused telemetry of {t.deployment_id}: {reason}",
                        attributes={"subject": subjects.telemetry_subject(tick),
                                    "reason": reason})
    return kept


async def run(ctx: ServiceContext) -> None:
    settings = settings_for(ctx.settings.policy)
    reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)
    policy = BreachPolicy()
    windows = WindowHistory(ctx.bus, policy)

    async def handle(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        try:
            tick, telemetry = planning.decode_telemetry(data)
        except Exception as exc:
            raise Undecodable(f"telemetry batch: {exc}") from exc
        # a tick far ahead would wait a whole stage deadline for its snapshot, be nak'd,
        # and hold this one-at-a-time consumer forever: refuse it instead
        clock = await clock_tick(ctx.bus)
        reason = check_tick(subject_tick(subject), tick, clock, ahead=TICKS_AHEAD)
        if reason is not None:
            await refuse(ctx, subject, data, headers, reason, clock)
            return
        snapshot = await reader.snapshot(tick)
        kept = await refuse_windows(ctx, tick, snapshot, telemetry)
        prev = await reader.snapshot(tick - 1, wait=False) if tick >= 1 else None
        prev2 = await reader.snapshot(tick - 2, wait=False) if tick >= 2 else None
        steady = steady_deployments(prev, prev2)
        observations = observe(snapshot, kept, steady, settings, ctx.catalog)
        await ctx.bus.publish(subjects.tick_subject(tick, "observations"),
                              planning.encode_observations(tick, observations),
                              msg_id=f"observations-{tick}")
        slos = {j.id: j.spec.slo for j in snapshot.jobs if isinstance(j.spec, OnlineJob)}
        history = await windows.history(tick, kept, slos)
        for ev in breach_events(tick, history, slos, policy):
            await ctx.event(kind="slo_breach", severity=ev.severity, tick=tick,
                            key=f"{ev.job_id}:{ev.phase}", job_id=ev.job_id,
                            deployment_id=ev.deployment_id, scenario_time_s=snapshot.time_s,
                            message=ev.message, attributes=ev.attributes)

    handle_ = await ctx.bus.consume(subjects.STREAM_TELEMETRY, "telemetry-ingest",
                                    f"{subjects.TELEMETRY_PREFIX}.>", handle, service=NAME)
    await ctx.stopping.wait()
    await handle_.stop()


class WindowHistory:
    """Each tick's ``job_windows`` over the policy's lookback: computed as batches are
    handled, and read back from the telemetry stream for ticks this process has not
    seen (after a restart), so the history does not depend on the process's past."""

    def __init__(self, bus: Bus, policy: BreachPolicy) -> None:
        self._bus = bus
        self._policy = policy
        self._by_tick: dict[int, dict[str, JobWindow]] = {}

    async def history(self, tick: int, telemetry: list[DeploymentTelemetry],
                      slos: dict[str, Slo]) -> dict[int, dict[str, JobWindow]]:
        first = max(0, tick - self._policy.lookback + 1)
        self._by_tick = {t: w for t, w in self._by_tick.items() if first <= t < tick}
        self._by_tick[tick] = job_windows(telemetry, slos, self._policy.min_requests)
        for t in range(first, tick):
            if t not in self._by_tick:
                self._by_tick[t] = job_windows(await self._stored(t), slos,
                                               self._policy.min_requests)
        return dict(self._by_tick)

    async def _stored(self, tick: int) -> list[DeploymentTelemetry]:
        data = await self._bus.get_last(subjects.telemetry_subject(tick))
        if data is None:
            return []
        try:
            stored_tick, telemetry = planning.decode_telemetry(data)
        except Exception:  # a batch that did not decode was dead-lettered: no windows
            return []
        # a batch under another tick's subject was refused when it came: no windows
        return [t for t in telemetry if plausible(t)] if stored_tick == tick else []


if __name__ == "__main__":
    main(NAME, run)
