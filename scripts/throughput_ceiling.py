"""How close one kernel scale can bring the kernel-table predictor to the throughput rows.

Issue 31's throughput bar is a held-out median (leave-one-source-out) over 56 rows, 44 of
them from one source (TensorRT-LLM's perf-overview page). When that source is held out,
the tables' kernel scale is fitted on the few trtllm rows of the other sources. This
script prints, per source, the held-out median error and what it would be if the scale
were fitted *in-sample* on that source's own covered rows (the geometric median of
measured ÷ predicted): a ceiling for any single scale, not a prediction. Run from the
repository root with the project's venv::

    .venv/bin/python scripts/throughput_ceiling.py
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from koi.predictor.compare import compare_held_out


def main() -> None:
    rows = [r for r in compare_held_out() if "throughput" in r.case.metric]
    by: dict[str, list] = defaultdict(list)
    for r in rows:
        by[r.case.source].append(r)
    print(f"throughput rows: {len(rows)}; held-out median (tables) "
          f"{100 * np.median([r.ape_kernels for r in rows]):.1f} %")
    print("| source | rows | with tables | held-out median | in-sample best scale | "
          "median after |")
    print("|---|---|---|---|---|---|")
    errors = []   # every row's error with its source's in-sample scale (uncovered: as is)
    for source, rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
        errors += [r.ape_kernels for r in rs if r.pass_model == "roofline"]
        covered = [r for r in rs if r.pass_model != "roofline"]
        held = 100 * np.median([r.ape_kernels for r in rs])
        if covered:
            pred = np.array([r.kernels for r in covered])
            meas = np.array([r.case.value for r in covered])
            scale = float(np.exp(np.median(np.log(meas / pred))))
            ape = np.abs(pred * scale - meas) / meas
            errors += list(ape)
            tail = f"{scale:.3f} | {100 * np.median(ape):.1f} % |"
        else:
            tail = "– | – |"
        print(f"| {source} | {len(rs)} | {len(covered)} | {held:.1f} % | {tail}")
    print(f"all {len(errors)} rows, each source at its in-sample scale: median "
          f"{100 * np.median(errors):.1f} %")


if __name__ == "__main__":
    main()
