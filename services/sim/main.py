"""sim: the simulated fleet behind the bus (the placer's backend in a test or demo).

Each tick ``n`` it publishes ``koi.tick.<n>.snapshot`` and the telemetry of the tick it
just simulated on ``koi.telemetry.<n>``, announces the scenario's jobs that arrived on
``koi.jobs.accepted.<id>``, then waits for ``koi.tick.<n>.actions``, applies them and
advances. Jobs accepted on ``koi.jobs.accepted.>`` join at the next
tick boundary; their messages are acked only once a published snapshot holds them.

With ``KOI_SIM_METRICS_PORT`` set it speaks the engines' protocol instead of publishing
telemetry: every simulated replica gets an engine ``/metrics`` page
(``koi.fleet.sim_pages``), updated with the tick just simulated *before* the next
snapshot goes out, served on loopback with a Prometheus ``http_sd`` ``/targets``
(``services/sim/metrics_http.py``; its URL in KV ``koi_sim/metrics``), and the
engine-metrics service (or a real Prometheus) reads them.

Restart-safe by replay: the simulator is deterministic given its seed, the actions and
the jobs, all of which are in the tick stream, so a restarted sim re-applies the stored
actions of every finished tick, re-injecting the jobs each stored snapshot held, and
carries on where the last one stopped. At the horizon it stores the run's metrics
(``RunSummary``) in the ``koi_sim`` bucket and idles.

No admitted job can take the sim down. A job whose decoding or submission raises is
quarantined: never added, an error event names it and the exception type, and its message
is acked with the tick's others, so no restart meets it again. A job whose simulation
raises is quarantined by the simulator (rejected ``quarantined: <type>``, deployments
stopped; the event comes with the tick's world events). A restarted sim reads each tick's
*next* stored snapshot before re-running the tick, and takes out the jobs it shows
quarantined first, so replay never re-runs what crashed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from functools import partial

from koi import subjects
from koi.cluster import ClusterSnapshot, DeploymentTelemetry, JobStatus, PlanDecision
from koi.fleet.sim_pages import SimulatedEngines
from koi.jobs import JobSpec
from koi.metrics import metrics_for
from koi.scenario import load_scenario
from koi.sim.simulator import QUARANTINED, Simulator
from koi.v1 import bus_pb2, work_pb2
from koi.wire import codec, planning
from services.runtime.app import ServiceContext, main, ready_key
from services.sim.metrics_http import PageServer

NAME = "sim"
KEY_SUMMARY = "summary"
KEY_METRICS = "metrics"   # the page server's base URL, "" when it serves none
JOBS_DURABLE = "sim-jobs"
ENGINE_METRICS = "engine-metrics"


def build_simulator(ctx: ServiceContext) -> Simulator:
    s = ctx.settings
    scn = load_scenario(s.scenario)
    if s.horizon_s is not None:
        scn = dataclasses.replace(scn, horizon_s=min(scn.horizon_s, s.horizon_s))
    return Simulator(scn, seed=s.seed, sample_fraction=s.sample_fraction,
                     catalog=ctx.catalog)


async def replay(ctx: ServiceContext, sim: Simulator,
                 engines: SimulatedEngines | None = None) -> list[DeploymentTelemetry]:
    """Re-apply every finished tick stored on the bus; returns the last telemetry.
    ``engines`` (pages served) are fed every replayed tick, so a restarted sim's pages
    carry on from where the last process left them."""
    telemetry: list[DeploymentTelemetry] = []
    snap = await _stored_snapshot(ctx, sim.tick)
    while not sim.done and snap is not None:
        for status in snap.jobs:
            if status.id not in sim.jobs:
                await _submit(ctx, sim, status.id, partial(_spec_of, status))
        _requarantine(sim, snap)
        acts = await ctx.bus.get_last(subjects.tick_subject(sim.tick, "actions"))
        if acts is None:
            break
        decision, _ = planning.decode_actions(acts)
        sim.apply(decision)
        # a job quarantined during this tick shows in the next snapshot: take it out
        # before re-running the tick, so what crashed once is not run again
        snap = await _stored_snapshot(ctx, sim.tick + 1)
        if snap is not None:
            _requarantine(sim, snap)
        telemetry = sim.advance()
        if engines is not None:
            engines.update(sim.snapshot(), telemetry)
    if sim.tick:
        ctx.log.info("sim_replayed", ticks=sim.tick, quarantined=len(sim.quarantined))
    return telemetry


async def _stored_snapshot(ctx: ServiceContext, tick: int) -> ClusterSnapshot | None:
    raw = await ctx.bus.get_last(subjects.tick_subject(tick, "snapshot"))
    return None if raw is None else planning.decode_snapshot(raw)


def _spec_of(status: JobStatus) -> JobSpec:
    return status.spec


def _requarantine(sim: Simulator, snap: ClusterSnapshot) -> None:
    for status in snap.jobs:
        if status.rejected and status.reason.startswith(f"{QUARANTINED}:") \
                and status.id in sim.jobs:
            sim.quarantine(status.id, status.reason.split(":", 1)[1].strip())


async def _submit(ctx: ServiceContext, sim: Simulator, job_id: str,
                  decode: Callable[[], JobSpec]) -> JobSpec | None:
    """Decode and submit one job; one whose handling raises is quarantined: not added,
    an error event naming it and the exception type (no traceback). None then."""
    try:
        job = decode()
        if job.id in sim.jobs:
            return None
        return sim.submit(job)
    except Exception as exc:  # an admitted job must never take the sim down
        error = type(exc).__name__
        ctx.log.error("job_quarantined", job_id=job_id, error=error, stage="submit")
        await ctx.event(kind="quarantine", severity="error", tick=sim.tick,
                        key=f"submit-{job_id}", job_id=job_id, scenario_time_s=sim.now,
                        message=f"job {job_id} quarantined: submitting it raised {error};"
                                " it was not added to the run")
        return None


def _status(sim: Simulator, ticks: int) -> bytes:
    last = sim.timeline[-1] if sim.timeline else None
    msg = bus_pb2.SimStatus(
        tick=sim.tick, ticks=ticks, time_s=sim.now, horizon_s=sim.scenario.horizon_s,
        done=sim.done, jobs_admitted=sum(js.admitted for js in sim.jobs.values()),
        jobs_submitted=sum(js.spec.submit_s <= sim.now for js in sim.jobs.values()),
        slo_attainment=(min(last.ttft_met_frac, last.tpot_met_frac) if last else 1.0),
        usd_per_hour=last.spend_usd_per_hour if last else 0.0,
        scenario=sim.scenario.name, seed=sim.seed)
    if last:
        msg.gpus_by_family.update(last.gpus_by_family)
    return msg.SerializeToString()


def summary(sim: Simulator, wall_s: float, submitted: list[str], ctx: ServiceContext
            ) -> work_pb2.RunSummary:
    record = dataclasses.replace(sim.record("koi-bus"), wall_s=wall_s)
    # jobs that came over the bus count in the offered load and the reference price
    scn = dataclasses.replace(sim.scenario,
                              jobs=tuple(js.spec for js in sim.jobs.values()))
    m = metrics_for(record, scn, ctx.catalog)
    out = work_pb2.RunSummary(scenario=sim.scenario.name, seed=sim.seed, ticks=sim.tick,
                              wall_s=wall_s, submitted_jobs=submitted)
    for f in dataclasses.fields(m):
        v = getattr(m, f.name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.metrics[f.name] = float(v)
    return out


# what the world did (the sim's own records) → operator event kind and severity; the
# placer reports what it asked for (launch, swap, …), the sim what happened to it
WORLD_EVENTS = {"preemption": ("preemption", "warning"), "stockout": ("preemption", "warning"),
                "admit": ("admission", "info"), "quarantine": ("quarantine", "error")}


async def _events(ctx: ServiceContext, sim: Simulator, seen: int) -> int:
    """Preemptions, stock-outs and admissions (a job's first deployment) this tick."""
    events = sim.fleet.events
    for i, e in enumerate(events[seen:], start=seen):
        if e.kind in WORLD_EVENTS:
            kind, severity = WORLD_EVENTS[e.kind]
            await ctx.event(kind=kind, severity=severity, tick=e.tick,
                            key=str(i), job_id=e.job_id, deployment_id=e.deployment_id,
                            message=f"{e.kind}: {e.detail}", scenario_time_s=e.time_s)
    return len(events)


PIPELINE = ("telemetry-ingest", "causal-store", "proposer", "evaluator", "placer")
KEY_RUN = "run"


async def claim_run(ctx: ServiceContext, sim: Simulator) -> None:
    """Record which run this bus holds; refuse to carry on someone else's."""
    s = ctx.settings
    me = f"{sim.scenario.name} seed={s.seed} horizon={sim.scenario.horizon_s:g} " \
         f"fraction={sim.fraction:g}"
    got = await ctx.bus.kv_get(subjects.KV_SIM, KEY_RUN)
    if got is None:
        await ctx.bus.kv_put(subjects.KV_SIM, KEY_RUN, me.encode())
    elif got[0].decode() != me:
        raise SystemExit(f"this NATS holds another run ({got[0].decode()}), not {me}: "
                         "start on a fresh JetStream, or delete Koi's streams and buckets "
                         "(`koi demo` does on an external NATS)")


async def wait_ready(ctx: ServiceContext, pipeline: tuple[str, ...] = PIPELINE) -> None:
    """Before the first tick: wait (up to a stage deadline) until every pipeline service
    has said it runs, so a short deadline does not degrade tick 0 while they start."""
    deadline = time.monotonic() + ctx.settings.stage_deadline_s
    missing = list(pipeline)
    while missing and time.monotonic() < deadline and not ctx.stopping.is_set():
        missing = [m for m in missing
                   if await ctx.bus.kv_get(subjects.KV_SIM, ready_key(m)) is None]
        if missing:
            await asyncio.sleep(0.1)
    if missing:
        ctx.log.warning("starting_without", services=missing)


async def serve_pages(ctx: ServiceContext) -> tuple[SimulatedEngines, PageServer] | None:
    """Start the page server if ``KOI_SIM_METRICS_PORT`` asks for one, and say where it
    is in KV (an empty value when not serving, so no reader believes an old address)."""
    port = ctx.settings.sim_metrics_port
    if port is None:
        await ctx.bus.kv_put(subjects.KV_SIM, KEY_METRICS, b"")
        return None
    server = PageServer("127.0.0.1", port)
    addr = server.start()
    await ctx.bus.kv_put(subjects.KV_SIM, KEY_METRICS, f"http://{addr}".encode())
    ctx.log.info("sim_metrics_serving", targets=f"http://{addr}/targets")
    return SimulatedEngines(), server


async def run(ctx: ServiceContext) -> None:
    sim = build_simulator(ctx)
    await claim_run(ctx, sim)
    served = await serve_pages(ctx)
    try:
        await _run(ctx, sim, served)
    finally:
        if served is not None:
            served[1].stop()


async def _run(ctx: ServiceContext, sim: Simulator,
               served: tuple[SimulatedEngines, PageServer] | None) -> None:
    engines = served[0] if served is not None else None
    ticks = max(1, int(-(-sim.scenario.horizon_s // sim.scenario.tick_s)))
    telemetry = await replay(ctx, sim, engines)
    if sim.tick == 0:
        await wait_ready(ctx, PIPELINE if engines is None else (*PIPELINE, ENGINE_METRICS))
    seen_events = len(sim.fleet.events)
    jobs_sub = await ctx.bus.js.pull_subscribe(
        f"{subjects.JOBS_ACCEPTED_PREFIX}.>", durable=JOBS_DURABLE,
        stream=subjects.STREAM_JOBS)
    submitted = [js.spec.id for js in sim.jobs.values()
                 if js.spec.id not in {j.id for j in sim.scenario.jobs}]
    announced: set[str] = set()
    t0 = time.perf_counter()
    wait_s = 2 * ctx.settings.stage_deadline_s  # the placer degrades well before this
    while not sim.done and not ctx.stopping.is_set():
        n = sim.tick
        stored = await ctx.bus.get_last(subjects.tick_subject(n, "snapshot"))
        pending = [] if stored is not None else await _fetch_jobs(jobs_sub)
        for msg in pending:
            job = await _submit(ctx, sim, msg.subject.rsplit(".", 1)[-1],
                                partial(_decode_job, ctx, msg.data))
            if job is not None:
                submitted.append(job.id)
        snap = sim.snapshot()
        if served is not None:  # the pages show the tick before its snapshot is out
            served[0].update(snap, telemetry)
            served[1].publish(served[0].pages(), served[0].targets(served[1].address))
        await ctx.bus.publish(subjects.tick_subject(n, "snapshot"),
                              planning.encode_snapshot(snap), msg_id=f"snapshot-{n}")
        if served is None:
            await ctx.bus.publish(subjects.telemetry_subject(n),
                                  planning.encode_telemetry(n, telemetry),
                                  msg_id=f"telemetry-{n}")
        for msg in pending:  # the effect (a published snapshot holding the job) is done
            await msg.ack()
        await _announce_arrivals(ctx, snap, announced)
        await ctx.bus.nc.publish(subjects.SIM_STATUS, _status(sim, ticks))
        raw = await ctx.bus.wait_for(subjects.tick_subject(n, "actions"), wait_s)
        if raw is None:
            decision = PlanDecision(tick=n, notes={"degraded": "no actions in time"})
            await ctx.event(kind="degraded_tick", severity="error", tick=n, key="sim",
                            message=f"tick {n}: no actions within {wait_s:g} s; the fleet "
                                    "keeps what it runs", scenario_time_s=sim.now)
        else:
            decision, _ = planning.decode_actions(raw)
        sim.apply(decision)
        if stored is not None:  # a tick the last process ran: as in replay(), look ahead
            nxt = await _stored_snapshot(ctx, n + 1)
            if nxt is not None:
                _requarantine(sim, nxt)
        telemetry = sim.advance()
        seen_events = await _events(ctx, sim, seen_events)
        ctx.log.debug("tick_done", tick=n)
    if sim.done:
        await ctx.bus.nc.publish(subjects.SIM_STATUS, _status(sim, ticks))
        done = summary(sim, time.perf_counter() - t0, submitted, ctx)
        await ctx.bus.kv_put(subjects.KV_SIM, KEY_SUMMARY, done.SerializeToString())
        ctx.log.info("run_done", ticks=sim.tick, score=done.metrics.get("overall_score"))
        await ctx.stopping.wait()


async def _announce_arrivals(ctx: ServiceContext, snap, announced: set[str]) -> None:
    """The scenario's own jobs, as they arrive, on ``koi.jobs.accepted.<id>`` beside the
    submitted ones: the jobs stream is the whole record, and a submission reusing an
    arrived scenario job's id is refused. (The sim's consumer skips ids it knows.)"""
    for status in snap.jobs:
        if status.id not in announced:
            announced.add(status.id)
            await ctx.bus.publish(subjects.job_accepted_subject(status.id),
                                  codec.encode_job(status.spec), msg_id=f"job-{status.id}")


async def _fetch_jobs(sub) -> list:
    """The accepted jobs waiting for this tick (none: one round trip, no waiting)."""
    try:
        if (await sub.consumer_info()).num_pending == 0:
            return []
        return await sub.fetch(256, timeout=1.0)
    except TimeoutError:
        return []
    except Exception as exc:  # nats raises its own TimeoutError subclass on no messages
        if "timeout" in type(exc).__name__.lower():
            return []
        raise


def _decode_job(ctx: ServiceContext, data: bytes) -> JobSpec:
    # validated at admission, but the stream may hold a job written past it (or under
    # older bounds): a failure here quarantines it (``_submit``)
    return codec.decode_job(data, catalog=ctx.catalog)


if __name__ == "__main__":
    main(NAME, run)
