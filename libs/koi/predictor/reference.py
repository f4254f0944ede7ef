"""Plain-numpy reference implementation of the serving model (the specification).

Readable, vectorised over candidates, and deliberately free of numba: the numba
kernel in ``kernel.py`` must agree with it to floating-point tolerance (tested). The
model, in one paragraph:

* A forward **pass** over ``b`` decoding sequences plus ``p`` prefill tokens reads the
  GPU's weights (only the experts the batch touches, for MoE) and the decoders' KV
  cache, and does 2·params FLOPs per token plus attention. Its time is the roofline
  ``max(t_mem, t_comp) + serial_frac·min(t_mem, t_comp)`` with
  ``t_mem = bytes / (BW·eff_mem)`` and ``t_comp = flops / (peak·eff_comp)``, plus
  tensor/expert-parallel collectives on the part's interconnect, plus a per-pass engine
  overhead. Pipeline
  stages process ``min(b, pp)`` micro-batches; fewer than ``pp`` leaves bubbles.
* **Continuous batching** with chunked prefill: each pass carries the running decodes
  and, when a prompt is waiting, a prefill chunk filling the token budget. The share
  ``f`` of passes that carry a chunk follows from the arrival rate (open loop), the
  number of clients (closed loop) or the token budget (saturated).
* **Queueing**: TTFT adds the wait for the next pass, an M/D/1 wait for the prefill
  budget and a Sakasegawa M/M/c wait for a free sequence slot (KV capacity or
  max_num_seqs). Past saturation the backlog grows over ``window_s``.

Units: seconds, bytes, tokens. Outputs are per deployment (× replicas).
"""

from __future__ import annotations

import numpy as np

from koi.predictor import tables
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

FIXED_POINT_ITERS = 6
RATE_BISECTIONS = 12
Z95 = 1.6449
EPS = 1e-12


def _col(X: np.ndarray, name: str) -> np.ndarray:
    return X[IN[name]]


