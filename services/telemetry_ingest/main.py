"""telemetry-ingest: ``koi.telemetry.<n>`` → ``koi.tick.<n>.observations``.

For each tick's telemetry batch it drops windows that cannot be true (non-finite or
negative counters: outliers, counted and logged), keeps the deployments that were in
steady state (fully running at the two snapshots before, read back from the tick
stream, so nothing here is per-process state), predicts each at the load it saw
(``koi.planner.tick.observe``) and publishes the observations. It also raises an
SLO-breach event for an online job whose window p95 exceeded its objective.
"""

from __future__ import annotations

import math

from koi import subjects
from koi.cluster import DeploymentTelemetry
from koi.jobs import OnlineJob
from koi.planner.tick import observe, steady_deployments
from koi.policies.koi import settings_for
from koi.wire import planning
from services.runtime.app import ServiceContext, main
from services.runtime.bus import Undecodable
from services.runtime.ticks import TickReader

NAME = "telemetry-ingest"


def plausible(t: DeploymentTelemetry) -> bool:
    """A window whose counters could have been measured (finite, non-negative)."""
    values = (t.window_s, t.requests_arrived, t.requests_finished, t.prompt_tokens,
              t.generation_tokens, t.ttft_p95_s, t.tpot_p95_s, t.output_tok_s)
    return t.window_s > 0 and all(math.isfinite(v) and v >= 0 for v in values)


async def run(ctx: ServiceContext) -> None:
    settings = settings_for(ctx.settings.policy)
    reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)

    async def handle(subject: str, data: bytes, headers: dict | None) -> None:
        try:
            tick, telemetry = planning.decode_telemetry(data)
        except Exception as exc:
            raise Undecodable(f"telemetry batch: {exc}") from exc
        kept = [t for t in telemetry if plausible(t)]
        if len(kept) < len(telemetry):
            ctx.log.warning("telemetry_outliers", tick=tick, dropped=len(telemetry) - len(kept))
        snapshot = await reader.snapshot(tick)
        prev = await reader.snapshot(tick - 1, wait=False) if tick >= 1 else None
        prev2 = await reader.snapshot(tick - 2, wait=False) if tick >= 2 else None
        steady = steady_deployments(prev, prev2)
        observations = observe(snapshot, kept, steady, settings, ctx.catalog)
        await ctx.bus.publish(subjects.tick_subject(tick, "observations"),
                              planning.encode_observations(tick, observations),
                              msg_id=f"observations-{tick}")
        await _slo_breaches(ctx, snapshot, kept, tick)

    handle_ = await ctx.bus.consume(subjects.STREAM_TELEMETRY, "telemetry-ingest",
                                    f"{subjects.TELEMETRY_PREFIX}.>", handle, service=NAME)
    await ctx.stopping.wait()
    await handle_.stop()


async def _slo_breaches(ctx: ServiceContext, snapshot, telemetry, tick: int) -> None:
    specs = {j.id: j.spec for j in snapshot.jobs}
    for t in telemetry:
        spec = specs.get(t.job_id)
        if not isinstance(spec, OnlineJob) or t.requests_finished < 20:
            continue
        ttft, tpot = t.ttft_p95_s * 1e3, t.tpot_p95_s * 1e3
        if ttft > spec.slo.ttft_ms or tpot > spec.slo.tpot_ms:
            await ctx.event(
                kind="slo_breach", severity="error", tick=tick, key=t.deployment_id,
                job_id=t.job_id, deployment_id=t.deployment_id, scenario_time_s=snapshot.time_s,
                message=(f"p95 TTFT {ttft:,.0f} ms (SLO {spec.slo.ttft_ms:,.0f}), TPOT "
                         f"{tpot:.1f} ms (SLO {spec.slo.tpot_ms:.1f}) over the last "
                         f"{t.window_s:.0f} s"),
                attributes={"ttft_p95_ms": f"{ttft:.1f}", "tpot_p95_ms": f"{tpot:.2f}"})


if __name__ == "__main__":
    main(NAME, run)
