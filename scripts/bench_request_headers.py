"""Cost of one header on a core NATS request: a plain embedded nats-server, an echo
responder in the same process, 5,000 concurrent requests per pass, alternating without
and with a ``Koi-Deadline-Ms`` header (docs/RELIABILITY.md, "Deadlines past the knee")."""

from __future__ import annotations

import asyncio
import time

import nats

from koi import subjects
from koi.jobs.intake import deadline_header
from services.runtime.embedded import start_nats

N = 5000


async def main(url: str) -> None:
    nc = await nats.connect(url)

    async def echo(msg) -> None:
        await msg.respond(b"ok")

    await nc.subscribe("bench.headers", cb=echo)
    for headers in (None, deadline_header(2.0), None, deadline_header(2.0)):
        t = time.perf_counter()
        await asyncio.gather(*(nc.request("bench.headers", b"p" * 200, timeout=10,
                                          headers=headers) for _ in range(N)))
        label = subjects.HEADER_DEADLINE_MS if headers else "no header"
        print(f"{label:>16}: {(time.perf_counter() - t) / N * 1e6:.1f} us/request")
    await nc.close()


if __name__ == "__main__":
    with start_nats(secure=False) as server:
        asyncio.run(main(server.url))
