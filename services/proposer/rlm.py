"""The proposer's language-model hypothesis rounds, beside the ticks and never in them.

With a model endpoint configured (``KOI_RLM_MODEL`` and ``KOI_RLM_BASE_URL``,
``RlmSettings.endpoint_configured``), every proposer replica competes for one lease
(key ``proposer-rlm`` in ``koi_leases``, ``services.runtime.lease.Lease``, TTL
``KOI_LEASE_TTL_S``): the holder renews it every third of the TTL and is the only
replica that runs rounds; one that loses it starts none and publishes nothing of a round
it had running; a standby takes over within about a TTL of the holder's last renewal.
The holder watches every tick's causal message (a plain subscription: it holds nothing
up). When the triggers say a round is due (``koi.rlm.triggers``; SLO breaches from the
tick's observations, residual shifts from the causal message's ``abs_error``) and none is
running, it starts one on a daemon thread over that tick's snapshot and learnt state, and
returns. When the round ends its outcome is published on ``koi.tick.<m>.hypotheses`` —
m the tick after the latest one seen, the first it can enter — with its operator events
(started; finished, or failed with the reason; each accepted and each dropped hypothesis
with its reason) and, with ``KOI_RLM_TRANSCRIPTS`` set, its transcript (``koi rlm
replay`` re-runs it). Every replica follows those messages
(``services.runtime.hypotheses.HypothesisFeed``); the one coordinating a tick puts the
hypotheses' candidates into its work items.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from koi import subjects
from koi.planner.explain import Explanation
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState
from koi.rlm.client import ChatClient
from koi.rlm.hierarchy import RoundResult
from koi.rlm.loop import (
    EventSpec,
    HypothesisLoop,
    RoundOutcome,
    observation_latencies,
    round_events,
    round_started,
    start_round,
    tick_signals,
)
from koi.rlm.record import inputs_record, round_text
from koi.rlm.settings import RlmSettings
from koi.v1 import causal_pb2, plan_pb2
from koi.wire import codec, planning
from koi.wire.hypotheses import encode_hypotheses
from services.runtime.app import ServiceContext
from services.runtime.lease import Lease
from services.runtime.ticks import TickReader


async def load_settings(ctx: ServiceContext) -> RlmSettings | None:
    """The layer's settings when a model endpoint is configured, else None. Bad values
    turn the layer off with an ERROR event naming the variable (never its value): the
    planner works without it."""
    if not os.environ.get("KOI_RLM_MODEL"):  # off: not even a key file is read
        return None
    try:
        settings = RlmSettings.from_env()
    except ValueError as err:
        ctx.log.error("rlm_settings_refused", error=str(err))
        await ctx.event(kind="service", severity="error", tick=0, key="rlm-settings",
                        message=f"{ctx.name}: hypothesis layer off, its settings were"
                                f" refused: {err}"[:400],
                        attributes={"phase": "rlm_settings"})
        return None
    return settings if settings.endpoint_configured else None


async def emit(ctx: ServiceContext, e: EventSpec, tick: int, at_s: float) -> None:
    await ctx.event(kind=e.kind, severity=e.severity, message=e.message, tick=tick, key=e.key,
                    job_id=e.job_id, mechanism_ids=e.mechanism_ids,
                    attributes=dict(e.attributes), scenario_time_s=at_s)


class RoundRunner:
    """The rounds of the replica holding the ``proposer-rlm`` lease: triggers, one round
    at a time, results onto the bus."""

    def __init__(self, ctx: ServiceContext, settings: RlmSettings, reader: TickReader,
                 planner: KoiSettings, variant: str) -> None:
        self.ctx, self.settings, self.reader = ctx, settings, reader
        self.planner, self.variant = planner, variant
        self.chat = ChatClient(settings)
        self.loop = HypothesisLoop(settings)
        self.latest = -1
        self.busy = False
        self.tasks: set[asyncio.Task[None]] = set()
        self._sub: Any = None
        # unique per process: replicas of a Deployment share their environment
        self.tag = uuid.uuid4().hex[:8]
        self.lease = Lease(ctx.bus, subjects.KEY_RLM_LEASE,
                           f"proposer-{socket.gethostname()}-{os.getpid()}-{self.tag}",
                           ctx.settings.lease_ttl_s)
        self._holding: asyncio.Task[None] | None = None
        self._import: asyncio.Task[Any] | None = None

    async def start(self) -> RoundRunner:
        await self._renew()
        self._holding = asyncio.create_task(self._hold(), name="rlm-lease")
        self._sub = await self.ctx.bus.nc.subscribe(subjects.tick_filter("causal"),
                                                    cb=self._on_causal)
        # the client library's first import costs ~0.7 s of CPU: start it now, at the
        # service's start, rather than inside the first round (not awaited: the first
        # causal message must find the subscription)
        self._import = asyncio.create_task(asyncio.to_thread(importlib.import_module,
                                                             "openai"))
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
        if self._holding is not None:
            self._holding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._holding
        for task in list(self.tasks):
            task.cancel()
        await self.lease.release()  # a standby need not wait out the TTL

    async def _renew(self) -> None:
        was = self.lease.is_leader
        now = await (self.lease.renew() if was else self.lease.acquire())
        if now and not was:
            self.ctx.log.info("rlm_lease_held", holder=self.lease.holder)
        elif was and not now:
            self.ctx.log.warning("rlm_lease_lost", holder=self.lease.holder)

    async def _hold(self) -> None:
        """Acquire or renew the lease every third of its TTL, for as long as we run."""
        while True:
            await asyncio.sleep(self.lease.ttl_s / 3)
            try:
                await self._renew()
            except Exception as exc:  # Lease absorbs bus errors; this is a bug, keep going
                self.ctx.log.warning("rlm_lease_error", error=repr(exc)[:300])

    async def _on_causal(self, msg: Any) -> None:
        tick = subjects.tick_of(msg.subject)
        self.latest = max(self.latest, tick)
        try:
            await self.consider(tick, await self.ctx.bus.resolve(msg))
        except Exception as exc:  # a round not started is a round missed, nothing more
            self.ctx.log.warning("rlm_trigger_failed", tick=tick, error=repr(exc)[:300])

    async def consider(self, tick: int, causal: bytes) -> None:
        """Start a round at ``tick`` if one is due and none is running. Only the signals
        are read here, on the event loop the tick's own proposing shares; decoding the
        learnt state and the last plan waits for the round's thread."""
        abs_error = dict(codec.decode(causal, causal_pb2.CausalState).abs_error)
        snapshot = await self.reader.snapshot(tick)
        _, observations = await self.reader.observations(tick)
        signals = tick_signals(snapshot, observation_latencies(observations), abs_error)
        if not self.lease.is_leader:
            return  # another replica runs the rounds
        reasons = self.loop.due(signals)
        if not reasons or self.busy:
            return
        self.loop.started(signals)
        self.busy = True
        plan = await self.reader.raw(tick - 1, "plan", wait=False) if tick > 0 else None
        round_id = f"r{tick}-{self.tag}"
        await emit(self.ctx, round_started(round_id, tick, self.settings.model, reasons), tick,
                   snapshot.time_s)
        self.ctx.log.info("rlm_round_started", tick=tick, round=round_id, reasons=reasons)
        task = asyncio.create_task(self._run(round_id, snapshot, causal, plan, reasons))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, round_id: str, snapshot: Any, causal: bytes, plan: bytes | None,
                   reasons: list[str]) -> None:
        try:
            result, text = await self._in_thread(round_id, snapshot, causal, plan)
            enters = max(self.latest + 1, snapshot.tick + 1)
            outcome = RoundOutcome.of(result, model=self.settings.model, enters_tick=enters,
                                      triggers=reasons)
            if not self.lease.is_leader:  # lost meanwhile: the new holder runs its own
                self.ctx.log.warning("rlm_round_dropped_lease_lost", round=round_id)
                return
            await self.ctx.bus.publish(subjects.tick_subject(enters, subjects.HYPOTHESES),
                                       encode_hypotheses(outcome),
                                       msg_id=f"hypotheses-{round_id}")
            at = snapshot.time_s + (enters - snapshot.tick) * snapshot.tick_s
            for e in round_events(outcome):
                await emit(self.ctx, e, enters, at)
            self.ctx.log.info("rlm_round_published", round=round_id, enters_tick=enters,
                              ok=result.ok, accepted=len(result.hypotheses),
                              dropped=len(result.dropped), tokens=result.spend.tokens)
            if text:
                await asyncio.to_thread(self._write, f"{round_id}.jsonl", text)
        except Exception as exc:
            self.ctx.log.warning("rlm_round_lost", round=round_id, error=repr(exc)[:300])
        finally:
            self.busy = False

    def _round(self, round_id: str, snapshot: Any, causal: bytes, plan: bytes | None
               ) -> tuple[RoundResult, str]:
        """The round itself, off the event loop: the learnt state and the last plan's
        explanations decoded (the ``explain`` tool's), the round run, and its file's text
        when transcripts are kept ("" otherwise)."""
        beliefs, calibrator, _ = planning.decode_causal_state(causal)
        state = KoiState(beliefs=beliefs, calibrator=calibrator, tick=snapshot.tick)
        explanations: tuple[Explanation, ...] = () if plan is None else \
            planning.explanations_from_proto(codec.decode(plan, plan_pb2.ClusterPlan))
        _, _, result = start_round(snapshot, self.ctx.catalog, state, self.planner,
                                   self.settings, self.chat, round_id=round_id,
                                   explanations=explanations)
        if not self.settings.transcripts:
            return result, ""
        return result, round_text(inputs_record(
            snapshot, state, self.settings, round_id=round_id, planner=self.variant,
            backend=self.planner.backend, explanations=explanations), result.transcript)

    async def _in_thread(self, round_id: str, snapshot: Any, causal: bytes,
                         plan: bytes | None) -> tuple[RoundResult, str]:
        """The round on a daemon thread (a process that stops does not wait for it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[RoundResult, str]] = loop.create_future()

        def work() -> None:
            try:
                got = self._round(round_id, snapshot, causal, plan)
                loop.call_soon_threadsafe(_settle, done, got, None)
            except BaseException as exc:  # run_round never raises; this is a bug
                loop.call_soon_threadsafe(_settle, done, None, exc)

        threading.Thread(target=work, name=f"koi-rlm-{round_id}", daemon=True).start()
        return await done

    def _write(self, name: str, text: str) -> None:
        directory = Path(self.settings.transcripts)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text, encoding="utf-8")
        except OSError as err:
            self.ctx.log.warning("rlm_transcript_not_written", dir=str(directory),
                                 error=type(err).__name__)


def _settle(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
