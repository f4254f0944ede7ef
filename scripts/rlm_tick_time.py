"""Time the in-process ``koi-rlm`` policy's ticks against ``koi``'s (docs/RLM.md).

Runs the first ``--ticks`` ticks of a scenario twice per repetition — ``koi``, then
``koi-rlm`` pointed at the loopback replay server of the tests
(``tests/support/openai_replay.py``), which answers the first round with one valid
hypothesis (``--job`` on an L4 with 96 sequences) and every later round with an empty
list — and prints each policy's median and p90 wall time of ``decide`` (a round, when one
runs, counted in its tick), with the rounds run and the hypothesis candidates scored.

    .venv/bin/python scripts/rlm_tick_time.py --scenario hetero-3h --ticks 20 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.openai_replay import ReplayServer  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="hetero-3h")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--job", default="chat-us-8b")
    args = ap.parse_args()
    answers = [{"content": json.dumps({"hypotheses": [hypothesis(args.job)]})}]
    answers += [{"content": json.dumps({"hypotheses": []})}] * 200
    timed(args.scenario, "koi", 2, args.seed)  # warm the kernels' caches
    got: dict[str, list[float]] = {"koi": [], "koi-rlm": []}
    notes = []
    with_round: list[float] = []
    for _ in range(args.reps):
        for policy in got:
            with ReplayServer(list(answers)) as srv, tempfile.TemporaryDirectory() as tmp:
                os.environ.update(KOI_RLM_BASE_URL=srv.base_url, KOI_RLM_MODEL="replay",
                                  KOI_RLM_TRANSCRIPTS=tmp)
                times, pol = timed(args.scenario, policy, args.ticks, args.seed)
                got[policy] += times
                if policy == "koi-rlm":
                    notes.append(pol.model_spend())  # type: ignore[attr-defined]
                    rounds_at = {o.round_tick for o in pol.outcomes}  # type: ignore[attr-defined]
                    with_round += [s for i, s in enumerate(times) if i in rounds_at]
    for policy, times in got.items():
        q = statistics.quantiles(times, n=10)
        print(f"{policy:8s} median {statistics.median(times) * 1e3:7.1f} ms   p90"
              f" {q[-1] * 1e3:7.1f} ms   ({len(times)} ticks)")
    ratio = statistics.median(got["koi-rlm"]) / statistics.median(got["koi"])
    print(f"koi-rlm / koi median: {ratio:.3f}")
    if with_round:
        print(f"koi-rlm ticks with a round: median {statistics.median(with_round) * 1e3:.1f}"
              f" ms ({len(with_round)} ticks)")
    for n in notes:
        print("koi-rlm rounds:", {k: n[k] for k in ("rounds", "hypotheses_accepted",
                                                     "candidates_tested", "calls", "tokens")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
