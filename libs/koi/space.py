"""The decision space: one typed, validated deployment configuration.

A ``DeploymentConfig`` is everything Koi decides for one job: where it runs
(accelerator, offering), how it is split (TP/PP/attention-DP/EP, replicas), which
engine and how that engine is tuned. Every knob has a default, a description and its
constraint next to it (``knob(...)`` metadata), so the CLI, the proto codec and the
docs derive from this one definition.

``validate(config, catalog)`` returns every violation with the knob it concerns;
``check`` raises the first. ``config_hash`` is the canonical hash used for caching.
This module holds no prediction logic and no I/O beyond reading the catalog.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from koi.catalog import Accelerator, Catalog, Engine, Model, load_catalog
from koi.errors import InvalidConfigError


class Precision(StrEnum):
    """Weight precision. ``bf16``/``fp16`` are 2 bytes; ``fp8``/``int8`` 1; ``int4``/``fp4`` ½."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"


class KvDtype(StrEnum):
    AUTO = "auto"  # same as the activation dtype (bf16/fp16)
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class SpecDecode(StrEnum):
    NONE = "none"
    NGRAM = "ngram"
    EAGLE = "eagle"
    DRAFT = "draft"


class SchedulingPolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class PreemptionMode(StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


WEIGHT_BYTES: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    # 4-bit formats carry group scales: ~0.5 B/param + ~3% (group size 128, fp16 scales)
    "int4": 0.53, "fp4": 0.53,
}
KV_BYTES: dict[str, float] = {"auto": 2.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


def knob(default: Any, help: str, **constraint: Any) -> Any:
    """A config field with its default, description and constraint in one place."""
    return field(default=default, metadata={"help": help, **constraint})


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    """One job's deployment: placement, parallelism and engine configuration."""

    model: str = knob("llama-3.1-8b", "Model id from the catalog.")
    accelerator: str = knob("h100-sxm", "Accelerator id from the catalog.")
    offering: str = knob("", "Offering id (cloud/region/accelerator/market); '' = any.")
    engine: str = knob("vllm", "Inference engine id.", choices=("vllm", "sglang", "trtllm"))
    tp: int = knob(1, "Tensor-parallel degree.", min=1, max=64)
    pp: int = knob(1, "Pipeline-parallel degree (stages).", min=1, max=16)
    dp_attention: int = knob(1, "Attention data-parallel ranks inside one engine (MoE only).",
                             min=1, max=64)
    ep: int = knob(1, "Expert-parallel degree (MoE only): 1 or tp × dp_attention.", min=1, max=64)
    replicas: int = knob(1, "Independent engine replicas (data parallel).", min=1, max=1024)
    weight_precision: Precision = knob(Precision.BF16, "Weight precision.",
                                       choices=tuple(Precision))
    kv_dtype: KvDtype = knob(KvDtype.AUTO, "KV-cache element type.", choices=tuple(KvDtype))
    gpu_mem_fraction: float = knob(0.9, "Share of GPU memory the engine may use.",
                                   min=0.1, max=0.98)
    max_num_seqs: int = knob(256, "Max sequences in one batch.", min=1, max=8192)
    max_batched_tokens: int = knob(8192, "Max tokens in one forward pass.", min=16,
                                   max=1_048_576)
    max_model_len: int = knob(0, "Max context length; 0 = the model's.", min=0, max=1_048_576)
    chunked_prefill: bool = knob(True, "Split long prompts into chunks mixed with decodes.")
    prefix_caching: bool = knob(True, "Reuse KV of shared prompt prefixes.")
    cuda_graphs: bool = knob(True, "Capture decode steps as CUDA/HIP graphs.")
    spec_decode: SpecDecode = knob(SpecDecode.NONE, "Speculative decoding method.",
                                   choices=tuple(SpecDecode))
    spec_tokens: int = knob(0, "Speculative tokens per step (0 when spec_decode=none).",
                            min=0, max=8)
    block_size: int = knob(16, "KV-cache block size in tokens.", choices=(8, 16, 32, 64, 128))
    scheduling_policy: SchedulingPolicy = knob(SchedulingPolicy.FCFS, "Request scheduling.",
                                               choices=tuple(SchedulingPolicy))
    preemption_mode: PreemptionMode = knob(PreemptionMode.RECOMPUTE,
                                           "What happens to KV when the cache overflows.",
                                           choices=tuple(PreemptionMode))
    multi_node: bool = knob(False, "Allow TP×PP to span nodes (else it must fit one node).")
    custom_allreduce: bool = knob(True, "Use the engine's one-shot all-reduce for small TP.")
    pd_disaggregation: bool = knob(False, "Run prefill and decode in separate pools.")
    prefill_accelerator: str = knob("", "Prefill pool accelerator ('' = same as decode).")
    prefill_tp: int = knob(0, "Prefill pool TP (0 = same as tp).", min=0, max=64)
    prefill_replicas: int = knob(0, "Prefill pool replicas (0 = none / not disaggregated).",
                                 min=0, max=1024)

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp_attention

    @property
    def total_gpus(self) -> int:
        prefill = 0
        if self.pd_disaggregation:
            prefill = (self.prefill_tp or self.tp) * self.prefill_replicas
        return self.gpus_per_replica * self.replicas + prefill

    def with_(self, **changes: Any) -> DeploymentConfig:
        return replace(self, **changes)


KNOBS: tuple[str, ...] = tuple(f.name for f in fields(DeploymentConfig))
_KNOB_SET = frozenset(KNOBS)
# per knob: (name, its metadata, its enum type where its choices are an enum's), read once
# (validation runs over every proposer grid configuration)
_RULES: tuple[tuple[str, Any, type | None], ...] = tuple(
    (f.name, f.metadata, type(f.metadata["choices"][0])
     if f.metadata.get("choices") and isinstance(f.metadata["choices"][0], StrEnum) else None)
    for f in fields(DeploymentConfig))


def knob_help(name: str) -> dict[str, Any]:
    """The metadata (help text and constraint) of one knob."""
    for f in fields(DeploymentConfig):
        if f.name == name:
            return dict(f.metadata)
    raise KeyError(name)


def config_to_dict(config: DeploymentConfig) -> dict[str, Any]:
    """Plain JSON-able dict (enums as their string values)."""
    return {k: (v.value if isinstance(v, StrEnum) else v) for k, v in asdict(config).items()}


def config_from_dict(data: dict[str, Any]) -> DeploymentConfig:
    """Build a config from a plain dict, coercing enum strings; unknown keys are an error."""
    unknown = sorted(set(data) - _KNOB_SET)
    if unknown:
        raise InvalidConfigError(unknown[0], f"unknown knob; known knobs: {', '.join(KNOBS)}")
    kwargs: dict[str, Any] = {}
    for name, meta, enum_type in _RULES:
        if name not in data:
            continue
        value = data[name]
        if enum_type is not None:
            try:
                value = enum_type(value)
            except ValueError:
                allowed = ", ".join(c.value for c in meta["choices"])
                raise InvalidConfigError(name, f"{value!r} is not one of {allowed}") from None
        kwargs[name] = value
    return DeploymentConfig(**kwargs)


def engine_default_config(model: str, accelerator: str, engine: str = "vllm",
                          catalog: Catalog | None = None, **knobs: Any) -> DeploymentConfig:
    """A config with the engine's own defaults for its batching and memory knobs.

    What an operator gets by launching the engine without those flags; ``knobs``
    override anything (enum knobs may be given as strings).
    """
    eng = (catalog or load_catalog()).engine(engine)
    base: dict[str, Any] = {
        "model": model, "accelerator": accelerator, "engine": engine,
        "max_num_seqs": eng.default_max_num_seqs,
        "max_batched_tokens": max(eng.default_max_batched_tokens, eng.default_max_num_seqs),
        "gpu_mem_fraction": eng.default_gpu_mem_fraction,
        "chunked_prefill": eng.supports_chunked_prefill,
        "prefix_caching": eng.supports_prefix_caching,
    }
    base.update(knobs)
    return config_from_dict(base)


def config_hash(config: DeploymentConfig) -> str:
    """Canonical hash: sorted-key JSON of every knob, so equal configs hash equally."""
    blob = json.dumps(config_to_dict(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- memory ----------------------------------------------------------------------------

# Vendors' memory figures are binary: an "80 GB" H100 reports 81,559 MiB.
GIB = float(2**30)

# Memory an engine keeps besides weights and KV: CUDA context, activations at the
# max-batched-tokens pass, CUDA-graph pools, sampler buffers. A fixed part plus a part
# that grows with the pass size; typical of vLLM's profile run on an 8B model.
RUNTIME_FIXED_GB = 1.5
RUNTIME_PER_TOKEN_BYTES_PER_HIDDEN = 24.0  # × hidden_size × max_batched_tokens / tp


def weight_bytes_per_gpu(model: Model, cfg: DeploymentConfig) -> float:
    """Weight bytes resident on one GPU of a replica."""
    wb = WEIGHT_BYTES[cfg.weight_precision]
    dense_b, expert_b = split_params(model)
    dense = dense_b * 1e9 * wb / (cfg.tp * cfg.pp)
    expert = expert_b * 1e9 * wb / (cfg.tp * cfg.pp * cfg.dp_attention)
    return dense + expert


def split_params(model: Model) -> tuple[float, float]:
    """(dense, routed-expert) parameters in billions; routed experts are 0 for dense models."""
    if not model.is_moe:
        return model.params_b, 0.0
    moe_layers = model.num_layers - model.first_dense_layers
    per_layer = 3 * model.hidden_size * model.moe_intermediate_size * model.num_experts
    expert_b = min(per_layer * moe_layers / 1e9, model.params_b * 0.98)
    return model.params_b - expert_b, expert_b


def kv_bytes_per_token_per_gpu(model: Model, cfg: DeploymentConfig) -> float:
    """KV-cache bytes one token of context occupies on one GPU of a replica."""
    kvb = KV_BYTES[cfg.kv_dtype]
    layers = model.num_layers / cfg.pp
    if model.uses_mla:
        # MLA caches one compressed latent per token, replicated on every TP rank.
        return layers * (model.mla_kv_lora_rank + model.mla_rope_head_dim) * kvb
    kv_heads_per_gpu = max(1.0, model.num_kv_heads / cfg.tp)
    return 2.0 * layers * kv_heads_per_gpu * model.head_dim * kvb


def runtime_reserve_bytes(model: Model, cfg: DeploymentConfig) -> float:
    per_token = RUNTIME_PER_TOKEN_BYTES_PER_HIDDEN * model.hidden_size / cfg.tp
    return RUNTIME_FIXED_GB * 1e9 + per_token * min(cfg.max_batched_tokens, 65536)


def kv_budget_bytes_per_gpu(model: Model, accel: Accelerator, cfg: DeploymentConfig,
                            engine: Engine | None = None) -> float:
    """Bytes left for the KV cache on one GPU after weights and runtime reserve."""
    total = accel.memory_gb * GIB
    fixed = weight_bytes_per_gpu(model, cfg) + runtime_reserve_bytes(model, cfg)
    if engine is not None and engine.mem_fraction_of_free:
        return (total - fixed) * cfg.gpu_mem_fraction
    return total * cfg.gpu_mem_fraction - fixed


def kv_capacity_tokens(model: Model, accel: Accelerator, cfg: DeploymentConfig,
                       engine: Engine | None = None) -> float:
    """Tokens of context one replica can hold (per attention-DP rank × ranks)."""
    budget = kv_budget_bytes_per_gpu(model, accel, cfg, engine)
    if budget <= 0:
        return 0.0
    return budget / kv_bytes_per_token_per_gpu(model, cfg) * cfg.dp_attention


# --- validation ------------------------------------------------------------------------

def validate(cfg: DeploymentConfig, catalog: Catalog | None = None) -> list[InvalidConfigError]:
    """Every reason this configuration cannot run, each naming its knob (empty = valid)."""
    cat = catalog or load_catalog()
    errors: list[InvalidConfigError] = []

    def bad(knob_name: str, reason: str) -> None:
        errors.append(InvalidConfigError(knob_name, reason))

    errors.extend(_check_ranges(cfg))
    try:
        model = cat.model(cfg.model)
    except KeyError as e:
        bad("model", str(e.args[0]) if e.args else str(e))
        return errors
    try:
        accel = cat.accelerator(cfg.accelerator)
    except KeyError as e:
        bad("accelerator", str(e.args[0]) if e.args else str(e))
        return errors
    try:
        engine = cat.engine(cfg.engine)
    except KeyError as e:
        bad("engine", str(e.args[0]) if e.args else str(e))
        return errors
    if errors:
        return errors
    _check_offering(cfg, cat, bad)
    _check_engine(cfg, engine, accel, bad)
    _check_precision(cfg, accel, bad)
    _check_parallelism(cfg, model, accel, bad)
    _check_batching(cfg, model, bad)
    _check_disaggregation(cfg, cat, engine, bad)
    if not errors:
        _check_memory(cfg, model, accel, engine, bad)
    return errors


def check(cfg: DeploymentConfig, catalog: Catalog | None = None) -> DeploymentConfig:
    """Return ``cfg`` if valid, else raise the first ``InvalidConfigError``."""
    errors = validate(cfg, catalog)
    if errors:
        raise errors[0]
    return cfg


def _check_ranges(cfg: DeploymentConfig) -> list[InvalidConfigError]:
    errors = []
    for name, meta, _ in _RULES:
        value = getattr(cfg, name)
        if "min" in meta and value < meta["min"]:
            errors.append(InvalidConfigError(name, f"{value} is below the minimum {meta['min']}"))
        if "max" in meta and value > meta["max"]:
            errors.append(InvalidConfigError(name, f"{value} is above the maximum {meta['max']}"))
        choices = meta.get("choices")
        if choices and value not in choices:
            allowed = ", ".join(str(getattr(c, "value", c)) for c in choices)
            errors.append(InvalidConfigError(name, f"{value!r} is not one of {allowed}"))
    return errors


def _check_offering(cfg: DeploymentConfig, cat: Catalog, bad: Any) -> None:
    if not cfg.offering:
        return
    try:
        off = cat.offering(cfg.offering)
    except KeyError as e:
        bad("offering", str(e.args[0]) if e.args else str(e))
        return
    if off.accelerator != cfg.accelerator:
        bad("offering", f"{cfg.offering} sells {off.accelerator}, not {cfg.accelerator}")


def _check_engine(cfg: DeploymentConfig, engine: Engine, accel: Accelerator, bad: Any) -> None:
    if accel.vendor not in engine.accelerator_vendors:
        bad("engine", f"{engine.id} does not run on {accel.vendor} accelerators ({accel.id})")
    if cfg.weight_precision.value not in engine.weight_precisions:
        bad("weight_precision", f"{engine.id} does not serve {cfg.weight_precision} weights")
    if cfg.kv_dtype.value not in engine.kv_dtypes:
        bad("kv_dtype", f"{engine.id} does not support a {cfg.kv_dtype} KV cache")
    if cfg.chunked_prefill and not engine.supports_chunked_prefill:
        bad("chunked_prefill", f"{engine.id} has no chunked prefill")
    if cfg.spec_decode != SpecDecode.NONE and not engine.supports_spec_decode:
        bad("spec_decode", f"{engine.id} has no speculative decoding")
    if cfg.dp_attention > 1 and not engine.supports_dp_attention:
        bad("dp_attention", f"{engine.id} has no attention data parallelism")
    if (cfg.spec_decode == SpecDecode.NONE) != (cfg.spec_tokens == 0):
        bad("spec_tokens", "must be 0 exactly when spec_decode is none")


def _check_precision(cfg: DeploymentConfig, accel: Accelerator, bad: Any) -> None:
    if cfg.weight_precision == Precision.FP8 and not accel.supports_fp8:
        bad("weight_precision", f"fp8 needs fp8 tensor cores; {accel.id} has none")
    if cfg.weight_precision == Precision.FP4 and not accel.supports_fp4:
        bad("weight_precision", f"fp4 needs fp4 tensor cores; {accel.id} has none")
    if cfg.kv_dtype == KvDtype.FP8 and not accel.supports_fp8:
        bad("kv_dtype", f"an fp8 KV cache needs fp8 support; {accel.id} has none")
    if cfg.weight_precision == Precision.BF16 and accel.family in ("turing", "volta"):
        bad("weight_precision", f"{accel.id} has no bf16; use fp16")


def _check_parallelism(cfg: DeploymentConfig, model: Model, accel: Accelerator,
                       bad: Any) -> None:
    if model.num_attention_heads % cfg.tp:
        bad("tp", f"tp={cfg.tp} does not divide the {model.num_attention_heads} attention heads"
                  f" of {model.id}")
    if model.num_kv_heads % cfg.tp and cfg.tp % model.num_kv_heads:
        bad("tp", f"tp={cfg.tp} does not divide the {model.num_kv_heads} KV heads of {model.id}"
                  " (nor is it a multiple of them)")
    if cfg.pp > model.num_layers:
        bad("pp", f"pp={cfg.pp} exceeds the {model.num_layers} layers of {model.id}")
    if not model.is_moe and (cfg.ep > 1 or cfg.dp_attention > 1):
        knob_name = "ep" if cfg.ep > 1 else "dp_attention"
        bad(knob_name, f"{model.id} is dense: use replicas for data parallelism")
    if model.is_moe and cfg.ep not in (1, cfg.tp * cfg.dp_attention):
        bad("ep", f"ep must be 1 or tp×dp_attention={cfg.tp * cfg.dp_attention}")
    if model.is_moe and cfg.ep > model.num_experts:
        bad("ep", f"ep={cfg.ep} exceeds the {model.num_experts} experts of {model.id}")
    per_node = accel.gpus_per_node * accel.max_nodes_nvlink_domain
    if cfg.gpus_per_replica > per_node and not cfg.multi_node:
        bad("tp" if cfg.tp > per_node else "pp",
            f"tp×pp×dp_attention={cfg.gpus_per_replica} exceeds the {accel.gpus_per_node} GPUs"
            f" of one {accel.id} node; set multi_node to span nodes")


def _check_batching(cfg: DeploymentConfig, model: Model, bad: Any) -> None:
    if cfg.max_batched_tokens < cfg.max_num_seqs:
        bad("max_batched_tokens", f"{cfg.max_batched_tokens} is below max_num_seqs="
                                  f"{cfg.max_num_seqs}: a decode step could not fit")
    max_len = cfg.max_model_len or model.max_context
    if cfg.max_model_len > model.max_context:
        bad("max_model_len", f"{cfg.max_model_len} exceeds {model.id}'s context of"
                             f" {model.max_context}")
    if not cfg.chunked_prefill and cfg.max_batched_tokens < max_len:
        bad("max_batched_tokens", f"without chunked prefill it must be ≥ max_model_len={max_len}"
                                  " so a whole prompt fits one pass")


def _check_disaggregation(cfg: DeploymentConfig, cat: Catalog, engine: Engine,
                          bad: Any) -> None:
    if not cfg.pd_disaggregation:
        if cfg.prefill_replicas or cfg.prefill_accelerator or cfg.prefill_tp:
            bad("pd_disaggregation", "prefill pool knobs are set but disaggregation is off")
        return
    if not engine.supports_pd_disaggregation:
        bad("pd_disaggregation", f"{engine.id} has no prefill/decode disaggregation")
    if cfg.prefill_replicas < 1:
        bad("prefill_replicas", "a disaggregated deployment needs ≥ 1 prefill replica")
    if cfg.prefill_accelerator:
        try:
            cat.accelerator(cfg.prefill_accelerator)
        except KeyError as e:
            bad("prefill_accelerator", str(e.args[0]) if e.args else str(e))


def _check_memory(cfg: DeploymentConfig, model: Model, accel: Accelerator, engine: Engine,
                  bad: Any) -> None:
    share = 1.0 if engine.mem_fraction_of_free else cfg.gpu_mem_fraction
    usable_gb = accel.memory_gb * GIB * share / 1e9
    weights_gb = weight_bytes_per_gpu(model, cfg) / 1e9
    reserve_gb = runtime_reserve_bytes(model, cfg) / 1e9
    if weights_gb + reserve_gb > usable_gb:
        bad("weight_precision" if cfg.tp * cfg.pp >= accel.gpus_per_node else "tp",
            f"{model.id} weights need {weights_gb:.1f} GB per GPU (+{reserve_gb:.1f} GB runtime)"
            f" but {cfg.engine} on {accel.id} (gpu_mem_fraction {cfg.gpu_mem_fraction}) leaves"
            f" {usable_gb:.1f} GB;"
            " raise tp/pp or use a smaller weight precision")
        return
    cap = kv_capacity_tokens(model, accel, cfg, engine)
    need = cfg.max_model_len or min(model.max_context, 4096)
    if cap < need:
        bad("gpu_mem_fraction", f"KV cache holds {cap:.0f} tokens, fewer than one sequence of"
                                f" {need} tokens; raise tp/pp, gpu_mem_fraction or use fp8 KV")
