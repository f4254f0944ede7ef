"""numba kernel of the serving model: one scalar loop per candidate, in ``@njit(cache=True)``
code that mirrors ``reference.py`` line for line.

``reference.py`` is the specification and documents the model; this file only makes it
fast (≈ millions of candidates per second on one core) and must agree with it to
floating-point tolerance (``tests/unit/test_predictor_kernel.py``). Column indices come
from ``columns.py``; no other logic lives here.

A batch of at least ``PARALLEL_MIN_COLUMNS`` candidates is cut into one contiguous block
per core, each run by the same compiled serial loop in a thread (it releases the GIL):
the numbers are the serial loop's, bit for bit (``test_predictor_kernel.py``; numba's
``prange`` was not: its separately compiled loop differed in the last bits under
fastmath), and a tick at 10,000 GPUs (~70,000 rows) evaluates in about half the time on
two cores. Smaller batches stay serial.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from koi.predictor.columns import (
    IN,
    MODE_BURST,
    MODE_CONCURRENCY,
    MODE_RATE,
    MODE_SATURATED,
    MODE_STATIC,
    N_OUT,
    OUT,
)
from koi.predictor.reference import EPS, FIXED_POINT_ITERS, RATE_BISECTIONS, Z95
from koi.predictor.tables import (
    NB,
    NC,
    NM,
    NQ,
    NS,
    OFF_A,
    OFF_C,
    OFF_FLAG,
    OFF_G,
    OFF_H,
    OFF_L,
    REGISTRY,
    S0,
)

# numba needs plain integer globals, not dict lookups
W_DENSE, W_EXPERT, MOE_KE = IN["w_dense"], IN["w_expert"], IN["moe_ke"]
FLOPS_TOK, FLOPS_TOK_EXP, ATTN_CTX = IN["flops_tok"], IN["flops_tok_exp"], IN["attn_flops_ctx"]
KV_TOK, KV_CAP, AR_BYTES, N_AR = IN["kv_tok"], IN["kv_cap"], IN["ar_bytes_tok"], IN["n_ar"]
A2A_BYTES, N_MOE = IN["a2a_bytes_tok"], IN["n_moe"]
TP, PP, DP, EP, LAYERS = IN["tp"], IN["pp"], IN["dp"], IN["ep"], IN["layers_gpu"]
PEAK, HBM, LINK_BW, LINK_LAT = IN["peak_flops"], IN["hbm_bw"], IN["link_bw"], IN["link_lat"]
EFF_MEM, EFF_COMP, EFF_LINK = IN["eff_mem"], IN["eff_comp"], IN["eff_link"]
OVH_BASE, OVH_SEQ = IN["ovh_base"], IN["ovh_seq"]
ATTN_MEM, MOE_EFF, SERIAL, TTFT_OVH = IN["attn_mem"], IN["moe_eff"], IN["serial_frac"], \
    IN["ttft_ovh"]
MAX_SEQS, MAX_TOKENS, CHUNKED, KV_FULL = IN["max_seqs"], IN["max_tokens"], IN["chunked"], \
    IN["kv_full_reserve"]
CUDA_GRAPHS, SPEC_GAIN, SPEC_COST = IN["cuda_graphs"], IN["spec_gain"], IN["spec_cost"]
IN_LEN, OUT_LEN, PREFIX_HIT, MODE, LOAD, WINDOW = IN["in_len"], IN["out_len"], \
    IN["prefix_hit"], IN["mode"], IN["load"], IN["window_s"]
SLO_TTFT, SLO_TPOT, USD_HOUR, REPLICAS = IN["slo_ttft"], IN["slo_tpot"], IN["usd_hour"], \
    IN["replicas"]
MEM_TOTAL, MEM_FIXED = IN["mem_total"], IN["mem_fixed"]
KTAB, KSCALE = IN["ktab"], IN["kscale"]

Y_TTFT, Y_TTFT50, Y_TTFT95 = OUT["ttft"], OUT["ttft_p50"], OUT["ttft_p95"]
Y_TPOT, Y_TPOT50, Y_TPOT95 = OUT["tpot"], OUT["tpot_p50"], OUT["tpot_p95"]
Y_OUT, Y_TOTAL, Y_REQ, Y_MAXRATE = OUT["out_tput"], OUT["total_tput"], OUT["req_rate"], \
    OUT["max_rate_slo"]
Y_COST, Y_E2E, Y_KVP, Y_COMM = OUT["cost_mtok"], OUT["e2e"], OUT["kv_pressure"], \
    OUT["comm_frac"]
Y_CU, Y_MU, Y_QU, Y_BE = OUT["compute_util"], OUT["membw_util"], OUT["queue_util"], \
    OUT["batch_eff"]
Y_HEAD, Y_BATCH = OUT["mem_headroom"], OUT["batch"]


@numba.njit(cache=True, fastmath=True, inline="always")
def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


@numba.njit(cache=True, fastmath=True)
def _coeffs(X: np.ndarray, K: np.ndarray, j: int) -> tuple:
    """Per-candidate constants of a pass, resolved once so each pass is a few flops: the
    roofline's 15, then the kernel-table row's 8 (row, scale, grid positions, LM head)."""
    dp, pp = X[DP, j], X[PP, j]
    ke = X[MOE_KE, j]
    log_miss = math.log(max(1.0 - ke, 1e-300)) if ke > 0 else 0.0
    link = X[LINK_BW, j] * X[EFF_LINK, j]
    tp, ep = X[TP, j], X[EP, j]
    comm_fix, comm_tok = 0.0, 0.0
    if tp > 1:
        comm_fix += X[N_AR, j] * X[LINK_LAT, j]
        comm_tok += X[N_AR, j] * 2.0 * (tp - 1.0) / tp * X[AR_BYTES, j] / link / dp
    if ep > 1:
        comm_fix += X[N_MOE, j] * 2.0 * X[LINK_LAT, j]
        comm_tok += X[N_MOE, j] * 2.0 * (ep - 1.0) / ep * X[A2A_BYTES, j] / link / dp
    graphs = 1.0 if X[CUDA_GRAPHS, j] > 0 else 1.0 + X[LAYERS, j] / 8.0
    # kernel tables: row, scale, the fixed decode context and prompt on their grids, and
    # the LM head at one row (for finishing prompts)
    k = int(X[KTAB, j])
    prompt = X[IN_LEN, j]
    ic, wc = _pos(X[IN_LEN, j] + 0.5 * max(X[OUT_LEN, j], 1.0), NC, 1.0)
    is_, ws = _pos(prompt, NS, S0)
    return (X[W_DENSE, j], X[W_EXPERT, j], log_miss, 1.0 if ke > 0 else 0.0, pp,
            1.0 / (X[HBM, j] * X[EFF_MEM, j]), 1.0 / (X[PEAK, j] * X[EFF_COMP, j]),
            comm_fix, comm_tok, X[OVH_BASE, j] * graphs, X[OVH_SEQ, j],
            X[FLOPS_TOK, j] + X[FLOPS_TOK_EXP, j] / X[MOE_EFF, j], X[ATTN_CTX, j] / dp,
            X[KV_TOK, j] / dp / X[ATTN_MEM, j], X[SERIAL, j],
            k, X[KSCALE, j], ic, wc, is_, ws, 1.0 / max(prompt, 1.0),
            K[k, OFF_H] if k >= 0 else 0.0, K[k, OFF_FLAG] if k >= 0 else 0.0)


@numba.njit(cache=True, fastmath=True, inline="always")
def _pos(x: float, n: int, x0: float) -> tuple[int, float]:
    """(lower index, weight of the upper point) of x on the grid x0 · 2^i, i < n:
    clamped at the bottom, extrapolated linearly at the top (tables._pow2_pos)."""
    u = max(x / x0, 1.0)
    mant, e = math.frexp(u)  # u = mant · 2^e, mant in [0.5, 1)
    if e - 1 > n - 2:
        return n - 2, u * 2.0 ** (2 - n) - 1.0
    return e - 1, 2.0 * mant - 1.0


@numba.njit(cache=True, fastmath=True, inline="always")
def _at(K: np.ndarray, k: int, off: int, i: int, w: float, x: float) -> float:
    """A 1-D curve at x, its grid position (i, w) known (x < 1 scales to 0)."""
    y0 = K[k, off + i]
    return (y0 + w * (K[k, off + i + 1] - y0)) * min(x, 1.0)


@numba.njit(cache=True, fastmath=True, inline="always")
def _at2(K: np.ndarray, k: int, off: int, n_col: int, i: int, w: float, r: float, ic: int,
         wc: float) -> float:
    """A 2-D curve at row value r, its row position (i, w) and column (ic, wc) known."""
    a = off + i * n_col + ic
    y0 = K[k, a] + wc * (K[k, a + 1] - K[k, a])
    a += n_col
    y1 = K[k, a] + wc * (K[k, a + 1] - K[k, a])
    return (y0 + w * (y1 - y0)) * min(r, 1.0)


@numba.njit(cache=True, fastmath=True, inline="always")
def _roof(cf: tuple, b: float, p: float, ctx_dec: float,
          ctx_pre: float) -> tuple[float, float, float, float]:
    """The roofline pass: (total, memory-busy, compute-busy, collectives)."""
    (w_dense, w_expert, log_miss, moe, pp, inv_bw, inv_fl, comm_fix, comm_tok, ovh_fix,
     ovh_seq, fl_tok, attn, kv_mem, serial) = cf[:15]
    tokens = b + p
    touched = 1.0 - math.exp(tokens * log_miss) if moe > 0 else 1.0
    micro = _clip(max(b, 1.0), 1.0, pp)
    t_mem = ((w_dense + w_expert * touched) * micro + (b * ctx_dec + p) * kv_mem) * inv_bw
    t_comp = (tokens * fl_tok + (b * ctx_dec + p * ctx_pre) * attn) * inv_fl
    t_comm = comm_fix + comm_tok * tokens
    roof = max(t_mem, t_comp) + serial * min(t_mem, t_comp)
    total = (roof + t_comm) * (pp / micro) + ovh_fix + ovh_seq * b
    return total, t_mem, t_comp, t_comm


@numba.njit(cache=True, fastmath=True, inline="always")
def _kern(cf: tuple, K: np.ndarray, b: float, p: float) -> tuple[float, float]:
    """The pass from measured kernels (tables.pass_from_tables): (total, all-reduce)."""
    comm_fix, comm_tok, ovh_fix, ovh_seq = cf[7], cf[8], cf[9], cf[10]
    k, kscale, ic, wc, is_, ws, inv_s, head1, roof_comm = cf[15:]
    tokens = b + p
    q = p * inv_s
    i, w = _pos(tokens, NM, 1.0)
    ar = _at(K, k, OFF_A, i, w, tokens)
    if roof_comm > 0:  # PCIe parts: the roofline's collectives (tables.shard_row)
        ar += (comm_fix + comm_tok * tokens) / kscale
    kern = _at(K, k, OFF_L, i, w, tokens) + ar + q * head1
    if b > 0:
        if p > 0:
            i, w = _pos(b, NM, 1.0)
        kern += _at(K, k, OFF_H, i, w, b)
        if i > NB - 2:  # the batch grid is the M grid's first NB points
            i, w = NB - 2, b * 2.0 ** (2 - NB) - 1.0
        kern += _at2(K, k, OFF_G, NC, i, w, b, ic, wc)
    if q > 0:
        i, w = _pos(q, NQ, 1.0)
        kern += _at2(K, k, OFF_C, NS, i, w, q, is_, ws)
    return kern * kscale + ovh_fix + ovh_seq * b, ar * kscale


@numba.njit(cache=True, fastmath=True, inline="always")
def _pass(cf: tuple, K: np.ndarray, b: float, p: float, ctx_dec: float,
          ctx_pre: float) -> float:
    """Seconds of one pass: measured kernels where the config has a table row."""
    if cf[15] >= 0:
        return _kern(cf, K, b, p)[0]
    return _roof(cf, b, p, ctx_dec, ctx_pre)[0]


@numba.njit(cache=True, fastmath=True)
def _pass_parts(cf: tuple, K: np.ndarray, b: float, p: float, ctx_dec: float,
                ctx_pre: float) -> tuple[float, float, float, float]:
    """(total, memory-busy, compute-busy, collectives); with a table row the total and
    the collectives are measured and the roofline's shares stay for the mediators."""
    total, t_mem, t_comp, t_comm = _roof(cf, b, p, ctx_dec, ctx_pre)
    if cf[15] >= 0:
        total, t_comm = _kern(cf, K, b, p)
    return total, t_mem, t_comp, t_comm


