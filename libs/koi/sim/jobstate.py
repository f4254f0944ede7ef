"""Per-job bookkeeping of a simulated run: request accounting, queues, batch feeding.

``JobState`` counts every request of a job (weighted): offered, served (with SLO hits),
dropped with a reason, and still queued; it holds the queue of online requests that have
no replica yet, and feeds a batch job's backlog to its replicas as fast as they absorb
it. No routing across replicas, no fleet logic, no ``koi.predictor`` imports.
"""

from __future__ import annotations

from collections import deque
from functools import partial

import numpy as np

from koi.jobs import BatchJob, JobSpec, OnlineJob
from koi.records import JobOutcome
from koi.sim.replica import Completion, Replica, ReplicaSpec, Req

QUEUE_TIMEOUT_S = 60.0   # an online request with no replica waits this long, then drops
BATCH_GROUPS = 8         # a batch replica's batch is fed as ~this many request groups


class JobState:
    """Accounting and queues of one job."""

    def __init__(self, idx: int, spec: JobSpec, rng: np.random.Generator) -> None:
        self.idx = idx
        self.spec = spec
        self.rng = rng
        self.admitted = False
        self.rejected = False
        self.reason = ""
        self.queue: deque[Req] = deque()      # online: no replica yet; batch: returned work
        self.offered = self.offered_tokens = 0.0
        self.served = self.served_tokens = self.good_tokens = 0.0
        self.ttft_met = self.tpot_met = 0.0
        self.dropped: dict[str, float] = {}
        self.in_flight = 0.0                  # weighted requests on replicas
        self.arrived_tick = 0.0
        # moves' cost (koi.churn): weighted requests disrupted, and of those dropped;
        # [from, to) s: a relaunch left the job no replica (Simulator.relaunched)
        self.disrupted = self.dropped_by_move = 0.0
        self.move_gap = (0.0, 0.0)
        # batch
        self.issued = 0.0
        self.tokens_processed = self.tokens_by_deadline = 0.0
        self._lens: tuple[np.ndarray, np.ndarray] | None = None
        self._li = 0
        self._phase = -1.0                    # systematic thinning's carry (-1: not drawn)

    @property
    def is_batch(self) -> bool:
        return isinstance(self.spec, BatchJob)

    # --- online --------------------------------------------------------------------------

    def arrivals(self, t0: float, t1: float, fraction: float) -> list[Req]:
        """This window's requests, thinned to ``fraction`` (each weighted 1/fraction).

        Thinning is systematic: one request in every 1/fraction is kept, counting on
        across windows from a random start, so the kept request stands for itself and the
        ones after it up to the next kept one. (Keeping each request with probability f
        instead makes the weighted count over-dispersed by a factor 1/f: a burstier load
        than the job's.)
        """
        spec = self.spec
        assert isinstance(spec, OnlineJob)
        times, ins, outs = spec.sample_requests(self.rng, t0, t1)
        prompts: list[list[int]] = []
        if fraction < 1.0 and times.size:
            if self._phase < 0.0:
                self._phase = float(self.rng.random())
            c = self._phase + fraction * np.arange(1, times.size + 1)
            keep = np.floor(c) > np.floor(c - fraction)   # the count passed a whole number
            self._phase = float(c[-1] % 1.0)
            prompts = _groups(ins, keep, round(1.0 / fraction))
            outs = _group_means(outs, keep)
            times = times[keep]
            ins = np.array([round(sum(m) / len(m)) for m in prompts], dtype=np.int64)
        w = 1.0 / fraction
        reqs = [Req(self.idx, float(t), int(i), int(o), w, 0.0)
                for t, i, o in zip(times.tolist(), ins.tolist(), outs.tolist(), strict=True)]
        if prompts:
            for r, m in zip(reqs, prompts, strict=True):
                if len(m) > 1:
                    r.members(m)
        self.offered += w * len(reqs)
        self.offered_tokens += w * float(outs.sum())
        self.arrived_tick = w * len(reqs)
        return reqs

    def expire(self, now: float) -> None:
        """Drop online requests that waited for a replica longer than the timeout."""
        if self.is_batch:
            return
        while self.queue and self.queue[0].arrival + QUEUE_TIMEOUT_S <= now:
            self.drop(self.queue.popleft(), "no_capacity")

    def drop(self, r: Req, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0.0) + r.w
        if r.moved:
            self.dropped_by_move += r.w

    def disrupt(self, r: Req) -> None:
        """Count ``r`` as disrupted by a move (once, however many moves it meets)."""
        if not r.moved:
            r.moved = True
            self.disrupted += r.w

    # --- completions ---------------------------------------------------------------------

    def complete(self, c: Completion) -> None:
        self.served += c.w
        self.served_tokens += c.w * c.out
        if isinstance(self.spec, OnlineJob):
            ok_ttft = c.ttft <= self.spec.slo.ttft_ms / 1e3
            ok_tpot = c.tpot <= self.spec.slo.tpot_ms / 1e3
            self.ttft_met += c.w * ok_ttft
            self.tpot_met += c.w * ok_tpot
            if ok_ttft and ok_tpot:
                self.good_tokens += c.w * c.out

    # --- batch feeding -------------------------------------------------------------------

    @property
    def batch_requests_done(self) -> float:
        """Batch: requests completed or dropped (a dropped batch request is not
        retried); 0 for online jobs."""
        return self.served + sum(self.dropped.values()) if self.is_batch else 0.0

    @property
    def batch_left(self) -> float:
        spec = self.spec
        return spec.num_requests - self.issued if isinstance(spec, BatchJob) else 0.0

    def feed(self, rep: Replica) -> None:
        """Top the replica's queue up to about one batch of work from the backlog."""
        spec = self.spec
        assert isinstance(spec, BatchJob)
        target = rep.s.max_seqs
        while rep.w_wait < target:
            if self.queue:
                r = self.queue.popleft()
                # a request not yet started arrives at this engine now; one whose first
                # token came on an evicted replica keeps its arrival (else its TTFT, first
                # token - arrival, comes out negative: hetero-3h over HTTP, ticks 36-37)
                if r.first < 0:
                    r.arrival = rep.now
            else:
                left = spec.num_requests - self.issued
                if left <= 1e-9:
                    return
                inp, out = self._peek_lens()
                w = min(batch_group(rep.s, inp, out), left)
                inp, out = self._take_lens(w)
                self.issued += w
                r = Req(self.idx, rep.now, inp, out, w, 0.0)
            rep.enqueue(r)

    def _peek_lens(self) -> tuple[int, int]:
        """The next request's (input, output) lengths, not consumed."""
        self._refill()
        assert self._lens is not None
        return int(self._lens[0][self._li]), int(self._lens[1][self._li])

    def _take_lens(self, w: float) -> tuple[int, int]:
        """A group of ``w`` requests: the mean (input, output) lengths of the next ``w``
        draws, consumed. The group stands for those requests, so a job's requests sum to
        the same tokens however its replicas cut them into groups (one draw × ``w``, as
        before, made the realised total depend on the group sizes — on the policy)."""
        k = n = max(round(w), 1)
        ins, outs = 0, 0
        while n > 0:
            self._refill()
            assert self._lens is not None
            take = min(n, self._lens[0].size - self._li)
            ins += int(self._lens[0][self._li:self._li + take].sum())
            outs += int(self._lens[1][self._li:self._li + take].sum())
            self._li += take
            n -= take
        return max(round(ins / k), 1), max(round(outs / k), 1)

    def _refill(self) -> None:
        spec = self.spec
        if self._lens is None or self._li >= self._lens[0].size:
            self._lens = (spec.input_len.sample(self.rng, 1024),
                          spec.output_len.sample(self.rng, 1024))
            self._li = 0

    # --- the record ----------------------------------------------------------------------

    def outcome(self, horizon_s: float, queued_reqs: float) -> JobOutcome:
        spec = self.spec
        record = partial(JobOutcome, job_id=spec.id, kind=spec.kind, model=spec.model,
                         submitted=spec.submit_s < horizon_s, admitted=self.admitted,
                         rejected=self.rejected, reason=self.reason)
        if isinstance(spec, BatchJob):
            return record(served_requests=self.served,
                          served_output_tokens=self.served_tokens,
                          queued_at_end=spec.num_requests - self.served,
                          disrupted_requests=self.disrupted,
                          tokens_requested=float(spec.total_output_tokens),
                          tokens_by_deadline=self.tokens_by_deadline,
                          tokens_processed=self.tokens_processed)
        return record(offered_requests=self.offered,
                      offered_output_tokens=self.offered_tokens,
                      served_requests=self.served,
                      dropped_requests=sum(self.dropped.values()),
                      ttft_met_requests=self.ttft_met, tpot_met_requests=self.tpot_met,
                      good_output_tokens=self.good_tokens,
                      served_output_tokens=self.served_tokens,
                      queued_at_end=queued_reqs, disrupted_requests=self.disrupted,
                      dropped_by_move=self.dropped_by_move)


