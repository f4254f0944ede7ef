"""Every tick's decisions of a Koi run, as text to compare across commits.

Runs a policy of the Koi family through a scenario (``koi.bench.runner.run_once``) and
writes, per tick, the repr of every action, the plan's notes and each explanation, then
the run's metrics. Two commits that should plan alike give byte-identical files:

    .venv/bin/python scripts/decisions_dump.py hetero-3h --seed 1 -o /tmp/before.txt
    (change the code)
    .venv/bin/python scripts/decisions_dump.py hetero-3h --seed 1 -o /tmp/after.txt
    cmp /tmp/before.txt /tmp/after.txt
"""

from __future__ import annotations

import argparse
import sys

from koi.bench.runner import run_once
from koi.policies import koi as koi_policies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="a shipped scenario, a generated one or a YAML file")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default="koi", help="koi or one of its variants")
    ap.add_argument("-o", "--out", default="-", help="file to write (default: stdout)")
    args = ap.parse_args()
    out = sys.stdout if args.out == "-" else open(args.out, "w")  # noqa: SIM115
    decide = koi_policies._KoiBase.decide

    def recording(self, snapshot, telemetry):  # type: ignore[no-untyped-def]
        decision = decide(self, snapshot, telemetry)
        out.write(f"tick {decision.tick}\n")
        out.writelines(repr(a) + "\n" for a in decision.actions)
        out.write(repr(sorted(decision.notes.items())) + "\n")
        out.writelines(repr(e) + "\n" for e in self.reports[-1].explanations)
        return decision

    koi_policies._KoiBase.decide = recording  # type: ignore[method-assign]
    try:
        result = run_once(args.scenario, args.policy, args.seed)
    finally:
        koi_policies._KoiBase.decide = decide  # type: ignore[method-assign]
    out.write(f"score {result.metrics}\n")
    if out is not sys.stdout:
        out.close()
    print(f"score {result.metrics.overall_score:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
