"""A ``DeploymentConfig`` as the command line of a real engine container.

Each engine's official image (pinned in ``IMAGES``, the one place tags live) and the
flags that carry Koi's knobs, checked against the engines' own documentation:

- vLLM ``vllm serve`` — flags are EngineArgs fields in kebab case, booleans with a
  ``--no-`` form (vllm/engine/arg_utils.py @ 99d7eb5d, the commit the catalog cites;
  docs.vllm.ai "Engine Arguments", vllm.config.parallel / vllm.config.cache pages):
  --tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size,
  --enable-expert-parallel, --max-num-seqs, --max-num-batched-tokens,
  --gpu-memory-utilization, --kv-cache-dtype, --[no-]enable-prefix-caching,
  --[no-]enable-chunked-prefill, --enforce-eager, --max-model-len, --block-size,
  --speculative-config (JSON), --quantization, --dtype, --scheduling-policy,
  --disable-custom-all-reduce, --distributed-executor-backend.
- SGLang ``python3 -m sglang.launch_server`` (docs.sglang.io "Server Arguments"; the
  LeaderWorkerSet example in kubernetes-sigs/lws docs/examples/sglang for multi-node):
  --model-path, --tp-size, --pp-size, --enable-metrics, --dp-size, --enable-dp-attention,
  --ep-size, --mem-fraction-static, --max-running-requests, --chunked-prefill-size (-1 = off),
  --max-prefill-tokens, --kv-cache-dtype, --disable-radix-cache, --disable-cuda-graph,
  --context-length, --page-size, --quantization, --dtype, --speculative-algorithm,
  --speculative-num-draft-tokens, --speculative-draft-model-path, --schedule-policy,
  --enable-priority-scheduling, --disable-custom-all-reduce, --nnodes, --node-rank,
  --dist-init-addr.
- TensorRT-LLM ``trtllm-serve`` (nvidia.github.io/TensorRT-LLM commands/trtllm-serve;
  tensorrt_llm/commands/serve.py @ 00209af1 as the catalog cites): --backend, --tp_size,
  --pp_size, --ep_size, --max_batch_size, --max_num_tokens, --max_seq_len,
  --kv_cache_free_gpu_memory_fraction, --enable_chunked_prefill,
  --extra_llm_api_options (a YAML file: kv_cache_config.enable_block_reuse,
  kv_cache_config.dtype, enable_attention_dp, cuda_graph_config, speculative_config,
  dtype — the knobs trtllm-serve has no flag for, as catalog/data/engines.yaml says).

The catalog's ``Engine.knobs`` table names the same flags; a unit test checks the two
agree. Pure: no I/O, no kubernetes imports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from koi.catalog import Catalog, Model
from koi.errors import KoiError
from koi.space import DeploymentConfig, KvDtype, Precision, SpecDecode

# (engine, accelerator vendor) -> image. Sources: docs.vllm.ai "Using Docker"
# (vllm/vllm-openai:v0.11.0); ROCm/amdgpu-docs issue #88 lists rocm/vllm tags;
# docs.habana.ai "vLLM Quick Start" (the Gaudi vllm-installer image, versioned by path);
# docs.sglang.io "Installation" (v0.5.19-cu129 is the last CUDA 12 tag);
# rocm.docs.amd.com "SGLang inference and serving on ROCm"; TensorRT-LLM 1.0.0 docs
# ("Run benchmarking with trtllm-serve": nvcr.io/nvidia/tensorrt-llm/release:1.0.0).
IMAGES: dict[tuple[str, str], str] = {
    ("vllm", "nvidia"): "vllm/vllm-openai:v0.11.0",
    ("vllm", "amd"): "rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210",
    ("vllm", "intel"): "vault.habana.ai/gaudi-docker/1.23.0/ubuntu22.04/habanalabs/"
                       "vllm-installer-2.9.0:latest",
    ("sglang", "nvidia"): "lmsysorg/sglang:v0.5.19-cu129",
    ("sglang", "amd"): "rocm/sgl-dev:v0.5.13.post1-ubuntu24.04-py3.14-rocm7.14",
    ("trtllm", "nvidia"): "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
}
PORTS = {"vllm": 8000, "sglang": 30000, "trtllm": 8000}
HEALTH_PATH = "/health"  # all three serve GET /health (200 once the model is loaded)
SGLANG_DIST_PORT = 20000
TRTLLM_OPTIONS_FILE = "/tmp/koi-extra-llm-api-options.yaml"
TRTLLM_OPTIONS_ENV = "KOI_EXTRA_LLM_API_OPTIONS"
# Constant shell programs; the data they need comes in through "$@" and environment
# variables, never spliced into the script, so no id or knob value is ever parsed by a
# shell. vLLM spans nodes with Ray (the helper script ships in the vLLM image, as the
# LWS vLLM example uses it); TRT-LLM reads its extra options from a file.
VLLM_RAY_LEADER = ('bash /vllm-workspace/examples/online_serving/multi-node-serving.sh '
                   'leader --ray_cluster_size="$LWS_GROUP_SIZE" && exec vllm serve "$@"')
VLLM_RAY_WORKER = ('exec bash /vllm-workspace/examples/online_serving/multi-node-serving.sh'
                   ' worker --ray_address="$LWS_LEADER_ADDRESS"')
TRTLLM_WRAPPER = (f'printf "%s" "${TRTLLM_OPTIONS_ENV}" > {TRTLLM_OPTIONS_FILE} '
                  f'&& exec trtllm-serve "$@"')
NGRAM_LOOKUP = 4  # n-gram window for prompt-lookup speculation (a common setting)


class ManifestError(KoiError, ValueError):
    """A deployment Koi cannot write a manifest for; the message says why."""


@dataclass(frozen=True, slots=True)
class Launch:
    """One container's entry: command, arguments, port and plain environment."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    port: int
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Weights:
    """Where the weights come from and the flags that say their precision."""

    path: str
    quantization: str = ""   # an on-load quantization the engine applies ("fp8")
    dtype: str = ""          # activation dtype: bfloat16 | float16 | "" (engine's choice)