@numba.njit(cache=True, fastmath=True)
def _chunk(X: np.ndarray, j: int, b: float) -> float:
    T = X[MAX_TOKENS, j]
    prompt = max(X[IN_LEN, j] * (1.0 - X[PREFIX_HIT, j]), 1.0)
    if X[CHUNKED, j] > 0:
        return min(prompt, max(T - b, 0.25 * T))
    return prompt


@numba.njit(cache=True, fastmath=True)
def _sakasegawa(rho: float, servers: float, service: float) -> float:
    c = max(servers, 1.0)
    return service * rho ** (math.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho))


@numba.njit(cache=True, fastmath=True)
def _loaded(X: np.ndarray, K: np.ndarray, j: int, cf: tuple, rate: float, conc: float,
            is_rate: bool, b_lim: float, n_c1: float, s_p1: float, ctx_dec: float,
            ctx_pre: float) -> tuple[float, float, float, float]:
    O = max(X[OUT_LEN, j], 1.0)
    prompt = max(X[IN_LEN, j] * (1.0 - X[PREFIX_HIT, j]), 1.0)
    spec = X[SPEC_COST, j] / X[SPEC_GAIN, j]
    b = min(rate * (s_p1 + O * 0.01), b_lim) if is_rate else min(conc, b_lim)
    b = max(b, 1.0)
    ttft, f = s_p1, 0.0
    tpot = 0.0  # first guess: no prefill interference yet
    T = X[MAX_TOKENS, j]
    chunked = X[CHUNKED, j] > 0
    for _ in range(FIXED_POINT_ITERS):
        b_dec = max(b * (O - 1.0) / max(O - 1.0 + n_c1, 1.0), 1.0)
        ch = _chunk(X, j, b_dec)
        n_c = prompt / ch
        free = max(T - b_dec, 0.25 * T) if chunked else max(T, prompt)
        if is_rate:
            demand = rate * prompt * tpot  # tpot: the previous estimate
        else:
            demand = max(b - 1.0, 0.0) * prompt / max(O - 1.0 + n_c, 1.0)
        p_m = min(free, max(ch, demand))
        t_d = _pass(cf, K, b_dec, 0.0, ctx_dec, ctx_pre) * spec
        t_m = _pass(cf, K, b_dec, p_m, ctx_dec, ctx_pre)
        if is_rate:
            k_rate = rate * prompt / p_m
            f = k_rate * t_d / max(1.0 - k_rate * (t_m - t_d), EPS)
        else:
            f = demand / p_m
        f = _clip(f, 0.0, 1.0)
        tpot = (1.0 - f) * t_d + f * t_m
        s_p = n_c * t_m
        lifetime = s_p + (O - 1.0) * tpot
        if is_rate:
            rho_p = _clip(rate * prompt * tpot / free, 0.0, 0.999)
            w_pre = rho_p / (2.0 * (1.0 - rho_p)) * s_p
        else:  # the other clients' prompts, a finite source (reference._loaded)
            hold = prompt * t_m / free
            ahead = max(b - 1.0, 0.0)
            rho_p = _clip(ahead / (ttft + (O - 1.0) * tpot) * hold, 0.0, 0.999)
            w_pre = min(rho_p / (2.0 * (1.0 - rho_p)) * s_p, ahead * hold)
        w_slot = 0.0
        if is_rate:
            w_slot = _sakasegawa(_clip(rate * lifetime / b_lim, 0.0, 0.999), b_lim, lifetime)
        ttft = s_p + 0.5 * tpot + w_pre + w_slot
        b_new = rate * (ttft - w_slot + (O - 1.0) * tpot) if is_rate else min(conc, b_lim)
        b = _clip(0.5 * b + 0.5 * b_new, 1.0, b_lim)
    return ttft, tpot, f, b


