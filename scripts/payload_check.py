"""Run a scenario through the bus under a given NATS ``max_payload`` and report what
crossed it (issue 25, defect 1: the pipeline stalled for good once a stage output
outgrew the server's 1 MiB default).

Starts an embedded NATS with ``--max-payload-mb`` (and valkey), runs every service as a
process (``BusRun``) on the scenario cut to ``--ticks`` ticks, optionally submits
``--extra-jobs`` copies of the scenario's jobs (new ids) at tick 1, then reads the
streams back and prints, as JSON: the largest message per stage (its payload size, the
blob's when it went as a reference), blob references per tick, the ``degraded_tick`` and
``bus_error`` events, and the seconds per tick (snapshot to snapshot, from the stream's
own timestamps).

    .venv/bin/python scripts/payload_check.py --max-payload-mb 1 --ticks 50
    .venv/bin/python scripts/payload_check.py --max-payload-mb 1 --ticks 50 --extra-jobs 60
    .venv/bin/python scripts/payload_check.py --blob-cost   # what one blob round trip costs

It is slow (minutes), so it is a script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from koi import subjects
from koi.scenario import load_scenario
from koi.v1 import jobs_pb2
from koi.wire.codec import encode_job
from services.runtime.blobs import HEADER_BLOB, HEADER_BLOB_SIZE
from services.runtime.bus import Bus
from services.runtime.busrun import BusRun
from services.runtime.connection import connect
from services.runtime.embedded import start_nats, start_valkey
from services.runtime.launcher import Supervisor
from services.runtime.logs import configure_logging
from services.runtime.security import submit_subject


def extra_jobs(scenario: str, n: int) -> list:
    """``n`` copies of the scenario's jobs, round robin, with new ids, submitted now."""
    jobs = load_scenario(scenario).jobs
    return [dataclasses.replace(jobs[i % len(jobs)], id=f"{jobs[i % len(jobs)].id}-x{i}",
                                submit_s=0.0) for i in range(n)]


async def submit(url: str, jobs: list) -> Counter:
    bus = await connect(url, "payload-check-submit", wait_s=10)
    outcome: Counter = Counter()
    try:
        for job in jobs:
            for _ in range(20):  # the placer may still be starting: retry a while
                try:
                    ack = jobs_pb2.JobAck.FromString(
                        await bus.request(submit_subject(), encode_job(job), 2.0))
                except Exception:
                    await asyncio.sleep(0.25)
                    continue
                outcome["accepted" if ack.accepted else f"refused: {ack.reason}"] += 1
                break
            else:
                outcome["unanswered"] += 1
    finally:
        await bus.close()
    return outcome


