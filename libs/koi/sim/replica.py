"""One engine replica: request-level continuous batching, advanced segment by segment.

Requests wait, are admitted when a batch slot and KV blocks are free, prefill (chunked
by ``max_batched_tokens`` when chunked prefill is on, otherwise in prefill-only passes),
then decode one token per pass until done. When the KV cache overflows, the newest
decoding request is preempted and later recomputed (vLLM's recompute mode).

The loop is event-driven, not one Python iteration per decode step: between events (an
admissible arrival, a prefill completing, a request finishing, the KV cache filling, the
window ending) the pass time is held constant and many passes are taken at once. A
global pass counter ``G`` plus running sums give every sequence's context in O(1).

A simulated request carries a weight ``w`` (thinned simulation: it stands for ``w``
identical requests), and the batch and KV load it exerts are multiplied by ``w``. An
online group also carries its members' prompt lengths and arrival offsets
(``Req.members``, ``Req.spread``): its prompt is released to prefill one member at a time
as they arrive, not all at once, and each member's first token is timed when its own
prompt is done and reported as its own completion. (Without that, a group's whole prompt
lands in one burst and every request behind it waits for all of it: ``koi bench
thinning`` shows the size of that artefact.) The group still decodes as one once its
last member is prefilled.
No routing, fleet or cost logic here, and no ``koi.predictor`` imports.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from koi.sim.physics import StepCoef, step_time

INF = math.inf
# Past the KV cliff, a preemption's recompute and block churn slow the following passes;
# a full cache that is not preempting (steady saturation) runs at normal speed.
THRASH_PASSES = 64


class Req:
    """One simulated request (or a group of ``w`` identical ones)."""

    __slots__ = ("alive", "arrival", "cum", "done_t", "first", "g0", "gen", "gen0", "hseq",
                 "inp", "job", "lag", "moved", "n", "net", "offs", "out", "pre_left",
                 "pre_start", "pre_tot", "w")

    def __init__(self, job: int, arrival: float, inp: int, out: int, w: float,
                 net: float) -> None:
        self.job = job
        self.arrival = arrival
        self.inp = inp
        self.out = out
        self.w = w
        self.net = net          # client ↔ region latency added to TTFT, s
        self.n = 1              # members timed apart (1: the group is timed as one)
        self.cum: list[float] = [1.0]    # share of the group's prompt up to each member
        self.offs: list[float] | None = None  # members' arrival offsets (None: all at 0)
        self.pre_tot = 0.0      # weighted prefill tokens of the current prefill
        self.done_t: list[float] = []   # members' first-token times (first prefill only)
        self.first = -1.0       # first-token time (engine side), -1 = none yet
        self.lag = 0.0          # group prefill after ``first`` that is not its members' TPOT
        self.gen = 0            # tokens generated before the current prefill
        self.gen0 = 0           # tokens generated when the current decode began
        self.g0 = 0             # pass counter when the current decode began
        self.pre_left = 0.0     # weighted prefill tokens still to compute
        self.pre_start = 0.0    # when its prefill reached the head of the prefill queue
        self.alive = False      # in the decoding set (heap entries are deleted lazily)
        self.hseq = 0           # id of its live heap entry; older entries are stale
        self.moved = False      # disrupted by a policy's move (evicted, or waited it out)

    def members(self, prompts: list[int]) -> None:
        """Time the group as ``len(prompts)`` members with these prompt lengths, each
        standing for ``w / len(prompts)`` requests (until ``spread``, all arrive at once,
        as a batch feed's backlog or a saturating burst does)."""
        total = float(sum(prompts))
        acc, self.cum = 0.0, []
        for x in prompts:
            acc += x
            self.cum.append(acc / total)
        self.cum[-1] = 1.0
        self.n = len(prompts)

    def spread(self, offsets: list[float]) -> None:
        """Its members arrive at ``arrival + offsets`` (sorted, the first 0)."""
        assert len(offsets) == self.n, "one offset per member"
        self.offs = offsets

    @property
    def paced(self) -> bool:
        """Members still to time: a spread group's first prefill."""
        return self.n > 1 and self.first < 0

    def released(self, t: float) -> float:
        """Weighted prefill tokens whose members have arrived by ``t``."""
        if not self.paced or self.offs is None:
            return self.pre_tot
        k = bisect_right(self.offs, t - self.arrival + 1e-9)
        return self.pre_tot * self.cum[k - 1]

    def next_release(self, t: float) -> float:
        """When the next member arrives after ``t`` (inf when all have)."""
        if not self.paced or self.offs is None:
            return INF
        k = bisect_right(self.offs, t - self.arrival + 1e-9)
        return INF if k >= self.n else self.arrival + self.offs[k]


@dataclass(slots=True)
class Completion:
    job: int
    w: float
    ttft: float
    tpot: float
    out: int
    t: float


@dataclass(slots=True)
class ReplicaStats:
    """What a replica did over one window (weighted counts; time-weighted means)."""

    arrived: float = 0.0
    prompt_tokens: float = 0.0
    gen_tokens: float = 0.0
    gen_by: float = 0.0          # generated before ``deadline`` (batch jobs)
    preemptions: float = 0.0
    busy_kv: float = 0.0         # ∫ kv usage dt
    busy_run: float = 0.0        # ∫ running seqs dt
    busy_wait: float = 0.0       # ∫ waiting seqs dt
    span: float = 0.0
    done: list[Completion] = field(default_factory=list)
    dropped: list[tuple[Req, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """Engine limits and world effects of one replica."""

    coef: StepCoef
    kv_cap: float            # tokens of KV the replica holds
    max_seqs: int
    max_tokens: int          # max batched tokens per pass
    chunked: bool
    prefix_hit: float = 0.0  # share of prompt tokens served from the prefix cache
    slow: float = 1.0        # straggler × throttling multiplier
    cliff_usage: float = 0.9
    cliff_factor: float = 1.6
    noise_sigma: float = 0.0
    # TensorRT-LLM's default scheduler admits a request only when KV for its whole
    # sequence (prompt + max output) is free, so it never preempts; vLLM/SGLang admit on
    # the prompt alone and preempt when decodes outgrow the cache.
    reserve_full: bool = False
    ttft_overhead: float = 0.0   # per-request scheduling/tokenisation/return cost, s


class Replica:
    """Continuous-batching engine state of one replica; ``run_until`` advances it."""

    def __init__(self, spec: ReplicaSpec, rng: np.random.Generator, now: float,
                 deadline: float = INF) -> None:
        self.s = spec
        self.rng = rng
        self.now = now
        self.deadline = deadline
        self.pending: deque[Req] = deque()   # routed, arriving later in this window
        self.waiting: deque[Req] = deque()
        self.prefill: deque[Req] = deque()
        self.heap: list[tuple[int, int, Req]] = []
        self.order: list[tuple[int, Req]] = []  # decode start order, to preempt the newest
        self.G = 0
        self.w_dec = 0.0
        self.a_sum = 0.0                     # Σ w·(inp + gen0 − g0) over decoding
        self.w_pre = 0.0
        self.kv_pre = 0.0                    # KV reserved by prefilling requests
        self.kv_full = 0.0                   # whole-sequence KV reserved (reserve_full)
        self.w_wait = 0.0
        self.seq = 0
        self.feeder: Callable[[Replica], None] | None = None
        self.stats = ReplicaStats()
        self._thrash_until = -1   # pass counter up to which preemptions make KV thrash
        self._noise = np.empty(0)
        self._ni = 0

    # --- inputs --------------------------------------------------------------------------

    def add_arrival(self, r: Req) -> None:
        self.pending.append(r)

    def enqueue(self, r: Req, front: bool = False) -> None:
        (self.waiting.appendleft if front else self.waiting.append)(r)
        self.w_wait += r.w

    @property
    def outstanding(self) -> float:
        """Weighted requests queued or in flight (for routing)."""
        pend = sum(r.w for r in self.pending)
        return self.w_wait + self.w_pre + self.w_dec + pend

    @property
    def kv_used(self) -> float:
        return self.a_sum + self.w_dec * self.G + self.kv_pre

    def take_stats(self) -> ReplicaStats:
        out, self.stats = self.stats, ReplicaStats()
        return out

    # --- eviction ------------------------------------------------------------------------

    def evict_waiting(self) -> list[Req]:
        """Give back requests not yet admitted (the replica stops taking work)."""
        out = list(self.pending) + list(self.waiting)
        self.pending.clear()
        self.waiting.clear()
        self.w_wait = 0.0
        return out

    def evict_all(self) -> list[Req]:
        """Everything queued or in flight; in-flight ones must recompute elsewhere."""
        out = self.evict_waiting()
        for r in self.prefill:
            out.append(r)
        for _, q, r in self.heap:
            if r.alive and r.hseq == q:
                r.alive = False
                r.gen = r.gen0 + (self.G - r.g0)
                out.append(r)
        self.prefill.clear()
        self.heap.clear()
        self.order.clear()
        self.w_dec = self.a_sum = self.w_pre = self.kv_pre = 0.0
        self.kv_full = 0.0
        for r in out:
            r.pre_left = 0.0
        return out

    @property
    def empty(self) -> bool:
        return not (self.pending or self.waiting or self.prefill or self.w_dec > 0)

    # --- the loop ------------------------------------------------------------------------

    def run_until(self, t_end: float) -> None:
        """Advance the engine to ``t_end``."""
        while self.now < t_end:
            self._take_arrivals()
            if self.feeder is not None and self.w_wait < self.s.max_seqs:
                self.feeder(self)
            self._admit()
            if not self.prefill and self.w_dec <= 0:
                if self.waiting:       # nothing runs yet the head cannot fit: too long
                    self._drop(self.waiting.popleft(), "too_long")
                    continue
                nxt = self.pending[0].arrival if self.pending else t_end
                self._account(min(nxt, t_end) - self.now, 0.0)
                self.now = min(max(nxt, self.now), t_end)
                continue
            self._make_room()
            backlog, head, release = self._backlog()
            if not self.s.chunked and backlog > 0.0:
                self._prefill_pass(backlog)
            else:
                self._mixed_segment(t_end, backlog, head, release)

    def _take_arrivals(self) -> None:
        while self.pending and self.pending[0].arrival <= self.now:
            r = self.pending.popleft()
            self.stats.arrived += r.w
            self.enqueue(r)

    def _admit(self) -> None:
        s = self.s
        budget = INF if s.chunked else float(s.max_tokens)
        while self.waiting:
            r = self.waiting[0]
            need = r.w * (r.inp + r.gen + 1)
            busy = self.w_dec + self.w_pre
            idle = busy <= 0
            if s.reserve_full:
                kv_now, need = self.kv_full, r.w * (r.inp + r.out)
            else:
                kv_now = self.kv_used
            if not idle and (busy + r.w > s.max_seqs or kv_now + need > s.kv_cap):
                return
            toks = self._prefill_tokens(r)
            if not s.chunked and self.prefill and toks > budget:
                return
            budget -= toks
            self.waiting.popleft()
            self._dequeued(r)
            r.pre_left = r.pre_tot = toks
            if r.first < 0:   # a recompute keeps its members' first tokens
                r.done_t = []
            r.pre_start = self.now
            self.prefill.append(r)
            self.w_pre += r.w
            self.kv_pre += r.w * (r.inp + r.gen + 1)
            if s.reserve_full:
                self.kv_full += r.w * (r.inp + r.out)

    def _prefill_tokens(self, r: Req) -> float:
        if r.gen == 0:  # a first prefill may hit the prefix cache; a recompute does not
            return r.w * max(1.0, r.inp * (1.0 - self.s.prefix_hit))
        return r.w * (r.inp + r.gen)

    def _make_room(self) -> None:
        """Preempt the newest decoding requests while the next pass would overflow KV."""
        while self.w_dec > 0 and self.kv_used + self.w_dec > self.s.kv_cap:
            victim = self._newest()
            if victim is None or victim.w >= self.w_dec:
                return  # one group alone: let it run (its weight is an approximation)
            self._stop_decoding(victim)
            victim.gen = victim.gen0 + (self.G - victim.g0)
            self.stats.preemptions += victim.w
            self._thrash_until = self.G + THRASH_PASSES
            self.enqueue(victim, front=True)

    def _newest(self) -> Req | None:
        while self.order and not _live(*self.order[-1]):
            self.order.pop()
        return self.order[-1][1] if self.order else None

    def _stop_decoding(self, r: Req) -> None:
        r.alive = False
        self.w_dec -= r.w
        self.a_sum -= r.w * (r.inp + r.gen0 - r.g0)
        if self.w_dec <= 1e-9:
            self.w_dec = 0.0
            self.a_sum = 0.0

    def _factor(self) -> float:
        """World effects on this pass: straggler/throttle, KV thrash cliff, noise."""
        s = self.s
        f = s.slow
        if self._thrash_until > self.G and self.kv_used > s.cliff_usage * s.kv_cap:
            f *= s.cliff_factor
        if s.noise_sigma > 0:
            if self._ni >= self._noise.size:
                self._noise = np.exp(s.noise_sigma * self.rng.standard_normal(512))
                self._ni = 0
            f *= float(self._noise[self._ni])
            self._ni += 1
        return f

    def _backlog(self) -> tuple[float, float, float]:
        """Prefill work that can run now: (released tokens not yet computed, those of the
        first group that has some, when the next member arrives)."""
        backlog = head = 0.0
        release = INF
        for r in self.prefill:
            avail = r.released(self.now) - (r.pre_tot - r.pre_left)
            if avail > 1e-6:
                backlog += avail
                head = head or avail
            if r.paced:
                release = min(release, r.next_release(self.now))
        return backlog, head, release

    def _mixed_segment(self, t_end: float, backlog: float, head: float,
                       release: float) -> None:
        """Passes of all decoding sequences plus a prefill chunk (chunked prefill only),
        until the next event."""
        s = self.s
        b = self.w_dec
        ctx = (self.a_sum + b * self.G) / b if b > 0 else 0.0
        p = p_ctx = 0.0
        k_pre = INF
        chunk = max(s.max_tokens - b, 64.0)
        if s.chunked and backlog > 0.0:
            p = min(chunk, backlog)
            k_pre = math.ceil(head / p - 1e-9)
            p_ctx = 0.5 * self.prefill[0].inp
        if p >= chunk:
            release = INF  # compute-bound: members arriving meanwhile only queue
        if b <= 0 and p <= 0:  # idle until the next member (or request) arrives
            nxt = min(release, t_end, self.pending[0].arrival if self.pending else INF)
            self._account(nxt - self.now, 0.0)
            self.now = max(nxt, self.now)
            return
        t = step_time(s.coef, b, ctx, p, p_ctx) * self._factor()
        k = k_pre
        if b > 0:
            k = min(k, self._k_decode(), self._k_kv())
        k = min(k, self._k_time(t, min(t_end, release)))
        k = max(1, int(k))
        self._advance(k, t, b, p)
        if p > 0:
            self._consume_prefill(k * p, self.now - k * t, t, p)
        self._finish_decodes()

    def _k_decode(self) -> float:
        while self.heap and not _live(self.heap[0][1], self.heap[0][2]):
            heapq.heappop(self.heap)
        return self.heap[0][0] - self.G if self.heap else INF

    def _k_kv(self) -> float:
        room = self.s.kv_cap - self.kv_used
        return max(1.0, math.floor(room / self.w_dec)) if self.w_dec > 0 else INF

    def _k_time(self, t: float, t_end: float) -> float:
        """Passes until ``t_end``, the next arrival or a feeder top-up."""
        nxt = t_end
        if self.pending and not self.waiting:
            nxt = min(nxt, self.pending[0].arrival)
        if self.feeder is not None:
            nxt = min(nxt, self.now + 30.0)  # let a feeder top the queue up
        return max(1.0, math.ceil((nxt - self.now) / t)) if t > 0 else 1.0

    def _advance(self, k: int, t: float, b: float, p: float) -> None:
        dt = k * t
        st = self.stats
        self._account(dt, b)
        gen = k * b
        st.gen_tokens += gen
        if self.deadline < INF:
            share = min(max((self.deadline - self.now) / dt, 0.0), 1.0) if dt > 0 else 1.0
            st.gen_by += gen * share
        st.prompt_tokens += k * p
        self.now += dt
        self.G += k

    def _account(self, dt: float, b: float) -> None:
        if dt <= 0:
            return
        st = self.stats
        st.span += dt
        st.busy_run += dt * (b + self.w_pre)
        st.busy_wait += dt * self.w_wait
        st.busy_kv += dt * min(self.kv_used / self.s.kv_cap, 1.0) if self.s.kv_cap > 0 else 0.0

    def _prefill_pass(self, backlog: float) -> None:
        """Without chunked prefill: one pass over the arrived prompts; decodes stall."""
        p = backlog
        p_ctx = 0.5 * sum(r.inp for r in self.prefill) / len(self.prefill)
        t = step_time(self.s.coef, 0.0, 0.0, p, p_ctx) * self._factor()
        self._account(t, self.w_dec)
        self.stats.prompt_tokens += p
        self.now += t
        self._consume_prefill(p, self.now - t, t, p)

    def _consume_prefill(self, tokens: float, t0: float, t: float, p: float) -> None:
        """Spend ``tokens`` of prefill, begun at ``t0`` in passes of ``t`` s and ``p``
        tokens, on the groups in arrival order, each up to what had arrived by ``t0``."""
        pos = 0.0
        finished: list[Req] = []
        for r in self.prefill:
            if tokens - pos <= 1e-9:
                break
            if finished:  # the group before it is done: it heads the queue from now
                r.pre_start = max(r.pre_start, self.now)
            done = r.pre_tot - r.pre_left
            used = min(tokens - pos, r.released(t0) - done)
            if used <= 1e-9:
                continue
            if r.paced:
                self._time_members(r, done, done + used, pos, t0, t, p)
            r.pre_left -= used
            pos += used
            if r.pre_left <= 1e-6:
                finished.append(r)
        if not finished:
            return
        gone = {id(r) for r in finished}
        self.prefill = deque(r for r in self.prefill if id(r) not in gone)
        if self.prefill:
            self.prefill[0].pre_start = max(self.prefill[0].pre_start, self.now)
        for r in finished:
            self.w_pre -= r.w
            self.kv_pre -= r.w * (r.inp + r.gen + 1)
        if self.w_pre <= 1e-9:
            self.w_pre = self.kv_pre = 0.0
        for r in finished:
            self._start_decode(r)

    @staticmethod
    def _time_members(r: Req, c0: float, c1: float, pos: float, t0: float, t: float,
                      p: float) -> None:
        """First-token times of the members whose prompt ends between ``c0`` and ``c1``
        of the group's prefill: the end of the pass that computes a member's last token."""
        while len(r.done_t) < r.n and r.cum[len(r.done_t)] * r.pre_tot <= c1 + 1e-6:
            # its last token's place in this segment's prefill
            q = pos + r.cum[len(r.done_t)] * r.pre_tot - c0
            r.done_t.append(t0 + max(1, math.ceil(q / p - 1e-9)) * t)

    def _start_decode(self, r: Req) -> None:
        """A prefill ends with the request's next token; decode the rest."""
        st = self.stats
        if r.first < 0:
            if r.n > 1:
                # members' first tokens, each less its own arrival offset; ``first`` is
                # their mean (``_complete`` reports each member)
                if r.offs is not None:
                    r.done_t = [d - o for d, o in zip(r.done_t, r.offs, strict=True)]
                r.first = sum(r.done_t) / r.n
            else:
                # a group with no spread (a batch feed's backlog, a saturating burst)
                # keeps the older rule: a member's first token comes after 1/w of the
                # group's prefill time, not after all of it
                r.first = r.pre_start + (self.now - r.pre_start) / max(r.w, 1.0)
            # each member decodes right after its own prefill, so the rest of the group's
            # prefill is not time between its tokens
            r.lag = self.now - r.first
        r.gen += 1
        st.gen_tokens += r.w
        if self.now <= self.deadline:
            st.gen_by += r.w
        if r.gen >= r.out:
            self._complete(r)
            return
        r.gen0 = r.gen
        r.g0 = self.G
        r.alive = True
        self.w_dec += r.w
        self.a_sum += r.w * (r.inp + r.gen0 - r.g0)
        self.seq += 1
        r.hseq = self.seq
        heapq.heappush(self.heap, (self.G + r.out - r.gen0, self.seq, r))
        self.order.append((self.seq, r))
        if len(self.order) > 64 and len(self.order) > 4 * len(self.heap):
            self.order = [x for x in self.order if _live(*x)]

    def _finish_decodes(self) -> None:
        while self.heap and self.heap[0][0] <= self.G:
            _, q, r = heapq.heappop(self.heap)
            if not _live(q, r):
                continue
            self._stop_decoding(r)
            r.gen = r.out
            self._complete(r)

    def _complete(self, r: Req) -> None:
        if self.s.reserve_full:
            self.kv_full = max(self.kv_full - r.w * (r.inp + r.out), 0.0)
        extra = r.net + self.s.ttft_overhead - r.arrival
        tpot = (self.now - r.first - r.lag) / (r.out - 1) if r.out > 1 else 0.0
        if r.n > 1 and len(r.done_t) == r.n:   # a spread group: each member's own TTFT
            w = r.w / r.n
            self.stats.done.extend(Completion(r.job, w, d + extra, tpot, r.out, self.now)
                                   for d in r.done_t)
        else:
            self.stats.done.append(Completion(r.job, r.w, r.first + extra, tpot, r.out,
                                              self.now))

    def _drop(self, r: Req, reason: str) -> None:
        self._dequeued(r)
        self.stats.dropped.append((r, reason))

    def _dequeued(self, r: Req) -> None:
        """``r`` has left the waiting queue: its weight leaves ``w_wait``, which is exactly
        0 once the queue is empty (not the sum's rounding error, ~-1e-14)."""
        self.w_wait = self.w_wait - r.w if self.waiting else 0.0


def _live(q: int, r: Req) -> bool:
    """A heap/order entry is current only while its request decodes under that id."""
    return r.alive and r.hseq == q