@numba.njit(cache=True, fastmath=True)
def _percentiles(ttft: float, service: float, rho: float, tpot: float, t_dec: float, f: float,
                 O: float) -> tuple[float, float, float]:
    r = _clip(rho, 0.05, 1.0)
    wait = max(ttft - service, 0.0)
    p50 = service + wait / r * math.log(max(r / 0.5, 1.0))
    p95 = max(service + wait / r * math.log(max(r / 0.05, 1.0)), ttft)
    spread = max(tpot - t_dec, 0.0) / max(f, 0.02)
    tpot95 = tpot + Z95 * math.sqrt(max(f * (1.0 - f), 0.0) / O) * spread
    return p50, p95, tpot95


@numba.njit(cache=True, fastmath=True)
def _max_rate(X: np.ndarray, K: np.ndarray, j: int, cf: tuple, mu: float, b_lim: float,
              n_c1: float, s_p1: float, ctx_dec: float, ctx_pre: float) -> float:
    slo_ttft, slo_tpot = X[SLO_TTFT, j], X[SLO_TPOT, j]
    if slo_ttft <= 0 and slo_tpot <= 0:
        return mu * 0.999
    O = max(X[OUT_LEN, j], 1.0)
    spec = X[SPEC_COST, j] / X[SPEC_GAIN, j]
    ovh = X[TTFT_OVH, j]
    lo, hi = 0.0, mu * 0.999
    for _ in range(RATE_BISECTIONS):
        mid = 0.5 * (lo + hi)
        ttft, tpot, f, b = _loaded(X, K, j, cf, mid, 0.0, True, b_lim, n_c1, s_p1, ctx_dec, ctx_pre)
        t_d = _pass(cf, K, b, 0.0, ctx_dec, ctx_pre) * spec
        _, ttft95, tpot95 = _percentiles(ttft + ovh, s_p1 + ovh, mid / max(mu, EPS), tpot, t_d,
                                         f, O)
        ok = (slo_ttft <= 0 or ttft95 <= slo_ttft) and (slo_tpot <= 0 or tpot95 <= slo_tpot)
        if ok:
            lo = mid
        else:
            hi = mid
    return lo


