"""placer: ``koi.tick.<n>.plan`` → ``koi.tick.<n>.actions``; ``koi.jobs.submit``.

* One leader at a time holds the ``placer`` lease in the ``koi_leases`` bucket; a
  standby keeps trying and takes over when the leader stops renewing. Only the leader
  consumes plans and snapshots.
* For each plan it runs ``koi.planner.tick.place_targets`` against the tick's snapshot,
  publishes the actions, stores the plan as the last good one (``koi_plan``/latest) and
  emits one operator event per action, citing the mechanisms behind the decision.
* Every snapshot starts the tick's deadline: no plan by then → the last good plan is
  placed against the new snapshot instead (a degraded tick, said in the event log). A
  late plan is then ignored: the tick's actions are published once (``Nats-Msg-Id``).
* Job submission (request/reply, both replicas answer): the ``JobSpec`` is validated as
  the YAML form is; an accepted job is stored on ``koi.jobs.accepted.<id>`` before the
  ack is sent, so it survives any restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid

from koi import subjects
from koi.cluster import ActionKind, ClusterSnapshot, PlanDecision
from koi.errors import InvalidSpecError
from koi.planner.tick import place_targets
from koi.policies.koi import settings_for
from koi.v1 import jobs_pb2, plan_pb2
from koi.wire import codec, planning
from koi.wire.jobs import job_from_proto
from services.runtime.app import ServiceContext, main
from services.runtime.bus import Lease, Undecodable
from services.runtime.ticks import TickReader

NAME = "placer"

EVENT_OF = {ActionKind.LAUNCH: ("launch", "info"), ActionKind.SCALE: ("scale", "info"),
            ActionKind.SWAP: ("swap", "info"), ActionKind.RELAUNCH: ("relaunch", "info"),
            ActionKind.DRAIN: ("stop", "info"), ActionKind.STOP: ("stop", "info"),
            ActionKind.REJECT: ("rejection", "warning"),
            ActionKind.DEFER: ("deferral", "warning")}


class Placer:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings = settings_for(ctx.settings.policy)
        self.reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)
        self.latest: ClusterSnapshot | None = None
        self.timers: set[asyncio.Task] = set()

    # --- plans -------------------------------------------------------------------------

    async def on_plan(self, subject: str, data: bytes, headers: dict | None) -> None:
        tick = subjects.tick_of(subject)
        if await self.ctx.bus.get_last(subjects.tick_subject(tick, "actions")) is not None:
            return  # placed already (or degraded before the plan came)
        try:
            msg = codec.decode(data, plan_pb2.ClusterPlan)
            _, targets, notes = planning.plan_targets_from_proto(msg)
            mechs = {e.job_id: (e.mechanism_ids, e.mechanisms)
                     for e in planning.explanations_from_proto(msg)}
        except Exception as exc:
            raise Undecodable(f"plan: {exc}") from exc
        snapshot = await self.reader.snapshot(tick)
        decision = place_targets(targets, notes, snapshot, self.settings)
        await self.publish(decision, tick, snapshot, mechs)
        await self.ctx.bus.kv_put(subjects.KV_PLAN, subjects.KEY_LATEST_PLAN, data)

    async def publish(self, decision: PlanDecision, plan_tick: int,
                      snapshot: ClusterSnapshot, mechs: dict) -> None:
        n = decision.tick
        await self.ctx.bus.publish(subjects.tick_subject(n, "actions"),
                                   planning.encode_actions(decision, plan_tick),
                                   msg_id=f"actions-{n}")
        for i, a in enumerate(decision.actions):
            kind, severity = EVENT_OF[a.kind]
            where = f" on {a.offering}" if a.offering else ""
            size = f" ×{a.replicas}" if a.replicas else ""
            ids, lines = mechs.get(a.job_id, ((), ()))
            because = f"; mechanisms: {' | '.join(lines)}" if lines else ""
            await self.ctx.event(kind=kind, severity=severity, tick=n, key=str(i),
                                 job_id=a.job_id, deployment_id=a.deployment_id,
                                 mechanism_ids=tuple(ids), scenario_time_s=snapshot.time_s,
                                 message=f"{a.kind.value}{size}{where}: {a.reason}{because}")

    # --- the tick's deadline -------------------------------------------------------------

    async def on_snapshot(self, subject: str, data: bytes, headers: dict | None) -> None:
        tick = subjects.tick_of(subject)
        task = asyncio.create_task(self.deadline(tick))
        self.timers.add(task)
        task.add_done_callback(self.timers.discard)

    async def deadline(self, tick: int) -> None:
        bus, wait = self.ctx.bus, self.ctx.settings.stage_deadline_s
        if await bus.wait_for(subjects.tick_subject(tick, "plan"), wait) is not None:
            return
        if await bus.get_last(subjects.tick_subject(tick, "actions")) is not None:
            return
        snapshot = await self.reader.snapshot(tick)
        last = await bus.kv_get(subjects.KV_PLAN, subjects.KEY_LATEST_PLAN)
        if last is None:
            decision = PlanDecision(tick=tick, notes={"degraded": "no plan yet"})
            source = -1
        else:
            source, targets, notes = planning.decode_plan_targets(last[0])
            decision = place_targets(targets, {**notes, "degraded": f"plan of tick {source}"},
                                     snapshot, self.settings)
        await self.publish(decision, source, snapshot, {})
        await self.ctx.event(
            kind="degraded_tick", severity="warning", tick=tick, key="deadline",
            scenario_time_s=snapshot.time_s,
            message=(f"tick {tick}: no plan within {wait:g} s; placed the last good plan "
                     f"(tick {source}) against the current fleet" if source >= 0 else
                     f"tick {tick}: no plan within {wait:g} s and none before; no actions"))

    # --- job submission ------------------------------------------------------------------

    async def on_submit(self, msg) -> None:
        ack = await self.admit(msg.data)
        await msg.respond(ack.SerializeToString())

    async def admit(self, data: bytes) -> jobs_pb2.JobAck:
        tick = self.latest.tick if self.latest else 0
        try:
            spec = codec.decode(data, jobs_pb2.JobSpec)
        except Exception as exc:
            return jobs_pb2.JobAck(accepted=False, reason=f"undecodable JobSpec: {exc}",
                                   tick=tick)
        try:
            job = job_from_proto(spec, catalog=self.ctx.catalog)
        except InvalidSpecError as exc:
            field = getattr(exc, "field", "") or getattr(exc, "path", "") or ""
            await self.ctx.event(kind="rejection", severity="warning", tick=tick,
                                 key=f"submit-{spec.id}", job_id=spec.id,
                                 message=f"rejected at submission: {exc}")
            return jobs_pb2.JobAck(accepted=False, job_id=spec.id, reason=str(exc),
                                   field=str(field), tick=tick)
        known = {j.id for j in self.latest.jobs} if self.latest else set()
        subject = subjects.job_accepted_subject(job.id)
        if job.id in known or await self.ctx.bus.get_last(subject) is not None:
            return jobs_pb2.JobAck(accepted=False, job_id=job.id, field="id",
                                   reason=f"a job with id {job.id!r} already exists", tick=tick)
        await self.ctx.bus.publish(subject, data, msg_id=f"job-{job.id}")
        await self.ctx.event(kind="admission", severity="info", tick=tick, key=job.id,
                             job_id=job.id, message=f"accepted {job.id} ({job.model}); "
                                                    "it joins the plan at the next tick")
        return jobs_pb2.JobAck(accepted=True, job_id=job.id, tick=tick)

    def on_any_snapshot(self, data: bytes) -> None:
        try:
            snap = planning.decode_snapshot(data)
        except Exception:
            return
        if self.latest is None or snap.tick >= self.latest.tick:
            self.latest = snap


async def run(ctx: ServiceContext) -> None:
    placer = Placer(ctx)
    bus = ctx.bus

    async def track(msg) -> None:
        placer.on_any_snapshot(msg.data)

    subs = [await bus.nc.subscribe(subjects.tick_filter("snapshot"), cb=track),
            await bus.nc.subscribe(subjects.JOBS_SUBMIT, queue="placer", cb=placer.on_submit)]
    # unique per process: replicas of a Deployment share their environment
    holder = f"placer-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lease = Lease(bus, subjects.KEY_PLACER_LEASE, holder, ctx.settings.lease_ttl_s)
    consumers: list = []
    try:
        while not ctx.stopping.is_set():
            leading = await (lease.renew() if lease.is_leader else lease.acquire())
            if leading and not consumers:
                ctx.log.info("placer_leading")
                consumers = [
                    await bus.consume(subjects.STREAM_TICKS, "placer", subjects.tick_filter("plan"),
                                      placer.on_plan, service=NAME),
                    await bus.consume(subjects.STREAM_TICKS, "placer-deadline",
                                      subjects.tick_filter("snapshot"), placer.on_snapshot,
                                      service=NAME)]
            elif not leading and consumers:
                ctx.log.warning("placer_lost_lease")
                for c in consumers:
                    await c.stop()
                consumers = []
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), ctx.settings.lease_ttl_s / 3)
    finally:
        for c in consumers:
            await c.stop()
        for s in subs:
            await s.unsubscribe()
        if lease.is_leader:
            await lease.release()


if __name__ == "__main__":
    main(NAME, run)