async def read_stream(bus: Bus, subject: str) -> list:
    """Every message stored on ``subject`` (a wildcard), oldest first, without payloads
    resolved: the point is what went over the wire."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5.0)
            out.append(msg)
            if msg.metadata.num_pending == 0:
                return out
    except TimeoutError:
        return out
    finally:
        await sub.unsubscribe()


def sizes(messages: list) -> dict:
    """Per stage: the largest payload, the largest message on the wire, references."""
    per: dict[str, dict] = defaultdict(lambda: {"max_bytes": 0, "max_wire_bytes": 0,
                                                "messages": 0, "blob_refs": 0})
    refs_per_tick: Counter = Counter()
    for m in messages:
        parts = m.subject.split(".")
        stage = parts[-1] if parts[1] == "tick" else parts[1]
        headers = m.headers or {}
        size = int(headers.get(HEADER_BLOB_SIZE, len(m.data)))
        row = per[stage]
        row["messages"] += 1
        row["max_bytes"] = max(row["max_bytes"], size)
        row["max_wire_bytes"] = max(row["max_wire_bytes"], len(m.data) + sum(
            len(k) + len(v) + 4 for k, v in headers.items()))
        if HEADER_BLOB in headers:
            row["blob_refs"] += 1
            refs_per_tick[subjects.tick_of(m.subject)] += 1
    return {"per_stage": dict(per), "refs_per_tick": refs_per_tick}


def tick_seconds(messages: list) -> list[float]:
    """Wall seconds from each snapshot to the next (the stream's timestamps)."""
    stamps = {subjects.tick_of(m.subject): m.metadata.timestamp for m in messages
              if m.subject.endswith(".snapshot")}
    ticks = sorted(stamps)
    return [(stamps[b] - stamps[a]).total_seconds() for a, b in itertools.pairwise(ticks)
            if b == a + 1]


async def analyse(url: str) -> dict:
    bus = await connect(url, "payload-check-read", wait_s=10)
    try:
        ticks = await read_stream(bus, "koi.tick.>")
        telemetry = await read_stream(bus, "koi.telemetry.>")
        events = await read_stream(bus, "koi.events.>")
        objects = await bus.js.stream_info(f"OBJ_{subjects.OBJ_BLOBS}",
                                           subjects_filter=f"$O.{subjects.OBJ_BLOBS}.M.>")
    finally:
        await bus.close()
    stats = sizes(ticks + telemetry)
    per_tick = stats["refs_per_tick"]
    n_ticks = 1 + max((subjects.tick_of(m.subject) for m in ticks), default=-1)
    kinds = Counter(m.subject.rsplit(".", 1)[1] for m in events)
    secs = tick_seconds(ticks)
    return {
        "ticks": n_ticks,
        "per_stage": stats["per_stage"],
        "blob_refs_per_tick": {"max": max(per_tick.values(), default=0),
                               "mean": sum(per_tick.values()) / max(1, n_ticks),
                               "ticks_with_refs": len(per_tick)},
        "blobs_stored": len(objects.state.subjects or {}),  # stream refs + work answers
        "degraded_ticks": kinds["degraded_tick"],
        "bus_errors": kinds["bus_error"],
        "tick_s": {"median": statistics.median(secs) if secs else None,
                   "mean": statistics.fmean(secs) if secs else None,
                   "max": max(secs, default=None)},
    }


async def blob_cost(url: str, size: int, repeats: int) -> dict:
    """Median seconds to publish ``size`` random bytes on a tick subject and read them
    back with ``get_last`` (a blob round trip when they exceed the server's limit)."""
    bus = await connect(url, "payload-check-cost", wait_s=10)
    await bus.ensure_streams()
    await bus.ensure_kv()
    pub, get = [], []
    try:
        for i in range(repeats):
            data = os.urandom(size)
            subject = subjects.tick_subject(10_000 + i, "candidates")
            t0 = time.perf_counter()
            await bus.publish(subject, data)
            t1 = time.perf_counter()
            assert await bus.get_last(subject) == data
            pub.append(t1 - t0)
            get.append(time.perf_counter() - t1)
    finally:
        await bus.close()
    return {"bytes": size, "blob": not bus.blobs.fits(b"\0" * size),
            "publish_ms": round(statistics.median(pub) * 1e3, 1),
            "get_last_ms": round(statistics.median(get) * 1e3, 1)}


def blob_costs(sizes_mb: list[float], payloads_mb: tuple[int, ...] = (1, 8),
               repeats: int = 9) -> list[dict]:
    out = []
    for mb in payloads_mb:
        with start_nats(max_payload_mb=mb) as nats:
            for size in sizes_mb:
                row = asyncio.run(blob_cost(nats.url, int(size * 1e6), repeats))
                out.append({"max_payload_mb": mb, **row})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blob-cost", action="store_true",
                    help="only time publish + get_last of 0.5, 1.5 and 5 MB payloads on "
                         "1 MiB (blobs) and 8 MiB (inline) servers")
    ap.add_argument("--scenario", default="hetero-12h")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ticks", type=int, default=50)
    ap.add_argument("--max-payload-mb", type=int, default=1)
    ap.add_argument("--extra-jobs", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=60.0,
                    help="KOI_STAGE_DEADLINE_S: a stalled tick costs this much")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    args = ap.parse_args()
    configure_logging("payload-check", "warning", "console")  # stdout is the JSON alone
    if args.blob_cost:
        json.dump(blob_costs([0.5, 1.5, 5.0]), sys.stdout, indent=2)
        print()
        return 0

    scn = load_scenario(args.scenario)
    logs = Path(tempfile.mkdtemp(prefix="koi-payload-"))
    submitted: Counter = Counter()
    with start_nats(store_dir=logs / "js", max_payload_mb=args.max_payload_mb) as nats, \
            start_valkey() as cache:
        def on_tick(tick: int, sup: Supervisor) -> None:
            if tick == 1 and args.extra_jobs and not submitted:
                jobs = extra_jobs(args.scenario, args.extra_jobs)
                submitted.update(asyncio.run(submit(nats.url, jobs)))

        run = BusRun(nats.url, logs / "logs", args.scenario, args.seed,
                     args.ticks * scn.tick_s, cache.url, timeout_s=args.timeout_s,
                     extra_env={"KOI_STAGE_DEADLINE_S": repr(args.deadline_s)})
        t0 = time.perf_counter()
        result = run.run(on_tick)
        report = asyncio.run(analyse(nats.url))
    report.update({"scenario": args.scenario, "max_payload_mb": args.max_payload_mb,
                   "extra_jobs": args.extra_jobs, "submitted": dict(submitted),
                   "wall_s": round(time.perf_counter() - t0, 1),
                   "restarts": {k: v for k, v in result.restarts.items() if v},
                   "logs": str(logs)})
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
