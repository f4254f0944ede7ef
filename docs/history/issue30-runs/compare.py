"""Issue 30's paired before/after on runs.jsonl files (koi rows only).

    python docs/history/issue30-runs/compare.py BEFORE_DIR... -- AFTER_DIR...

A throwaway analysis script, kept beside the runs it read; not part of the package.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from koi.bench.stats import compare

COLUMNS = (("overall_score", ".2f"), ("churn_median_moves_per_job_hour", ".2f"),
           ("churn_moves_per_job_hour", ".2f"), ("churn_flaps", ".0f"),
           ("churn_jobs_with_flaps", ".0f"), ("churn_disrupted_requests", ".0f"),
           ("churn_dropped_by_move", ".0f"))
PAIRED = ("overall_score", "churn_median_moves_per_job_hour", "churn_moves_per_job_hour",
          "churn_flaps", "churn_jobs_with_flaps", "churn_disrupted_requests",
          "churn_dropped_by_move", "ttft_met_pct", "tpot_met_pct", "batch_progress_pct",
          "admit_online_pct")
TOTALS = ("churn_disrupted_requests", "churn_dropped_by_move", "churn_total_moves",
          "churn_flaps", "churn_online_disrupted_requests", "churn_online_dropped_by_move",
          "churn_online_relaunches")


def load(dirs: list[str], label: str) -> list[dict]:
    out = []
    for d in dirs:
        for f in Path(d).rglob("runs.jsonl"):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if "metrics" not in r or r.get("policy") != "koi":
                    continue
                m = dict(r["metrics"])
                for k, v in (r.get("churn") or {}).items():
                    if isinstance(v, int | float):
                        m["churn_" + k] = v
                out.append({**r, "policy": label, "metrics": m})
    return out


def cell(r: dict, key: str, fmt: str) -> str:
    v = r["metrics"].get(key)
    return "nan" if v is None else format(v, fmt)


def main(argv: list[str]) -> None:
    i = argv.index("--")
    before, after = load(argv[:i], "before"), load(argv[i + 1:], "after")
    keys = ({(r["scenario"], r["seed"]) for r in before}
            & {(r["scenario"], r["seed"]) for r in after})
    before = [r for r in before if (r["scenario"], r["seed"]) in keys]
    after = [r for r in after if (r["scenario"], r["seed"]) in keys]
    print(f"{len(keys)} pairs")
    print("| run | score | median moves/job-h | moves/job-h | flaps | jobs flapping |"
          " disrupted | dropped by move |")
    print("|---|---|---|---|---|---|---|---|")
    by_key = {(r["scenario"], r["seed"]): r for r in before}
    for a in sorted(after, key=lambda r: (r["scenario"], r["seed"])):
        b = by_key[(a["scenario"], a["seed"])]
        cells = [f"{cell(b, k, f)} → {cell(a, k, f)}" for k, f in COLUMNS]
        print(f"| {a['scenario']} s{a['seed']} | " + " | ".join(cells) + " |")
    print("\nafter − before (paired, 95 % bootstrap CI):")
    for metric in PAIRED:
        try:
            (c,) = compare(before + after, metric, reference="after", higher_is_better=True)
        except (KeyError, ValueError) as e:
            print(f"  {metric}: n/a ({e})")
            continue
        print(f"  {metric}: mean {c.mean_diff:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
              f" n={c.n}")
    for k in TOTALS:
        x = sum(r["metrics"].get(k) or 0 for r in before)
        y = sum(r["metrics"].get(k) or 0 for r in after)
        print(f"  total {k}: {x:.0f} → {y:.0f}" + (f" ({100 * (y - x) / x:+.1f} %)" if x else ""))
    for label, runs in (("before", before), ("after", after)):
        meds = [r["metrics"].get("churn_median_moves_per_job_hour") for r in runs]
        flapping = sum(1 for r in runs if r["metrics"].get("churn_flaps"))
        print(f"  {label}: median over runs of median moves/job-h "
              f"{statistics.median(meds):.2f}; runs with a flap {flapping}/{len(runs)}")


if __name__ == "__main__":
    main(sys.argv[1:])
