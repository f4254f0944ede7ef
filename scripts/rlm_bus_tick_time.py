"""Time the bus's ticks with the hypothesis layer on against the same ticks without it.

Paired runs of a scenario through the bus (every service its own process, fresh NATS and
valkey each run, as ``koi bench bus`` runs them), alternating which goes first: one
without ``KOI_RLM_*``, one with the proposer pointed at a loopback replay server
(``koi.rlm.replay_server``) that answers the first round with one valid hypothesis and
every later one with an empty list, each answer after ``--delay-s`` (a model that takes
its time: the rounds run beside the ticks, so a tick should not see it). Rounds are made
frequent (``--period`` ticks apart). A tick's time is the stream timestamp of its
``actions`` minus that of its ``snapshot``: the planning pipeline, sim excluded. Prints
each run's median tick, each pair's ratio, and the median ratio with a
distribution-free interval.

    .venv/bin/python scripts/rlm_bus_tick_time.py --horizon-s 1200 --pairs 6
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from koi import subjects  # noqa: E402
from koi.rlm.replay_server import ReplayServer  # noqa: E402
from rlm_tick_time import hypothesis, median_interval  # noqa: E402
from services.runtime.busrun import BusRun  # noqa: E402
from services.runtime.embedded import start_nats, start_valkey  # noqa: E402
from services.runtime.security import connect_nats  # noqa: E402


async def stamps(url: str, stage: str) -> dict[int, float]:
    """tick → the stream timestamp (s) of its ``stage`` message."""
    nc = await connect_nats(url)
    sub = await nc.jetstream().subscribe(subjects.tick_filter(stage), ordered_consumer=True)
    out: dict[int, float] = {}
    try:
        while True:
            msg = await sub.next_msg(timeout=1.0)
            out.setdefault(subjects.tick_of(msg.subject), msg.metadata.timestamp.timestamp())
    except Exception:
        pass
    await nc.close()
    return out


STAGES = ("snapshot", "observations", "causal", "candidates", "plan", "actions")


def one_run(scenario: str, seed: int, horizon_s: float, env: dict[str, str]
            ) -> tuple[list[float], int, dict[str, list[float]]]:
    """(tick times in s, hypothesis rounds published, per stage the time from the
    previous stage's message to its own, per tick) of one bus run."""
    logs = Path(tempfile.mkdtemp(prefix="koi-rlm-bus-"))
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("KOI_RLM_")}
    try:
        with start_nats(store_dir=logs / "js") as nats, start_valkey() as cache:
            BusRun(nats.url, logs / "logs", scenario, seed, horizon_s, cache.url,
                   timeout_s=1800, extra_env=env).run()
            at = {stage: asyncio.run(stamps(nats.url, stage)) for stage in STAGES}
            rounds = len(asyncio.run(stamps(nats.url, subjects.HYPOTHESES)))
    finally:
        os.environ.update(saved)
    snaps, acts = at["snapshot"], at["actions"]
    ticks = [t for t in sorted(acts) if all(t in at[s] for s in STAGES)]
    stages = {b: [at[b][t] - at[a][t] for t in ticks]
              for a, b in itertools.pairwise(STAGES)}
    return [acts[t] - snaps[t] for t in ticks], rounds, stages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="hetero-3h")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--horizon-s", type=float, default=1200.0)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--period", type=int, default=3, help="KOI_RLM_TRIGGER_PERIOD_TICKS")
    ap.add_argument("--delay-s", type=float, default=2.0, help="the model's answer time")
    ap.add_argument("--job", default="chat-us-8b")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    answers = [{"content": json.dumps({"hypotheses": [hypothesis(args.job)]}),
                "delay_s": args.delay_s},
               {"content": json.dumps({"hypotheses": []}), "delay_s": args.delay_s}]
    runs: list[dict] = []
    for pair in range(args.pairs):
        order = ["off", "on"] if pair % 2 == 0 else ["on", "off"]
        got: dict[str, float] = {}
        for mode in order:
            env: dict[str, str] = {}
            with ReplayServer(answers, repeat_last=True) as srv:
                if mode == "on":
                    env = {"KOI_RLM_BASE_URL": srv.base_url, "KOI_RLM_MODEL": "replay-model",
                           "KOI_RLM_TRIGGER_PERIOD_TICKS": str(args.period),
                           "KOI_RLM_COOLDOWN_TICKS": "1"}
                times, rounds, stages = one_run(args.scenario, args.seed, args.horizon_s,
                                                env)
                calls = srv.calls
            got[mode] = statistics.median(times)
            runs.append({"pair": pair, "mode": mode, "ticks": times, "rounds": rounds,
                         "calls": calls, "stages": stages})
            per_stage = ", ".join(f"{k} {statistics.median(v) * 1e3:.0f}"
                                  for k, v in stages.items())
            print(f"pair {pair + 1} {mode:3s}: median tick {got[mode] * 1e3:7.1f} ms over"
                  f" {len(times)} ticks; {rounds} rounds published, {calls} model calls;"
                  f" stages (ms, median): {per_stage}", flush=True)
        print(f"pair {pair + 1}: on/off {got['on'] / got['off']:.3f}", flush=True)
    ratios = [statistics.median(a["ticks"]) / statistics.median(b["ticks"])
              for a, b in zip([r for r in runs if r["mode"] == "on"],
                              [r for r in runs if r["mode"] == "off"], strict=True)]
    mid, lo, hi = median_interval(ratios)
    pooled = {m: statistics.median([t for r in runs if r["mode"] == m for t in r["ticks"]])
              for m in ("on", "off")}
    print(f"on/off per pair: median {mid:.3f}, interval [{lo:.3f}, {hi:.3f}] (>= 90 %,"
          f" order statistics over {len(ratios)} pairs); pooled medians"
          f" {pooled['on'] * 1e3:.1f} / {pooled['off'] * 1e3:.1f} ms ="
          f" {pooled['on'] / pooled['off']:.3f}")
    for mode in ("off", "on"):
        pooled_stages = {k: statistics.median([x for r in runs if r["mode"] == mode
                                               for x in r["stages"][k]])
                         for k in runs[0]["stages"]}
        print(f"{mode:3s} stages, pooled medians (ms): " + ", ".join(
            f"{k} {v * 1e3:.0f}" for k, v in pooled_stages.items()))
    if args.json:
        args.json.write_text(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