def image_for(engine: str, vendor: str, images: Mapping[tuple[str, str], str]) -> str:
    image = images.get((engine, vendor))
    if not image:
        raise ManifestError(f"no {engine} image for {vendor} accelerators")
    return image


def weights(cfg: DeploymentConfig, model: Model,
            checkpoints: Mapping[str, str]) -> Weights:
    """The checkpoint for ``cfg.weight_precision``: one named in ``checkpoints``
    (``"<model>/<precision>"``: the engine reads its quantization from the checkpoint),
    else the catalog's repo, which serves bf16/fp16 as is and fp8 through vLLM's and
    SGLang's on-load FP8 quantization. Other precisions need a pre-quantized checkpoint
    (AWQ/GPTQ int4, W8A8 int8, NVFP4, ModelOpt FP8 for TensorRT-LLM): refused without."""
    prec = cfg.weight_precision
    dtype = _dtype(cfg)
    named = checkpoints.get(f"{model.id}/{prec.value}")
    if named:
        return Weights(named, dtype=dtype)
    if prec in (Precision.BF16, Precision.FP16):
        return Weights(model.hf_repo, dtype=dtype)
    if prec == Precision.FP8 and cfg.engine in ("vllm", "sglang"):
        return Weights(model.hf_repo, quantization="fp8", dtype=dtype)
    raise ManifestError(f"{prec.value} weights of {model.id} on {cfg.engine} need a"
                        f" pre-quantized checkpoint: name one as checkpoints"
                        f"['{model.id}/{prec.value}']")


def _dtype(cfg: DeploymentConfig) -> str:
    # the KV cache's bf16/fp16 is the activation dtype (no engine has it as a KV value)
    if cfg.kv_dtype in (KvDtype.BF16, KvDtype.FP16):
        return "bfloat16" if cfg.kv_dtype == KvDtype.BF16 else "float16"
    if cfg.weight_precision in (Precision.BF16, Precision.FP16):
        return "bfloat16" if cfg.weight_precision == Precision.BF16 else "float16"
    return ""


def _draft(cfg: DeploymentConfig, model: Model, drafts: Mapping[str, str]) -> str:
    if cfg.spec_decode in (SpecDecode.EAGLE, SpecDecode.DRAFT):
        draft = drafts.get(model.id)
        if not draft:
            raise ManifestError(f"{cfg.spec_decode.value} speculative decoding for"
                                f" {model.id} needs a draft model: name one as"
                                f" draft_models['{model.id}']")
        return draft
    return ""


