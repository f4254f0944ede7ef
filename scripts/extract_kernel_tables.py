#!/usr/bin/env python3
"""Turn AIConfigurator's public kernel-time tables into the compact files Koi ships.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), directory
``aic-core/src/aiconfigurator_core/systems/data/<system>/<op>/trtllm/<version>/*.parquet``:
kernel latencies (ms) measured on real GPUs with TensorRT-LLM's kernels. For each system
that matches an accelerator of Koi's catalog, one engine version, this keeps

* ``gemm``: [dtype, m, n, k] at the power-of-two m values measured (all n, k);
* ``gen_attn``: decode attention [kv dtype, head_dim, heads, kv heads, batch, context]
  (context = step + 1, powers of two; sliding window 0 only);
* ``ctx_attn``: prefill attention [kv dtype, head_dim, heads, kv heads, batch, prompt];
* ``allreduce``: TensorRT-LLM custom all-reduce [GPUs, message elements] (bf16);
* ``moe``: fused MoE [shape key, tokens], balanced routing (else the mildest skew);

as float16 milliseconds (NaN = not measured) in one ``<system>.npz`` with a ``header``
entry (JSON: repository, commit, paths, licence, engine version). Nothing is fitted here.

GEMM and decode-attention cells are floored at their speed of light (``sol_floor``), as
AIConfigurator does when it loads the same tables (``clamp_gemm_grids_to_sol``,
``clamp_generation_attention_grids_to_sol`` in its ``perf_database``), with the peak
HBM bandwidth and tensor-core FLOP/s of its ``systems/<system>.yaml``: some collected
cells are faster than the part's HBM can stream their KV cache (H100 bf16 decode
attention, batch 512 × 512 tokens, 32/8 heads: 0.25 ms for 1.07 GB, 4.4 TB/s on a
3.35 TB/s part), which made decode passes at large batches too short.

Usage (needs pyarrow and pyyaml, only for this script; git for the bare mirror):
    python3 scripts/extract_kernel_tables.py --repo /path/to/aiconfigurator.git \
        --out libs/koi/predictor/data/kernels
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
from pathlib import Path

import numpy as np

REPOSITORY = "https://github.com/ai-dynamo/aiconfigurator"
DATA = "aic-core/src/aiconfigurator_core/systems/data"
# system directory → engine version kept: one with gemm, attention, comm and MoE collected
# for it (not reused from another version). B200 keeps 1.2.0rc5: 1.3.0rc10's decode
# attention is ~10x slower than 1.2.0rc5's and 1.3.0rc15's at the same shapes (e.g. 64/8
# heads, batch 128, 1k context: 0.6 ms against 0.037 ms with an fp8 cache).
SYSTEMS = {"h200_sxm": "1.3.0rc10", "h100_sxm": "1.3.0rc10", "b200_sxm": "1.2.0rc5",
           "a100_sxm": "1.0.0", "l40s": "1.0.0"}
SYSTEM_SPEC = "aic-core/src/aiconfigurator_core/systems/{system}.yaml"
FILES = {"gemm": "gemm/trtllm/{v}/gemm_perf.parquet",
         "ctx_attn": "attention/trtllm/{v}/context_attention_perf.parquet",
         "gen_attn": "attention/trtllm/{v}/generation_attention_perf.parquet",
         "allreduce": "comm/trtllm/{v}/custom_allreduce_perf.parquet",
         "moe": "moe/trtllm/{v}/moe_perf.parquet"}
GEMM_DTYPES = ("bfloat16", "fp8", "nvfp4")
KV_DTYPES = ("bfloat16", "fp8")
MOE_DTYPES = ("bfloat16", "fp8", "nvfp4")
# gated-MLP MoE kernels in the order preferred (the non-gated ones serve other models)
MOE_SOURCES = ("moe_torch_flow", "moe_torch_flow_cutlass")
# balanced routing; the mildest skew where balanced was not measured (A100)
DISTRIBUTIONS = ("balanced", "power_law_1.01")
# AIConfigurator's quant mappings (aiconfigurator-core common/enums.rs): bytes per element
# and the tensor-core rate a GEMM of that dtype runs at
GEMM_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "nvfp4": 9.0 / 16.0}
GEMM_FLOPS = {"bfloat16": "bfloat16_tc_flops", "fp8": "fp8_tc_flops", "nvfp4": "fp4_tc_flops"}
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}


def git_show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(repo), "show", f"{commit}:{path}"],
                          check=True, capture_output=True).stdout


def read_table(repo: Path, commit: str, path: str) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(git_show(repo, commit, path))).to_pydict()
    return {k: np.asarray(v) for k, v in table.items()}


def pow2(values: np.ndarray) -> np.ndarray:
    v = np.unique(values.astype(np.int64))
    return v[(v > 0) & ((v & (v - 1)) == 0)]


def fill(shape: tuple[int, ...], index: tuple[np.ndarray, ...], latency: np.ndarray
         ) -> np.ndarray:
    """A NaN array with each measured cell set to the median of its repeats."""
    out = np.full(shape, np.nan)
    flat = np.ravel_multi_index(index, shape)
    for cell in np.unique(flat):
        out.flat[cell] = np.median(latency[flat == cell])
    return out


def lookup(grid: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index into grid, mask of values on the grid)."""
    pos = np.searchsorted(grid, values)
    pos = np.clip(pos, 0, len(grid) - 1)
    return pos, grid[pos] == values