def pass_time(X: np.ndarray, b: np.ndarray, p: np.ndarray, ctx_dec: np.ndarray,
              ctx_pre: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seconds for one forward pass: (total, memory-busy, compute-busy, collectives)."""
    c = lambda name: _col(X, name)  # noqa: E731
    dp, pp = c("dp"), c("pp")
    tokens = b + p
    ke = c("moe_ke")
    touched = np.where(ke > 0, 1.0 - np.power(np.maximum(1.0 - ke, 0.0), tokens), 1.0)
    # micro-batches in flight through the pipeline; each re-reads its stage's weights
    micro = np.clip(np.maximum(b, 1.0), 1.0, pp)
    weights = (c("w_dense") + c("w_expert") * touched) * micro
    kv_read = (b / dp) * ctx_dec * c("kv_tok") + (p / dp) * c("kv_tok")
    t_mem = (weights + kv_read / c("attn_mem")) / (c("hbm_bw") * c("eff_mem"))
    attn = (b * ctx_dec + p * ctx_pre) / dp * c("attn_flops_ctx")
    flops = tokens * c("flops_tok") + attn + tokens * c("flops_tok_exp") / c("moe_eff")
    t_comp = flops / (c("peak_flops") * c("eff_comp"))
    link = c("link_bw") * c("eff_link")
    tp, ep = c("tp"), c("ep")
    per_rank = tokens / dp
    t_ar = np.where(tp > 1, c("n_ar") * (c("link_lat") + 2.0 * (tp - 1.0) / tp
                                           * per_rank * c("ar_bytes_tok") / link), 0.0)
    t_a2a = np.where(ep > 1, c("n_moe") * 2.0 * (c("link_lat") + (ep - 1.0) / ep
                                                  * per_rank * c("a2a_bytes_tok") / link), 0.0)
    t_comm = t_ar + t_a2a
    layers = c("layers_gpu")
    ovh = c("ovh_base") * np.where(c("cuda_graphs") > 0, 1.0, 1.0 + layers / 8.0) \
        + c("ovh_seq") * b
    # the shorter of memory and compute time overlaps the longer except for serial_frac
    roof = np.maximum(t_mem, t_comp) + c("serial_frac") * np.minimum(t_mem, t_comp)
    stage = roof + t_comm
    total = stage * (pp / micro) + ovh
    k = c("ktab").astype(np.int64)
    has = k >= 0
    if has.any():
        # measured kernels (pp = 1, dp = 1 only): their sum, scaled, replaces the roofline
        # and its collectives; the roofline's t_mem/t_comp stay as the mediators' shares
        # (the roofline's collectives stand in for the tables' on PCIe parts: tables.py)
        kern, ar = tables.pass_from_tables(tables.REGISTRY.curves(), np.maximum(k, 0), b, p,
                                           ctx_dec, 2.0 * ctx_pre, t_comm / c("kscale"))
        total = np.where(has, kern * c("kscale") + ovh, total)
        t_comm = np.where(has, ar * c("kscale"), t_comm)
    return total, t_mem, t_comp, t_comm


def predict_reference(X: np.ndarray) -> np.ndarray:
    """Evaluate every candidate column of ``X``; returns ``Y`` of shape (N_OUT, n)."""
    c = lambda name: _col(X, name)  # noqa: E731
    n = X.shape[1]
    Y = np.zeros((N_OUT, n))
    I, O = c("in_len"), np.maximum(c("out_len"), 1.0)
    I_eff = I * (1.0 - c("prefix_hit"))
    mode, load = c("mode"), c("load")
    reps = c("replicas")
    spec = c("spec_gain")

    # --- capacity: sequences that fit the KV cache and the engine's limits -------------
    per_seq_kv = I + np.where(c("kv_full_reserve") > 0, O, 0.5 * O)
    b_kv = c("kv_cap") / per_seq_kv
    b_cap = np.maximum(np.minimum(c("max_seqs"), b_kv), 1e-3)
    chunked = c("chunked") > 0
    T = c("max_tokens")
    b_sat = np.where(chunked, np.minimum(b_cap, T / (1.0 + I_eff / O)), b_cap)
    b_sat = np.maximum(b_sat, 1e-3)
    ctx_dec = I + 0.5 * O
    ctx_pre = 0.5 * I

    # --- saturated operating point ------------------------------------------------------
    p_sat = b_sat * I_eff / O
    t_sat_mix, *_ = pass_time(X, b_sat, p_sat, ctx_dec, ctx_pre)
    ch_un = np.minimum(np.maximum(I_eff, 1.0) * np.maximum(np.floor(T / np.maximum(I_eff, 1.0)),
                                                           1.0), np.maximum(p_sat, 1.0))
    t_pre_un, *_ = pass_time(X, np.zeros(n), ch_un, ctx_dec, ctx_pre)
    t_dec_sat, *_ = pass_time(X, b_sat, np.zeros(n), ctx_dec, ctx_pre)
    t_sat = np.where(chunked, t_sat_mix, t_dec_sat + p_sat / ch_un * t_pre_un)
    t_sat = t_sat * c("spec_cost") / spec
    x_sat = b_sat / t_sat                      # output tokens/s per replica
    mu = x_sat / O                             # requests/s per replica

    # --- unloaded prefill of one request ------------------------------------------------
    ch1 = _chunk(X, np.ones(n))
    n_c1 = np.maximum(I_eff, 1.0) / ch1
    t_c1, *_ = pass_time(X, np.ones(n), ch1, ctx_dec, ctx_pre)
    s_p1 = n_c1 * t_c1

    # --- open loop (rate) / closed loop (concurrency): fixed point on the batch ----------
    per_rep_load = load / reps
    is_rate = mode == MODE_RATE
    is_conc = mode == MODE_CONCURRENCY
    rate = np.where(is_rate, per_rep_load, 0.0)
    conc = np.where(is_conc, per_rep_load, 0.0)
    b_lim = np.where(chunked, b_sat, b_cap)
    ttft, tpot, f, b = _loaded(X, rate, conc, is_rate, b_lim, n_c1, s_p1, ctx_dec, ctx_pre)
    lifetime = ttft + (O - 1.0) * tpot
    # closed loop: clients beyond the slot limit queue for a slot
    conc_extra = np.maximum(conc - b_lim, 0.0)
    ttft_conc = ttft + conc_extra * lifetime / b_lim
    # the saturated operating point is the most a replica can deliver
    x_conc = np.minimum(np.minimum(b, conc) * O / lifetime, x_sat)
    x_rate = np.minimum(rate, mu) * O
    overloaded = is_rate & (rate >= mu * 0.999)
    backlog_wait = np.maximum(1.0 - mu / np.maximum(rate, EPS), 0.0) * 0.5 * c("window_s")

    # --- static batch and burst -----------------------------------------------------------
    n_batch = np.maximum(per_rep_load, 1.0)
    is_sat, is_st, is_burst = mode == MODE_SATURATED, mode == MODE_STATIC, mode == MODE_BURST
    # a burst under continuous batching runs like back-to-back static waves of b_sat
    b_st = np.minimum(n_batch, np.where(is_burst, b_sat, b_cap))
    waves = n_batch / b_st
    pre_tokens = b_st * np.maximum(I_eff, 1.0)
    ch_st = np.minimum(pre_tokens, np.maximum(T, np.maximum(I_eff, 1.0)))
    t_pre_st, *_ = pass_time(X, np.zeros(n), ch_st, ctx_dec, ctx_pre)
    prefill_st = pre_tokens / ch_st * t_pre_st
    t_dec_st, *_ = pass_time(X, b_st, np.zeros(n), ctx_dec, ctx_pre)
    t_dec_st = t_dec_st * c("spec_cost") / spec
    total_st = waves * (prefill_st + (O - 1.0) * t_dec_st)
    ttft_st = prefill_st + 0.5 * (waves - 1.0) * total_st / waves

    # --- select by mode -----------------------------------------------------------------------
    is_wave = is_st | is_burst
    burst_mixed = is_burst & (n_batch > b_sat)
    out_tput = np.select([is_sat, is_conc, is_rate, is_wave],
                         [x_sat, x_conc, x_rate, n_batch * O / total_st])
    ttft_sat = s_p1 + b_sat * I_eff / np.maximum(T, 1.0) * t_sat
    ttft_out = np.select(
        [is_sat, is_conc, is_rate, is_wave],
        [ttft_sat, ttft_conc,
         np.where(overloaded, np.maximum(ttft, ttft_sat + backlog_wait), ttft), ttft_st])
    ttft_out = ttft_out + c("ttft_ovh")
    saturated = is_sat | overloaded | burst_mixed
    tpot_out = np.select([saturated, is_wave], [t_sat, t_dec_st], tpot)
    f_out = np.where(saturated, 1.0, np.where(is_wave, 0.0, f))
    batch = np.select([is_sat | overloaded, is_wave], [b_sat, b_st], b)

    # percentiles of the per-request TTFT and mean TPOT
    rho_q = np.where(is_rate, np.minimum(rate / np.maximum(mu, EPS), 1.0), 0.5)
    t_d_out = pass_time(X, np.maximum(batch, 1.0), np.zeros(n), ctx_dec, ctx_pre)[0] \
        * c("spec_cost") / spec
    s_p1 = s_p1 + c("ttft_ovh")
    ttft_p50, ttft_p95, tpot_p95 = _percentiles(ttft_out, s_p1, rho_q, tpot_out, t_d_out,
                                                f_out, O)
    tpot_p50 = tpot_out

    # --- mediators ------------------------------------------------------------------------------
    t_pass, t_mem, t_comp, t_comm = pass_time(X, np.maximum(batch, 1.0),
                                              np.maximum(batch, 1.0) * I_eff / O * f_out,
                                              ctx_dec, ctx_pre)
    demand = np.select([is_conc, is_rate, is_st | is_burst], [conc, rate * lifetime, n_batch],
                       b_cap * 2.0)
    kv_pressure = np.minimum(demand, c("max_seqs")) * per_seq_kv / np.maximum(c("kv_cap"), 1.0)
    queue_util = np.select([is_rate, is_conc], [rate / np.maximum(mu, EPS),
                                                conc / np.maximum(b_lim, EPS)], 1.0)
    kv_used = np.minimum(batch * per_seq_kv, c("kv_cap"))
    mem_headroom = 1.0 - (c("mem_fixed") + kv_used * c("kv_tok") / c("dp")) / c("mem_total")

    Y[OUT["ttft"]] = ttft_out
    Y[OUT["ttft_p50"]] = ttft_p50
    Y[OUT["ttft_p95"]] = ttft_p95
    Y[OUT["tpot"]] = tpot_out
    Y[OUT["tpot_p50"]] = tpot_p50
    Y[OUT["tpot_p95"]] = tpot_p95
    Y[OUT["out_tput"]] = out_tput * reps
    Y[OUT["total_tput"]] = out_tput * reps * (1.0 + I / O)
    Y[OUT["req_rate"]] = out_tput * reps / O
    Y[OUT["e2e"]] = ttft_out + (O - 1.0) * tpot_out
    Y[OUT["cost_mtok"]] = c("usd_hour") / np.maximum(out_tput * 3600.0, EPS) * 1e6
    Y[OUT["kv_pressure"]] = kv_pressure
    Y[OUT["comm_frac"]] = t_comm * c("pp") / np.maximum(t_pass, EPS)
    Y[OUT["compute_util"]] = np.minimum(t_comp / np.maximum(t_pass, EPS), 1.0)
    Y[OUT["membw_util"]] = np.minimum(t_mem / np.maximum(t_pass, EPS), 1.0)
    Y[OUT["queue_util"]] = queue_util
    Y[OUT["batch_eff"]] = np.minimum(out_tput / np.maximum(x_sat, EPS), 1.0)
    Y[OUT["mem_headroom"]] = mem_headroom
    Y[OUT["batch"]] = batch
    Y[OUT["max_rate_slo"]] = _max_rate_under_slo(X, mu, b_lim, n_c1, s_p1 - c("ttft_ovh"),
                                                  ctx_dec, ctx_pre) * reps
    return Y


def _chunk(X: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Prefill chunk that fits beside ``b`` decodes (the whole prompt when unchunked)."""
    T = X[IN["max_tokens"]]
    prompt = np.maximum(X[IN["in_len"]] * (1.0 - X[IN["prefix_hit"]]), 1.0)
    free = np.maximum(T - b, 0.25 * T)
    return np.where(X[IN["chunked"]] > 0, np.minimum(prompt, free), prompt)


def _loaded(X: np.ndarray, rate: np.ndarray, conc: np.ndarray, is_rate: np.ndarray,
            b_lim: np.ndarray, n_c1: np.ndarray, s_p1: np.ndarray, ctx_dec: np.ndarray,
            ctx_pre: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fixed point of batch ↔ latency under a rate (open loop) or clients (closed loop).

    Returns (mean TTFT without request overhead, mean TPOT, share of passes carrying a
    prefill chunk, running batch).
    """
    n = X.shape[1]
    O = np.maximum(X[IN["out_len"]], 1.0)
    prompt = np.maximum(X[IN["in_len"]] * (1.0 - X[IN["prefix_hit"]]), 1.0)
    spec = X[IN["spec_cost"]] / X[IN["spec_gain"]]
    b = np.where(is_rate, np.minimum(rate * (s_p1 + O * 0.01), b_lim), np.minimum(conc, b_lim))
    b = np.maximum(b, 1.0)
    ttft, f = s_p1, np.zeros(n)
    tpot = np.zeros(n)  # first guess: no prefill interference yet
    T = X[IN["max_tokens"]]
    budget = np.where(X[IN["chunked"]] > 0, 1.0, 0.0)
    for _ in range(FIXED_POINT_ITERS):
        b_dec = np.maximum(b * (O - 1.0) / np.maximum(O - 1.0 + n_c1, 1.0), 1.0)
        ch = _chunk(X, b_dec)
        n_c = prompt / ch
        # prefill tokens the other requests bring per pass; several prompts share a pass
        # up to the token budget left beside the decodes
        free = np.where(budget > 0, np.maximum(T - b_dec, 0.25 * T), np.maximum(T, prompt))
        t_d = pass_time(X, b_dec, np.zeros(n), ctx_dec, ctx_pre)[0] * spec
        demand = np.where(is_rate, rate * prompt * tpot,  # tpot: the previous estimate
                          np.maximum(b - 1.0, 0.0) * prompt / np.maximum(O - 1.0 + n_c, 1.0))
        p_m = np.minimum(free, np.maximum(ch, demand))
        t_m = pass_time(X, b_dec, p_m, ctx_dec, ctx_pre)[0]
        # share of passes that carry a prefill load of p_m tokens
        k_rate = rate * prompt / p_m
        f_rate = k_rate * t_d / np.maximum(1.0 - k_rate * (t_m - t_d), EPS)
        f = np.clip(np.where(is_rate, f_rate, demand / p_m), 0.0, 1.0)
        tpot = (1.0 - f) * t_d + f * t_m
        s_p = n_c * t_m
        lifetime = s_p + (O - 1.0) * tpot
        # prompts wait while the prefill budget is taken (M/D/1 on that budget). Poisson
        # arrivals at the rate; closed-loop ones at the other clients' pace: b − 1 of
        # them per response time (the previous estimate's TTFT; a lone client never
        # waits), each holding the budget for prompt/free passes of a mixed pass, and a
        # finite source: never more than all of them ahead
        hold = prompt * t_m / free
        ahead = np.maximum(b - 1.0, 0.0)
        others = ahead / (ttft + (O - 1.0) * tpot) * hold
        rho_p = np.clip(np.where(is_rate, rate * prompt * tpot / free, others), 0.0, 0.999)
        w_pre = rho_p / (2.0 * (1.0 - rho_p)) * s_p
        w_pre = np.where(is_rate, w_pre, np.minimum(w_pre, ahead * hold))
        # requests waiting for a sequence slot hold no slot: utilisation of the slots is
        # the arrival rate × time in service over the slot count
        rho_slot = np.clip(rate * lifetime / b_lim, 0.0, 0.999)
        w_slot = np.where(is_rate, _sakasegawa(rho_slot, b_lim, lifetime), 0.0)
        ttft = s_p + 0.5 * tpot + w_pre + w_slot
        b_new = np.where(is_rate, rate * (ttft - w_slot + (O - 1.0) * tpot),
                         np.minimum(conc, b_lim))
        b = np.clip(0.5 * b + 0.5 * b_new, 1.0, b_lim)
    return ttft, tpot, f, b


def _sakasegawa(rho: np.ndarray, servers: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Mean wait in an M/M/c queue (Sakasegawa's approximation)."""
    c = np.maximum(servers, 1.0)
    return service * np.power(rho, np.sqrt(2.0 * (c + 1.0)) - 1.0) / (c * (1.0 - rho))


def _percentiles(ttft: np.ndarray, service: np.ndarray, rho: np.ndarray, tpot: np.ndarray,
                 t_dec: np.ndarray, f: np.ndarray, O: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT p50, TTFT p95, TPOT p95).

    The wait beyond the unloaded service is ~exponential in the tail with P(W>0) = ρ
    (M/M/1-like); a request's mean TPOT varies with how many of its O passes carried a
    prefill chunk (binomial with share f).
    """
    r = np.clip(rho, 0.05, 1.0)
    wait = np.maximum(ttft - service, 0.0)
    p50 = service + wait / r * np.log(np.maximum(r / 0.5, 1.0))
    # the deterministic part of the wait (next pass boundary) keeps p95 above the mean
    p95 = np.maximum(service + wait / r * np.log(np.maximum(r / 0.05, 1.0)), ttft)
    spread = np.maximum(tpot - t_dec, 0.0) / np.maximum(f, 0.02)
    tpot95 = tpot + Z95 * np.sqrt(np.maximum(f * (1.0 - f), 0.0) / O) * spread
    return p50, p95, tpot95


def _max_rate_under_slo(X: np.ndarray, mu: np.ndarray, b_lim: np.ndarray, n_c1: np.ndarray,
                        s_p1: np.ndarray, ctx_dec: np.ndarray, ctx_pre: np.ndarray
                        ) -> np.ndarray:
    """Largest Poisson rate (req/s per replica) whose p95 TTFT and p95 TPOT meet the SLOs.

    Bisection on the rate with the open-loop solver; without SLOs, the saturation rate.
    """
    n = X.shape[1]
    slo_ttft, slo_tpot = X[IN["slo_ttft"]], X[IN["slo_tpot"]]
    O = np.maximum(X[IN["out_len"]], 1.0)
    spec = X[IN["spec_cost"]] / X[IN["spec_gain"]]
    has_slo = (slo_ttft > 0) | (slo_tpot > 0)
    if not has_slo.any():  # e.g. every calibration fit: nothing to bisect
        return mu * 0.999
    lo, hi = np.zeros(n), mu * 0.999
    is_rate = np.ones(n, dtype=bool)
    for _ in range(RATE_BISECTIONS):
        mid = 0.5 * (lo + hi)
        ttft, tpot, f, b = _loaded(X, mid, np.zeros(n), is_rate, b_lim, n_c1, s_p1, ctx_dec,
                                   ctx_pre)
        t_d = pass_time(X, b, np.zeros(n), ctx_dec, ctx_pre)[0] * spec
        ovh = X[IN["ttft_ovh"]]
        _, ttft95, tpot95 = _percentiles(ttft + ovh, s_p1 + ovh, mid / np.maximum(mu, EPS),
                                         tpot, t_d, f, O)
        ok = ((slo_ttft <= 0) | (ttft95 <= slo_ttft)) & ((slo_tpot <= 0) | (tpot95 <= slo_tpot))
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(has_slo, lo, mu * 0.999)