def batch_group(spec: ReplicaSpec, inp: int, out: int) -> float:
    """Requests per group a batch backlog is fed to a replica in.

    Batch requests have no SLO to sample, so they travel in groups sized to keep
    ~BATCH_GROUPS groups per replica batch (fewer simulated events, same load).
    """
    by_seqs = spec.max_seqs / BATCH_GROUPS
    by_kv = spec.kv_cap / BATCH_GROUPS / (inp + out)
    return float(max(1, int(min(by_seqs, by_kv))))


def _group_means(lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Each kept request's length as the mean over the requests it stands for (``_groups``,
    the window's last group only its own window's): the group's work then varies as the
    sum of its members' would, not ``w`` times one member's."""
    return np.array([max(round(sum(m) / len(m)), 1) for m in _groups(lengths, keep, 1)],
                    dtype=lengths.dtype)


def _groups(lengths: np.ndarray, keep: np.ndarray, size: int) -> list[list[int]]:
    """The lengths of the requests each kept one stands for (itself and those up to the
    next kept one; requests before the first kept one belong to the previous window's
    group), at least ``size`` of them: the window's last group, cut short by the window's
    end, repeats its own members to make up the number."""
    idx = np.flatnonzero(keep)
    if not idx.size:  # a window none of whose requests is kept (few, at a small fraction)
        return []
    out = []
    for a, b in zip(idx.tolist(), [*idx[1:].tolist(), lengths.size], strict=True):
        m = lengths[a:b].tolist()
        out.append([m[i % len(m)] for i in range(max(size, 1))] if len(m) < size else m)
    return out
