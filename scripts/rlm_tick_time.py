"""Time the in-process ``koi-rlm`` policy's ticks against ``koi``'s (docs/RLM.md).

Runs the first ``--ticks`` ticks of a scenario twice per repetition — ``koi``, then
``koi-rlm`` pointed at the loopback replay server of the tests
(``koi.rlm.replay_server``), which answers the first round with one valid
hypothesis (``--job`` on an L4 with 96 sequences) and every later round with an empty
list — and prints each policy's median and p90 wall time of ``decide`` (a round, when one
runs, counted in its tick), with the rounds run and the hypothesis candidates scored.

    .venv/bin/python scripts/rlm_tick_time.py --scenario hetero-3h --ticks 20 --reps 6

The pairs alternate which policy runs first; the ratio of each pair's medians is the
statistic, reported as its median with a distribution-free interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from koi.rlm.replay_server import ReplayServer


def hypothesis(job: str) -> dict:
    return {"claim": {"cause": "kv_pressure", "effect": "tpot",
                      "scope": {"accelerator": "l4", "engine": "vllm", "size_class": "<=10B"},
                      "direction": "increase", "size": 1.5, "size_low": 1.2, "size_high": 2.0},
            "statement": "L4 thrashes its KV cache earlier than predicted",
            "why": [f"residual:{job}/tpot_p95"],
            "test": {"configs": [{"job_id": job, "config": {"accelerator": "l4", "tp": 1,
                                                             "max_num_seqs": 96}}]},
            "expires_tick": 60}


def timed(scenario: str, policy: str, ticks: int, seed: int) -> tuple[list[float], object]:
    from koi.catalog import load_catalog
    from koi.policies import make_policy
    from koi.scenario import load_scenario
    from koi.sim.simulator import Simulator

    cat = load_catalog()
    scn = load_scenario(scenario)
    pol = make_policy(policy, catalog=cat, seed=seed)
    pol.prepare(scn, seed)
    sim = Simulator(scn, seed=seed, catalog=cat)
    telemetry, times = [], []
    for _ in range(ticks):
        snap = sim.snapshot()
        t0 = time.perf_counter()
        decision = pol.decide(snap, telemetry)
        times.append(time.perf_counter() - t0)
        sim.apply(decision)
        telemetry = sim.advance()
    return times, pol


def median_interval(values: list[float], level: float = 0.9) -> tuple[float, float, float]:
    """(the median, and a distribution-free interval for it at ``level`` or wider: the
    k-th smallest and k-th largest value, k the largest with P(Binomial(n, ½) < k) ≤
    (1 − level)/2)."""
    xs = sorted(values)
    n, k, tail = len(xs), 0, 0.0
    while k < n // 2:
        nxt = tail + math.comb(n, k) / 2 ** n
        if nxt > (1 - level) / 2:
            break
        tail, k = nxt, k + 1
    k = max(k, 1)
    return statistics.median(xs), xs[k - 1], xs[n - k]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="hetero-3h")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--reps", type=int, default=6, help="pairs of runs (koi, koi-rlm);"
                    " the order alternates from one pair to the next")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--job", default="chat-us-8b")
    ap.add_argument("--json", type=Path, default=None, help="write every tick time here")
    args = ap.parse_args()
    answers = [{"content": json.dumps({"hypotheses": [hypothesis(args.job)]})}]
    answers += [{"content": json.dumps({"hypotheses": []})}] * 200
    timed(args.scenario, "koi", 2, args.seed)  # warm the kernels' caches
    got: dict[str, list[float]] = {"koi": [], "koi-rlm": []}
    pairs: list[dict[str, float]] = []
    notes = []
    with_round: list[float] = []
    for rep in range(args.reps):
        order = ["koi", "koi-rlm"] if rep % 2 == 0 else ["koi-rlm", "koi"]
        medians: dict[str, float] = {}
        for policy in order:
            with ReplayServer(list(answers)) as srv, tempfile.TemporaryDirectory() as tmp:
                os.environ.update(KOI_RLM_BASE_URL=srv.base_url, KOI_RLM_MODEL="replay",
                                  KOI_RLM_TRANSCRIPTS=tmp)
                times, pol = timed(args.scenario, policy, args.ticks, args.seed)
                got[policy] += times
                medians[policy] = statistics.median(times)
                if policy == "koi-rlm":
                    notes.append(pol.model_spend())  # type: ignore[attr-defined]
                    rounds_at = {o.round_tick for o in pol.outcomes}  # type: ignore[attr-defined]
                    with_round += [s for i, s in enumerate(times) if i in rounds_at]
        pairs.append(medians)
        print(f"pair {rep + 1} ({order[0]} first): koi {medians['koi'] * 1e3:6.1f} ms,"
              f" koi-rlm {medians['koi-rlm'] * 1e3:6.1f} ms, ratio"
              f" {medians['koi-rlm'] / medians['koi']:.3f}", flush=True)
    for policy, times in got.items():
        q = statistics.quantiles(times, n=10)
        print(f"{policy:8s} median {statistics.median(times) * 1e3:7.1f} ms   p90"
              f" {q[-1] * 1e3:7.1f} ms   ({len(times)} ticks)")
    ratios = [p["koi-rlm"] / p["koi"] for p in pairs]
    mid, lo, hi = median_interval(ratios)
    print(f"koi-rlm / koi, per pair (median tick of each run): median {mid:.3f},"
          f" interval [{lo:.3f}, {hi:.3f}] (>= 90 %, order statistics over"
          f" {len(ratios)} pairs); pooled medians"
          f" {statistics.median(got['koi-rlm']) / statistics.median(got['koi']):.3f}")
    if with_round:
        print(f"koi-rlm ticks with a round: median {statistics.median(with_round) * 1e3:.1f}"
              f" ms ({len(with_round)} ticks)")
    for n in notes[:1]:
        print("koi-rlm rounds (per run):", {k: n[k] for k in (
            "rounds", "hypotheses_accepted", "candidates_tested", "calls", "tokens")})
    if args.json:
        args.json.write_text(json.dumps({"pairs": pairs, "ticks": got,
                                         "with_round": with_round}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
