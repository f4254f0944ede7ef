"""Rich/markdown rendering of the predictor's accuracy, fit, GPU step times and demo.

Formatting only: the numbers come from ``koi.predictor.accuracy``, ``.fit``, ``.steps``
and ``.kernel_evidence``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from koi.predictor.accuracy import CaseResult, accuracy_report, summarise
from koi.predictor.kernel_evidence import KernelsComparison
from koi.predictor.steps import LONG_PROMPT, SMALL_BATCH, Spread, StepsComparison

KINDS = ("throughput", "tpot", "ttft")
TARGETS = {"throughput": 0.15, "tpot": 0.20, "ttft": 0.35}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _by_accelerator(results: Sequence[CaseResult]) -> dict[str, dict[str, list[float]]]:
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        table[r.case.config.accelerator][r.case.kind].append(r.ape)
        table[r.case.config.accelerator]["all"].append(r.ape)
    return table


def _cell(values: list[float]) -> str:
    return f"{100 * np.median(values):.1f}% ({len(values)})" if values else "–"


def accuracy_tables(console: Console, *, markdown: bool = False, rows: bool = False,
                    results: Sequence[CaseResult] | None = None) -> None:
    if results is None:
        results, _ = accuracy_report()
    summary = summarise(results)
    if markdown:
        print(markdown_tables(results, summary, rows=rows))
        return
    t = Table(title="Median absolute % error vs public measurements (n cases)")
    t.add_column("metric")
    t.add_column("median APE", justify="right")
    t.add_column("p90 APE", justify="right")
    t.add_column("n", justify="right")
    t.add_column("target", justify="right")
    for kind in KINDS:
        s = summary[f"kind:{kind}"]
        t.add_row(kind, _pct(s["median_ape"]), _pct(s["p90_ape"]), f"{s['n']:.0f}",
                  f"≤ {_pct(TARGETS[kind])}")
    console.print(t)
    t2 = Table(title="By accelerator: median APE (n)")
    for col in ("accelerator", *KINDS, "all"):
        t2.add_column(col, justify="right")
    for accel, groups in sorted(_by_accelerator(results).items()):
        t2.add_row(accel, *(_cell(groups.get(k, [])) for k in (*KINDS, "all")))
    console.print(t2)
    if rows:
        t3 = Table(title="Every case")
        for col in ("row", "case", "measured", "predicted", "error"):
            t3.add_column(col)
        for r in results:
            t3.add_row(str(r.case.row), r.case.label, f"{r.case.value:,.1f}",
                       f"{r.predicted:,.1f}", f"{100 * (r.predicted / r.case.value - 1):+.0f}%")
        console.print(t3)


def markdown_tables(results: Sequence[CaseResult], summary: dict[str, dict[str, float]],
                    *, rows: bool = False) -> str:
    lines = ["| metric | median APE | p90 APE | n | target |", "|---|---|---|---|---|"]
    for kind in KINDS:
        s = summary[f"kind:{kind}"]
        lines.append(f"| {kind} | {_pct(s['median_ape'])} | {_pct(s['p90_ape'])} | "
                     f"{s['n']:.0f} | ≤ {_pct(TARGETS[kind])} |")
    lines += ["", "| accelerator | throughput | TPOT | TTFT | all |", "|---|---|---|---|---|"]
    for accel, groups in sorted(_by_accelerator(results).items()):
        cells = " | ".join(_cell(groups.get(k, [])) for k in (*KINDS, "all"))
        lines.append(f"| {accel} | {cells} |")
    if rows:
        lines += ["", "| row | case | measured | predicted | error |", "|---|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r.case.row} | {r.case.label} | {r.case.value:,.1f} | "
                         f"{r.predicted:,.1f} | {100 * (r.predicted / r.case.value - 1):+.0f}% |")
    return "\n".join(lines)


def _spread(s: Spread | None, fmt: str = "{:.2f}") -> tuple[str, str, str]:
    """(median, range, n) cells of a spread; dashes when the group is empty."""
    if s is None:
        return "–", "–", "0"
    return fmt.format(s.median), f"{fmt.format(s.low)}–{fmt.format(s.high)}", str(s.n)


def _share(value: float | None, of: float, unit: str, scale: float, digits: int) -> str:
    if value is None:
        return "not measured"
    return (f"{value / scale:,.{digits}f} {unit} = {value / of:.2f} of "
            f"{of / scale:,.{digits}f} {unit}")


def steps_summary_tables(c: StepsComparison) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the summary: ratios by group, then efficiencies."""
    s = c.summary
    ratios = [[group, *_spread(spread)] for group, spread in s.ratio.items()]
    effs = [
        [f"HBM bandwidth share, decode b ≤ {SMALL_BATCH}", *_spread(s.mem_share),
         f"eff_mem {s.eff_mem:.2f}"],
        [f"compute share, prefill ≥ {LONG_PROMPT} tokens", *_spread(s.comp_share),
         f"eff_comp {s.eff_comp:.2f}"],
        ["card: copy bandwidth (read + write)", "", "", "",
         _share(s.copy_bytes_per_s, s.hbm_bw, "TB/s", 1e12, 2)],
        ["card: bf16 GEMM 8192³", "", "", "",
         _share(s.gemm_flops, s.peak_flops, "TFLOP/s", 1e12, 0)],
        [f"run-to-run spread per point ({s.runs} runs)", *_spread(s.run_spread, "{:.1%}"), ""],
    ]
    where = f"{s.device} vs catalog {c.accelerator}, trtllm bf16, roofline only"
    return [(f"Predicted / measured pass time ({where})",
             ["points", "median predicted / measured", "range", "n"], ratios),
            ("Implied efficiencies (predictor's bytes or FLOPs ÷ catalog peak × measured time)",
             ["quantity", "median", "range", "n", "calibration table / catalog"], effs)]


