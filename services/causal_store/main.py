"""causal-store: ``koi.tick.<n>.observations`` → ``koi.tick.<n>.causal``.

The state (beliefs, mechanisms, DRO calibrator, the last tick folded in) lives in the
``koi_causal`` KV bucket, written right after the tick's ``causal`` message is published
and before the observations are acked, so a restart loses nothing and a redelivered
tick is not learnt twice: a tick at the stored one is only re-published, an older one
is dropped. A tick whose body disagrees with its subject, or that is ahead of the clock
(the latest snapshot), is refused to the DLQ with an ``implausible`` event
(``services.runtime.plausible``), so the stored tick never passes the clock. Newly
discovered and retired mechanisms become operator events.

Language-model hypotheses (``koi.tick.*.hypotheses``, followed from the stream's start by
``HypothesisFeed``) set weak priors: before learning a tick, the priors of the hypotheses
in force then are put on the beliefs (``koi.rlm.adopt.with_priors``; expired ones taken
off). One observation outweighs such a prior and only telemetry promotes a mechanism
(its ``source`` then says "rlm"). Without any hypothesis message this changes nothing;
with them, learning also depends on which rounds had arrived when the tick was learnt.
"""

from __future__ import annotations

from collections.abc import Mapping

from koi import subjects
from koi.causal.store import BeliefStore
from koi.dro import DroCalibrator
from koi.planner.settings import KoiSettings, settings_for
from koi.planner.tick import KoiState, learn_from
from koi.rlm.adopt import with_priors
from koi.wire import planning
from services.runtime import plausible, ticks
from services.runtime.app import ServiceContext, main
from services.runtime.consumer import Undecodable
from services.runtime.hypotheses import HypothesisFeed

NAME = "causal-store"


class StateCache:
    """The stored state, decoded again only when the bucket's revision moved (another
    replica or an operator wrote it); the bucket stays the one truth."""

    def __init__(self, settings: KoiSettings) -> None:
        self.revision = -1
        start = KoiState.initial(settings)  # immutable: shared by every empty load
        self.empty: tuple[BeliefStore, DroCalibrator, int] = (start.beliefs,
                                                              start.calibrator, -1)
        self.state = self.empty

    async def load(self, ctx: ServiceContext) -> tuple[BeliefStore, DroCalibrator, int]:
        got = await ctx.bus.kv_get(subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE)
        if got is None:
            return self.empty
        data, revision = got
        if revision != self.revision:
            self.state, self.revision = planning.decode_causal_state(data), revision
        return self.state

    def stored(self, revision: int, state: tuple[BeliefStore, DroCalibrator, int]) -> None:
        self.revision, self.state = revision, state


async def run(ctx: ServiceContext) -> None:
    settings = settings_for(ctx.settings.policy)
    cache = StateCache(settings)
    feed = await HypothesisFeed(ctx.bus, ctx.catalog).start()

    async def handle(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        try:
            tick, observations = planning.decode_observations(data)
        except Exception as exc:
            raise Undecodable(f"observations: {exc}") from exc
        # checked before the state is read: a tick past the clock stored as "the last
        # tick learnt" would make every genuine tick after it look stale, for good
        clock = await ticks.clock_tick(ctx.bus)
        reason = plausible.check_tick(ticks.subject_tick(subject), tick, clock)
        if reason is not None:
            await plausible.refuse(ctx, subject, data, headers, reason, clock)
            return
        beliefs, calibrator, last = await cache.load(ctx)
        if tick < last:
            ctx.log.info("stale_observations", tick=tick, state_tick=last)
            return
        learnt = tick > last
        abs_error: dict[str, float] = {}
        if learnt:
            before = dict(beliefs.mechanisms)
            if feed.seen:  # the weak priors of the hypotheses in force at this tick
                active = feed.loop.active_priors(beliefs.config, tick)
                beliefs = with_priors(beliefs, active, tick)
            beliefs, calibrator, abs_error = learn_from(observations, beliefs, calibrator,
                                                        tick, settings)
        state = planning.encode_causal_state(beliefs, calibrator, tick,
                                             target_coverage=settings.coverage,
                                             readable_beliefs=False, abs_error=abs_error)
        # publish first, store second: learning is deterministic in (stored state, the
        # tick's observations), so a crash in between re-learns the same state from the
        # redelivered observations and re-publishes the same bytes (de-duplicated)
        await ctx.bus.publish(subjects.tick_subject(tick, "causal"), state,
                              msg_id=f"causal-{tick}")
        if learnt:
            revision = await ctx.bus.kv_put(subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE, state)
            cache.stored(revision, (beliefs, calibrator, tick))
            ctx.log.info("learnt", tick=tick, observations=len(observations),
                         belief_version=beliefs.version, **{f"err_{k}": round(v, 4)
                                                            for k, v in abs_error.items()})
            await _mechanism_events(ctx, before, beliefs, tick)

    handle_ = await ctx.bus.consume(subjects.STREAM_TICKS, "causal-store",
                                    subjects.tick_filter("observations"), handle,
                                    service=NAME)
    await ctx.stopping.wait()
    await handle_.stop()
    await feed.stop()


async def _mechanism_events(ctx: ServiceContext, before: dict, beliefs: BeliefStore,
                            tick: int) -> None:
    changed = [(m, before.get(mid)) for mid, m in sorted(beliefs.mechanisms.items())
               if (before.get(mid) is None and m.active)
               or (before.get(mid) is not None and before[mid].active and not m.active)]
    if not changed:
        return
    raw = await ctx.bus.get_last(subjects.tick_subject(tick, "snapshot"))
    at = planning.decode_snapshot(raw).time_s if raw is not None else 0.0
    for m, old in changed:
        if old is None:
            await ctx.event(kind="mechanism_discovered", severity="info", tick=tick,
                            key=m.id, message=m.line(), mechanism_ids=(m.id,),
                            scenario_time_s=at)
        else:
            await ctx.event(kind="mechanism_retired", severity="info", tick=tick, key=m.id,
                            message=f"retired: {m.line()}", mechanism_ids=(m.id,),
                            scenario_time_s=at)


if __name__ == "__main__":
    main(NAME, run)
