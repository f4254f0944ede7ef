"""scripts/extract_kernel_tables.py on synthetic tables: the reductions keep what
tables.py reads (power-of-two grids, medians of repeats, the preferred MoE kernel)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "extract_kernel_tables.py"


@pytest.fixture(scope="module")
def ex() -> ModuleType:
    spec = importlib.util.spec_from_file_location("extract_kernel_tables", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gemm_keeps_power_of_two_m_and_medians_repeats(ex: ModuleType) -> None:
    t = {"gemm_dtype": np.array(["bfloat16"] * 5 + ["int8_wo"]),
         "m": np.array([1, 2, 3, 2, 2, 1]), "n": np.array([64] * 6),
         "k": np.array([128] * 6), "latency": np.array([1.0, 2.0, 9.0, 4.0, 3.0, 7.0])}
    out = ex.gemm_table(t)
    assert list(out["gemm_m"]) == [1, 2] and list(out["gemm_dtypes"]) == ["bfloat16"]
    assert out["gemm"][0, :, 0, 0].tolist() == [1.0, 3.0]


def test_moe_prefers_the_gated_kernel_and_balanced_routing(ex: ModuleType) -> None:
    rows = [("moe_torch_flow_cutlass", "balanced", 5.0), ("moe_torch_flow", "power_law_1.01", 4.0),
            ("moe_torch_flow", "balanced", 2.0), ("moe_torch_flow_nongated", "balanced", 1.0)]
    n = len(rows)
    t = {"kernel_source": np.array([r[0] for r in rows]),
         "distribution": np.array([r[1] for r in rows]),
         "latency": np.array([r[2] for r in rows]), "moe_dtype": np.array(["fp8"] * n),
         "num_tokens": np.array([16] * n), "hidden_size": np.array([4096] * n),
         "inter_size": np.array([14336] * n), "topk": np.array([2] * n),
         "num_experts": np.array([8] * n), "moe_tp_size": np.array([1] * n),
         "moe_ep_size": np.array([1] * n)}
    out = ex.moe_table(t)
    assert out["moe"].tolist() == [[2.0]]
    assert out["moe_keys"].tolist() == [[1, 4096, 14336, 2, 8, 1, 1]]


def test_cells_faster_than_the_part_are_floored_at_its_speed_of_light(ex: ModuleType) -> None:
    gpu = {"mem_bw": 1e12, "bfloat16_tc_flops": 1e15, "fp8_tc_flops": 2e15, "sm_version": 90}
    # GEMM 1024³ bf16: 2.1 GFLOP → 2.15 µs of math; 6 MiB → 6.3 µs of memory
    out = {"gemm_dtypes": np.array(["bfloat16"]), "gemm_m": np.array([1024]),
           "gemm_n": np.array([1024]), "gemm_k": np.array([1024]),
           "gemm": np.array([[[[0.001]]]]),
           # decode attention: 1 sequence, 8 heads / 1 KV head of 128, 4097 tokens:
           # 2 · 4096 · 128 · 2 bytes of bf16 cache + 2 · 8 · 128 · 2 of query/output
           "gen_head_dim": np.array([128]), "gen_heads": np.array([8]),
           "gen_kv_heads": np.array([1]), "gen_batch": np.array([1]),
           "gen_len": np.array([4097]),
           "gen_attn": np.array([0.0001, 1.0]).reshape(2, 1, 1, 1, 1, 1)}
    raised = ex.floor_at_sol(out, gpu)
    assert raised == {"gemm": 1, "gen_attn": 1}
    assert out["gemm"][0, 0, 0, 0] == pytest.approx(3 * 1024 * 1024 * 2 / 1e12 * 1e3)
    assert out["gen_attn"][0].item() == pytest.approx((2 * 4096 * 128 * 2 + 2 * 8 * 128 * 2)
                                                      / 1e12 * 1e3)
    assert out["gen_attn"][1].item() == 1.0  # slower than light: kept as measured


def test_a_dtype_the_spec_has_no_rate_for_is_left_as_measured(ex: ModuleType) -> None:
    gpu = {"mem_bw": 1e12, "bfloat16_tc_flops": 1e15, "sm_version": 80}
    out = {"gemm_dtypes": np.array(["fp8"]), "gemm_m": np.array([1024]),
           "gemm_n": np.array([1024]), "gemm_k": np.array([1024]),
           "gemm": np.array([[[[1e-6]]]])}
    assert ex.gemm_sol(out, gpu).max() == 0.0
