"""Measure forward-pass step times of model-shaped transformer layers on one GPU.

Calibration evidence for the predictor (docs/PREDICTOR.md, "Evidence from a GPU"): random
bf16 weights in PyTorch, nothing downloaded. For each model shape (one tensor-parallel
rank's shard: heads, KV heads and FFN width divided by TP) it times

* decode passes: ``b`` sequences, one new token each, attending to ``ctx`` cached tokens
  (the KV cache is written and read, as an engine's is), and
* prefill passes: one prompt of ``p`` tokens with causal attention,

as a CUDA graph of ``CALLS`` layer calls (two distinct layers, alternately, so no weight
stays in L2), plus the final norm and LM head on the tokens that need logits (every
decode token; the last token of a prompt). A whole pass is then
``layers × per-layer + head``. Collectives are not measured: the machine has one GPU, so a
TP>1 shard's time leaves out its all-reduces.

This file needs only torch; it runs where the GPU is and writes JSON that
``koi bench steps`` compares with the predictor. Usage::

    python3 scripts/gpu_steps.py --out steps.json            # on the GPU machine
    python3 scripts/gpu_steps.py --out s.json --device cpu --smoke   # a dry run anywhere
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CALLS = 8       # layer calls per timed graph
REPEATS = 15    # timed replays per point (median reported)

# name, layers, hidden, heads, kv heads, head dim, ffn, vocab, tp — catalog ids and shapes
# from libs/koi/catalog/data/models.yaml
SHAPES = [
    ("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 1),
    ("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, 1),
    ("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 4),
    ("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8),
]
DECODE_BATCH = [1, 8, 32, 64, 128, 256]
DECODE_CTX = [1024, 4096, 8192]
PREFILL_TOKENS = [256, 1024, 4096, 16384]
# fused attention kernels only: the math fallback would materialise the score matrix and
# time something no engine runs (a failure is reported, not hidden)
ATTN_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                 SDPBackend.EFFICIENT_ATTENTION]
SMOKE_SHAPES = [("tiny", 4, 256, 4, 2, 64, 512, 1000, 1)]


class Layer:
    """One decoder layer's weights for a TP shard (Llama/Qwen: RMSNorm, GQA, SwiGLU)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                 dev: torch.device, dtype: torch.dtype) -> None:
        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=dev, dtype=dtype) / math.sqrt(cols)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv = w((heads + 2 * kv_heads) * head_dim, hidden)
        self.o = w(hidden, heads * head_dim)
        self.gate_up = w(2 * ffn, hidden)
        self.down = w(hidden, ffn)
        self.norm1 = torch.ones(hidden, device=dev, dtype=dtype)
        self.norm2 = torch.ones(hidden, device=dev, dtype=dtype)

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.rms_norm(x, (x.shape[-1],), self.norm1)
        qkv = h @ self.qkv.t()
        d = self.head_dim
        q = qkv[:, : self.heads * d]
        k = qkv[:, self.heads * d: (self.heads + self.kv_heads) * d]
        v = qkv[:, (self.heads + self.kv_heads) * d:]
        return q, k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn @ self.o.t()
        h = F.rms_norm(x, (x.shape[-1],), self.norm2)
        gu = h @ self.gate_up.t()
        g, u = gu.chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ self.down.t()


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (..., tokens, head_dim) with cos/sin of (tokens, head_dim/2)."""
    a, b = t.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def decode_layer(layer: Layer, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                 pos: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (b, hidden); kc/vc: (b, kv_heads, ctx+1, d). Writes slot ``pos``, attends to all."""
    b = x.shape[0]
    hk, d = layer.kv_heads, layer.head_dim
    g = layer.heads // hk
    q, k, v = layer.split_qkv(x)
    q = rope(q.view(b, hk, g, d), cos, sin)          # the group's queries share a KV head
    kc[:, :, pos] = rope(k.view(b, hk, d), cos, sin)
    vc[:, :, pos] = v.view(b, hk, d)
    # GQA decode as (b, kv_heads, group, d) queries against (b, kv_heads, ctx, d): no copy
    # of the cache, the same trick FlashInfer and flash-decoding use
    with sdpa_kernel(ATTN_BACKENDS):
        out = F.scaled_dot_product_attention(q, kc, vc)
    return layer.finish(x, out.reshape(b, layer.heads * d))


