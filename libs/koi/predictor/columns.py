"""Column layout of the predictor's structure-of-arrays input and output matrices.

The numba kernel and the numpy reference both read a float64 matrix ``X`` of shape
(N_IN, n) — one row per feature, one column per candidate — and write ``Y`` of shape
(N_OUT, n). This module is the single definition of which row is which. It holds no
logic.
"""

from __future__ import annotations

# --- inputs ---------------------------------------------------------------------------
_IN = (
    # model × parallelism (per GPU of one replica)
    "w_dense",         # bytes of non-expert weights per GPU
    "w_expert",        # bytes of routed-expert weights per GPU
    "moe_ke",          # experts_per_token / num_experts (0 = dense)
    "flops_tok",       # dense (non-expert) matmul FLOPs per token of the replica, per GPU
    "flops_tok_exp",   # routed-expert matmul FLOPs per token of the replica, per GPU
    "attn_flops_ctx",  # attention FLOPs per (token × context token), per GPU
    "kv_tok",          # KV bytes per context token per GPU (per attention rank)
    "kv_cap",          # KV capacity of the replica, tokens
    "ar_bytes_tok",    # all-reduce payload per token per all-reduce (bytes)
    "n_ar",            # all-reduces per forward pass per GPU
    "a2a_bytes_tok",   # all-to-all payload per token per MoE layer (bytes)
    "n_moe",           # MoE layers per GPU (pipeline stage)
    "tp", "pp", "dp", "ep",
    "layers_gpu",      # layers per pipeline stage
    # accelerator
    "peak_flops",      # FLOP/s at the compute precision
    "hbm_bw",          # bytes/s
    "link_bw",         # unidirectional bytes/s per GPU
    "link_lat",        # seconds per collective
    # calibration (already resolved for this accelerator × precision × engine)
    "eff_mem", "eff_comp", "eff_link", "ovh_base", "ovh_seq",
    "attn_mem",        # paged-attention KV streaming efficiency relative to eff_mem
    "moe_eff",         # grouped expert GEMM efficiency relative to eff_comp
    "serial_frac",     # share of the shorter of t_mem/t_comp that does not overlap the longer
    "ttft_ovh",        # per-request seconds before the first token (API, tokenizer, sched)
    # measured kernel tables (tables.py): compiled row index, -1 = roofline; and the
    # multiplier on the tables' kernel time (calibration × learnt pass multiplier)
    "ktab", "kscale",
    # engine configuration
    "max_seqs", "max_tokens", "chunked", "kv_full_reserve", "cuda_graphs",
    "spec_gain",       # expected tokens accepted per decode step (1 = no speculation)
    "spec_cost",       # relative cost of a verify step (1 = plain decode)
    # workload
    "in_len", "out_len", "prefix_hit",
    "mode",            # LoadMode value
    "load",            # concurrency | rate (req/s) | batch size | burst size
    "window_s",        # horizon over which an overload is averaged
    "slo_ttft", "slo_tpot",  # seconds; 0 = no SLO
    # cost and scale
    "usd_hour",        # $/hour of one replica (all its GPUs)
    "replicas",
    "mem_total",       # bytes of memory per GPU
    "mem_fixed",       # weights + runtime reserve per GPU, bytes
)
_OUT = (
    "ttft", "ttft_p50", "ttft_p95",
    "tpot", "tpot_p50", "tpot_p95",
    "out_tput", "total_tput", "req_rate", "max_rate_slo", "cost_mtok", "e2e",
    # mediators
    "kv_pressure", "comm_frac", "compute_util", "membw_util", "queue_util",
    "batch_eff", "mem_headroom", "batch",
)

IN: dict[str, int] = {name: i for i, name in enumerate(_IN)}
OUT: dict[str, int] = {name: i for i, name in enumerate(_OUT)}
N_IN = len(_IN)
N_OUT = len(_OUT)
IN_NAMES = _IN
OUT_NAMES = _OUT

# Load modes (the "mode" input row)
MODE_SATURATED = 0   # as many requests as fit, forever (offline max-throughput)
MODE_CONCURRENCY = 1  # closed loop: a fixed number of clients, each waiting for its answer
MODE_RATE = 2        # open loop: Poisson arrivals at `load` req/s
MODE_STATIC = 3      # static batch of `load` requests started together
MODE_BURST = 4       # `load` requests all arriving at t=0, continuous batching
