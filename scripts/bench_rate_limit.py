"""Per-user rate limits under a flood (docs/RELIABILITY.md, "Per-user rate limits").

A secure embedded NATS (TLS, a user per role, submitters ``flood`` and ``alice``) and
one placer process with the default limit; ``flood`` submits open loop at each
``--rates`` value for ``--duration-s`` while ``alice`` submits at 5/s, each on its own
subject. Printed per rate: what ``flood`` got (accepted, busy for its rate limit, busy
otherwise, unanswered, the busy answers' latency), what ``alice`` got (accepted,
p50/p99), the rate-limit events, whether any busy job was stored, and the placer's CPU
per submission; first, ``alice`` alone as the baseline. ``--no-limit`` runs the placer
with ``KOI_SUBMIT_RATE_PER_S=0``, for comparison; ``--placers 2`` runs two placer
replicas, which share one budget per user (``koi.placer.spent``): ``flood`` should get
about what one bucket allows (burst + rate × duration), not twice it.

    PYTHONPATH=libs:. .venv/bin/python scripts/bench_rate_limit.py --rates 500,2000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import numpy as np

from koi import subjects
from koi.v1 import events_pb2
from services.bench_admission import _ready_watch, cpu_seconds, offer, payloads, stored_counts
from services.runtime.embedded import start_nats
from services.runtime.launcher import Supervisor
from services.runtime.permissions import ADMIN
from services.runtime.security import connect_nats

ALICE_RATE = 5.0
TIMEOUT_S = 2.0


def _ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.array(latencies) * 1e3, q)) if latencies else float("nan")


async def _limit_events(admin) -> int:
    pattern = f"{subjects.EVENTS_PREFIX}.*.overload"
    info = await admin.jetstream().stream_info(subjects.STREAM_EVENTS, subjects_filter=pattern)
    total, seen = sum((info.state.subjects or {}).values()), 0
    if total:
        sub = await admin.jetstream().subscribe(pattern, ordered_consumer=True)
        for _ in range(total):
            ev = events_pb2.OperatorEvent.FromString((await sub.next_msg(timeout=5)).data)
            seen += ev.attributes.get("cause") == "rate_limit"
        await sub.unsubscribe()
    return seen


async def measure(server, rate: float, duration_s: float, cpu, tag: str) -> str:
    sec = server.security
    flood = await connect_nats(server.url, sec.auth("flood"))
    alice = await connect_nats(server.url, sec.auth("alice"))
    admin = await connect_nats(server.url, sec.auth(ADMIN))
    try:
        alice_jobs = payloads(max(1, round(ALICE_RATE * duration_s)), f"alice-{tag}")
        alice_run = offer(alice, alice_jobs, ALICE_RATE, TIMEOUT_S,
                          subject=subjects.job_submit_subject("alice"))
        before = cpu()
        if rate > 0:
            flood_run = offer(flood, payloads(round(rate * duration_s), f"flood-{tag}"), rate,
                              TIMEOUT_S, subject=subjects.job_submit_subject("flood"))
            (f_res, f_window, _), (a_res, _, _) = await asyncio.gather(flood_run, alice_run)
        else:
            f_res, f_window = [], 1.0
            a_res, _, _ = await alice_run
        used = cpu() - before
        stored = await stored_counts(admin.jetstream())
        events = await _limit_events(admin)
    finally:
        for nc in (flood, alice, admin):
            await nc.close()
    stored_ids = {s.rsplit(".", 1)[-1] for s in stored}
    limited = [lat for _, lat, a in f_res if a and not a.accepted and "rate limit" in a.reason]
    busy_other = sum(1 for _, _, a in f_res if a and a.retry_after_ms
                     and "rate limit" not in a.reason)
    stored_busy = sum(1 for j, _, a in f_res if a and a.retry_after_ms and j in stored_ids)
    a_ok = [lat for _, lat, a in a_res if a and a.accepted]
    f_ok = sum(1 for _, _, a in f_res if a and a.accepted)
    n = len(f_res) + len(a_res)
    return (f"flood {rate:>6.0f}/s (sent {len(f_res) / f_window:>6.0f}/s): accepted {f_ok}, "
            f"rate-limited {len(limited)} (p50/p99 {_ms(limited, 50):.1f}/"
            f"{_ms(limited, 99):.1f} ms), other busy {busy_other}, unanswered "
            f"{sum(1 for _, _, a in f_res if a is None)} | alice {len(a_ok)}/{len(a_res)} "
            f"accepted, p50/p99 {_ms(a_ok, 50):.1f}/{_ms(a_ok, 99):.1f} ms | rate-limit "
            f"events {events} | busy stored {stored_busy} | placer CPU "
            f"{used / max(n, 1) * 1e6:.0f} us/submission")


def run(rate: float, duration_s: float, tag: str, log_dir: Path, limit: bool = True,
        placers: int = 1) -> str:
    with start_nats(secure=True, submitters=("flood", "alice")) as server:
        env = {"KOI_NATS_URL": server.url, "KOI_LOG_LEVEL": "warning",
               **({} if limit else {"KOI_SUBMIT_RATE_PER_S": "0"})}
        sup = Supervisor(env=env,
                         log_dir=log_dir / tag, replicas={"placer": placers},
                         service_env=server.security.service_env(("placer",)))

        def cpu() -> float:
            return sum(cpu_seconds(c.proc.pid) for c in sup.children)

        async def go() -> str:
            nc = await connect_nats(server.url, server.security.auth(ADMIN))
            try:
                ready = await _ready_watch(nc, placers)
                sup.start(("placer",))
                await asyncio.wait_for(ready.wait(), 60.0)
            finally:
                await nc.close()
            return await measure(server, rate, duration_s, cpu, tag)

        try:
            return asyncio.run(go())
        finally:
            sup.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="500,2000", help="flood rates, comma-separated")
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--no-limit", action="store_true", help="the placer unlimited")
    parser.add_argument("--placers", type=int, default=1, help="placer replicas")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="koi-rate-limit-"))
    for i, rate in enumerate([0.0, *(float(r) for r in args.rates.split(","))]):
        print(run(rate, args.duration_s, f"r{i}", log_dir, not args.no_limit, args.placers),
              flush=True)


if __name__ == "__main__":
    main()