def prefill_layer(layer: Layer, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (p, hidden), one prompt; kc/vc: (1, kv_heads, p, d) written in full."""
    p = x.shape[0]
    hk, d = layer.kv_heads, layer.head_dim
    q, k, v = layer.split_qkv(x)
    q = rope(q.view(p, layer.heads, d).transpose(0, 1), cos, sin).unsqueeze(0)
    kc[0] = rope(k.view(p, hk, d).transpose(0, 1), cos, sin)
    vc[0] = v.view(p, hk, d).transpose(0, 1)
    with sdpa_kernel(ATTN_BACKENDS):
        out = F.scaled_dot_product_attention(q, kc, vc, is_causal=True, enable_gqa=True)
    return layer.finish(x, out[0].transpose(0, 1).reshape(p, layer.heads * d))


def timed_graph(fn, dev: torch.device, repeats: int) -> float:
    """Median seconds of one call of ``fn`` (captured as a CUDA graph on a GPU)."""
    if dev.type != "cuda":
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):   # warm-up outside the graph: kernels chosen, workspaces made
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        start[i].record()
        graph.replay()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end, strict=True)) / 1e3


def ceilings(dev: torch.device) -> dict[str, float]:
    """Copy bandwidth (bytes read + written per second) and a large bf16 GEMM's FLOP/s."""
    if dev.type != "cuda":
        return {}
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    for _ in range(50):   # bring the clocks up before anything is timed
        x @ y
    t_mm = timed_graph(lambda: x @ y, dev, 10)
    n = 1 << 30   # 4 GiB of float32, far beyond the 60 MB L2
    a = torch.randn(n, device=dev)
    b = torch.empty_like(a)
    t_copy = timed_graph(lambda: b.copy_(a), dev, 10)
    return {"copy_bytes_per_s": 2 * 4 * n / t_copy, "bf16_gemm_flops": 2 * m ** 3 / t_mm}


def measure_shape(shape: tuple, dev: torch.device, dtype: torch.dtype, smoke: bool,
                  log) -> list[dict]:
    name, n_layers, hidden, heads, kv_heads, d, ffn, vocab, tp = shape
    h, hk, f = heads // tp, max(kv_heads // tp, 1), ffn // tp
    layers = [Layer(hidden, h, hk, d, f, dev, dtype) for _ in range(2)]
    head_w = torch.randn(vocab // tp, hidden, device=dev, dtype=dtype) / math.sqrt(hidden)
    final_norm = torch.ones(hidden, device=dev, dtype=dtype)
    base = {"model": name, "tp": tp, "layers": n_layers, "hidden": hidden, "heads": h,
            "kv_heads": hk, "head_dim": d, "ffn": f, "vocab": vocab // tp}
    rows = []

    def head_time(tokens: int) -> float:
        xs = torch.randn(tokens, hidden, device=dev, dtype=dtype)
        return timed_graph(lambda: F.rms_norm(xs, (hidden,), final_norm) @ head_w.t(),
                           dev, REPEATS)

    batches = [1, 4] if smoke else DECODE_BATCH
    ctxs = [64] if smoke else DECODE_CTX
    for ctx in ctxs:
        for b in batches:
            if b * ctx > 256 * 8192:
                continue
            caches = [(torch.randn(b, hk, ctx + 1, d, device=dev, dtype=dtype),
                       torch.randn(b, hk, ctx + 1, d, device=dev, dtype=dtype))
                      for _ in layers]
            x = torch.randn(b, hidden, device=dev, dtype=dtype)
            ang = torch.rand(1, d // 2, device=dev, dtype=dtype)
            cos, sin = ang.cos(), ang.sin()

            def run(x=x, caches=caches, cos=cos, sin=sin, ctx=ctx) -> None:
                y = x
                for i in range(CALLS):
                    kc, vc = caches[i % 2]
                    y = decode_layer(layers[i % 2], y, kc, vc, ctx, cos, sin)
            t_layer = timed_graph(run, dev, REPEATS) / CALLS
            t_head = head_time(b)
            rows.append({**base, "phase": "decode", "batch": b, "ctx": ctx, "tokens": b,
                         "layer_s": t_layer, "head_s": t_head,
                         "pass_s": n_layers * t_layer + t_head})
            log(rows[-1])
            del caches
    for p in ([32, 128] if smoke else PREFILL_TOKENS):
        caches = [(torch.empty(1, hk, p, d, device=dev, dtype=dtype),
                   torch.empty(1, hk, p, d, device=dev, dtype=dtype)) for _ in layers]
        x = torch.randn(p, hidden, device=dev, dtype=dtype)
        ang = torch.rand(p, d // 2, device=dev, dtype=dtype)
        cos, sin = ang.cos(), ang.sin()

        def run(x=x, caches=caches, cos=cos, sin=sin) -> None:
            y = x
            for i in range(CALLS):
                kc, vc = caches[i % 2]
                y = prefill_layer(layers[i % 2], y, kc, vc, cos, sin)
        t_layer = timed_graph(run, dev, REPEATS) / CALLS
        t_head = head_time(1)   # logits only for the prompt's last token
        rows.append({**base, "phase": "prefill", "batch": 1, "ctx": p, "tokens": p,
                     "layer_s": t_layer, "head_s": t_head,
                     "pass_s": n_layers * t_layer + t_head})
        log(rows[-1])
        del caches
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a dry run on a CPU)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu --smoke for a dry run", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type != "cuda":
        ATTN_BACKENDS.append(SDPBackend.MATH)   # the CPU dry run has only this one
    torch.manual_seed(0)
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "dtype": str(dtype), "calls_per_graph": CALLS, "repeats": REPEATS,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    env.update(ceilings(dev))
    print(json.dumps(env), flush=True)
    rows: list[dict] = []

    def log(row: dict) -> None:
        print(f"{row['model']:>14} tp{row['tp']} {row['phase']:>7} b={row['batch']:<4} "
              f"ctx/p={row['ctx']:<6} layer {row['layer_s'] * 1e6:9.1f} us  "
              f"head {row['head_s'] * 1e6:8.1f} us  pass {row['pass_s'] * 1e3:8.3f} ms",
              flush=True)

    for shape in (SMOKE_SHAPES if args.smoke else SHAPES):
        try:
            rows.extend(measure_shape(shape, dev, dtype, args.smoke, log))
        except Exception as exc:   # keep what was measured; say what failed
            print(f"FAILED {shape[0]} tp{shape[-1]}: {exc!r}", flush=True)
            env.setdefault("failures", []).append(f"{shape[0]} tp{shape[-1]}: {exc!r}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()   # the shape's weights and caches are gone
        with open(args.out, "w") as fh:   # written after every shape: nothing lost
            json.dump({"env": env, "rows": rows}, fh, indent=1)
    env["elapsed_s"] = time.perf_counter() - t0
    with open(args.out, "w") as fh:
        json.dump({"env": env, "rows": rows}, fh, indent=1)
    print(f"{len(rows)} points in {env['elapsed_s']:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
