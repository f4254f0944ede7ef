"""proposer: ``koi.tick.<n>.causal`` → ``koi.tick.<n>.candidates``.

The tick's active jobs are cut into work items on ``koi.work.propose`` that every
proposer replica serves (queue group ``proposer``); each item is
``koi.planner.tick.propose_stage`` for its jobs against the tick's snapshot, causal
state and observations (the running deployments' mediators), read back from the tick
stream. Candidates come back in job order, exactly as the in-process planner orders
them.

With a language-model endpoint configured (docs/RLM.md), the replica holding the
``proposer-rlm`` lease also runs hypothesis rounds beside the ticks
(``services.proposer.rlm``), and every replica follows the
published rounds: the coordinator puts the candidates of the hypotheses in force into
the tick's work items (``ProposeWork.extra``), which each worker adds after its jobs'
own (``koi.rlm.adopt.widen``). Without one nothing here changes.

Each tick logs one ``proposed`` line at its coordinator (``propose_s``: the tick's
message to the joined candidates, ``before_s`` of it before the items were sent) and one
``propose_item`` line per item where it ran (``item_s``); ``koi bench bus --proposers``
reads both (``koi.bench.fanout``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from koi import subjects
from koi.planner.propose import Proposal
from koi.planner.settings import settings_for
from koi.planner.tick import active_jobs, mediator_hints, propose_stage
from koi.rlm.adopt import widen
from koi.v1 import work_pb2
from koi.wire import planning
from services.proposer.rlm import RoundRunner, load_settings
from services.runtime.app import ServiceContext, main
from services.runtime.consumer import Undecodable
from services.runtime.hypotheses import HypothesisFeed
from services.runtime.ticks import TickReader
from services.runtime.work import chunks, serve_work, share

NAME = "proposer"
JOBS_PER_ITEM = 4  # small items balance well over replicas; each costs ~2 ms


async def run(ctx: ServiceContext) -> None:
    settings = settings_for(ctx.settings.policy)
    reader = TickReader(ctx.bus, ctx.settings.stage_deadline_s)
    rlm = await load_settings(ctx)
    feed = await HypothesisFeed(ctx.bus, ctx.catalog, rlm).start() if rlm else None
    # every replica competes for the rounds' lease; its holder alone runs them
    rounds = await RoundRunner(ctx, rlm, reader, settings, ctx.settings.policy).start() \
        if rlm else None

    async def work(data: bytes) -> bytes:
        t0 = time.perf_counter()
        item = work_pb2.ProposeWork.FromString(data)
        snapshot = await reader.snapshot(item.tick)
        version, mechanisms = await reader.mechanisms(item.tick)
        _, observations = await reader.observations(item.tick)
        by_id = {j.id: j for j in active_jobs(snapshot)}
        jobs = [by_id[i] for i in item.job_ids if i in by_id]
        proposals = propose_stage(snapshot, mechanisms, settings, ctx.catalog, jobs=jobs,
                                  hints=mediator_hints(observations))
        if item.extra:
            extra: dict[str, list[Proposal]] = {}
            for i, c in enumerate(item.extra):
                p = planning.proposal_from_proto(c, f"extra[{i}].", catalog=ctx.catalog)
                extra.setdefault(p.job_id, []).append(p)
            proposals = widen(proposals, extra)
        out = planning.encode_candidates(item.tick, version, proposals)
        ctx.log.info("propose_item", tick=item.tick, jobs=len(jobs),
                     item_s=round(time.perf_counter() - t0, 5))
        return out

    async def handle(subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        tick = subjects.tick_of(subject)
        ts = time.perf_counter()
        if await ctx.bus.has(subjects.tick_subject(tick, "candidates")):
            return  # already done (a redelivery)
        try:
            version, _ = await reader.mechanisms(tick)
        except Exception as exc:
            raise Undecodable(f"causal state: {exc}") from exc
        snapshot = await reader.snapshot(tick)
        ids = [j.id for j in active_jobs(snapshot)]
        # the hypotheses in force at this tick (none without the language-model layer)
        extra = feed.loop.extra_candidates(snapshot, ctx.catalog) if feed else {}
        items = [work_pb2.ProposeWork(
                     tick=tick, job_ids=ids[a:b],
                     extra=[planning.proposal_to_proto(p) for j in ids[a:b]
                            for p in extra.get(j, ())]).SerializeToString()
                 for a, b in chunks(len(ids), JOBS_PER_ITEM)]
        t0 = time.perf_counter()
        answers = await share(ctx.bus, subjects.WORK_PROPOSE, items, work,
                              ctx.settings.stage_deadline_s / 2)
        # each answer is a whole CandidateBatch for the same tick and version; protobuf
        # appends repeated fields of concatenated messages, so the bytes join in order
        batch = b"".join(answers) if answers else planning.encode_candidates(tick, version, [])
        t1 = time.perf_counter()
        await ctx.bus.publish(subjects.tick_subject(tick, "candidates"), batch,
                              msg_id=f"candidates-{tick}")
        ctx.log.info("proposed", tick=tick, jobs=len(ids), items=len(items),
                     bytes=len(batch), hypothesis_candidates=sum(map(len, extra.values())),
                     propose_s=round(t1 - ts, 5), before_s=round(t0 - ts, 5),
                     after_s=round(time.perf_counter() - t1, 5))

    sub = await serve_work(ctx.bus, subjects.WORK_PROPOSE, subjects.QUEUE_PROPOSER, work)
    # what a work item reads, decoded as it is published: the coordinator and every
    # other replica then have it when the tick's first item comes (hetero-12h, one
    # proposer: the stage's part before its items 11 → 1 ms, the stage 50 → 37 ms)
    prefetches = await reader.prefetch(("snapshot", "causal-mechanisms", "observations"),
                                       ctx.log)
    handle_ = await ctx.bus.consume(subjects.STREAM_TICKS, "proposer",
                                    subjects.tick_filter("causal"), handle, service=NAME)
    await ctx.stopping.wait()
    await handle_.stop()
    await sub.unsubscribe()
    for p in prefetches:
        await p.unsubscribe()
    for part in (rounds, feed):
        if part is not None:
            await part.stop()


if __name__ == "__main__":
    main(NAME, run)
