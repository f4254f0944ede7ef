"""Catalog record types: accelerators, offerings, models and engines.

Plain frozen dataclasses that mirror the YAML files in ``catalog/data/``. Every
numeric field carries its unit in its name. This module holds no lookup logic and
no I/O (see ``catalog/loader.py``) and must not import transport code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Interconnect(StrEnum):
    """How GPUs inside one node talk to each other for tensor parallelism."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINITY_FABRIC = "infinity_fabric"
    ROCE = "roce"  # Gaudi: on-die RoCE ports


class Market(StrEnum):
    ON_DEMAND = "on_demand"
    SPOT = "spot"
    RESERVED = "reserved"


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One accelerator part (per chip figures, dense, no sparsity)."""

    id: str
    vendor: str  # nvidia | amd | intel
    family: str  # ampere | ada | hopper | blackwell | cdna3 | gaudi
    memory_gb: float
    hbm_bandwidth_tb_s: float
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense; 0 = no native fp8
    fp4_tflops: float  # dense; 0 = no native fp4
    int8_tops: float  # dense; 0 = unknown/unsupported
    interconnect: Interconnect
    interconnect_gb_s: float  # bidirectional per GPU, as vendors quote it
    interconnect_latency_us: float  # per collective hop (small-message latency)
    gpus_per_node: int
    max_nodes_nvlink_domain: int = 1  # >1 only for rack-scale NVLink parts
    source: str = ""
    notes: str = ""

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops > 0

    @property
    def supports_fp4(self) -> bool:
        return self.fp4_tflops > 0


@dataclass(frozen=True, slots=True)
class Offering:
    """A purchasable unit of capacity: accelerator × cloud × region × market."""

    id: str  # e.g. "aws/us-east-1/h100-sxm/spot"
    cloud: str  # aws | gcp | azure | lambda | runpod | oci ...
    region: str
    accelerator: str  # Accelerator.id
    market: Market
    usd_per_gpu_hour: float
    gpus_per_instance: int
    preemption_rate_per_hour: float  # expected reclaims per instance-hour (0 for on-demand)
    preemption_notice_s: float  # warning before a spot reclaim (0 = none)
    instance_type: str = ""
    source: str = ""
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Model:
    """A model architecture, from its public config.json."""

    id: str
    hf_repo: str
    params_b: float  # total parameters, billions
    active_params_b: float  # parameters touched per token (== params_b for dense)
    num_layers: int
    hidden_size: int
    intermediate_size: int  # dense FFN width (or the dense layers' width for MoE)
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    # Mixture of experts (0 experts = dense)
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_dense_layers: int = 0  # leading dense layers before MoE layers start
    # Multi-head latent attention (DeepSeek): the KV cache stores a compressed latent
    mla_kv_lora_rank: int = 0
    mla_rope_head_dim: int = 0
    source: str = ""
    notes: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.mla_kv_lora_rank > 0


@dataclass(frozen=True, slots=True)
class Engine:
    """An inference engine and the knobs it exposes, with its defaults."""

    id: str  # vllm | sglang | trtllm
    name: str
    default_max_num_seqs: int
    default_max_batched_tokens: int
    default_gpu_mem_fraction: float
    supports_chunked_prefill: bool
    supports_prefix_caching: bool
    supports_spec_decode: bool
    supports_pd_disaggregation: bool
    supports_dp_attention: bool
    weight_precisions: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    accelerator_vendors: tuple[str, ...]  # vendors it runs on
    # True when gpu_mem_fraction is a share of the memory left free after the weights
    # (TensorRT-LLM's kv_cache_free_gpu_memory_fraction), False when it caps the whole
    # GPU (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static).
    mem_fraction_of_free: bool = False
    # True when the scheduler reserves KV for a request's whole prompt + output at
    # admission (TensorRT-LLM's GUARANTEED_NO_EVICT), False when KV grows per token and
    # an overflow preempts (vLLM, SGLang)
    reserves_full_kv: bool = False
    source: str = ""
    notes: str = ""
    knobs: dict[str, str] = field(default_factory=dict)  # koi knob -> engine flag name