def steps_point_table(c: StepsComparison) -> tuple[list[str], list[list[str]]]:
    header = ["model", "tp", "phase", "batch", "ctx", "measured ms", "predicted ms", "ratio",
              "bound", "mem share", "comp share", "run spread"]
    rows = [[r.model, str(r.tp), r.phase, str(r.batch), str(r.ctx), f"{r.measured_s * 1e3:.3f}",
             f"{r.predicted_s * 1e3:.3f}", f"{r.ratio:.2f}", r.bound, f"{r.mem_share:.2f}",
             f"{r.comp_share:.2f}", f"{r.run_spread:.1%}"] for r in c.rows]
    return header, rows


def steps_tables(console: Console, c: StepsComparison, *, markdown: bool = False,
                 rows: bool = False) -> None:
    tables = steps_summary_tables(c)
    if rows:
        tables.append(("Every point (median over runs)", *steps_point_table(c)))
    _print_tables(console, tables, markdown)


def _print_tables(console: Console, tables: list[tuple[str, list[str], list[list[str]]]],
                  markdown: bool) -> None:
    if markdown:
        print("\n\n".join(_markdown(header, body) for _, header, body in tables))
        return
    # a pipe or a log file gets the full tables, not ones squeezed into 80 columns
    wide = console if console.is_terminal else Console(file=console.file, width=160)
    for title, header, body in tables:
        t = Table(title=title)
        for i, col in enumerate(header):
            t.add_column(col, justify="left" if i == 0 else "right")
        for line in body:
            t.add_row(*line)
        wide.print(t)


