"""Is Koi learning? Prediction error, DRO radius, coverage and mechanisms over a run.

Runs a Koi-family policy through a scenario and collects what each tick's report says:
the median |log(observed / corrected prediction)| of TTFT and TPOT (means and p95s) and
throughput, the DRO radius per outcome and its realised coverage, and the playbook's
active / applicable / cumulative mechanism counts. ``summary`` compares the first and
last third of the run; ``plot`` draws the curves. Also used by ``koi explain`` to replay
a run to a tick.
"""

from __future__ import annotations

import csv
import math
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from koi.catalog import load_catalog
from koi.dro import OUTCOMES
from koi.planner.settings import KoiSettings
from koi.planner.tick import TickReport
from koi.policies import make_policy
from koi.scenario import load_scenario
from koi.scenario.types import Scenario


@runtime_checkable
class _Reporting(Protocol):
    """A Koi-family policy: it keeps its per-tick planner reports and its settings."""

    settings: KoiSettings
    reports: list[TickReport]


@dataclass(frozen=True)
class LearningRun:
    scenario: str
    policy: str
    seed: int
    reports: tuple[TickReport, ...]
    events: tuple = ()
    coverage_target: float = math.nan   # the calibrator's target (the policy's settings)
    rounds: tuple = ()                  # koi-rlm: its hypothesis rounds (RoundOutcome)


def replay(scenario: Scenario | str, policy: str = "koi", seed: int = 1, *,
           until_tick: int | None = None,
           on_tick: Callable[[int, int], None] | None = None) -> LearningRun:
    """Run ``policy`` (a Koi-family policy) and keep its per-tick reports."""
    from koi.sim import Simulator

    scn = load_scenario(scenario) if isinstance(scenario, str) else scenario
    cat = load_catalog()
    pol = make_policy(policy, catalog=cat, seed=seed)
    if not isinstance(pol, _Reporting):
        raise ValueError(f"{policy!r} keeps no planner reports; use koi or an ablation")
    pol.prepare(scn, seed)
    sim = Simulator(scn, seed=seed, catalog=cat)
    telemetry: list = []
    while not sim.done:
        snap = sim.snapshot()
        sim.apply(pol.decide(snap, telemetry))
        if until_tick is not None and snap.tick >= until_tick:
            break
        telemetry = sim.advance()
        if on_tick is not None:
            on_tick(sim.tick, scn.ticks)
    events = sim.record(policy).events
    return LearningRun(scn.name, policy, seed, tuple(pol.reports), events,
                       coverage_target=pol.settings.coverage,
                       rounds=tuple(getattr(pol, "outcomes", ())))


def series(run: LearningRun) -> dict[str, np.ndarray]:
    """Per-tick columns (NaN where a tick had nothing to say)."""
    r = run.reports
    out = {"tick": np.array([x.tick for x in r], dtype=float)}
    for o in OUTCOMES:
        out[f"abs_error_{o}"] = np.array([x.abs_error.get(o, math.nan) for x in r])
    for o in ("ttft_p95", "tpot_p95", "throughput"):
        out[f"radius_{o}"] = np.array([x.radii.get(o, math.nan) for x in r])
    for o in ("ttft_p95", "tpot_p95"):
        out[f"coverage_{o}"] = np.array([x.coverage.get(o, math.nan) for x in r])
    out["mechanisms_active"] = np.array([x.mechanisms_active for x in r], dtype=float)
    out["mechanisms_applicable"] = np.array([x.mechanisms_applicable for x in r], dtype=float)
    out["mechanisms_discovered"] = np.array([x.mechanisms_discovered for x in r], dtype=float)
    out["tick_s"] = np.array([x.stage_s.get("total", math.nan) for x in r])
    return out


def summary(run: LearningRun) -> dict[str, float]:
    """First vs last third of the run: error, radius; final coverage and mechanisms."""
    s = series(run)
    n = len(s["tick"])
    first, last = slice(0, max(n // 3, 1)), slice(2 * n // 3, n)
    out: dict[str, float] = {}
    for key in [k for k in s if k.startswith(("abs_error_", "radius_"))]:
        out[f"{key}_first"] = _nanmedian(s[key][first])
        out[f"{key}_last"] = _nanmedian(s[key][last])
    for key in ("coverage_ttft_p95", "coverage_tpot_p95"):
        out[f"{key}_final"] = float(s[key][-1]) if n else math.nan
    out["mechanisms_discovered"] = float(s["mechanisms_discovered"][-1]) if n else 0.0
    out["tick_s_median"] = _nanmedian(s["tick_s"])
    return out


def stage_times(run: LearningRun) -> dict[str, tuple[float, float]]:
    """Per planning stage (and ``total``): (median, p90) seconds over the run's ticks."""
    out = {}
    for stage in sorted({k for r in run.reports for k in r.stage_s}):
        v = np.array([r.stage_s[stage] for r in run.reports if stage in r.stage_s])
        out[stage] = (float(np.median(v)), float(np.percentile(v, 90)))
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _nanmedian(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def write_csv(run: LearningRun, path: Path) -> None:
    s = series(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(list(s))
        for row in zip(*s.values(), strict=True):
            w.writerow([f"{v:.6g}" for v in row])


def plot(run: LearningRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = series(run)
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    colors = {"ttft": "C0", "tpot": "C1", "throughput": "C2"}
    for o in OUTCOMES:  # a p95 dashed, in its mean's colour
        axes[0].plot(s["tick"], s[f"abs_error_{o}"], label=o, lw=1,
                     color=colors[o.removesuffix("_p95")], ls="--" if o.endswith("_p95") else "-")
    axes[0].set_ylabel("median |log(obs/pred)|")
    axes[0].set_title(f"{run.policy} on {run.scenario} (seed {run.seed}): prediction error")
    axes[0].legend()
    for o in ("ttft_p95", "tpot_p95", "throughput"):
        axes[1].plot(s["tick"], s[f"radius_{o}"], label=f"radius {o}", lw=1)
    ax2 = axes[1].twinx()
    for o in ("ttft_p95", "tpot_p95"):
        ax2.plot(s["tick"], s[f"coverage_{o}"], ls="--", lw=1, label=f"coverage {o}")
    ax2.axhline(run.coverage_target, color="grey", lw=0.5)
    ax2.set_ylim(0, 1.05)
    axes[1].set_ylabel("DRO radius (log)")
    ax2.set_ylabel("realised coverage")
    axes[1].legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    for key in ("mechanisms_active", "mechanisms_applicable", "mechanisms_discovered"):
        axes[2].plot(s["tick"], s[key], label=key.split("_")[1], lw=1)
    axes[2].set_ylabel("mechanisms")
    axes[2].set_xlabel("tick")
    axes[2].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
