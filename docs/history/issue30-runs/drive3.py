"""Dev driver: gen-medium 1-6 + hetero-3h s1 with the koi policy; runs.jsonl as bench suite
writes it, plus a trace of every flap (the job's actions ±12 min around it, with reasons).
usage: PYTHONPATH=SNAP/libs python drive.py OUTDIR [seeds...]"""
import json
import sys
from pathlib import Path

from koi.bench.report import run_json
from koi.bench.runner import run_once
from koi.catalog import load_catalog
from koi.churn import flaps, moves_of
from koi.policies import koi as kp
from koi.scenario import parse_scenario
from koi.scenario.generate import generate_scenario

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
which = sys.argv[2:] or ["1", "2", "3", "4", "5", "6", "h3"]
cat = load_catalog()
log = []
decide = kp._KoiBase.decide


def rec(self, snapshot, telemetry):
    d = decide(self, snapshot, telemetry)
    rates = {j.id: round(j.observed_rate_rps, 3) for j in snapshot.jobs if j.is_online}
    for a in d.actions:
        log.append((snapshot.time_s, a.job_id, a.kind.value, a.replicas, a.reason[:400],
                    rates.get(a.job_id)))
    return d


kp._KoiBase.decide = rec
done = set()
rp = out / "runs.jsonl"
if rp.exists():
    done = {json.loads(l)["scenario"] for l in rp.read_text().splitlines()}
for w in which:
    log.clear()
    if w == "h3":
        name, scn, seed = "hetero-3h", "hetero-3h", 1
    else:
        seed = int(w)
        name = f"gen-medium-{seed}"
        scn = parse_scenario(generate_scenario(seed, "medium", cat), source=name, catalog=cat)
    if name in done:
        continue
    res = run_once(scn, "koi", seed, catalog=cat)
    r = run_json(res)
    with rp.open("a") as f:
        f.write(json.dumps(r) + "\n")
    mv = moves_of(res.record.events)
    fl = flaps(mv)
    with (out / f"flaps-{name}.txt").open("w") as f:
        f.write(f"score {r['metrics']['overall_score']:.2f} moves {len(mv)} flaps {len(fl)}\n")
        for m in fl:
            f.write(f"\n=== FLAP t={m.time_s:.0f} {m.job_id} {m.kind} {m.before}->{m.after}\n")
            for p in mv:
                if p.job_id == m.job_id and abs(p.time_s - m.time_s) < 1500:
                    f.write(f"  move t={p.time_s:.0f} {p.kind} {p.before}->{p.after}\n")
            for (t, j, k, n, why, rate) in log:
                if j == m.job_id and m.time_s - 1500 < t <= m.time_s + 60:
                    f.write(f"  act t={t:.0f} {k} n={n} rate={rate} | {why}\n")
    with (out / f"moves-{name}.txt").open("w") as f:
        for p in mv:
            f.write(f"{p.time_s:.0f} {p.job_id} {p.kind} {p.before}->{p.after}\n")
    print(name, f"{r['metrics']['overall_score']:.2f}", len(mv), len(fl), flush=True)