@numba.njit(cache=True, fastmath=True)
def _predict_one(X: np.ndarray, K: np.ndarray, j: int, Y: np.ndarray) -> None:
    cf = _coeffs(X, K, j)
    I, O = X[IN_LEN, j], max(X[OUT_LEN, j], 1.0)
    I_eff = I * (1.0 - X[PREFIX_HIT, j])
    mode, load, reps = int(X[MODE, j]), X[LOAD, j], X[REPLICAS, j]
    spec = X[SPEC_GAIN, j]
    spec_f = X[SPEC_COST, j] / spec
    per_seq_kv = I + (O if X[KV_FULL, j] > 0 else 0.5 * O)
    b_cap = max(min(X[MAX_SEQS, j], X[KV_CAP, j] / per_seq_kv), 1e-3)
    chunked = X[CHUNKED, j] > 0
    T = X[MAX_TOKENS, j]
    b_sat = max(min(b_cap, T / (1.0 + I_eff / O)) if chunked else b_cap, 1e-3)
    ctx_dec, ctx_pre = I + 0.5 * O, 0.5 * I
    prompt = max(I_eff, 1.0)

    # saturated operating point
    p_sat = b_sat * I_eff / O
    if chunked:
        t_sat = _pass(cf, K, b_sat, p_sat, ctx_dec, ctx_pre)
    else:
        ch_un = min(prompt * max(math.floor(T / prompt), 1.0), max(p_sat, 1.0))
        t_pre_un = _pass(cf, K, 0.0, ch_un, ctx_dec, ctx_pre)
        t_sat = _pass(cf, K, b_sat, 0.0, ctx_dec, ctx_pre) + p_sat / ch_un * t_pre_un
    t_sat = t_sat * spec_f
    x_sat = b_sat / t_sat
    mu = x_sat / O

    # unloaded prefill of one request
    ch1 = _chunk(X, j, 1.0)
    n_c1 = prompt / ch1
    s_p1 = n_c1 * _pass(cf, K, 1.0, ch1, ctx_dec, ctx_pre)

    per_rep = load / reps
    is_rate, is_conc = mode == MODE_RATE, mode == MODE_CONCURRENCY
    rate = per_rep if is_rate else 0.0
    conc = per_rep if is_conc else 0.0
    b_lim = b_sat if chunked else b_cap
    ttft, tpot, f, b = s_p1, 0.0, 0.0, 1.0
    if is_rate or is_conc:  # the other modes never read the loaded operating point
        ttft, tpot, f, b = _loaded(X, K, j, cf, rate, conc, is_rate, b_lim, n_c1, s_p1, ctx_dec,
                                   ctx_pre)
    lifetime = ttft + (O - 1.0) * tpot
    overloaded = is_rate and rate >= mu * 0.999

    # static batch and burst
    n_batch = max(per_rep, 1.0)
    is_sat, is_st, is_burst = mode == MODE_SATURATED, mode == MODE_STATIC, mode == MODE_BURST
    b_st, waves, prefill_st, t_dec_st, total_st = 1.0, 1.0, 0.0, 0.0, 1.0
    if is_st or is_burst:  # only the wave modes read these
        b_st = min(n_batch, b_sat if is_burst else b_cap)
        waves = n_batch / b_st
        pre_tokens = b_st * prompt
        ch_st = min(pre_tokens, max(T, prompt))
        prefill_st = pre_tokens / ch_st * _pass(cf, K, 0.0, ch_st, ctx_dec, ctx_pre)
        t_dec_st = _pass(cf, K, b_st, 0.0, ctx_dec, ctx_pre) * spec_f
        total_st = waves * (prefill_st + (O - 1.0) * t_dec_st)

    # select by mode
    is_wave = is_st or is_burst
    saturated = is_sat or overloaded or (is_burst and n_batch > b_sat)
    ttft_sat = s_p1 + b_sat * I_eff / max(T, 1.0) * t_sat
    if is_sat:
        out_tput, ttft_out = x_sat, ttft_sat
    elif is_conc:
        out_tput = min(min(b, conc) * O / lifetime, x_sat)
        ttft_out = ttft + max(conc - b_lim, 0.0) * lifetime / b_lim
    elif is_rate:
        out_tput = min(rate, mu) * O
        backlog = max(1.0 - mu / max(rate, EPS), 0.0) * 0.5 * X[WINDOW, j]
        ttft_out = max(ttft, ttft_sat + backlog) if overloaded else ttft
    elif is_wave:
        out_tput = n_batch * O / total_st
        ttft_out = prefill_st + 0.5 * (waves - 1.0) * total_st / waves
    else:
        out_tput, ttft_out = 0.0, 0.0
    ttft_out += X[TTFT_OVH, j]
    if saturated:
        tpot_out, f_out = t_sat, 1.0
    elif is_wave:
        tpot_out, f_out = t_dec_st, 0.0
    else:
        tpot_out, f_out = tpot, f
    if is_sat or overloaded:
        batch = b_sat
    elif is_wave:
        batch = b_st
    else:
        batch = b

    rho_q = min(rate / max(mu, EPS), 1.0) if is_rate else 0.5
    t_d_out = _pass(cf, K, max(batch, 1.0), 0.0, ctx_dec, ctx_pre) * spec_f
    s_p1_ovh = s_p1 + X[TTFT_OVH, j]
    p50, p95, tpot95 = _percentiles(ttft_out, s_p1_ovh, rho_q, tpot_out, t_d_out, f_out, O)

    # mediators
    bb = max(batch, 1.0)
    t_pass, t_mem, t_comp, t_comm = _pass_parts(cf, K, bb, bb * I_eff / O * f_out, ctx_dec, ctx_pre)
    if is_conc:
        demand = conc
    elif is_rate:
        demand = rate * lifetime
    elif is_wave:
        demand = n_batch
    else:
        demand = b_cap * 2.0
    if is_rate:
        queue_util = rate / max(mu, EPS)
    elif is_conc:
        queue_util = conc / max(b_lim, EPS)
    else:
        queue_util = 1.0
    kv_used = min(batch * per_seq_kv, X[KV_CAP, j])

    Y[Y_TTFT, j] = ttft_out
    Y[Y_TTFT50, j] = p50
    Y[Y_TTFT95, j] = p95
    Y[Y_TPOT, j] = tpot_out
    Y[Y_TPOT50, j] = tpot_out
    Y[Y_TPOT95, j] = tpot95
    Y[Y_OUT, j] = out_tput * reps
    Y[Y_TOTAL, j] = out_tput * reps * (1.0 + I / O)
    Y[Y_REQ, j] = out_tput * reps / O
    Y[Y_E2E, j] = ttft_out + (O - 1.0) * tpot_out
    Y[Y_COST, j] = X[USD_HOUR, j] / max(out_tput * 3600.0, EPS) * 1e6
    Y[Y_KVP, j] = min(demand, X[MAX_SEQS, j]) * per_seq_kv / max(X[KV_CAP, j], 1.0)
    Y[Y_COMM, j] = t_comm * X[PP, j] / max(t_pass, EPS)
    Y[Y_CU, j] = min(t_comp / max(t_pass, EPS), 1.0)
    Y[Y_MU, j] = min(t_mem / max(t_pass, EPS), 1.0)
    Y[Y_QU, j] = queue_util
    Y[Y_BE, j] = min(out_tput / max(x_sat, EPS), 1.0)
    Y[Y_HEAD, j] = 1.0 - (X[MEM_FIXED, j] + kv_used * X[KV_TOK, j] / X[DP, j]) / X[MEM_TOTAL, j]
    Y[Y_BATCH, j] = batch
    Y[Y_MAXRATE, j] = _max_rate(X, K, j, cf, mu, b_lim, n_c1, s_p1, ctx_dec, ctx_pre) * reps


