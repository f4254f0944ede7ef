"""Memory model: weight, KV and runtime bytes per GPU against hand-computed figures."""

from __future__ import annotations

import pytest

from koi.catalog import Catalog, load_catalog
from koi.space import (
    GIB,
    DeploymentConfig,
    KvDtype,
    Precision,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    runtime_reserve_bytes,
    split_params,
    weight_bytes_per_gpu,
)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def test_gib_is_binary() -> None:
    assert GIB == 1024.0 ** 3


# ---------------------------------------------------------------------------- weights


def test_weights_8b_bf16_tp1(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    assert model.params_b == 8.03
    assert weight_bytes_per_gpu(model, DeploymentConfig()) == pytest.approx(8.03e9 * 2, rel=1e-12)


def test_weights_halve_with_tp2_and_pp2(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    one = weight_bytes_per_gpu(model, DeploymentConfig())
    assert weight_bytes_per_gpu(model, DeploymentConfig(tp=2)) == pytest.approx(one / 2)
    assert weight_bytes_per_gpu(model, DeploymentConfig(pp=2)) == pytest.approx(one / 2)
    assert weight_bytes_per_gpu(model, DeploymentConfig(tp=2, pp=2)) == pytest.approx(one / 4)


@pytest.mark.parametrize(("precision", "bytes_per_param"), [
    (Precision.BF16, 2.0), (Precision.FP16, 2.0), (Precision.FP8, 1.0), (Precision.INT8, 1.0),
])
def test_weights_scale_with_precision(cat: Catalog, precision: Precision,
                                      bytes_per_param: float) -> None:
    model = cat.model("llama-3.1-8b")
    got = weight_bytes_per_gpu(model, DeploymentConfig(weight_precision=precision))
    assert got == pytest.approx(8.03e9 * bytes_per_param)


def test_four_bit_weights_are_about_half_a_byte(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    got = weight_bytes_per_gpu(model, DeploymentConfig(weight_precision=Precision.INT4))
    # ½ byte per parameter plus a few percent of group scales
    assert 8.03e9 * 0.5 < got < 8.03e9 * 0.6


def test_moe_experts_split_over_dp_attention_ranks(cat: Catalog) -> None:
    model = cat.model("mixtral-8x7b")
    dense_b, expert_b = split_params(model)
    cfg = DeploymentConfig(model=model.id, tp=2, dp_attention=2, ep=4)
    # dense weights are replicated on every attention rank; experts are split over all GPUs
    expected = dense_b * 1e9 * 2 / 2 + expert_b * 1e9 * 2 / 4
    assert weight_bytes_per_gpu(model, cfg) == pytest.approx(expected)


# ---------------------------------------------------------------------------- split


def test_split_params_dense_model_has_no_experts(cat: Catalog) -> None:
    assert split_params(cat.model("llama-3.1-8b")) == (8.03, 0.0)


def test_split_params_mixtral(cat: Catalog) -> None:
    m = cat.model("mixtral-8x7b")
    assert (m.hidden_size, m.moe_intermediate_size, m.num_experts, m.num_layers) == \
        (4096, 14336, 8, 32)
    experts = 3 * 4096 * 14336 * 8 * 32 / 1e9  # gate, up and down projections
    dense, expert = split_params(m)
    assert expert == pytest.approx(experts)
    assert dense == pytest.approx(46.7 - experts)
    assert 1.0 < dense < 2.0  # attention + embeddings of Mixtral: ~1.6B


def test_split_params_deepseek_skips_dense_layers(cat: Catalog) -> None:
    m = cat.model("deepseek-v3")
    experts = 3 * 7168 * 2048 * 256 * (61 - 3) / 1e9
    dense, expert = split_params(m)
    assert expert == pytest.approx(experts)
    assert dense + expert == pytest.approx(m.params_b)


# ---------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize(("tp", "heads_per_gpu"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)])
def test_kv_bytes_gqa_by_tp(cat: Catalog, tp: int, heads_per_gpu: int) -> None:
    model = cat.model("llama-3.1-8b")
    got = kv_bytes_per_token_per_gpu(model, DeploymentConfig(tp=tp, multi_node=tp > 8))
    assert got == 2 * 32 * heads_per_gpu * 128 * 2  # K and V × layers × heads × dim × bytes


def test_kv_bytes_hand_values(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    assert kv_bytes_per_token_per_gpu(model, DeploymentConfig()) == 131072
    assert kv_bytes_per_token_per_gpu(model, DeploymentConfig(tp=2)) == 65536


def test_kv_bytes_fp8_halves_and_pp_halves_layers(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    base = kv_bytes_per_token_per_gpu(model, DeploymentConfig())
    assert kv_bytes_per_token_per_gpu(model, DeploymentConfig(kv_dtype=KvDtype.FP8)) == base / 2
    assert kv_bytes_per_token_per_gpu(model, DeploymentConfig(kv_dtype=KvDtype.BF16)) == base
    assert kv_bytes_per_token_per_gpu(model, DeploymentConfig(pp=2)) == 2 * 16 * 8 * 128 * 2


@pytest.mark.parametrize("tp", [1, 8, 16])
def test_kv_bytes_mla_is_one_latent_replicated_on_every_rank(cat: Catalog, tp: int) -> None:
    model = cat.model("deepseek-v3")
    assert (model.num_layers, model.mla_kv_lora_rank, model.mla_rope_head_dim) == (61, 512, 64)
    cfg = DeploymentConfig(model=model.id, tp=tp)
    assert kv_bytes_per_token_per_gpu(model, cfg) == 61 * (512 + 64) * 2
    fp8 = cfg.with_(kv_dtype=KvDtype.FP8)
    assert kv_bytes_per_token_per_gpu(model, fp8) == 61 * (512 + 64) * 1


# ----------------------------------------------------------------- reserve and capacity


def test_runtime_reserve_hand_value(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    # 1.5 GB fixed + 24 bytes × hidden × max_batched_tokens / tp
    assert runtime_reserve_bytes(model, DeploymentConfig(max_batched_tokens=8192)) == \
        pytest.approx(1.5e9 + 24 * 4096 * 8192)
    assert runtime_reserve_bytes(model, DeploymentConfig(tp=2, max_batched_tokens=2048)) == \
        pytest.approx(1.5e9 + 24 * 4096 * 2048 / 2)


def test_kv_capacity_vllm_caps_the_whole_gpu(cat: Catalog) -> None:
    model, accel = cat.model("llama-3.1-8b"), cat.accelerator("h100-sxm")
    assert accel.memory_gb == 80
    cfg = DeploymentConfig(engine="vllm", gpu_mem_fraction=0.9, max_batched_tokens=8192)
    weights = 8.03e9 * 2
    reserve = 1.5e9 + 24 * 4096 * 8192
    budget = 80 * 2**30 * 0.9 - weights - reserve
    expected = budget / 131072
    assert kv_capacity_tokens(model, accel, cfg, cat.engine("vllm")) == pytest.approx(expected)
    # no engine given = vLLM semantics
    assert kv_capacity_tokens(model, accel, cfg) == pytest.approx(expected)
    assert 400_000 < expected < 450_000  # ~52 GB of KV at 128 KiB per token


def test_kv_capacity_trtllm_is_a_share_of_free_memory(cat: Catalog) -> None:
    model, accel, engine = cat.model("llama-3.1-8b"), cat.accelerator("h100-sxm"), \
        cat.engine("trtllm")
    assert engine.mem_fraction_of_free
    cfg = DeploymentConfig(engine="trtllm", gpu_mem_fraction=0.9, max_batched_tokens=8192)
    weights = 8.03e9 * 2
    reserve = 1.5e9 + 24 * 4096 * 8192
    expected = (80 * 2**30 - weights - reserve) * 0.9 / 131072
    got = kv_capacity_tokens(model, accel, cfg, engine)
    assert got == pytest.approx(expected)
    # the same 0.9 leaves TensorRT-LLM more KV than vLLM
    assert got > kv_capacity_tokens(model, accel, cfg.with_(engine="vllm"), cat.engine("vllm"))


def test_kv_capacity_scales_with_dp_attention(cat: Catalog) -> None:
    model, accel = cat.model("mixtral-8x7b"), cat.accelerator("h100-sxm")
    cfg = DeploymentConfig(model=model.id, tp=2, dp_attention=2, ep=4)
    weights = weight_bytes_per_gpu(model, cfg)
    reserve = runtime_reserve_bytes(model, cfg)
    per_rank = (80 * 2**30 * 0.9 - weights - reserve) / (2 * 32 * 4 * 128 * 2)
    assert kv_capacity_tokens(model, accel, cfg) == pytest.approx(per_rank * 2)


def test_kv_capacity_is_zero_when_weights_do_not_fit(cat: Catalog) -> None:
    model, accel = cat.model("llama-3.1-405b"), cat.accelerator("h100-sxm")
    assert kv_capacity_tokens(model, accel, DeploymentConfig(model=model.id, tp=1)) == 0.0


def test_fp8_kv_doubles_capacity(cat: Catalog) -> None:
    model, accel = cat.model("llama-3.1-70b"), cat.accelerator("h100-sxm")
    cfg = DeploymentConfig(model=model.id, tp=4)
    assert kv_capacity_tokens(model, accel, cfg.with_(kv_dtype=KvDtype.FP8)) == \
        pytest.approx(2 * kv_capacity_tokens(model, accel, cfg))
