"""Issue 30's paired before/after on runs.jsonl files (koi rows only):
python docs/history/issue30-runs/compare.py BEFORE_DIR... -- AFTER_DIR...
A throwaway analysis script, kept beside the runs it read; not part of the package."""
import json, sys
from pathlib import Path
from koi.bench.stats import compare

def load(dirs, label):
    out = []
    for d in dirs:
        for f in Path(d).rglob("runs.jsonl"):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if "metrics" not in r or r.get("policy") != "koi":
                    continue
                c = r.get("churn") or {}
                m = dict(r["metrics"])
                for k, v in c.items():
                    if isinstance(v, (int, float)):
                        m["churn_" + k] = v
                m["churn_max_flaps_job"] = max((j["flaps"] for j in c.get("jobs", [])), default=None)
                out.append({**r, "policy": label, "metrics": m})
    return out

i = sys.argv.index("--")
before, after = load(sys.argv[1:i], "before"), load(sys.argv[i + 1:], "after")
keys = {(r["scenario"], r["seed"]) for r in before} & {(r["scenario"], r["seed"]) for r in after}
before = [r for r in before if (r["scenario"], r["seed"]) in keys]
after = [r for r in after if (r["scenario"], r["seed"]) in keys]
print(f"{len(keys)} pairs")
print("| run | score before → after | median moves/job-h | moves/job-h | flaps | jobs flapping | disrupted | dropped by move |")
print("|---|---|---|---|---|---|---|---|")
bmap = {(r["scenario"], r["seed"]): r for r in before}
for a in sorted(after, key=lambda r: (r["scenario"], r["seed"])):
    b = bmap[(a["scenario"], a["seed"])]
    def f(r, k, fmt):
        v = r["metrics"].get(k)
        return "nan" if v is None else format(v, fmt)
    cells = [f"{f(b,k,fmt)} → {f(a,k,fmt)}" for k, fmt in (("overall_score", ".2f"), ("churn_median_moves_per_job_hour", ".2f"), ("churn_moves_per_job_hour", ".2f"), ("churn_flaps", ".0f"), ("churn_jobs_with_flaps", ".0f"), ("churn_disrupted_requests", ".0f"), ("churn_dropped_by_move", ".0f"))]
    print(f"| {a['scenario']} s{a['seed']} | " + " | ".join(cells) + " |")
print()
print("after − before (paired, 95 % bootstrap CI):")
for metric in ("overall_score", "churn_median_moves_per_job_hour", "churn_moves_per_job_hour", "churn_flaps", "churn_jobs_with_flaps", "churn_disrupted_requests", "churn_dropped_by_move", "ttft_met_pct", "tpot_met_pct", "batch_progress_pct", "admit_online_pct"):
    try:
        (c,) = compare(before + after, metric, reference="after", higher_is_better=True)
    except (KeyError, ValueError) as e:
        print(metric, "n/a", e); continue
    print(f"  {metric}: mean {c.mean_diff:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}] n={c.n}")
tot = {k: (sum(r["metrics"].get(k) or 0 for r in before), sum(r["metrics"].get(k) or 0 for r in after)) for k in ("churn_disrupted_requests", "churn_dropped_by_move", "churn_total_moves", "churn_flaps")}
for k, (x, y) in tot.items():
    print(f"  total {k}: {x:.0f} → {y:.0f}" + (f" ({100*(y-x)/x:+.1f} %)" if x else ""))
import statistics
for lab, rs in (("before", before), ("after", after)):
    meds = [r["metrics"].get("churn_median_moves_per_job_hour") for r in rs]
    print(f"  {lab}: median over runs of median moves/job-h {statistics.median(meds):.2f}; runs with a flap {sum(1 for r in rs if r['metrics'].get('churn_flaps'))}/{len(rs)}")
