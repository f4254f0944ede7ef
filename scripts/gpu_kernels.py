"""Time on one GPU the kernels Koi's tables hold and the mixed passes of chunked prefill.

Calibration evidence for the predictor (docs/PREDICTOR.md, "Evidence from a GPU"), in three
parts, with random weights in PyTorch and nothing downloaded:

* ``gemm``: (m × k) · (k × n) products at cells of the shipped AIConfigurator table
  (``libs/koi/predictor/data/kernels/<system>.npz``: the table's own m, n and k values), in
  bf16 (``torch.matmul``) and fp8 e4m3 with per-tensor scales (``torch._scaled_mm``).
  Weights rotate through enough copies to overflow the L2, as a model's layers do.
* ``ctx_attn``: causal prefill attention (PyTorch's fused SDPA kernels, bf16, GQA) at cells
  of the table's context-attention grid.
* ``mixed``: one decoder layer's pass over ``b`` decoding sequences (``ctx`` cached tokens
  each) together with a chunk of ``c`` prompt tokens whose first ``past`` tokens are
  already cached — the pass an engine with chunked prefill runs while it admits a burst.
  The same layer alone on the decodes (c = 0) and alone on the chunk (b = 0) is timed too,
  so the measured mixed pass can be set against the predictor's (one GEMM over b + c
  tokens, the two attentions added).

* ``gen_attn``: decode attention (one new token per sequence, GQA) at cells of the
  table's generation-attention grid, two ways: PyTorch's fused SDPA in one pass (what
  ``scripts/gpu_steps.py`` runs; one thread block per sequence and KV head walks the whole
  context), and split-context "flash-decoding" — the context cut into S pieces attended
  in parallel by the fused flash kernel, which returns each piece's log-sum-exp, then
  merged — the scheme engines' decode kernels use. Each is checked against the plain
  softmax on the same inputs before it is timed.

This file needs torch and numpy; it writes JSON that ``koi bench kernels`` compares with
the tables and the predictor. Usage::

    python3 scripts/gpu_kernels.py --out kernels.json            # on the GPU machine
    python3 scripts/gpu_kernels.py --out k.json --device cpu --smoke   # a dry run anywhere
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).parent))
from gpu_steps import ATTN_BACKENDS, Layer, ceilings, rope, timed_graph

REPEATS = 15
L2_BYTES = 60 << 20          # H200: 60 MB; weights rotate through > 3× this
TABLES = Path(__file__).parent.parent / "libs/koi/predictor/data/kernels"

# (n, k) cells of the GEMM table: the projections of the catalog's dense models' shards
# that fall on the table's grid (8B: o 4096×4096, qkv 6144×4096; 70B: qkv/tp4 2560×8192,
# o/tp4 8192×2048, down/tp4 8192×7168, down/tp8 8192×3584; 32B-ish 5120/27648 pieces)
GEMM_NK = [(4096, 4096), (6144, 4096), (2560, 8192), (8192, 2048), (8192, 7168),
           (8192, 3584), (16384, 4096), (4096, 16384), (10240, 8192), (1024, 1024)]
GEMM_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# context attention: (heads, kv heads) per GPU at head_dim 128; batch × prompt cells
CTX_HEADS = [(32, 8), (16, 2), (8, 1), (64, 8)]
CTX_BATCH = [1, 2, 4, 8, 16]
CTX_LEN = [256, 512, 1024, 2048, 4096, 8192, 16384]
CTX_TOKENS_MAX = 65536
# mixed passes: model shard, decoding sequences at MIXED_CTX, chunk tokens, cached prefix
MIXED_SHAPES = [
    ("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 1),
    ("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 4),
]
MIXED_B = [0, 16, 64, 256]
MIXED_C = [0, 128, 512, 2048, 8192]
MIXED_PAST = [0, 4096]
MIXED_CTX = 2048
CALLS = 8


def rotating(make, nbytes: int, dev: torch.device) -> list:
    """Enough copies of a tensor that cycling through them overflows the L2."""
    copies = 1 if dev.type != "cuda" else max(2, min(128, math.ceil(3 * L2_BYTES / nbytes)))
    return [make() for _ in range(copies)]


def graph_time(fn_list, dev: torch.device) -> float:
    """Median seconds of one call, timing a graph that calls each of ``fn_list`` once."""
    def run() -> None:
        for fn in fn_list:
            fn()
    return timed_graph(run, dev, REPEATS) / len(fn_list)


def measure_gemm(dev: torch.device, smoke: bool, log) -> list[dict]:
    rows: list[dict] = []
    nk = [(64, 64)] if smoke else GEMM_NK
    ms = [1, 16] if smoke else GEMM_M
    fp8 = dev.type == "cuda" and hasattr(torch, "_scaled_mm")
    for n, k in nk:
        for m in ms:
            for dtype in ("bfloat16", "fp8") if fp8 else ("bfloat16",):
                flops = 2.0 * m * n * k
                if flops > 4e13:   # a few ms each at most
                    continue
                try:
                    t = _gemm_time(m, n, k, dtype, dev)
                    rows.append({"m": m, "n": n, "k": k, "dtype": dtype, "s": t})
                except Exception as exc:   # say what failed; keep going
                    rows.append({"m": m, "n": n, "k": k, "dtype": dtype, "s": None,
                                 "error": repr(exc)[:200]})
                log("gemm", rows[-1])
    return rows


def _gemm_time(m: int, n: int, k: int, dtype: str, dev: torch.device) -> float:
    bf = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.randn(m, k, device=dev, dtype=bf)
    if dtype == "bfloat16":
        ws = rotating(lambda: torch.randn(n, k, device=dev, dtype=bf) / math.sqrt(k),
                      2 * n * k, dev)
        calls = [lambda w=w: x @ w.t() for w in ws]
        return graph_time(calls * max(1, 8 // len(calls)), dev)
    f8 = torch.float8_e4m3fn
    xq = x.to(f8)
    one = torch.ones((), device=dev, dtype=torch.float32)
    # _scaled_mm wants A row-major and B column-major: B = W.t() of a row-major (n, k) W
    ws = rotating(lambda: (torch.randn(n, k, device=dev, dtype=bf) / math.sqrt(k)).to(f8),
                  n * k, dev)
    calls = [lambda w=w: torch._scaled_mm(xq, w.t(), scale_a=one, scale_b=one,
                                          out_dtype=torch.bfloat16) for w in ws]
    return graph_time(calls * max(1, 8 // len(calls)), dev)


def measure_ctx_attn(dev: torch.device, smoke: bool, log) -> list[dict]:
    rows: list[dict] = []
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    d = 64 if smoke else 128
    for heads, kvh in ([(4, 2)] if smoke else CTX_HEADS):
        for b in ([1, 2] if smoke else CTX_BATCH):
            for s in ([32, 64] if smoke else CTX_LEN):
                if b * s > CTX_TOKENS_MAX:
                    continue
                try:
                    q = torch.randn(b, heads, s, d, device=dev, dtype=dt)
                    shape = (b, kvh, s, d)
                    kv = rotating(lambda shape=shape: (
                        torch.randn(shape, device=dev, dtype=dt),
                        torch.randn(shape, device=dev, dtype=dt)), 4 * b * kvh * s * d, dev)

                    def attn(k, v, q=q) -> torch.Tensor:
                        with sdpa_kernel(ATTN_BACKENDS):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  enable_gqa=True)
                    calls = [lambda kv_=kv_: attn(*kv_) for kv_ in kv]
                    t = graph_time(calls * max(1, 4 // len(calls)), dev)
                    rows.append({"heads": heads, "kv_heads": kvh, "head_dim": d, "batch": b,
                                 "len": s, "s": t})
                except Exception as exc:
                    rows.append({"heads": heads, "kv_heads": kvh, "head_dim": d, "batch": b,
                                 "len": s, "s": None, "error": repr(exc)[:200]})
                log("ctx_attn", rows[-1])
    return rows


# decode attention: (heads, kv heads) per GPU at head_dim 128; sequences × context
GEN_HEADS = [(32, 8), (8, 1), (64, 8)]
GEN_BATCH = [1, 4, 16, 64, 256]
GEN_CTX = [1024, 4096, 16384]
GEN_KV_MAX = 4 << 30      # bytes of K and V per cell
SMS = 132                 # H200 multiprocessors: the split keeps ≥ 2 blocks on each
MIN_PIECE = 256


def lse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp of the scores) of plain attention, same heads for q and k."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False)
    else:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    return out[0], out[1]


def splits_for(b: int, kvh: int, ctx: int) -> int:
    """Pieces of the context so that b × kv heads × pieces fills the GPU twice over."""
    want = max(1, math.ceil(2 * SMS / (b * kvh)))
    pieces = 1
    while pieces < want and ctx // (pieces * 2) >= MIN_PIECE and ctx % (pieces * 2) == 0:
        pieces *= 2
    return pieces


def split_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pieces: int
                 ) -> torch.Tensor:
    """Flash-decoding. q: (b, kvh, g, d), the g query heads sharing each KV head;
    k, v: (b, kvh, ctx, d) contiguous. The context's pieces become extra heads (a view),
    each attended by every query of its KV head; the pieces merge by their log-sum-exp."""
    b, kvh, g, d = q.shape
    ctx = k.shape[2]
    kp = k.view(b, kvh * pieces, ctx // pieces, d)
    vp = v.view(b, kvh * pieces, ctx // pieces, d)
    qp = q.unsqueeze(2).expand(b, kvh, pieces, g, d).reshape(b, kvh * pieces, g, d)
    out, lse = lse_attention(qp, kp, vp)
    out = out.view(b, kvh, pieces, g, d).float()
    w = torch.softmax(lse.view(b, kvh, pieces, g).float(), dim=2)
    return (out * w.unsqueeze(-1)).sum(dim=2).to(q.dtype)


def one_pass_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(ATTN_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v)


def measure_gen_attn(dev: torch.device, smoke: bool, log) -> list[dict]:
    rows: list[dict] = []
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    d = 64 if smoke else 128
    for heads, kvh in ([(4, 2)] if smoke else GEN_HEADS):
        g = heads // kvh
        for b in ([1, 3] if smoke else GEN_BATCH):
            for ctx in ([512, 1024] if smoke else GEN_CTX):
                nbytes = 4 * b * kvh * ctx * d
                if nbytes > GEN_KV_MAX:
                    continue
                row = {"heads": heads, "kv_heads": kvh, "head_dim": d, "batch": b, "len": ctx}
                try:
                    q = torch.randn(b, kvh, g, d, device=dev, dtype=dt)
                    kv = rotating(lambda shape=(b, kvh, ctx, d): (
                        torch.randn(shape, device=dev, dtype=dt),
                        torch.randn(shape, device=dev, dtype=dt)), nbytes, dev)
                    pieces = 64 if smoke else splits_for(b, kvh, ctx)
                    pieces = min(pieces, ctx // 8) if smoke else pieces
                    ref = torch.softmax((q.float() @ kv[0][0].float().transpose(-1, -2))
                                        / math.sqrt(d), dim=-1) @ kv[0][1].float()
                    for name, fn in (("one_pass", one_pass_decode),
                                     ("split", lambda q, k, v, n=pieces: split_decode(q, k, v, n))):
                        got = fn(q, *kv[0]).float()
                        err = float((got - ref).norm() / ref.norm())
                        if not err < 2e-2:
                            raise RuntimeError(f"{name} decode attention is wrong: "
                                               f"relative error {err:.2e}")
                        calls = [lambda kv_=kv_, fn=fn, q=q: fn(q, *kv_) for kv_ in kv]
                        row[f"{name}_s"] = graph_time(calls * max(1, 4 // len(calls)), dev)
                        row[f"{name}_err"] = err
                    row["pieces"] = pieces
                    row["s"] = min(row["one_pass_s"], row["split_s"])
                except Exception as exc:
                    row.update({"s": None, "error": repr(exc)[:200]})
                rows.append(row)
                log("gen_attn", row)
    return rows


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Causal attention of a chunk's queries (1, h, c, d) over (1, hk, past + c, d): query i
    sees the cached prefix and the chunk up to itself (bottom-right causal)."""
    from torch.nn.attention.bias import causal_lower_right
    c, total = q.shape[2], k.shape[2]
    if c == total:
        with sdpa_kernel(ATTN_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=True), "causal"
    mask = causal_lower_right(c, total)
    g = q.shape[1] // k.shape[1]
    with sdpa_kernel(ATTN_BACKENDS):
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                  enable_gqa=True), "lower_right+gqa"
        except RuntimeError:
            # the fused kernels that take a lower-right mask may not take GQA: expand K/V
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1),
                attn_mask=mask), "lower_right+expanded_kv"


