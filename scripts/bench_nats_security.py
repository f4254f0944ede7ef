"""What TLS and per-user permissions cost on the bus: connection set-up and JetStream
publish/ack round trips, on an embedded NATS started plain and started secure.

    .venv/bin/python scripts/bench_nats_security.py [--messages 2000] [--runs 3]

Prints, for each server, the connection set-up time (connect + first flush, median of 20
connections) and the time per acked 1 KB publish in a loop of ``--messages`` (each
publish waits for its ack, as Koi's stages do); each the median of ``--runs`` runs,
interleaved between the two servers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

from nats.js import api

from services.runtime.embedded import start_nats
from services.runtime.permissions import ADMIN
from services.runtime.security import connect_nats
from services.runtime.settings import NatsAuth


async def _connect_s(url: str, auth: NatsAuth, n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        nc = await connect_nats(url, auth)
        await nc.flush()
        times.append(time.perf_counter() - t0)
        await nc.close()
    return statistics.median(times)


async def _publish_s(url: str, auth: NatsAuth, messages: int) -> float:
    """Seconds per acked publish over one loop of ``messages``."""
    nc = await connect_nats(url, auth)
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name="BENCH", subjects=["bench.>"],
                                         storage=api.StorageType.FILE))
    await js.purge_stream("BENCH")
    payload = b"x" * 1024
    t0 = time.perf_counter()
    for _ in range(messages):
        await js.publish("bench.one", payload)
    elapsed = (time.perf_counter() - t0) / messages
    await nc.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # asyncio warns once per closed TLS connection ("returning true from eof_received()")
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    with start_nats() as plain, start_nats(secure=True) as secure:
        servers = {"plain": (plain.url, NatsAuth()),
                   "TLS + users": (secure.url, secure.security.auth(ADMIN))}
        connect: dict[str, list[float]] = {k: [] for k in servers}
        publish: dict[str, list[float]] = {k: [] for k in servers}
        for _ in range(args.runs):  # interleaved, so a busy machine slows both alike
            for label, (url, auth) in servers.items():
                connect[label].append(asyncio.run(_connect_s(url, auth)))
                publish[label].append(asyncio.run(_publish_s(url, auth, args.messages)))
    for label in servers:
        print(f"{label:12s} connect {statistics.median(connect[label]) * 1e3:6.2f} ms   "
              f"publish+ack {statistics.median(publish[label]) * 1e6:7.1f} µs/msg "
              f"({args.messages} x 1 KB, median of {args.runs} interleaved runs)")


if __name__ == "__main__":
    main()