def vllm_args(cfg: DeploymentConfig, model: Model, w: Weights, draft: str,
              nodes: int) -> list[str]:
    a = [w.path, "--host", "0.0.0.0", "--port", str(PORTS["vllm"]),
         "--served-model-name", model.id,
         "--tensor-parallel-size", str(cfg.tp), "--pipeline-parallel-size", str(cfg.pp)]
    if cfg.dp_attention > 1:
        a += ["--data-parallel-size", str(cfg.dp_attention)]
    if cfg.ep > 1:
        a.append("--enable-expert-parallel")  # vLLM's EP degree is TP x DP
    a += ["--max-num-seqs", str(cfg.max_num_seqs),
          "--max-num-batched-tokens", str(cfg.max_batched_tokens),
          "--gpu-memory-utilization", _num(cfg.gpu_mem_fraction),
          "--kv-cache-dtype", "fp8" if cfg.kv_dtype == KvDtype.FP8 else "auto",
          "--enable-prefix-caching" if cfg.prefix_caching else "--no-enable-prefix-caching",
          "--enable-chunked-prefill" if cfg.chunked_prefill
          else "--no-enable-chunked-prefill",
          "--block-size", str(cfg.block_size),
          "--scheduling-policy", cfg.scheduling_policy.value]
    if not cfg.cuda_graphs:
        a.append("--enforce-eager")
    if not cfg.custom_allreduce:
        a.append("--disable-custom-all-reduce")
    if cfg.max_model_len:
        a += ["--max-model-len", str(cfg.max_model_len)]
    if w.quantization:
        a += ["--quantization", w.quantization]
    if w.dtype:
        a += ["--dtype", w.dtype]
    if cfg.spec_decode != SpecDecode.NONE:
        a += ["--speculative-config", json.dumps(_vllm_spec(cfg, draft), sort_keys=True)]
    if nodes > 1:
        a += ["--distributed-executor-backend", "ray"]
    # preemption_mode: vLLM V1 always recomputes; there is no flag for swapping
    return a


def _vllm_spec(cfg: DeploymentConfig, draft: str) -> dict[str, object]:
    spec: dict[str, object] = {"num_speculative_tokens": cfg.spec_tokens}
    if cfg.spec_decode == SpecDecode.NGRAM:
        spec.update(method="ngram", prompt_lookup_max=NGRAM_LOOKUP)
    elif cfg.spec_decode == SpecDecode.EAGLE:
        spec.update(method="eagle", model=draft)
    else:
        spec.update(model=draft)  # a draft model: vLLM infers the method
    return spec


def sglang_args(cfg: DeploymentConfig, model: Model, w: Weights, draft: str,
                nodes: int) -> list[str]:
    # SGLang's TP group spans the attention-DP ranks: --tp-size is every GPU of a stage
    a = ["--model-path", w.path, "--served-model-name", model.id,
         "--host", "0.0.0.0", "--port", str(PORTS["sglang"]),
         "--tp-size", str(cfg.tp * cfg.dp_attention), "--pp-size", str(cfg.pp),
         # SGLang serves /metrics only when asked; engine-metrics reads it (docs/FLEETS.md)
         "--enable-metrics"]
    if cfg.dp_attention > 1:
        a += ["--dp-size", str(cfg.dp_attention), "--enable-dp-attention"]
    if cfg.ep > 1:
        a += ["--ep-size", str(cfg.ep)]
    a += ["--mem-fraction-static", _num(cfg.gpu_mem_fraction),
          "--max-running-requests", str(cfg.max_num_seqs),
          "--kv-cache-dtype", "fp8_e4m3" if cfg.kv_dtype == KvDtype.FP8 else "auto",
          "--page-size", str(cfg.block_size)]
    if cfg.chunked_prefill:
        a += ["--chunked-prefill-size", str(cfg.max_batched_tokens)]
    else:
        a += ["--chunked-prefill-size", "-1", "--max-prefill-tokens",
              str(cfg.max_batched_tokens)]
    if not cfg.prefix_caching:
        a.append("--disable-radix-cache")
    if not cfg.cuda_graphs:
        a.append("--disable-cuda-graph")
    if not cfg.custom_allreduce:
        a.append("--disable-custom-all-reduce")
    a += (["--enable-priority-scheduling"] if cfg.scheduling_policy.value == "priority"
          else ["--schedule-policy", "fcfs"])
    if cfg.max_model_len:
        a += ["--context-length", str(cfg.max_model_len)]
    if w.quantization:
        a += ["--quantization", w.quantization]
    if w.dtype:
        a += ["--dtype", w.dtype]
    if cfg.spec_decode != SpecDecode.NONE:
        algo = {SpecDecode.NGRAM: "NGRAM", SpecDecode.EAGLE: "EAGLE",
                SpecDecode.DRAFT: "STANDALONE"}[cfg.spec_decode]
        a += ["--speculative-algorithm", algo,
              "--speculative-num-draft-tokens", str(cfg.spec_tokens)]
        if draft:
            a += ["--speculative-draft-model-path", draft]
    if nodes > 1:
        # $(VAR) is expanded by the kubelet from the variables LeaderWorkerSet injects
        a += ["--nnodes", str(nodes), "--node-rank", "$(LWS_WORKER_INDEX)",
              "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{SGLANG_DIST_PORT}"]
    return a