def mixed_layer(layer: Layer, x: torch.Tensor, b: int, dec_cache, pre_cache, past: int,
                cos_d, sin_d, cos_p, sin_p) -> torch.Tensor:
    """One layer over ``b`` decode tokens followed by a prompt chunk (rows b:) of x."""
    hk, d = layer.kv_heads, layer.head_dim
    g = layer.heads // hk
    c = x.shape[0] - b
    q, k, v = layer.split_qkv(x)
    outs = []
    if b:
        kc, vc = dec_cache
        pos = kc.shape[2] - 1
        qd = rope(q[:b].view(b, hk, g, d), cos_d, sin_d)
        kc[:, :, pos] = rope(k[:b].view(b, hk, d), cos_d, sin_d)
        vc[:, :, pos] = v[:b].view(b, hk, d)
        with sdpa_kernel(ATTN_BACKENDS):
            outs.append(F.scaled_dot_product_attention(qd, kc, vc).reshape(b, layer.heads * d))
    if c:
        kp, vp = pre_cache
        qp = rope(q[b:].view(c, layer.heads, d).transpose(0, 1), cos_p, sin_p).unsqueeze(0)
        kp[0, :, past:] = rope(k[b:].view(c, hk, d).transpose(0, 1), cos_p, sin_p)
        vp[0, :, past:] = v[b:].view(c, hk, d).transpose(0, 1)
        out, _ = chunk_attention(qp, kp, vp)
        outs.append(out[0].transpose(0, 1).reshape(c, layer.heads * d))
    attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
    return layer.finish(x, attn)


