"""Figures of one benchmark run, from its ``RunRecord`` (matplotlib, Agg backend).

``write_plots(result, out_dir)`` writes three PNGs named
``<scenario>-<policy>-s<seed>-{gpus,slo,cost}.png``:

- ``gpus``: per-job GPU assignment over time, one band per job, stacked by GPU family
  (colour) with band height ∝ GPUs held (the largest holding fills a row), and markers
  for placement (launch), swap, rank relaunch and spot preemption events — the
  preprint's assignment-timeline figure;
- ``slo``: the fleet's TTFT and TPOT met fractions per tick (weighted over the online
  requests that completed in the tick; 1.0 where none completed);
- ``cost``: spend rate ($/hour) per tick and the cumulative spend.

Drawing only: no simulation and no metrics beyond what the record holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display, also under a GUI-less CI

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from koi.bench.runner import RunResult
from koi.records import RunRecord

KINDS = ("gpus", "slo", "cost")
EVENT_STYLE: dict[str, tuple[str, str, str]] = {   # kind → (marker, colour, legend label)
    "launch": ("^", "#1a9850", "placement (launch)"),
    "swap": ("D", "#f46d43", "swap"),
    "relaunch": ("s", "#762a83", "rank relaunch"),
    "preemption": ("x", "#d73027", "spot preemption"),
}
DPI = 110


def plot_paths(result: RunResult, out_dir: Path | str) -> dict[str, Path]:
    """Where ``write_plots`` puts each figure."""
    stem = _safe(f"{result.scenario}-{result.policy}-s{result.seed}")
    return {k: Path(out_dir) / f"{stem}-{k}.png" for k in KINDS}


def write_plots(result: RunResult, out_dir: Path | str) -> dict[str, Path]:
    """Write the three figures of one run; returns their paths keyed by kind."""
    paths = plot_paths(result, out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    title = f"{result.scenario} · {result.policy} · seed {result.seed}"
    for kind, draw in (("gpus", gpu_figure), ("slo", slo_figure), ("cost", cost_figure)):
        fig = draw(result.record, title)
        try:
            fig.savefig(paths[kind], dpi=DPI, bbox_inches="tight")
        finally:
            plt.close(fig)
    return paths


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _times_h(rec: RunRecord) -> list[float]:
    """Tick start times plus the horizon, in hours (edges of ``step(where='post')``)."""
    return [t.time_s / 3600.0 for t in rec.timeline] + [rec.horizon_s / 3600.0]


def _steps(values: Sequence[float], n: int) -> list[float]:
    """Per-tick values padded to the ``n`` edges of a ``where='post'`` step plot."""
    return [*values, values[-1]] if values else [0.0] * n


def _job_order(rec: RunRecord) -> list[str]:
    """Jobs in scenario order, those never given a GPU included (an empty row says so)."""
    return [j.job_id for j in rec.jobs]


def gpu_figure(rec: RunRecord, title: str) -> plt.Figure:
    jobs = _job_order(rec)
    row = {j: i for i, j in enumerate(jobs)}
    families = sorted({f for t in rec.timeline for fams in t.gpus_by_job.values()
                       for f in fams})
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    peak = max((sum(fams.values()) for t in rec.timeline for fams in t.gpus_by_job.values()),
               default=0)
    scale = 0.85 / peak if peak else 0.0
    edges = _times_h(rec)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.32 * max(len(jobs), 1)))
    for job in jobs:
        held = _steps([sum(t.gpus_by_job.get(job, {}).values()) for t in rec.timeline],
                      len(edges))
        lo = [row[job] - scale * g / 2.0 for g in held]   # bands centred on the job's row
        for fam in families:
            per_tick = [t.gpus_by_job.get(job, {}).get(fam, 0) for t in rec.timeline]
            if not any(per_tick):
                continue
            g = _steps(per_tick, len(edges))
            hi = [a + scale * x for a, x in zip(lo, g, strict=True)]
            ax.fill_between(edges, lo, hi, step="post", color=colours[fam], linewidth=0)
            lo = hi
    seen: set[str] = set()
    for ev in rec.events:
        style = EVENT_STYLE.get(ev.kind)
        if style is None or ev.job_id not in row:
            continue
        marker, colour, _ = style
        ax.plot(ev.time_s / 3600.0, row[ev.job_id], marker=marker, color=colour,
                markersize=6, markeredgecolor="black", markeredgewidth=0.4, linestyle="")
        seen.add(ev.kind)
    ax.set_yticks(range(len(jobs)), jobs, fontsize=7)
    ax.set_ylim(len(jobs) - 0.5, -0.5)
    ax.set_xlim(-0.01 * rec.horizon_s / 3600.0, rec.horizon_s / 3600.0)
    ax.set_xlabel("time (h)")
    ax.set_title(f"{title}: GPUs per job (band height ∝ GPUs, peak {peak})")
    ax.grid(axis="x", alpha=0.3)
    handles: list = [Patch(color=colours[f], label=f) for f in families]
    handles += [Line2D([], [], marker=EVENT_STYLE[k][0], color=EVENT_STYLE[k][1],
                       linestyle="", markeredgecolor="black", label=EVENT_STYLE[k][2])
                for k in EVENT_STYLE if k in seen]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8, frameon=False)
    return fig


def slo_figure(rec: RunRecord, title: str) -> plt.Figure:
    edges = _times_h(rec)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for attr, label, colour in (("ttft_met_frac", "TTFT met", "#4575b4"),
                                ("tpot_met_frac", "TPOT met", "#d73027")):
        v = [100.0 * getattr(t, attr) for t in rec.timeline]
        ax.step(edges, _steps(v, len(edges)), where="post",
                label=label, color=colour)
    ax.set_ylim(-2, 102)
    ax.set_xlim(0, rec.horizon_s / 3600.0)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("requests meeting SLO (%)")
    ax.set_title(f"{title}: SLO attainment per tick (100% where no request completed)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return fig


def cost_figure(rec: RunRecord, title: str) -> plt.Figure:
    edges = _times_h(rec)
    rate = [t.spend_usd_per_hour for t in rec.timeline]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.step(edges, _steps(rate, len(edges)), where="post",
            color="#1b7837", label="spend rate ($/h)")
    ax.set_xlim(0, rec.horizon_s / 3600.0)
    ax.set_ylim(0, 1.15 * max(rate, default=0.0) or 1.0)  # a flat rate must not hide
    ax.set_xlabel("time (h)")                                # under the frame
    ax.set_ylabel("$/hour")
    ax.grid(alpha=0.3)
    cum, total = [0.0], 0.0
    for t, r in zip(rec.timeline, rate, strict=True):
        nxt = edges[len(cum)]
        total += r * (nxt - t.time_s / 3600.0)
        cum.append(total)
    ax2 = ax.twinx()
    ax2.plot(edges[: len(cum)], cum, color="#762a83", linestyle="--", label="cumulative $")
    ax2.set_ylim(0, 1.15 * cum[-1] or 1.0)
    ax2.set_ylabel("cumulative $")
    ax.set_title(f"{title}: fleet spend (total ${rec.spend_usd:,.0f})")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    return fig


__all__ = ["KINDS", "cost_figure", "gpu_figure", "plot_paths", "slo_figure", "write_plots"]
