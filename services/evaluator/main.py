"""evaluator: ``koi.tick.<n>.candidates`` → ``koi.tick.<n>.plan``.

The coordinator (the replica whose durable consumer got the tick) cuts the candidates
into slices at job boundaries and shares them on ``koi.work.evaluate`` (queue group
``evaluator``); each slice is ``koi.planner.tick.evaluate_stage`` with the kernel behind
the Redis prediction cache. The joined scores are composed into one plan
(``compose_stage``, HiGHS MILP), explained, and published.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from koi import subjects
from koi.cluster import ClusterSnapshot
from koi.planner.churn_settings import ChurnSettings
from koi.planner.evaluate import Evaluated
from koi.planner.propose import Proposal
from koi.planner.settings import settings_for
from koi.planner.stability import ChurnMemory, planning_view, remember
from koi.planner.tick import TickInputs, compose_stage, evaluate_stage, explain_stage, tick_inputs
from koi.v1 import work_pb2
from koi.wire import planning
from services.evaluator.kernel import CachedKernel
from services.runtime.app import ServiceContext, main
from services.runtime.cache import PredictionCache
from services.runtime.consumer import Undecodable
from services.runtime.ticks import TickReader
from services.runtime.work import serve_work, share

NAME = "evaluator"
KEY_CACHE_STATS = "evaluator-cache"
ARRAYS = ("max_rate_rps", "nominal_max_rate_rps", "goodput_tok_s", "ttft_p95_ms",
          "tpot_p95_ms", "kv_pressure", "comm_overhead_frac", "queue_util", "gpus",
          "radius_ttft", "radius_tpot", "slo_risk")


def job_slices(job_ids: list[str], size: int) -> list[tuple[int, int]]:
    """[start, end) slices of about ``size`` candidates, never splitting a job."""
    out, start = [], 0
    for i in range(1, len(job_ids) + 1):
        at_boundary = i == len(job_ids) or job_ids[i] != job_ids[i - 1]
        if at_boundary and (i - start >= size or i == len(job_ids)):
            out.append((start, i))
            start = i
    return out


def to_slice(tick: int, start: int, end: int, ev: Evaluated, candidates: Sequence[Proposal],
             hits: int = 0, misses: int = 0, skipped: int = 0) -> bytes:
    """``ev``, the scores of ``candidates`` (the slice ``start:end``), as a message; each
    row names its candidate by index into the slice (a candidate may have several rows,
    one per margin)."""
    msg = work_pb2.EvaluatedSlice(tick=tick, start=start, end=end, cache_hits=hits,
                                  cache_misses=misses, cache_skipped=skipped)
    index: dict[Proposal, int] = {}
    for k, p in enumerate(candidates):
        index.setdefault(p, k)
    msg.candidate.extend(index[p] for p in ev.proposals)
    for name in ARRAYS:
        getattr(msg, name).extend(getattr(ev, name).tolist())
    msg.slo_feasible.extend(bool(x) for x in ev.slo_feasible)
    return msg.SerializeToString()


def from_slice(msg: work_pb2.EvaluatedSlice, proposals) -> Evaluated:
    arrays = {name: np.array(getattr(msg, name), dtype=float) for name in ARRAYS}
    return Evaluated(proposals=tuple(proposals[msg.start + k] for k in msg.candidate),
                     **arrays,
                     slo_feasible=np.array(msg.slo_feasible, dtype=bool))


async def _tell_cache_health(ctx: ServiceContext, cache: PredictionCache, tick: int) -> None:
    """An event when the prediction cache stops answering, and one when it is back: it
    costs speed, never a decision, but an operator should know it is gone."""
    change = cache.health_change()
    if change == "down":
        await ctx.event(kind="service", severity="warning", tick=tick, key="cache-down",
                        message="the prediction cache (Redis) is not answering: predictions"
                                " are computed without it (slower, the same decisions);"
                                f" retried every {cache.retry_after_s:g} s",
                        attributes={"phase": "cache_down", "errors": str(cache.errors)})
    elif change == "up":
        await ctx.event(kind="service", severity="info", tick=tick, key="cache-up",
                        message="the prediction cache (Redis) answers again",
                        attributes={"phase": "cache_up"})


async def planning_snapshot(reader: TickReader, tick: int, churn: ChurnSettings
                            ) -> ClusterSnapshot:
    """Tick ``tick``'s snapshot as the plan's stages read it (``stability.planning_view``:
    each online job at its planned rate), its rate history read back from the snapshots
    of the window before it on the tick stream, so every replica plans the same rates
    and the in-process planner's memory is matched without per-process state."""
    snapshot = await reader.snapshot(tick)
    if churn.rate_window_s <= 0 or churn.rate_rise_s <= 0:
        return snapshot
    done = reader.cached(tick, "planning")
    if done is not None:
        return done   # this tick's shards read it once
    back = math.ceil(churn.rate_window_s / max(snapshot.tick_s, 1e-9))
    memory = ChurnMemory()
    for k in range(min(back, tick), 0, -1):
        earlier = await reader.snapshot(tick - k, wait=False)
        if earlier is not None:
            memory = remember(memory, earlier)
    view = planning_view(snapshot, remember(memory, snapshot), churn)
    reader.put(tick, "planning", view)
    return view


