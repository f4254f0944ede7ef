"""placer: ``koi.tick.<n>.plan`` → ``koi.tick.<n>.actions``; ``koi.jobs.submit.<user>``.

* One leader at a time holds the ``placer`` lease in the ``koi_leases`` bucket; a
  standby keeps trying and takes over when the leader stops renewing. Only the leader
  consumes plans and snapshots.
* For each plan it runs ``koi.planner.tick.place_stable`` against the tick's snapshot
  (the placer's churn holds keep their memory here, as the in-process planner's
  ``KoiState`` does; a replica that takes the lease rebuilds it first by replaying the
  last hour of placements from the tick stream, ``recover_memory``),
  publishes the actions, stores the plan as the last good one (``koi_plan``/latest) and
  emits one operator event per action, citing the mechanisms behind the decision.
* Every snapshot starts the tick's deadline: no plan by then → the last good plan is
  placed against the new snapshot instead (a degraded tick, said in the event log with
  the stage the tick stalled at). A late plan is then ignored: the tick's actions are
  published once (``Nats-Msg-Id``).
* Job submission (request/reply, both replicas answer): ``services/placer/admission.py``
  — validated as the YAML form is, stored on ``koi.jobs.accepted.<id>`` before the ack
  is sent (so it survives any restart), idempotent by job id, "busy" when overloaded
  or when the submitting user is over its rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Mapping

from koi import subjects
from koi.cluster import ActionKind, ClusterSnapshot, PlanDecision
from koi.fold import Folder
from koi.planner.settings import settings_for
from koi.planner.stability import ChurnMemory, remember
from koi.planner.tick import churn_memory_span_s, place_stable, replay_placements
from koi.v1 import events_pb2, plan_pb2
from koi.wire import codec, planning
from services.placer.admission import Admission
from services.runtime.app import ServiceContext, main
from services.runtime.consumer import Undecodable
from services.runtime.lease import Lease
from services.runtime.ticks import TickReader

NAME = "placer"

# who publishes each stage of a tick, for a degraded tick's message
STAGE_OWNER = {"snapshot": "sim", "observations": "telemetry-ingest",
               "causal": "causal-store", "candidates": "proposer", "plan": "evaluator"}
_BUS_ERRORS_KEPT = 64  # ticks whose bus_error events are remembered for that message

EVENT_OF = {ActionKind.LAUNCH: ("launch", "info"), ActionKind.SCALE: ("scale", "info"),
            ActionKind.SWAP: ("swap", "info"), ActionKind.RELAUNCH: ("relaunch", "info"),
            ActionKind.DRAIN: ("stop", "info"), ActionKind.STOP: ("stop", "info"),
            ActionKind.REJECT: ("rejection", "warning")}  # deferrals: fold_deferrals


class Placer:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings = settings_for(ctx.settings.policy)
        self.reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)
        self.latest: ClusterSnapshot | None = None
        self.memory = ChurnMemory()   # koi.planner.stability: plans and moves seen
        self.timers: set[asyncio.Task] = set()
        self.admission = Admission(ctx, NAME)
        self.bus_errors: dict[int, list[str]] = {}  # tick → bus_error messages seen
        # a job deferred tick after tick: one event when it starts, a count every few
        # ticks, one when it ends (koi.fold), not a line per tick
        self.deferrals = Folder()

    # --- plans -------------------------------------------------------------------------

    async def on_plan(self, subject: str, data: bytes, headers: Mapping[str, str] | None
                      ) -> None:
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
        decision = self.place(targets, notes, snapshot)
        await self.publish(decision, tick, snapshot, mechs)
        await self.ctx.bus.kv_put(subjects.KV_PLAN, subjects.KEY_LATEST_PLAN, data)

    def place(self, targets, notes: dict[str, str], snapshot: ClusterSnapshot
              ) -> PlanDecision:
        self.memory = remember(self.memory, snapshot)
        decision, self.memory = place_stable(targets, notes, snapshot, self.settings,
                                             self.memory)
        return decision

    async def publish(self, decision: PlanDecision, plan_tick: int,
                      snapshot: ClusterSnapshot, mechs: dict) -> None:
        n = decision.tick
        await self.ctx.bus.publish(subjects.tick_subject(n, "actions"),
                                   planning.encode_actions(decision, plan_tick),
                                   msg_id=f"actions-{n}")
        deferred = {a.job_id: a.reason for a in decision.actions
                    if a.kind == ActionKind.DEFER}
        await self.fold_deferrals(n, deferred, snapshot)
        for i, a in enumerate(decision.actions):
            if a.kind == ActionKind.DEFER:
                continue
            kind, severity = EVENT_OF[a.kind]
            where = f" on {a.offering}" if a.offering else ""
            size = f" ×{a.replicas}" if a.replicas else ""
            ids, lines = mechs.get(a.job_id, ((), ()))
            because = f"; mechanisms: {' | '.join(lines)}" if lines else ""
            await self.ctx.event(kind=kind, severity=severity, tick=n, key=str(i),
                                 job_id=a.job_id, deployment_id=a.deployment_id,
                                 mechanism_ids=tuple(ids), scenario_time_s=snapshot.time_s,
                                 message=f"{a.kind.value}{size}{where}: {a.reason}{because}")

    async def fold_deferrals(self, tick: int, deferred: dict[str, str],
                             snapshot: ClusterSnapshot) -> None:
        """The deferral events of ``tick``. Severity says whether to look: a job that
        serves meanwhile (it waits for GPUs to grow) is info; one with nothing serving
        is a warning while it waits, info when it ends."""
        serving = {d.job_id for d in snapshot.deployments if d.replicas_ready > 0}
        for f in self.deferrals.tick(tick, deferred):
            if f.phase == "start":
                message = f"defer: {f.message}"
            elif f.phase == "still":
                message = (f"still deferred: {f.ticks} ticks, since tick {f.since_tick}"
                           f" ({f.message})")
            else:
                message = f"no longer deferred, after {f.ticks} ticks"
            quiet = f.phase == "end" or f.key in serving
            await self.ctx.event(kind="deferral", severity="info" if quiet else "warning",
                                 tick=tick, key=f"{f.key}:{f.phase}", job_id=f.key,
                                 scenario_time_s=snapshot.time_s, message=message,
                                 attributes={"phase": f.phase, "ticks": str(f.ticks),
                                             "since_tick": str(f.since_tick)})

    async def recover_memory(self) -> int:
        """The churn memory the placers before this one kept, rebuilt on taking the lease:
        the ticks of the memory's span (``churn_memory_span_s``) read back from the tick
        stream — each snapshot, and the plan its published actions implemented — and
        replayed through the same holds (``replay_placements``). Returns the ticks
        replayed; on a bus error the memory starts empty, as it did before, and says so."""
        bus = self.ctx.bus
        try:
            info = await bus.js.stream_info(subjects.STREAM_TICKS,
                                            subjects_filter=subjects.tick_filter("actions"))
            ticks = sorted(subjects.tick_of(s) for s in (info.state.subjects or {}))
            history = []
            newest = None
            for tick in reversed(ticks):
                raw = await bus.get_last(subjects.tick_subject(tick, "snapshot"))
                actions = await bus.get_last(subjects.tick_subject(tick, "actions"))
                if raw is None or actions is None:
                    continue
                snapshot = planning.decode_snapshot(raw)
                newest = snapshot.time_s if newest is None else newest
                if newest - snapshot.time_s > churn_memory_span_s(self.settings) \
                        + snapshot.tick_s:
                    break
                _, source = planning.decode_actions(actions)
                plan = await bus.get_last(subjects.tick_subject(source, "plan")) \
                    if source >= 0 else None
                targets = planning.decode_plan_targets(plan)[1] if plan is not None else None
                history.append((snapshot, targets))
        except Exception as exc:  # the holds start from nothing, as a first leader's do
            self.ctx.log.warning("placer_memory_not_recovered", error=repr(exc)[:300])
            self.memory = ChurnMemory()
            return 0
        self.memory = replay_placements(reversed(history), self.settings)
        return len(history)

    # --- the tick's deadline -------------------------------------------------------------

    async def on_snapshot(self, subject: str, data: bytes,
                          headers: Mapping[str, str] | None) -> None:
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
            self.memory = remember(self.memory, snapshot)
            source = -1
        else:
            source, targets, notes = planning.decode_plan_targets(last[0])
            decision = self.place(targets, {**notes, "degraded": f"plan of tick {source}"},
                                  snapshot)
        await self.publish(decision, source, snapshot, {})
        cause = await self.stalled_at(tick)
        await self.ctx.event(
            kind="degraded_tick", severity="warning", tick=tick, key="deadline",
            scenario_time_s=snapshot.time_s, attributes={"cause": cause},
            message=(f"tick {tick}: no plan within {wait:g} s ({cause}); placed the last "
                     f"good plan (tick {source}) against the current fleet" if source >= 0
                     else f"tick {tick}: no plan within {wait:g} s ({cause}) and none "
                          "before; no actions"))

    async def stalled_at(self, tick: int) -> str:
        """Which stage of ``tick`` is missing and whose it is, e.g. "no candidates for
        tick 41 (proposer): the tick stalled after causal", with the bus errors seen for
        that tick. One stream-info request: no payload is read."""
        try:
            info = await self.ctx.bus.js.stream_info(
                subjects.STREAM_TICKS, subjects_filter=f"{subjects.TICK_PREFIX}.{tick}.>")
            present = set(info.state.subjects or {})
        except Exception as exc:  # the message says less, the tick still degrades
            return f"the stages present could not be read: {type(exc).__name__}"
        cause, before = f"the plan of tick {tick} came too late", ""
        for stage, owner in STAGE_OWNER.items():
            if subjects.tick_subject(tick, stage) not in present:
                after = f"the tick stalled after {before}" if before else "nothing arrived"
                cause = f"no {stage} for tick {tick} ({owner}): {after}"
                break
            before = stage
        errors = self.bus_errors.get(tick, [])
        if errors:
            cause += f"; bus errors in that tick: {' | '.join(errors[:3])}"
            cause += f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        return cause

    def on_bus_error(self, data: bytes) -> None:
        """Remember a bus_error event by tick (a few ticks back) for ``stalled_at``."""
        try:
            ev = events_pb2.OperatorEvent.FromString(data)
        except Exception:
            return
        self.bus_errors.setdefault(ev.tick, []).append(ev.message[:300])
        while len(self.bus_errors) > _BUS_ERRORS_KEPT:
            del self.bus_errors[min(self.bus_errors)]

    def on_any_snapshot(self, data: bytes) -> None:
        try:
            snap = planning.decode_snapshot(data)
        except Exception:
            return
        if self.latest is None or snap.tick >= self.latest.tick:
            self.latest = snap
            self.admission.see(snap)


async def run(ctx: ServiceContext) -> None:
    placer = Placer(ctx)
    bus = ctx.bus

    async def track(msg) -> None:
        placer.on_any_snapshot(await bus.resolve(msg))  # a large snapshot is a blob

    async def bus_error(msg) -> None:
        placer.on_bus_error(msg.data)

    admission = placer.admission
    await admission.start()
    worker = asyncio.create_task(admission.work(), name="admission")
    subs = [await bus.nc.subscribe(subjects.tick_filter("snapshot"), cb=track),
            await bus.nc.subscribe(f"{subjects.EVENTS_PREFIX}.*.bus_error", cb=bus_error)]
    admission.sub = await bus.nc.subscribe(subjects.JOBS_SUBMIT_ANY, queue="placer",
                                           cb=admission.on_submit)
    subs.append(admission.sub)
    # unique per process: replicas of a Deployment share their environment
    holder = f"placer-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lease = Lease(bus, subjects.KEY_PLACER_LEASE, holder, ctx.settings.lease_ttl_s)
    consumers: list = []
    try:
        while not ctx.stopping.is_set():
            leading = await (lease.renew() if lease.is_leader else lease.acquire())
            if leading and not consumers:
                replayed = await placer.recover_memory()
                ctx.log.info("placer_leading", replayed_ticks=replayed)
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
        for s in reversed(subs):  # stop taking submissions first
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await admission.close()
        if lease.is_leader:
            await lease.release()


if __name__ == "__main__":
    main(NAME, run)
