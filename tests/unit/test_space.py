"""The decision space: validation names the offending knob; hashing and codecs are canonical."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from koi.catalog import Catalog, load_catalog
from koi.errors import InvalidConfigError
from koi.space import (
    KNOBS,
    DeploymentConfig,
    KvDtype,
    Precision,
    SpecDecode,
    check,
    config_from_dict,
    config_hash,
    config_to_dict,
    knob_help,
    validate,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def knobs_of(cfg: DeploymentConfig, cat: Catalog) -> list[str]:
    return [e.knob for e in validate(cfg, cat)]


def only_knob(cfg: DeploymentConfig, cat: Catalog) -> InvalidConfigError:
    """The errors of ``cfg`` all concern one knob; return the first."""
    errors = validate(cfg, cat)
    assert errors, f"{cfg} should be invalid"
    assert len({e.knob for e in errors}) == 1, [str(e) for e in errors]
    return errors[0]


# ----------------------------------------------------------------------- valid configs


def test_default_config_is_valid(cat: Catalog) -> None:
    assert validate(DeploymentConfig(), cat) == []
    cfg = DeploymentConfig()
    assert check(cfg, cat) is cfg


@pytest.mark.parametrize("cfg", [
    DeploymentConfig(model="llama-3.1-70b", tp=4),
    DeploymentConfig(model="llama-3.1-405b", tp=8, weight_precision=Precision.FP8),
    DeploymentConfig(model="mixtral-8x7b", tp=2, dp_attention=2, ep=4),
    DeploymentConfig(accelerator="mi300x", engine="sglang"),
    DeploymentConfig(accelerator="b200", weight_precision=Precision.FP4, kv_dtype=KvDtype.FP8),
    DeploymentConfig(engine="trtllm", spec_decode=SpecDecode.EAGLE, spec_tokens=3),
], ids=lambda c: f"{c.model}-{c.accelerator}-{c.engine}-tp{c.tp}")
def test_valid_configs_have_no_errors(cat: Catalog, cfg: DeploymentConfig) -> None:
    assert validate(cfg, cat) == []


# ------------------------------------------------------------------------- rejections


def test_tp_not_dividing_attention_heads_names_tp(cat: Catalog) -> None:
    model = cat.model("llama-3.1-8b")
    assert (model.num_attention_heads, model.num_kv_heads) == (32, 8)
    err = only_knob(DeploymentConfig(tp=3), cat)
    assert err.knob == "tp"
    assert "32" in err.reason
    with pytest.raises(InvalidConfigError) as exc:
        check(DeploymentConfig(tp=3), cat)
    assert exc.value.knob == "tp"


def test_tp_neither_dividing_nor_multiple_of_kv_heads_names_tp(cat: Catalog) -> None:
    # qwen2.5-7b: 28 attention heads, 4 KV heads; tp=7 divides 28 but not 4, nor is 7 % 4 == 0
    model = cat.model("qwen2.5-7b")
    assert model.num_attention_heads % 7 == 0
    assert model.num_kv_heads % 7 and 7 % model.num_kv_heads
    err = only_knob(DeploymentConfig(model="qwen2.5-7b", tp=7, multi_node=True), cat)
    assert err.knob == "tp"
    assert "KV heads" in err.reason


def test_tp_a_multiple_of_kv_heads_is_allowed(cat: Catalog) -> None:
    # 16 ranks over 8 KV heads replicate each head on two ranks
    assert validate(DeploymentConfig(tp=16, multi_node=True), cat) == []


def test_weights_that_do_not_fit_name_tp_or_precision_and_mention_gb(cat: Catalog) -> None:
    cfg = DeploymentConfig(model="llama-3.1-405b", accelerator="h100-sxm", tp=1)
    err = only_knob(cfg, cat)
    assert err.knob in ("tp", "weight_precision")
    assert "GB" in err.reason
    # a full node of bf16 still does not hold 405B: the advice is a smaller precision
    full = only_knob(cfg.with_(tp=8), cat)
    assert full.knob == "weight_precision"
    assert "GB" in full.reason


def test_fp8_weights_need_fp8_hardware(cat: Catalog) -> None:
    cfg = DeploymentConfig(accelerator="a100-80gb", weight_precision=Precision.FP8)
    assert only_knob(cfg, cat).knob == "weight_precision"


def test_fp8_kv_needs_fp8_hardware(cat: Catalog) -> None:
    cfg = DeploymentConfig(accelerator="a100-80gb", kv_dtype=KvDtype.FP8)
    assert only_knob(cfg, cat).knob == "kv_dtype"


def test_fp4_weights_need_fp4_hardware(cat: Catalog) -> None:
    cfg = DeploymentConfig(accelerator="h100-sxm", weight_precision=Precision.FP4)
    err = only_knob(cfg, cat)
    assert err.knob == "weight_precision"
    assert "fp4" in err.reason


def test_tp_beyond_one_node_needs_multi_node(cat: Catalog) -> None:
    assert cat.accelerator("h100-sxm").gpus_per_node == 8
    cfg = DeploymentConfig(model="llama-3.1-405b", accelerator="h100-sxm", tp=16)
    err = only_knob(cfg, cat)
    assert err.knob == "tp"
    assert "multi_node" in err.reason
    # across two nodes, bf16 405B fits (~51 GB of weights per GPU)
    assert validate(cfg.with_(multi_node=True), cat) == []


def test_trtllm_does_not_run_on_amd(cat: Catalog) -> None:
    err = only_knob(DeploymentConfig(accelerator="mi300x", engine="trtllm"), cat)
    assert err.knob == "engine"
    assert "mi300x" in err.reason


def test_ep_on_a_dense_model_names_ep(cat: Catalog) -> None:
    assert only_knob(DeploymentConfig(tp=2, ep=2), cat).knob == "ep"


def test_dp_attention_on_a_dense_model_names_dp_attention(cat: Catalog) -> None:
    assert only_knob(DeploymentConfig(dp_attention=2), cat).knob == "dp_attention"


def test_ep_must_match_tp_times_dp_attention_on_moe(cat: Catalog) -> None:
    cfg = DeploymentConfig(model="mixtral-8x7b", tp=2, ep=8, dp_attention=1)
    assert "ep" in knobs_of(cfg, cat)


def test_max_batched_tokens_below_max_num_seqs(cat: Catalog) -> None:
    err = only_knob(DeploymentConfig(max_num_seqs=512, max_batched_tokens=256), cat)
    assert err.knob == "max_batched_tokens"
    assert "512" in err.reason


@pytest.mark.parametrize(("spec", "tokens"), [(SpecDecode.NONE, 3), (SpecDecode.EAGLE, 0)])
def test_spec_tokens_inconsistent_with_spec_decode(cat: Catalog, spec: SpecDecode,
                                                   tokens: int) -> None:
    cfg = DeploymentConfig(spec_decode=spec, spec_tokens=tokens)
    assert only_knob(cfg, cat).knob == "spec_tokens"


@pytest.mark.parametrize(("knob", "typo", "meant"), [
    ("model", "llama-3.1-8", "llama-3.1-8b"),
    ("accelerator", "h100sxm", "h100-sxm"),
])
def test_unknown_ids_name_the_knob_and_suggest_the_close_match(
        cat: Catalog, knob: str, typo: str, meant: str) -> None:
    err = only_knob(DeploymentConfig(**{knob: typo}), cat)
    assert err.knob == knob
    assert repr(meant) in err.reason


@pytest.mark.parametrize(("knob", "value"), [
    ("gpu_mem_fraction", 1.5), ("gpu_mem_fraction", 0.0), ("tp", 0), ("replicas", 0),
    ("max_num_seqs", 100_000), ("block_size", 24), ("engine", "tgi"),
])
def test_out_of_range_values_name_their_knob(cat: Catalog, knob: str, value: Any) -> None:
    errors = validate(DeploymentConfig(**{knob: value}), cat)
    assert knob in [e.knob for e in errors]
    err = next(e for e in errors if e.knob == knob)
    assert str(value) in err.reason


def test_offering_for_another_accelerator_names_offering(cat: Catalog) -> None:
    other = cat.offerings_for(accelerator_id="a100-80gb")[0]
    err = only_knob(DeploymentConfig(accelerator="h100-sxm", offering=other.id), cat)
    assert err.knob == "offering"
    assert "a100-80gb" in err.reason
    same = cat.offerings_for(accelerator_id="h100-sxm")[0]
    assert validate(DeploymentConfig(accelerator="h100-sxm", offering=same.id), cat) == []


def test_every_error_is_an_invalid_config_error_with_a_known_knob(cat: Catalog) -> None:
    cfg = DeploymentConfig(tp=3, dp_attention=2, max_batched_tokens=16, spec_tokens=2)
    errors = validate(cfg, cat)
    assert {"tp", "dp_attention", "max_batched_tokens", "spec_tokens"} <= {e.knob for e in errors}
    for e in errors:
        assert isinstance(e, InvalidConfigError)
        assert e.knob in KNOBS
        assert str(e).startswith(f"{e.knob}: ")


# ---------------------------------------------------------------------- knob metadata


def test_at_least_25_knobs_each_with_help() -> None:
    assert len(KNOBS) >= 25
    assert len(set(KNOBS)) == len(KNOBS)
    for name in KNOBS:
        meta = knob_help(name)
        assert isinstance(meta.get("help"), str) and meta["help"].strip(), name
    with pytest.raises(KeyError):
        knob_help("not_a_knob")


def test_defaults_satisfy_their_own_constraints() -> None:
    for f in fields(DeploymentConfig):
        meta = f.metadata
        if "min" in meta:
            assert f.default >= meta["min"], f.name
        if "max" in meta:
            assert f.default <= meta["max"], f.name
        if "choices" in meta:
            assert f.default in meta["choices"], f.name


# ------------------------------------------------------------------- hash and codecs


def canonical_hash(cfg: DeploymentConfig) -> str:
    """sha256 of the sorted-key compact JSON of every knob (enums as values), 16 hex digits."""
    plain = {}
    for f in fields(DeploymentConfig):
        value = getattr(cfg, f.name)
        plain[f.name] = value.value if isinstance(value, StrEnum) else value
    blob = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def changed_value(name: str, value: Any) -> Any:
    """A different value of the same type for knob ``name``."""
    meta = knob_help(name)
    if "choices" in meta:
        return next(c for c in meta["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if value + 1 <= meta.get("max", value + 1) else value - 1
    if isinstance(value, float):
        return round(value - 0.05, 4)
    assert isinstance(value, str), name
    return value + "-x"


def test_equal_configs_hash_equal() -> None:
    a = DeploymentConfig(model="llama-3.1-70b", tp=4, kv_dtype=KvDtype.FP8)
    b = DeploymentConfig(model="llama-3.1-70b", tp=4, kv_dtype=KvDtype.FP8)
    assert a == b
    assert config_hash(a) == config_hash(b)
    # a str where the enum is expected is the same config
    assert config_hash(DeploymentConfig(kv_dtype="fp8")) == config_hash(  # type: ignore[arg-type]
        DeploymentConfig(kv_dtype=KvDtype.FP8))


@pytest.mark.parametrize("name", KNOBS)
def test_any_knob_change_changes_the_hash(name: str) -> None:
    base = DeploymentConfig()
    other = base.with_(**{name: changed_value(name, getattr(base, name))})
    assert other != base
    assert config_hash(other) != config_hash(base)


def test_hash_is_the_canonical_sha256() -> None:
    for cfg in (DeploymentConfig(), DeploymentConfig(model="deepseek-v3", accelerator="h200",
                                                     tp=8, weight_precision=Precision.FP8)):
        assert config_hash(cfg) == canonical_hash(cfg)


def test_hash_is_stable_across_processes() -> None:
    cfg = DeploymentConfig(model="mixtral-8x7b", tp=2, engine="sglang")
    code = ("from koi.space import DeploymentConfig, config_hash;"
            "print(config_hash(DeploymentConfig(model='mixtral-8x7b', tp=2, engine='sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "libs"), "PYTHONHASHSEED": "12345"},
                         timeout=60)
    assert out.stdout.strip() == config_hash(cfg) == canonical_hash(cfg)


@pytest.mark.parametrize("cfg", [
    DeploymentConfig(),
    DeploymentConfig(model="deepseek-v3", accelerator="h200", tp=8, dp_attention=2, ep=16,
                     weight_precision=Precision.FP8, kv_dtype=KvDtype.FP8, multi_node=True,
                     spec_decode=SpecDecode.EAGLE, spec_tokens=3, gpu_mem_fraction=0.85),
])
def test_dict_round_trip_is_lossless(cfg: DeploymentConfig) -> None:
    data = config_to_dict(cfg)
    assert set(data) == set(KNOBS)
    json.dumps(data)  # JSON-able
    assert not any(isinstance(v, StrEnum) for v in data.values())
    back = config_from_dict(data)
    assert back == cfg
    assert isinstance(back.weight_precision, Precision)
    assert config_hash(back) == config_hash(cfg)


def test_from_dict_rejects_an_unknown_key_naming_it() -> None:
    with pytest.raises(InvalidConfigError) as exc:
        config_from_dict({"tp": 2, "tensor_parallel": 2})
    assert exc.value.knob == "tensor_parallel"


def test_from_dict_rejects_a_bad_enum_value_naming_the_knob() -> None:
    with pytest.raises(InvalidConfigError) as exc:
        config_from_dict({"weight_precision": "fp3"})
    assert exc.value.knob == "weight_precision"


def test_from_dict_fills_defaults() -> None:
    assert config_from_dict({}) == DeploymentConfig()
    assert config_from_dict({"tp": 2}) == DeploymentConfig(tp=2)