def measure_mixed(dev: torch.device, smoke: bool, log) -> list[dict]:
    rows: list[dict] = []
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = [("tiny", 4, 256, 4, 2, 64, 512, 1000, 1)] if smoke else MIXED_SHAPES
    for name, n_layers, hidden, heads, kv_heads, d, ffn, _vocab, tp in shapes:
        h, hk, f = heads // tp, max(kv_heads // tp, 1), ffn // tp
        layers = [Layer(hidden, h, hk, d, f, dev, dt) for _ in range(2)]
        ctx = 64 if smoke else MIXED_CTX
        for past in ([0, 32] if smoke else MIXED_PAST):
            for c in ([0, 16] if smoke else MIXED_C):
                for b in ([0, 4] if smoke else MIXED_B):
                    if (b == 0 and c == 0) or (c == 0 and past):
                        continue   # nothing to run; a decode-only pass has no prefix
                    row = {"model": name, "tp": tp, "layers": n_layers, "hidden": hidden,
                           "heads": h, "kv_heads": hk, "head_dim": d, "ffn": f,
                           "batch": b, "ctx": ctx, "chunk": c, "past": past}
                    try:
                        row["layer_s"], row["attn_path"] = _mixed_time(
                            layers, hidden, b, c, past, ctx, dev, dt)
                    except Exception as exc:
                        row["layer_s"], row["error"] = None, repr(exc)[:200]
                    rows.append(row)
                    log("mixed", row)
        del layers
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _mixed_time(layers, hidden, b, c, past, ctx, dev, dt) -> tuple[float, str]:
    hk, d = layers[0].kv_heads, layers[0].head_dim
    dec = [(torch.randn(b, hk, ctx + 1, d, device=dev, dtype=dt),
            torch.randn(b, hk, ctx + 1, d, device=dev, dtype=dt)) if b else None
           for _ in layers]
    pre = [(torch.randn(1, hk, past + c, d, device=dev, dtype=dt),
            torch.randn(1, hk, past + c, d, device=dev, dtype=dt)) if c else None
           for _ in layers]
    x = torch.randn(b + c, hidden, device=dev, dtype=dt)
    ang_d = torch.rand(1, d // 2, device=dev, dtype=dt)
    ang_p = torch.rand(max(c, 1), d // 2, device=dev, dtype=dt)
    path = "none"
    if c:
        _, path = chunk_attention(torch.randn(1, layers[0].heads, c, d, device=dev, dtype=dt),
                                  pre[0][0], pre[0][1])

    def run() -> None:
        y = x
        for i in range(CALLS):
            y = mixed_layer(layers[i % 2], y, b, dec[i % 2], pre[i % 2], past,
                            ang_d.cos(), ang_d.sin(), ang_p.cos(), ang_p.sin())
    return timed_graph(run, dev, REPEATS) / CALLS, path


def table_info() -> dict:
    """Which shipped tables the GEMM and attention cells were chosen from."""
    out = {}
    for f in sorted(TABLES.glob("*.npz")):
        with np.load(f) as z:
            out[f.stem] = json.loads(str(z["header"]))["engine_version"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a dry run on a CPU)")
    ap.add_argument("--parts", default="mixed,gemm,ctx_attn,gen_attn")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu --smoke for a dry run", file=sys.stderr)
        return 2
    if dev.type != "cuda":
        ATTN_BACKENDS.append(SDPBackend.MATH)   # the CPU dry run has only this one
    torch.manual_seed(0)
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "repeats": REPEATS, "tables": table_info(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    env.update(ceilings(dev))
    print(json.dumps(env), flush=True)
    result: dict = {"env": env}

    def log(part: str, row: dict) -> None:
        shown = {k: v for k, v in row.items() if k not in ("hidden", "ffn", "layers")}
        t = row.get("s", row.get("layer_s"))
        print(f"{part:>8} {shown}  -> {t * 1e6 if t else float('nan'):.1f} us", flush=True)

    def save() -> None:   # after every part: nothing measured is lost
        env["elapsed_s"] = time.perf_counter() - t0
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)

    parts = {"gemm": measure_gemm, "ctx_attn": measure_ctx_attn, "mixed": measure_mixed,
             "gen_attn": measure_gen_attn}
    for part in args.parts.split(","):
        try:
            result[part] = parts[part](dev, args.smoke, log)
        except Exception as exc:
            print(f"FAILED {part}: {exc!r}", flush=True)
            env.setdefault("failures", []).append(f"{part}: {exc!r}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        save()
    print(f"done in {env['elapsed_s']:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