def gemm_table(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dtypes = [d for d in GEMM_DTYPES if d in set(t["gemm_dtype"])]
    m, n, k = pow2(t["m"]), np.unique(t["n"]), np.unique(t["k"])
    keep = np.isin(t["gemm_dtype"], dtypes) & np.isin(t["m"], m)
    d = np.array([dtypes.index(x) for x in t["gemm_dtype"][keep]])
    idx = (d, lookup(m, t["m"][keep])[0], lookup(n, t["n"][keep])[0], lookup(k, t["k"][keep])[0])
    return {"gemm": fill((len(dtypes), len(m), len(n), len(k)), idx, t["latency"][keep]),
            "gemm_dtypes": np.array(dtypes), "gemm_m": m, "gemm_n": n, "gemm_k": k}


def attention_table(t: dict[str, np.ndarray], prefix: str, length: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """``length``: the context (decode) or prompt (prefill) of each row."""
    keep = (t["window_size"] == 0) & np.isin(t["kv_cache_dtype"], KV_DTYPES) \
        & (t["beam_width"] == 1)
    # prefill: bf16 attention math where it was measured for a KV dtype, else fp8 FMHA
    for kv in KV_DTYPES:
        rows = keep & (t["kv_cache_dtype"] == kv)
        if (rows & (t["attn_dtype"] == "bfloat16")).any():
            keep &= ~rows | (t["attn_dtype"] == "bfloat16")
    b, ln = pow2(t["batch_size"][keep]), pow2(length[keep])
    keep &= np.isin(t["batch_size"], b) & np.isin(length, ln)
    kv_dt = np.array([KV_DTYPES.index(x) for x in t["kv_cache_dtype"][keep]])
    hd, heads, kvh = (np.unique(t[c][keep]) for c in ("head_dim", "num_heads",
                                                      "num_key_value_heads"))
    idx = (kv_dt, lookup(hd, t["head_dim"][keep])[0], lookup(heads, t["num_heads"][keep])[0],
           lookup(kvh, t["num_key_value_heads"][keep])[0],
           lookup(b, t["batch_size"][keep])[0], lookup(ln, length[keep])[0])
    shape = (len(KV_DTYPES), len(hd), len(heads), len(kvh), len(b), len(ln))
    return {f"{prefix}_attn": fill(shape, idx, t["latency"][keep]),
            f"{prefix}_head_dim": hd, f"{prefix}_heads": heads, f"{prefix}_kv_heads": kvh,
            f"{prefix}_batch": b, f"{prefix}_len": ln}


def allreduce_table(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keep = t["allreduce_dtype"] == "bfloat16"
    g, size = np.unique(t["num_gpus"][keep]), np.unique(t["message_size"][keep])
    idx = (lookup(g, t["num_gpus"][keep])[0], lookup(size, t["message_size"][keep])[0])
    return {"allreduce": fill((len(g), len(size)), idx, t["latency"][keep]),
            "allreduce_gpus": g, "allreduce_elems": size}


def moe_table(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keep = np.isin(t["distribution"], DISTRIBUTIONS) & np.isin(t["moe_dtype"], MOE_DTYPES) \
        & np.isin(t["kernel_source"], MOE_SOURCES)
    cols = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")
    dtype = np.array([MOE_DTYPES.index(x) if x in MOE_DTYPES else -1 for x in t["moe_dtype"]])
    key = np.stack([dtype] + [t[c] for c in cols], axis=1)
    # one kernel and routing per shape: the first of MOE_SOURCES, then of DISTRIBUTIONS,
    # that measured it
    rank = np.array([(MOE_SOURCES.index(s) if s in MOE_SOURCES else 99) * 10
                     + (DISTRIBUTIONS.index(d) if d in DISTRIBUTIONS else 9)
                     for s, d in zip(t["kernel_source"], t["distribution"], strict=False)])
    keys = np.unique(key[keep], axis=0)
    tokens = np.unique(t["num_tokens"][keep])
    out = np.full((len(keys), len(tokens)), np.nan)
    for i, kk in enumerate(keys):
        rows = keep & np.all(key == kk, axis=1)
        rows &= rank == rank[rows].min()
        for j, n in enumerate(tokens):
            sel = rows & (t["num_tokens"] == n)
            if sel.any():
                out[i, j] = np.median(t["latency"][sel])
    return {"moe": out, "moe_keys": keys.astype(np.int32), "moe_tokens": tokens,
            "moe_dtypes": np.array(MOE_DTYPES),
            "moe_key_columns": np.array(("dtype", *cols))}


def gemm_sol(out: dict[str, np.ndarray], gpu: dict) -> np.ndarray:
    """Speed of light of every GEMM cell (ms): max(2mnk / FLOP/s, bytes of A, B, C / BW),
    as AIConfigurator's ``gemm_sol_with_flops``."""
    m, n, k = (out[f"gemm_{a}"].astype(float) for a in "mnk")
    m, n, k = m[:, None, None], n[None, :, None], k[None, None, :]
    sol = []
    for dtype in out["gemm_dtypes"]:
        flops = float(gpu.get(GEMM_FLOPS[str(dtype)], 0.0))
        if flops <= 0:  # no rate in the spec: left unfloored, as AIConfigurator does
            sol.append(np.zeros(np.broadcast_shapes(m.shape, n.shape, k.shape)))
            continue
        sol.append(np.maximum(2.0 * m * n * k / flops,
                              GEMM_BYTES[str(dtype)] * (m * n + m * k + n * k) / gpu["mem_bw"]))
    return np.stack(sol) * 1e3


def gen_attention_sol(out: dict[str, np.ndarray], gpu: dict) -> np.ndarray:
    """Speed of light of every decode-attention cell (ms), as AIConfigurator's
    ``generation_attention_sol``: the query and output in bf16 plus the K and V of
    ``length − 1`` cached tokens per sequence, against the FMHA's tensor-core math (fp8
    only from SM 89 on: older parts dequantise an fp8 cache into bf16 math)."""
    h = out["gen_head_dim"].astype(float)[None, :, None, None, None, None]
    n = out["gen_heads"].astype(float)[None, None, :, None, None, None]
    n_kv = out["gen_kv_heads"].astype(float)[None, None, None, :, None, None]
    b = out["gen_batch"].astype(float)[None, None, None, None, :, None]
    kv_len = out["gen_len"].astype(float)[None, None, None, None, None, :] - 1.0
    kv_bytes = np.array([KV_BYTES[d] for d in KV_DTYPES])[:, None, None, None, None, None]
    fp8_mma = int(gpu.get("sm_version", 0)) >= 89 and gpu.get("fp8_tc_flops")
    flops = np.array([gpu["bfloat16_tc_flops"], gpu["fp8_tc_flops"] if fp8_mma
                      else gpu["bfloat16_tc_flops"]])[:, None, None, None, None, None]
    mem = b * (n * h * 2.0 + 2.0 * n_kv * kv_len * h * kv_bytes + n * h * 2.0) / gpu["mem_bw"]
    math = 2.0 * b * n * h * 2.0 * kv_len / flops
    return np.maximum(mem, math) * 1e3


def floor_at_sol(out: dict[str, np.ndarray], gpu: dict) -> dict[str, int]:
    """Raise every GEMM and decode-attention cell below its speed of light to it (in
    place); returns how many cells of each were raised."""
    raised = {}
    for name, sol in (("gemm", gemm_sol(out, gpu)), ("gen_attn", gen_attention_sol(out, gpu))):
        low = np.isfinite(out[name]) & (out[name] < sol)
        out[name] = np.where(low, sol, out[name])
        raised[name] = int(low.sum())
    return raised


def extract(repo: Path, commit: str, system: str, version: str) -> dict[str, np.ndarray]:
    import yaml

    paths = {name: f"{DATA}/{system}/{f.format(v=version)}" for name, f in FILES.items()}
    tables = {name: read_table(repo, commit, p) for name, p in paths.items()}
    spec_path = SYSTEM_SPEC.format(system=system)
    gpu = yaml.safe_load(git_show(repo, commit, spec_path))["gpu"]
    gen = tables["gen_attn"]
    out = {**gemm_table(tables["gemm"]),
           **attention_table(gen, "gen", gen["step"] + 1),
           **attention_table(tables["ctx_attn"], "ctx", tables["ctx_attn"]["isl"]),
           **allreduce_table(tables["allreduce"]), **moe_table(tables["moe"])}
    raised = floor_at_sol(out, gpu)
    header = {"source_repository": REPOSITORY, "commit": commit, "system": system,
              "engine": "trtllm", "engine_version": version, "paths": paths,
              "licence": "Apache-2.0 (AIConfigurator, NVIDIA CORPORATION & AFFILIATES); "
                         "reduced and re-encoded by Koi's scripts/extract_kernel_tables.py",
              "units": "milliseconds per kernel call; NaN = not measured",
              "devices": sorted({str(x) for x in tables["gemm"]["device"]}),
              "sol_floor": {"spec": spec_path, "applied_to": sorted(raised),
                            "cells_raised": raised,
                            **{k: gpu[k] for k in ("mem_bw", "bfloat16_tc_flops",
                                                   "fp8_tc_flops", "fp4_tc_flops",
                                                   "sm_version") if k in gpu}}}
    for name, arr in out.items():
        if arr.dtype.kind == "f":
            out[name] = arr.astype(np.float16)
    out["header"] = np.array(json.dumps(header, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="bare git dir of aiconfigurator")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", type=Path, default=Path("libs/koi/predictor/data/kernels"))
    ap.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    args = ap.parse_args()
    commit = subprocess.run(["git", "--git-dir", str(args.repo), "rev-parse", args.commit],
                            check=True, capture_output=True, text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    for system in args.systems:
        arrays = extract(args.repo, commit, system, SYSTEMS[system])
        target = args.out / f"{system}.npz"
        np.savez_compressed(target, **arrays)
        print(f"{target}: {target.stat().st_size / 1e3:.0f} kB "
              f"({', '.join(f'{k} {v.shape}' for k, v in arrays.items() if v.ndim > 1)})")


if __name__ == "__main__":
    main()
