"""How the operator event log is made up on one bus run: events by kind and severity.

    .venv/bin/python scripts/event_mix.py --scenario hetero-3h --horizon-s 3600

Starts an embedded NATS, runs the scenario through every service (``BusRun``), then reads
the whole ``KOI_EVENTS`` stream back and prints the count per kind and per severity, and
the share of ``slo_breach`` events, as one JSON object. A measuring tool only: nothing
here is used by the services.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter
from pathlib import Path

import nats

from koi import subjects
from koi.v1 import events_pb2
from koi.wire.planning import EVENT_KINDS, SEVERITIES
from services.runtime.busrun import BusRun
from services.runtime.embedded import start_nats

_KIND = {n: k for k, n in EVENT_KINDS.items()}
_SEVERITY = {n: k for k, n in SEVERITIES.items()}


async def _count(nats_url: str) -> dict:
    nc = await nats.connect(nats_url, connect_timeout=10)
    js = nc.jetstream()
    kinds: Counter[str] = Counter()
    severities: Counter[str] = Counter()
    breach_severities: Counter[str] = Counter()
    try:
        state = (await js.stream_info(subjects.STREAM_EVENTS)).state
        for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
            raw = await js.get_msg(subjects.STREAM_EVENTS, seq)
            ev = events_pb2.OperatorEvent.FromString(raw.data or b"")
            kind, severity = _KIND.get(ev.kind, "?"), _SEVERITY.get(ev.severity, "?")
            kinds[kind] += 1
            severities[severity] += 1
            if kind == "slo_breach":
                breach_severities[severity] += 1
    finally:
        await nc.close()
    total = sum(kinds.values())
    return {"events": total, "slo_breach": kinds["slo_breach"],
            "slo_breach_share": round(kinds["slo_breach"] / total, 4) if total else 0.0,
            "slo_breach_by_severity": dict(breach_severities),
            "by_kind": dict(kinds.most_common()), "by_severity": dict(severities)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="hetero-3h")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--horizon-s", type=float, default=3600.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args()
    server = start_nats()
    try:
        with tempfile.TemporaryDirectory(prefix="koi-event-mix-") as logs:
            result = BusRun(server.url, Path(logs), scenario=args.scenario, seed=args.seed,
                            horizon_s=args.horizon_s, timeout_s=args.timeout_s).run()
            counts = asyncio.run(_count(server.url))
    finally:
        server.stop()
    print(json.dumps({"scenario": args.scenario, "seed": args.seed,
                      "horizon_s": args.horizon_s, "ticks": result.summary.ticks,
                      "wall_s": round(result.wall_s, 1), **counts}, indent=1))


if __name__ == "__main__":
    main()