@numba.njit(cache=True, fastmath=True, nogil=True)
def _predict_all(X: np.ndarray, K: np.ndarray, Y: np.ndarray) -> None:
    for j in range(X.shape[1]):
        _predict_one(X, K, j, Y)


PARALLEL_MIN_COLUMNS = 4096
THREADS = max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1, 1)
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that made it, the pool)


def predict_kernel(X: np.ndarray, *, parallel: bool | None = None) -> np.ndarray:
    """Evaluate every candidate column of ``X`` (shape (N_IN, n)); returns (N_OUT, n).
    ``parallel`` None: split over the machine's cores from ``PARALLEL_MIN_COLUMNS``
    columns."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    n = X.shape[1]
    if parallel is None:
        parallel = n >= PARALLEL_MIN_COLUMNS and THREADS > 1
    if not parallel or n < 2:
        Y = np.zeros((N_OUT, n))
        _predict_all(X, REGISTRY.curves(), Y)
        return Y
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():  # a forked child has none of its threads
        _POOL = (os.getpid(),
                 ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="koi-kernel"))
    curves = REGISTRY.curves()
    cuts = np.linspace(0, n, min(THREADS, n) + 1).astype(int)

    def chunk(a: int, b: int) -> np.ndarray:
        # a C-contiguous copy, so the very function the serial path runs computes it
        Xc = np.ascontiguousarray(X[:, a:b])
        Yc = np.zeros((N_OUT, b - a))
        _predict_all(Xc, curves, Yc)
        return Yc

    parts = list(_POOL[1].map(chunk, cuts[:-1].tolist(), cuts[1:].tolist()))
    Y = np.concatenate(parts, axis=1)
    return Y