async def run(ctx: ServiceContext) -> None:
    settings = settings_for(ctx.settings.policy)
    reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)
    cache = PredictionCache(ctx.settings.redis_url or None)
    kernel = CachedKernel(cache, settings.backend)
    last: list[tuple[int, TickInputs]] = []  # the last tick's inputs: its slices share them

    async def inputs_of(tick: int) -> TickInputs:
        if not last or last[0][0] != tick:
            snapshot = await planning_snapshot(reader, tick, settings.churn)
            beliefs, calibrator, _ = await reader.causal(tick)
            last[:] = [(tick, tick_inputs(snapshot, beliefs, calibrator, settings,
                                          ctx.catalog))]
        return last[0][1]

    async def work(data: bytes) -> bytes:
        item = work_pb2.EvaluateWork.FromString(data)
        inputs = await inputs_of(item.tick)
        _, _, proposals = await reader.candidates(item.tick)
        h0, m0, s0 = kernel.hits, kernel.misses, kernel.skipped
        ev = evaluate_stage(proposals[item.start:item.end], inputs, kernel=kernel)
        return to_slice(item.tick, item.start, item.end, ev,
                        proposals[item.start:item.end], kernel.hits - h0,
                        kernel.misses - m0, kernel.skipped - s0)

    async def handle(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        tick = subjects.tick_of(subject)
        ts = time.perf_counter()
        if await ctx.bus.has(subjects.tick_subject(tick, "plan")):
            return  # already done (a redelivery)
        try:
            decoded = await reader.candidates(tick)  # prefetched, or read now
        except Exception as exc:
            raise Undecodable(f"candidates: {exc}") from exc
        _, version, proposals = decoded
        inputs = await inputs_of(tick)
        slices = job_slices([p.job_id for p in proposals], ctx.settings.eval_shard)
        items = [work_pb2.EvaluateWork(tick=tick, start=a, end=b).SerializeToString()
                 for a, b in slices]
        t0 = time.perf_counter()
        answers = [work_pb2.EvaluatedSlice.FromString(a) for a in await share(
            ctx.bus, subjects.WORK_EVALUATE, items, work, ctx.settings.stage_deadline_s / 2)]
        ev = Evaluated.concat([from_slice(a, proposals) for a in answers])
        t1 = time.perf_counter()
        plan = compose_stage(ev, inputs)
        t2 = time.perf_counter()
        explanations = explain_stage(plan, ev, inputs)
        await ctx.bus.publish(subjects.tick_subject(tick, "plan"),
                              planning.encode_plan(tick, plan, explanations, version,
                                                   catalog=ctx.catalog),
                              msg_id=f"plan-{tick}")
        t3 = time.perf_counter()
        hits, misses = sum(a.cache_hits for a in answers), sum(a.cache_misses for a in answers)
        skipped = sum(a.cache_skipped for a in answers)
        stats = {"tick": tick, "hits": hits, "misses": misses, "skipped": skipped,
                 "cache": cache.stats()}
        await ctx.bus.kv_put(subjects.KV_PLAN, KEY_CACHE_STATS, json.dumps(stats).encode())
        await _tell_cache_health(ctx, cache, tick)
        ctx.log.info("evaluated", tick=tick, candidates=len(proposals), slices=len(slices),
                     cache_hits=hits, cache_misses=misses, cache_skipped=skipped,
                     evaluate_s=round(t1 - t0, 4), compose_s=round(t2 - t1, 4),
                     before_s=round(t0 - ts, 4),
                     after_s=round(t3 - t2, 4), solver=str(plan.solver),
                     status=plan.status)

    sub = await serve_work(ctx.bus, subjects.WORK_EVALUATE, subjects.QUEUE_EVALUATOR, work)
    # the tick's snapshot and causal state decoded as they are published, while the
    # proposer works (on another core), so the candidates find them ready; and the
    # candidates themselves, so a replica that is not the tick's coordinator has them
    # ready when its first work item comes
    prefetches = await reader.prefetch(("snapshot", "causal", "candidates"), ctx.log)
    handle_ = await ctx.bus.consume(subjects.STREAM_TICKS, "evaluator",
                                    subjects.tick_filter("candidates"), handle, service=NAME)
    await ctx.stopping.wait()
    await handle_.stop()
    await sub.unsubscribe()
    for p in prefetches:
        await p.unsubscribe()


if __name__ == "__main__":
    main(NAME, run)