def kernels_summary_tables(c: KernelsComparison) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows): cells against the tables, layer passes against both
    predictors, and the additivity of mixed passes."""
    cells = [[kind, band, *_spread(spread)] for kind, band, spread in c.cell_bands()]
    passes = [[group, *_spread(t)[:2], *_spread(r)] for group, t, r in c.mixed_ratios()]
    measured, tab, roof = c.additivity_errors()
    adds = [["measured t(b, c) ÷ (t(b, 0) + t(0, c))", *_spread(measured)],
            ["tables: absolute error", *_spread(tab, "{:.3f}")],
            ["roofline: absolute error", *_spread(roof, "{:.3f}")]]
    devices = ", ".join(sorted({str(e.get("device", "?")) for e in c.envs}))
    spread = _spread(c.run_spread(), "{:.1%}")
    where = f"{devices}, {len(c.envs)} runs, run-to-run spread per point {spread[0]} " \
            f"(max {spread[1].split('–')[-1]}); tables {c.system}"
    off = f"; {c.off_grid} measured cells not in the table" if c.off_grid else ""
    return [(f"Table ÷ measured kernel time ({where}{off})",
             ["kernel", "size", "median", "range", "n"], cells),
            ("Predicted ÷ measured time of one decoder layer's pass (kernels only; tables "
             "before the kernel scale)",
             ["pass", "tables median", "range", "roofline median", "range", "n"], passes),
            ("Mixed passes: additivity of decodes and a prompt chunk",
             ["quantity", "median", "range", "n"], adds)]


def kernels_point_table(c: KernelsComparison) -> tuple[list[str], list[list[str]]]:
    header = ["model", "tp", "batch", "chunk", "past", "measured µs", "tables ÷ meas",
              "roofline ÷ meas", "additivity meas / tables / roofline"]
    rows = [[r.model, str(r.tp), str(r.batch), str(r.chunk), str(r.past),
             f"{r.measured_s * 1e6:.1f}", f"{r.tables_s / r.measured_s:.2f}",
             f"{r.roofline_s / r.measured_s:.2f}",
             " / ".join(f"{a:.2f}" for a in r.additivity) if r.additivity else "–"]
            for r in c.mixed]
    return header, rows


def kernels_tables(console: Console, c: KernelsComparison, *, markdown: bool = False,
                   rows: bool = False) -> None:
    tables = kernels_summary_tables(c)
    if rows:
        tables.append(("Every layer pass (median over runs)", *kernels_point_table(c)))
    _print_tables(console, tables, markdown)


def _markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(line) + " |" for line in body])


def calibrate_report(console: Console, *, write: bool, cv: bool) -> None:
    from koi.predictor.fit import cross_validate, fit_and_report
    from koi.predictor.measurements import load_cases

    with console.status("fitting efficiency factors…"):
        cal, summary = fit_and_report(write=write)
    t = Table(title="Fitted efficiency factors")
    t.add_column("group")
    t.add_column("factors")
    for group, table in cal.factors.items():
        if table:
            t.add_row(group, ", ".join(f"{k}={v:.3g}" for k, v in sorted(table.items())))
    console.print(t)
    for kind in KINDS:
        s = summary[f"kind:{kind}"]
        console.print(f"in-sample {kind}: median APE {_pct(s['median_ape'])} (n={s['n']:.0f})")
    if write:
        console.print("wrote libs/koi/predictor/data/calibration.yaml")
    if cv:
        with console.status("leave-one-source-out cross-validation…"):
            held_out = cross_validate(load_cases())
        by_kind: dict[str, list[float]] = defaultdict(list)
        for case, pred in held_out:
            by_kind[case.kind].append(abs(pred - case.value) / case.value)
        for kind in KINDS:
            console.print(f"held-out {kind}: median APE {_pct(float(np.median(by_kind[kind])))}"
                          f" (n={len(by_kind[kind])})")


def demo_report(console: Console) -> None:
    """The predictor on real deployments: predicted vs measured, then a what-if."""
    from koi.predictor.api import predict_many
    from koi.predictor.types import LoadMode, Workload
    from koi.space import engine_default_config

    console.rule("[bold]Koi predictor on public measurements")
    results, _ = accuracy_report()
    picks = [r for r in results if r.case.row in (4, 10, 19, 28, 54, 63, 66, 98, 101)]
    t = Table(title="Predicted vs measured (public benchmarks)")
    for col in ("deployment", "metric", "measured", "predicted", "error"):
        t.add_column(col)
    for r in picks or results[:8]:
        t.add_row(r.case.label.rsplit(" ", 1)[0], r.case.metric, f"{r.case.value:,.1f}",
                  f"{r.predicted:,.1f}", f"{100 * (r.predicted / r.case.value - 1):+.0f}%")
    console.print(t)
    accuracy_tables(console, results=results)

    console.rule("[bold]What-if: llama-3.1-70b chat at 6 req/s (1000 in / 250 out)")
    options = [("h100-sxm", 4, "fp8"), ("h100-sxm", 8, "bf16"), ("h200", 2, "fp8"),
               ("a100-80gb", 4, "bf16"), ("mi300x", 2, "fp8"), ("l40s", 4, "fp8")]
    pairs = []
    for accel, tp, prec in options:
        cfg = engine_default_config("llama-3.1-70b", accel, "vllm", tp=tp,
                                    weight_precision=prec)
        pairs.append((cfg, Workload(1000, 250, LoadMode.RATE, 6.0, slo_ttft_ms=1000,
                                    slo_tpot_ms=60)))
    t = Table(title="One replica each; max rate = highest req/s meeting TTFT p95 ≤ 1 s, "
                    "TPOT p95 ≤ 60 ms")
    for col in ("deployment", "TTFT p95 ms", "TPOT p95 ms", "max rate", "$/Mtok",
                "kv_pressure", "comm_overhead"):
        t.add_column(col, justify="right")
    for (cfg, _), p in zip(pairs, predict_many(pairs), strict=True):
        t.add_row(f"{cfg.accelerator} tp{cfg.tp} {cfg.weight_precision}",
                  f"{p.ttft_p95_ms:,.0f}", f"{p.tpot_p95_ms:.1f}",
                  f"{p.max_rate_under_slo_rps:.2f}", f"{p.cost_per_mtok_usd:.2f}",
                  f"{p.kv_pressure:.2f}", f"{p.comm_overhead_frac:.2f}")
    console.print(t)
    planner_demo(console)


def planner_demo(console: Console, horizon_s: float = 1200.0) -> None:
    """Koi against a naive first-fit on the first minutes of hetero-3h, in-process."""
    import dataclasses

    from rich.progress import Progress, TaskID

    from koi.bench.report import rich_table, summarise
    from koi.bench.runner import run_once
    from koi.scenario import load_scenario

    scn = load_scenario("hetero-3h")
    scn = dataclasses.replace(scn, horizon_s=horizon_s)
    console.rule(f"[bold]The planner on hetero-3h (first {horizon_s / 60:.0f} min, simulated)")
    console.print(f"{scn.total_gpus} GPUs on {len({f.offering.split('/')[0] for f in scn.fleet})}"
                  f" clouds, {len(scn.jobs)} jobs; policies share the simulator and seed")
    results = []
    with Progress(console=console, transient=True) as progress:
        for policy in ("fcfs-first-fit", "koi"):
            task = progress.add_task(policy, total=scn.ticks)

            def advance(done: int, total: int, task: TaskID = task) -> None:
                progress.update(task, completed=done)

            results.append(run_once(scn, policy, 1, on_tick=advance))
    console.print(rich_table(summarise(results)))
    koi_events = [e for e in results[-1].record.events if e.kind in ("launch", "swap",
                                                                      "relaunch", "reject")]
    console.print("[bold]Koi's first decisions:[/bold]")
    for e in koi_events[:8]:
        console.print(f"  t={e.time_s:>5.0f}s {e.kind:<8} {e.job_id}: {e.detail[:110]}")
    console.print("Why a job is where it is: koi explain --scenario hetero-3h --job ID --tick N")
