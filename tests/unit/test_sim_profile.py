"""The replica profiler: deterministic, faster worlds measure faster, and the highest rate
under an SLO behaves as an SLO does (issue 26, item 5)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from koi.catalog import load_catalog
from koi.shapes import default_config
from koi.sim.profile import LoadPoint, Profiler, RequestShape, leading_run
from koi.sim.world import load_world

CAT = load_catalog()
CFG = default_config("llama-3.1-8b", "h100-sxm", CAT, tp=1)
SHAPE = RequestShape(1000, 200)
GRID = (0.2, 0.4, 0.6, 0.8, 1.0)   # coarse and few requests: the tests stay cheap


def profiler(world=None, seed: int = 0) -> Profiler:
    return Profiler(world or load_world(), CAT, seed=seed, grid=GRID, requests=80,
                    soak_requests=160)


def test_a_profile_is_deterministic_for_a_seed() -> None:
    assert CFG is not None
    a, b = profiler().profile(CFG, SHAPE), profiler().profile(CFG, SHAPE)
    assert a == b
    assert len(a.points) >= 2 and a.saturation.tok_s > 0
    assert [p.rate_rps for p in a.points] == pytest.approx(
        [s * a.saturation.rps for s in GRID[:len(a.points)]])


def test_what_a_profiler_measures_does_not_depend_on_what_it_measured_before() -> None:
    """Why the profiled policies may share one (``koi.policies.profiled.shared_profiler``)."""
    other = default_config("llama-3.1-8b", "a100-80gb", CAT, tp=1)
    assert CFG is not None and other is not None
    used = profiler()
    used.profile(other, RequestShape(300, 900))
    used.max_rate_under_slo(CFG, SHAPE, 0.05, 0.01)   # a tight SLO: part of the sweep
    assert used.profile(CFG, SHAPE) == profiler().profile(CFG, SHAPE)


def test_the_noise_is_on() -> None:
    assert CFG is not None
    quiet = dataclasses.replace(load_world(), noise_sigma=0.0)
    assert profiler().saturation(CFG, SHAPE) != profiler(quiet).saturation(CFG, SHAPE)


def test_a_faster_world_measures_more_throughput() -> None:
    assert CFG is not None
    world = load_world()
    fast = dataclasses.replace(world, mem_eff={**world.mem_eff,
                                               "h100-sxm": world.mem_eff_of("h100-sxm") * 1.3})
    decode_heavy = RequestShape(200, 1000)   # bandwidth-bound: HBM efficiency shows
    slow = profiler(world).saturation(CFG, decode_heavy)
    quick = profiler(fast).saturation(CFG, decode_heavy)
    assert quick.tok_s > 1.08 * slow.tok_s


def test_max_rate_grows_as_the_slo_loosens_and_is_zero_when_impossible() -> None:
    assert CFG is not None
    p = profiler()
    sweep = p.profile(CFG, SHAPE).points
    slos = [(0.001, 0.001), (0.12, 0.018), (0.15, 0.02), (0.2, 0.03), (0.5, 0.06), (1e3, 1e3)]
    answers = [p.max_rate_under_slo(CFG, SHAPE, *slo) for slo in slos]
    rates = [rate for rate, _ in answers]
    assert answers[0] == (0.0, None)
    assert rates == sorted(rates) and rates[-1] > rates[1] > 0
    for (ttft, tpot), (rate, point) in zip(slos[1:], answers[1:], strict=True):
        assert point is not None and point.meets(ttft, tpot) and point.rate_rps == rate
        assert rate in [q.rate_rps for q in sweep]   # a load of the sweep's grid
    # asked in another order, or of a fresh profiler, the answers are the same
    assert [profiler().max_rate_under_slo(CFG, SHAPE, *slo) for slo in reversed(slos)] == \
        answers[::-1]


def test_a_tight_slo_measures_only_the_start_of_the_sweep() -> None:
    assert CFG is not None
    p = profiler()
    assert p.max_rate_under_slo(CFG, SHAPE, 0.001, 0.001) == (0.0, None)
    assert p.runs == 2   # the saturation and the first point


def test_a_load_near_saturation_is_soaked_before_it_counts() -> None:
    assert CFG is not None
    p = profiler()
    rate, point = p.max_rate_under_slo(CFG, SHAPE, 1e3, 1e3)
    assert rate == pytest.approx(p.saturation(CFG, SHAPE).rps)   # the grid's top
    assert point is not None and point not in p.profile(CFG, SHAPE).points   # the soak's


def test_the_sweep_is_read_up_to_the_first_miss() -> None:
    pts = [LoadPoint(1.0, 0.1, 0.01, True, 1.0), LoadPoint(2.0, 0.5, 0.01, True, 1.0),
           LoadPoint(3.0, 0.1, 0.01, True, 1.0), LoadPoint(4.0, 0.1, 0.01, False, 1.0)]
    assert leading_run(pts, 0.2, 0.05) == 1      # 3.0 passes again: not believed
    assert leading_run(pts, 1.0, 0.05) == 3      # 4.0 fell behind: fails any SLO
    assert leading_run(pts, 0.05, 0.05) == 0


def test_the_profiler_never_imports_the_predictor() -> None:
    code = ("import sys, koi.sim.profile; "
            "sys.exit(any(m.startswith('koi.predictor') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
