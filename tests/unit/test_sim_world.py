"""The hidden world: overrides are validated field by field; randomization is seeded;
the step-time physics behaves (monotone, PCIe penalty, KV cliff)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from koi.catalog import load_catalog
from koi.scenario.world import WorldParams, validate_world_overrides
from koi.sim.physics import step_coef, step_time
from koi.sim.world import load_world, randomize
from koi.space import engine_default_config

CAT = load_catalog()


def test_override_errors_name_the_field() -> None:
    errs = dict(validate_world_overrides({
        "noise_sigma": -1, "kv_cliff_factr": 2, "mem_eff": {"l4": 1.5}, "comp_eff": 3,
        "pcie_tp_penalty": "big"}))
    assert "must be >= 0" in errs["noise_sigma"]
    assert "unknown world parameter" in errs["kv_cliff_factr"]
    assert "must be <= 1" in errs["mem_eff.l4"]
    assert "mapping" in errs["comp_eff"]
    assert "finite number" in errs["pcie_tp_penalty"]
    assert validate_world_overrides({"noise_sigma": 0.1, "mem_eff": {"l4": 0.5}}) == []


def test_overrides_apply_and_randomize_is_seeded() -> None:
    w = load_world({"mem_eff": {"l4": 0.5}, "kv_cliff_factor": 2.0})
    assert w.mem_eff_of("l4") == 0.5 and w.kv_cliff_factor == 2.0
    assert w.mem_eff_of("h100-sxm") == load_world().mem_eff_of("h100-sxm")
    a = load_world(seed=1, randomize=True)
    b = load_world(seed=1, randomize=True)
    c = load_world(seed=2, randomize=True)
    assert a == b and a != c
    r = randomize(WorldParams(), np.random.default_rng(0))
    assert 0.05 <= r.default_mem_eff <= 1.0
    with pytest.raises(ValueError, match=r"world\.noise_sigma"):
        load_world({"noise_sigma": -2})


def _coef(accel: str, tp: int = 1, world: WorldParams | None = None, model: str = "llama-3.1-8b"):
    cfg = engine_default_config(model, accel, "vllm", CAT, tp=tp)
    return step_coef(cfg, CAT, world or load_world())


def test_step_time_is_monotone_in_batch_context_and_prefill() -> None:
    k = _coef("h100-sxm")
    ts = [step_time(k, b, 1000, 0) for b in (1, 8, 64, 256, 1024)]
    assert all(x < y for x, y in itertools.pairwise(ts))
    assert step_time(k, 32, 500, 0) < step_time(k, 32, 4000, 0)
    assert step_time(k, 32, 500, 0) < step_time(k, 32, 500, 2048, 1024)
    # memory-bound decode at small batch: about weights / achieved bandwidth
    w = load_world()
    floor = 16.06e9 / (3.35e12 * w.mem_eff_of("h100-sxm"))
    assert floor < step_time(k, 1, 100, 0) < floor * 1.6


def test_pcie_penalty_slows_tensor_parallel_collectives() -> None:
    base = load_world()
    hard = load_world({"pcie_tp_penalty": 5.0})
    t1 = step_time(_coef("l40s", 2, base), 64, 1000, 0)
    t2 = step_time(_coef("l40s", 2, hard), 64, 1000, 0)
    assert t2 > t1
    # NVLink parts do not pay it
    n1 = step_time(_coef("h100-sxm", 2, base), 64, 1000, 0)
    n2 = step_time(_coef("h100-sxm", 2, hard), 64, 1000, 0)
    assert n1 == pytest.approx(n2)


def test_moe_touches_more_experts_with_bigger_batches() -> None:
    k = _coef("h100-sxm", 2, model="mixtral-8x7b")
    assert k.touch_p > 0
    per_tok = [step_time(k, b, 500, 0) / b for b in (1, 4, 64)]
    assert per_tok[0] > per_tok[1] > per_tok[2]
