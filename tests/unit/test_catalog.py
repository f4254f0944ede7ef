"""Catalog data and loader: required records, data sanity, and the error paths."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from koi.catalog import (
    Accelerator,
    Catalog,
    CatalogError,
    Engine,
    Interconnect,
    Market,
    Model,
    Offering,
    load_catalog,
)
from koi.catalog.loader import DEFAULT_DATA_DIR

REQUIRED_ACCELERATORS = ("a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-sxm",
                         "h100-pcie", "h200", "b200", "mi300x", "gaudi2", "gaudi3")
REQUIRED_MODELS = ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b",
                   "llama-3.3-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b",
                   "qwen2.5-32b", "qwen2.5-72b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                   "deepseek-v3")
REQUIRED_ENGINES = ("vllm", "sglang", "trtllm")
KOI_KNOBS = ("max_num_seqs", "max_batched_tokens", "gpu_mem_fraction", "chunked_prefill",
             "prefix_caching", "kv_dtype", "tp", "pp", "ep", "spec_decode", "cuda_graphs")
# Accelerators no cloud in offerings.yaml sells (documented in docs/CATALOG.md).
NOT_ON_SALE = {"gaudi3"}


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


# ----------------------------------------------------------------- required records


@pytest.mark.parametrize("acc_id", REQUIRED_ACCELERATORS)
def test_required_accelerators_present(cat: Catalog, acc_id: str) -> None:
    assert isinstance(cat.accelerator(acc_id), Accelerator)


@pytest.mark.parametrize("model_id", REQUIRED_MODELS)
def test_required_models_present(cat: Catalog, model_id: str) -> None:
    assert isinstance(cat.model(model_id), Model)


@pytest.mark.parametrize("engine_id", REQUIRED_ENGINES)
def test_required_engines_present(cat: Catalog, engine_id: str) -> None:
    engine = cat.engine(engine_id)
    assert isinstance(engine, Engine)
    missing = [k for k in KOI_KNOBS if k not in engine.knobs]
    assert not missing, f"{engine_id} has no flag for {missing}"


def test_every_record_names_its_source(cat: Catalog) -> None:
    tables: dict[str, Any] = {"accelerator": cat.accelerators, "offering": cat.offerings,
                              "model": cat.models, "engine": cat.engines}
    for kind, table in tables.items():
        for rid, rec in table.items():
            assert rec.source.strip(), f"{kind} {rid} has no source"
            assert rec.id == rid


def test_default_catalog_is_cached_and_read_only(cat: Catalog) -> None:
    assert load_catalog() is load_catalog()
    with pytest.raises(TypeError):
        cat.models["x"] = cat.model("llama-3.1-8b")  # type: ignore[index]


# ----------------------------------------------------------------- accelerators


def test_accelerator_types_and_fp_support(cat: Catalog) -> None:
    h100 = cat.accelerator("h100-sxm")
    assert h100.interconnect is Interconnect.NVLINK
    assert h100.supports_fp8 and not h100.supports_fp4
    assert cat.accelerator("b200").supports_fp4
    for a100 in ("a100-40gb", "a100-80gb", "a10g"):
        assert not cat.accelerator(a100).supports_fp8
    assert [a.id for a in cat.accelerators.values() if a.supports_fp4] == ["b200"]
    assert cat.accelerator("mi300x").interconnect is Interconnect.INFINITY_FABRIC
    assert cat.accelerator("gaudi3").interconnect is Interconnect.ROCE
    assert cat.accelerator("h100-pcie").interconnect is Interconnect.PCIE


def test_accelerator_figures_are_dense_and_ordered(cat: Catalog) -> None:
    for a in cat.accelerators.values():
        assert a.memory_gb > 0 and a.hbm_bandwidth_tb_s > 0 and a.bf16_tflops > 0
        assert a.fp8_tflops == 0 or a.fp8_tflops >= a.bf16_tflops, a.id
        assert a.gpus_per_node == 8, a.id
    # hardware_prices.md cross-checks (dense, not the sparse headline numbers)
    assert cat.accelerator("h100-sxm").bf16_tflops == 989
    assert cat.accelerator("h200").memory_gb == 141
    assert cat.accelerator("b200").fp4_tflops == 9000
    assert cat.accelerator("l4").bf16_tflops == 121


def test_unverified_accelerator_cells_are_flagged(cat: Catalog) -> None:
    for acc_id in ("gaudi2", "gaudi3", "h100-pcie", "a10g"):
        notes = cat.accelerator(acc_id).notes.lower()
        assert "not retrieved" in notes or "uncertain" in notes, acc_id


# ----------------------------------------------------------------- offerings


def test_offerings_cover_clouds_regions_and_markets(cat: Catalog) -> None:
    clouds = {o.cloud for o in cat.offerings.values()}
    assert {"aws", "gcp", "azure"} <= clouds
    assert clouds & {"lambda", "runpod"}
    assert len(clouds) >= 4
    assert len({o.region for o in cat.offerings.values()}) >= 8
    markets = {o.market for o in cat.offerings.values()}
    assert {Market.ON_DEMAND, Market.SPOT} <= markets


def test_every_sellable_accelerator_has_an_offering(cat: Catalog) -> None:
    sold = {o.accelerator for o in cat.offerings.values()}
    assert set(cat.accelerators) - sold == NOT_ON_SALE


def test_offering_ids_and_units(cat: Catalog) -> None:
    for o in cat.offerings.values():
        assert o.id == f"{o.cloud}/{o.region}/{o.accelerator}/{o.market.value}"
        assert o.accelerator in cat.accelerators
        assert 0.05 < o.usd_per_gpu_hour < 50, o.id
        assert o.gpus_per_instance in (1, 2, 4, 8), o.id
        assert o.instance_type, o.id


def test_preemption_fields(cat: Catalog) -> None:
    notice = {"aws": 120, "gcp": 30, "azure": 30, "runpod": 0}
    for o in cat.offerings.values():
        if o.market is Market.ON_DEMAND:
            assert o.preemption_rate_per_hour == 0 and o.preemption_notice_s == 0, o.id
        elif o.market is Market.SPOT:
            # monthly reclaim fractions of a few % to 20% => 1e-5 .. 1e-3 per hour
            assert 1e-5 < o.preemption_rate_per_hour < 1e-3, o.id
            assert o.preemption_notice_s == notice[o.cloud], o.id


def test_spot_is_cheaper_than_on_demand(cat: Catalog) -> None:
    od = {(o.cloud, o.region, o.accelerator): o.usd_per_gpu_hour
          for o in cat.offerings.values() if o.market is Market.ON_DEMAND}
    pairs = 0
    for o in cat.offerings.values():
        key = (o.cloud, o.region, o.accelerator)
        if o.market is Market.SPOT and key in od:
            pairs += 1
            assert o.usd_per_gpu_hour < od[key], o.id
    assert pairs >= 10


def test_derived_and_secondary_prices_say_so(cat: Catalog) -> None:
    for o in cat.offerings.values():
        if o.region in ("eu-west-1", "us-west-2", "europe-west4", "westeurope"):
            assert "DERIVED" in o.notes, o.id
        if o.cloud in ("oci", "intel-tiber") or o.accelerator == "mi300x":
            assert "UNVERIFIED" in o.notes, o.id


def test_offerings_for_filters_and_sorts(cat: Catalog) -> None:
    spot = cat.offerings_for("h100-sxm", market="spot")
    assert spot and all(o.accelerator == "h100-sxm" and o.market is Market.SPOT for o in spot)
    prices = [o.usd_per_gpu_hour for o in spot]
    assert prices == sorted(prices)
    aws = cat.offerings_for(cloud="aws", market=Market.ON_DEMAND)
    assert aws and {o.cloud for o in aws} == {"aws"}
    assert cat.offerings_for("gaudi3") == []
    assert len(cat.offerings_for()) == len(cat.offerings)
    with pytest.raises(CatalogError, match="h100-sxm"):
        cat.offerings_for("h100sxm")
    with pytest.raises(CatalogError, match="spot"):
        cat.offerings_for(market="spto")
    with pytest.raises(CatalogError, match="unknown cloud"):
        cat.offerings_for(cloud="awz")


# ----------------------------------------------------------------- models


def test_model_head_geometry(cat: Catalog) -> None:
    for m in cat.models.values():
        assert m.num_attention_heads % m.num_kv_heads == 0, m.id
        if m.uses_mla or m.id.startswith("qwen3"):
            continue  # explicit head_dim (Qwen3) / latent attention (DeepSeek)
        assert m.hidden_size == m.num_attention_heads * m.head_dim, m.id


def test_model_params_and_moe_fields(cat: Catalog) -> None:
    moe_fields = ("experts_per_token", "moe_intermediate_size")
    for m in cat.models.values():
        assert 0 < m.active_params_b <= m.params_b, m.id
        if m.num_experts > 0:
            assert all(getattr(m, f) > 0 for f in moe_fields), m.id
            assert m.active_params_b < m.params_b, m.id
        else:
            assert all(getattr(m, f) == 0 for f in (*moe_fields, "num_shared_experts",
                                                     "first_dense_layers")), m.id
            assert m.active_params_b == m.params_b, m.id
    assert {m.id for m in cat.models.values() if m.is_moe} == {
        "mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"}


def test_model_known_values(cat: Catalog) -> None:
    ds = cat.model("deepseek-v3")
    assert ds.uses_mla and (ds.mla_kv_lora_rank, ds.mla_rope_head_dim) == (512, 64)
    assert (ds.num_experts, ds.experts_per_token, ds.num_shared_experts) == (256, 8, 1)
    assert (ds.first_dense_layers, ds.params_b, ds.active_params_b) == (3, 671, 37)
    q3 = cat.model("qwen3-30b-a3b")
    assert (q3.head_dim, q3.num_experts, q3.moe_intermediate_size) == (128, 128, 768)
    assert cat.model("llama-3.1-405b").num_layers == 126
    assert cat.model("llama-3.1-8b").max_context == 131072
    assert cat.model("mixtral-8x7b").experts_per_token == 2
    for m in cat.models.values():
        assert m.source.startswith("https://huggingface.co/") and m.hf_repo in m.source


# ----------------------------------------------------------------- engines


def test_engine_vocabularies(cat: Catalog) -> None:
    assert cat.engine("vllm").accelerator_vendors == ("nvidia", "amd", "intel")
    assert cat.engine("sglang").accelerator_vendors == ("nvidia", "amd")
    assert cat.engine("trtllm").accelerator_vendors == ("nvidia",)
    for e in cat.engines.values():
        assert isinstance(e.weight_precisions, tuple) and "bf16" in e.weight_precisions
        assert "fp8" in e.kv_dtypes and "auto" in e.kv_dtypes
        assert 0 < e.default_gpu_mem_fraction <= 1
    assert cat.engine("vllm").default_gpu_mem_fraction == 0.9
    assert cat.engine("trtllm").default_max_num_seqs == 2048
    assert cat.engine("vllm").knobs["tp"] == "--tensor-parallel-size"


# ----------------------------------------------------------------- error paths


def test_unknown_id_suggests_the_closest(cat: Catalog) -> None:
    with pytest.raises(CatalogError) as exc:
        cat.model("llama3.1-8b")
    err = exc.value
    assert isinstance(err, KeyError)
    assert "model" in str(err) and "'llama3.1-8b'" in str(err)
    assert "llama-3.1-8b" in err.suggestions and "llama-3.1-8b" in str(err)
    with pytest.raises(KeyError, match="h100-sxm"):
        cat.accelerator("h100_sxm")
    with pytest.raises(CatalogError, match="sglang"):
        cat.engine("sglng")
    with pytest.raises(CatalogError, match="aws/us-east-1/h100-sxm/spot"):
        cat.offering("aws/us-east-1/h100/spot")


def _copy_data(tmp_path: Path) -> Path:
    for name in ("accelerators.yaml", "offerings.yaml", "models.yaml", "engines.yaml"):
        shutil.copy(DEFAULT_DATA_DIR / name, tmp_path / name)
    return tmp_path


def _edit(tmp_path: Path, name: str, fn: Callable[[list[dict[str, Any]]], None]) -> None:
    path = tmp_path / name
    records = yaml.safe_load(path.read_text())
    fn(records)
    path.write_text(yaml.safe_dump(records, sort_keys=False))


def _first(records: list[dict[str, Any]], rid: str) -> dict[str, Any]:
    return next(r for r in records if r["id"] == rid)


def test_temp_copy_loads(tmp_path: Path) -> None:
    cat = load_catalog(_copy_data(tmp_path))
    assert cat is not load_catalog()
    assert set(cat.models) == set(load_catalog().models)


@pytest.mark.parametrize(
    ("fname", "edit", "rid", "field", "text"),
    [
        ("accelerators.yaml", lambda rs: _first(rs, "l4").update(memory_gb=0),
         "l4", "memory_gb", "> 0"),
        ("accelerators.yaml", lambda rs: _first(rs, "h200").update(hbm_bandwidth_tb_s=-4.8),
         "h200", "hbm_bandwidth_tb_s", "> 0"),
        ("accelerators.yaml", lambda rs: _first(rs, "a10g").update(memory_gib=24),
         "a10g", "memory_gib", "unknown field"),
        ("accelerators.yaml", lambda rs: _first(rs, "b200").pop("gpus_per_node"),
         "b200", "gpus_per_node", "missing"),
        ("accelerators.yaml", lambda rs: _first(rs, "mi300x").update(interconnect="xgmi"),
         "mi300x", "interconnect", "not one of"),
        ("accelerators.yaml", lambda rs: _first(rs, "l40s").update(gpus_per_node="eight"),
         "l40s", "gpus_per_node", "integer"),
        ("accelerators.yaml", lambda rs: rs.append(dict(_first(rs, "l4"))),
         "l4", "id", "duplicate"),
        ("offerings.yaml",
         lambda rs: _first(rs, "aws/us-east-1/l4/spot").update(accelerator="l4x"),
         "aws/us-east-1/l4/spot", "accelerator", "unknown accelerator"),
        ("offerings.yaml",
         lambda rs: _first(rs, "aws/us-east-1/l4/on_demand").update(usd_per_gpu_hour=0),
         "aws/us-east-1/l4/on_demand", "usd_per_gpu_hour", "> 0"),
        ("offerings.yaml",
         lambda rs: _first(rs, "aws/us-east-1/l4/on_demand").update(market="ondemand"),
         "aws/us-east-1/l4/on_demand", "market", "not one of"),
        ("models.yaml", lambda rs: _first(rs, "mistral-7b").update(active_params_b=99.0),
         "mistral-7b", "active_params_b", "exceeds"),
        ("models.yaml", lambda rs: _first(rs, "llama-2-7b").update(num_experts=8),
         "llama-2-7b", "experts_per_token", "> 0"),
        ("engines.yaml", lambda rs: _first(rs, "vllm").update(kv_dtypes="fp8"),
         "vllm", "kv_dtypes", "list of strings"),
        ("engines.yaml", lambda rs: _first(rs, "sglang").update(kv_dtypes=["int2"]),
         "sglang", "kv_dtypes", "int2"),
    ],
)
def test_bad_record_names_file_id_and_field(
    tmp_path: Path, fname: str, edit: Callable[[list[dict[str, Any]]], None], rid: str,
    field: str, text: str,
) -> None:
    data = _copy_data(tmp_path)
    _edit(data, fname, edit)
    with pytest.raises(CatalogError) as exc:
        load_catalog(data)
    msg = str(exc.value)
    assert fname in msg and repr(rid) in msg and repr(field) in msg and text in msg, msg
    assert (exc.value.file, exc.value.key, exc.value.field) == (fname, rid, field)


def test_missing_file_and_bad_shape(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    (data / "engines.yaml").unlink()
    with pytest.raises(CatalogError, match=r"engines\.yaml"):
        load_catalog(data)
    (data / "engines.yaml").write_text("vllm: {}\n")
    with pytest.raises(CatalogError, match=r"engines\.yaml.*list"):
        load_catalog(data)


def test_records_are_typed(cat: Catalog) -> None:
    off = cat.offering("aws/us-east-1/h100-sxm/spot")
    assert isinstance(off, Offering) and off.market is Market.SPOT
    assert isinstance(off.usd_per_gpu_hour, float) and isinstance(off.gpus_per_instance, int)
    assert isinstance(cat.engine("trtllm").knobs, dict)