def trtllm_args(cfg: DeploymentConfig, w: Weights) -> list[str]:
    a = [w.path, "--host", "0.0.0.0", "--port", str(PORTS["trtllm"]),
         "--backend", "pytorch",
         "--tp_size", str(cfg.tp * cfg.dp_attention), "--pp_size", str(cfg.pp)]
    if cfg.ep > 1:
        a += ["--ep_size", str(cfg.ep)]
    a += ["--max_batch_size", str(cfg.max_num_seqs),
          "--max_num_tokens", str(cfg.max_batched_tokens),
          "--kv_cache_free_gpu_memory_fraction", _num(cfg.gpu_mem_fraction)]
    if cfg.max_model_len:
        a += ["--max_seq_len", str(cfg.max_model_len)]
    if cfg.chunked_prefill:
        a.append("--enable_chunked_prefill")
    a += ["--extra_llm_api_options", TRTLLM_OPTIONS_FILE]
    return a


def trtllm_options(cfg: DeploymentConfig, w: Weights, draft: str) -> dict[str, object]:
    """The LLM-API options trtllm-serve takes only from its YAML file."""
    kv: dict[str, object] = {"enable_block_reuse": cfg.prefix_caching,
                             "dtype": "fp8" if cfg.kv_dtype == KvDtype.FP8 else "auto"}
    opts: dict[str, object] = {"kv_cache_config": kv,
                               "enable_attention_dp": cfg.dp_attention > 1}
    if not cfg.cuda_graphs:
        opts["cuda_graph_config"] = None  # null turns CUDA graphs off
    if w.dtype:
        opts["dtype"] = w.dtype
    if cfg.spec_decode == SpecDecode.NGRAM:
        opts["speculative_config"] = {"decoding_type": "NGram",
                                      "max_draft_len": cfg.spec_tokens,
                                      "max_matching_ngram_size": NGRAM_LOOKUP}
    elif cfg.spec_decode != SpecDecode.NONE:
        kind = "Eagle" if cfg.spec_decode == SpecDecode.EAGLE else "DraftTarget"
        opts["speculative_config"] = {"decoding_type": kind,
                                      "max_draft_len": cfg.spec_tokens,
                                      "speculative_model_dir": draft}
    return opts


def launch(cfg: DeploymentConfig, catalog: Catalog, *, role: str, nodes: int,
           checkpoints: Mapping[str, str], draft_models: Mapping[str, str]) -> Launch:
    """The container entry for one pod of a replica: ``role`` is ``single`` (the whole
    replica in one pod), ``leader`` or ``worker`` (a LeaderWorkerSet group of
    ``nodes`` pods). Raises ``ManifestError`` for what cannot be written."""
    model = catalog.model(cfg.model)
    w = weights(cfg, model, checkpoints)
    draft = _draft(cfg, model, draft_models)
    port = PORTS[cfg.engine]
    if cfg.engine == "vllm":
        args = vllm_args(cfg, model, w, draft, nodes)
        if nodes == 1:
            return Launch(("vllm", "serve"), tuple(args), port)
        if role == "leader":
            return Launch(("sh", "-c", VLLM_RAY_LEADER, "koi-vllm-leader"), tuple(args), port)
        return Launch(("sh", "-c", VLLM_RAY_WORKER), (), port)
    if cfg.engine == "sglang":
        return Launch(("python3", "-m", "sglang.launch_server"),
                      tuple(sglang_args(cfg, model, w, draft, nodes)), port)
    if cfg.engine == "trtllm":
        if nodes > 1:
            raise ManifestError("TensorRT-LLM across nodes needs an MPI launch Koi does"
                                " not write; keep its replicas within one node")
        text = yaml.safe_dump(trtllm_options(cfg, w, draft), sort_keys=True)
        return Launch(("sh", "-c", TRTLLM_WRAPPER, "koi-trtllm"),
                      tuple(trtllm_args(cfg, w)), port, ((TRTLLM_OPTIONS_ENV, text),))
    raise ManifestError(f"unknown engine {cfg.engine!r}")


def _num(x: float) -> str:
    return f"{x:g}"
