"""Job admission, the placer's ``koi.jobs.submit.<user>`` responder: answers that tell the
truth under load.

* **A rate limit per user.** The subject's last token names the submitter (its NATS user
  may publish on no other's); each has a token bucket (``koi.jobs.rate_limit``,
  ``KOI_SUBMIT_RATE_PER_S`` and ``KOI_SUBMIT_BURST``), one budget across replicas: each
  tells the others on ``koi.placer.spent`` what it admitted, every 50 ms, and takes the
  same tokens from its own buckets (what can get past: that module's doc). An empty
  bucket is answered at once ``busy (rate limit …), retry after N ms``, N the time until
  its next token, before anything is decoded or stored; one ``overload`` event when a
  user starts being limited, a count every minute while it lasts, one when it ends
  (``koi.fold``).

* **Bounded queue, explicit busy.** A submission is queued (the NATS callback does
  nothing else but the rate check); when this replica already holds more than
  ``MAX_WAIT_S`` of work (at its measured rate), it answers at once ``busy, retry after
  N ms`` (``JobAck.retry_after_ms``) instead of letting the sender time out while the job is
  admitted anyway.
* **Batches.** One worker takes everything queued (up to ``BATCH_MAX``), decides each
  submission in memory, publishes the accepted ones to ``koi.jobs.accepted.<id>``
  together (their JetStream acks awaited together, not one round trip each), answers,
  and emits the batch's events while the next batch is stored.
* **Idempotent by job id, across replicas.** Each store carries ``Nats-Msg-Id job-<id>``
  and ``Nats-Expected-Last-Subject-Sequence: 0``, so the stream keeps at most one
  message per job subject, whatever the timing and however old the first one is, and
  its refusal says someone was first: the stored message (its headers name the job, its
  spec digest and tick) is then read to answer. The same spec again → ``accepted`` with
  ``duplicate=true`` and the first answer's tick; another spec under a taken id →
  refused, naming the job that holds it. A bounded map of the subjects this replica has
  stored or read answers retries without a round trip. (It is not fed from the stream:
  an ordered consumer on ``koi.jobs.accepted.>``, even headers only, cost 140 µs of CPU
  per stored job in each replica, more than the admission itself.)
* **The sender's deadline.** A submission carries its sender's remaining budget
  (``Koi-Deadline-Ms``, ``koi.jobs.intake``), stamped on receipt with this replica's
  monotonic clock, and planned for half of it (``ANSWER_SHARE``; no budget:
  ``MAX_AGE_S``). One whose budget cannot cover the queue
  ahead of it and a store is answered busy at once; one whose budget runs out while
  queued is answered busy, not stored: nothing is stored for a sender that will have
  stopped listening, and the busy answer comes before its deadline.
* An undecodable submission is answered, dead-lettered (``koi.dlq.placer``) and reported.

No placement here; the placer's ``main`` wires this in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import structlog
from nats.js import api

from koi import subjects
from koi.cluster import ClusterSnapshot
from koi.errors import InvalidSpecError
from koi.jobs import JobSpec
from koi.jobs.bounds import MAX_ID_LEN
from koi.jobs.intake import budget_s, late_by
from koi.jobs.rate_limit import SHARE_EVERY_S, Limited, RateLimit, SubmitterLimits
from koi.safe_text import printable
from koi.v1 import jobs_pb2
from koi.wire import codec
from koi.wire.jobs import job_from_proto
from koi.wire.planning import make_event
from services.placer.pipeline import Pipeline, Stored
from services.runtime.app import ServiceContext

log = structlog.get_logger(__name__)

MAX_WAIT_S = 0.15       # queue at most this much work (at the measured rate), then shed
MAX_AGE_S = 1.0         # without a deadline header, a submission queued longer is answered
                        # busy, not admitted: its sender may have given up
QUEUE_MIN = 256         # ... but never less than this many submissions
QUEUE_MAX = 8192        # ... nor more
BATCH_MAX = 512         # submissions decided and stored together
STORE_TIMEOUT_S = 2.0   # a store not confirmed by then is answered busy (a retry tells)
RETRY_MIN_MS, RETRY_MAX_MS = 50, 5000
HELD_MAX = 100_000      # taken subjects remembered per replica (about 200 bytes each)
OVERLOAD_EVENT_EVERY_S = 10.0   # at most one overload event per replica per this
LIMITS_FOLD_EVERY_S = 1.0       # how often a rate-limited spell is checked for its end
_INITIAL_RATE = 1000.0          # submissions/s assumed before the first batch is timed
_INITIAL_STORE_S = 0.01         # a batch's store round trip assumed before one is timed
_ERR_WRONG_LAST_SEQUENCE = 10071  # the subject holds a message already
HEADER_JOB_ID = "Koi-Job-Id"
HEADER_DIGEST = "Koi-Spec-Digest"
HEADER_TICK = "Koi-Admitted-Tick"


def spec_digest(spec: jobs_pb2.JobSpec) -> str:
    """Equal for equal specs, however the sender's encoder ordered the bytes."""
    return hashlib.blake2b(spec.SerializeToString(deterministic=True),
                           digest_size=16).hexdigest()


@dataclass(frozen=True)
class Held:
    """A job subject that is taken: by which job id, with which spec, since which tick
    (-1: stored without Koi's headers, e.g. a scenario job the sim published)."""
    job_id: str
    digest: str
    tick: int


@dataclass
class Pending:
    msg: Any
    data: bytes
    job: JobSpec
    digest: str
    subject: str


def held_answer(job_id: str, digest: str, held: Held) -> jobs_pb2.JobAck:
    """The answer to a submission whose subject is taken: the first answer again when
    it is the same job and spec, else a refusal that says who holds the id and why."""
    if not held.job_id:
        return jobs_pb2.JobAck(accepted=False, job_id=job_id, field="id",
                               reason=f"a job is already stored under "
                                      f"{subjects.job_accepted_subject(job_id)} (unreadable); "
                                      "choose another id")
    if held.job_id == job_id and held.digest == digest:
        return jobs_pb2.JobAck(accepted=True, job_id=job_id, duplicate=True,
                               tick=max(held.tick, 0))
    since = f" at tick {held.tick}" if held.tick >= 0 else ""
    if held.job_id != job_id:
        reason = (f"job id {job_id!r} is taken: job {held.job_id!r} was admitted{since} "
                  f"and is stored under the same name ({subjects.job_accepted_subject(job_id)}"
                  "; '.' and '_' are the same character there); choose another id")
    else:
        reason = (f"a job with id {job_id!r} was already admitted{since} with a different "
                  "spec; submit this one under another id (the same spec again would be "
                  "answered accepted)")
    return jobs_pb2.JobAck(accepted=False, job_id=job_id, field="id", reason=reason,
                           tick=max(held.tick, 0))


def held_from(headers: dict[str, str] | None, data: bytes | None = None) -> Held | None:
    """What a stored ``koi.jobs.accepted.<id>`` message says about its job: from Koi's
    headers, else (given the payload) from the spec itself; None if neither says."""
    h = headers or {}
    if HEADER_JOB_ID in h and HEADER_DIGEST in h:
        with contextlib.suppress(ValueError):
            return Held(h[HEADER_JOB_ID], h[HEADER_DIGEST], int(h.get(HEADER_TICK, "-1")))
    if data is None:
        return None
    try:
        spec = jobs_pb2.JobSpec.FromString(data)
    except Exception:
        return None
    return Held(spec.id, spec_digest(spec), -1)


class Admission:
    """One placer replica's admission: queue, worker, the map of stored ids."""

    def __init__(self, ctx: ServiceContext, name: str = "placer") -> None:
        self.ctx = ctx
        self.name = name
        self.queue: asyncio.Queue[Any] = asyncio.Queue(QUEUE_MAX)
        self.held: OrderedDict[str, Held] = OrderedDict()  # job subject → who holds it
        self.fleet: frozenset[str] = frozenset()  # job ids in the latest snapshot
        self.tick, self.time_s = 0, 0.0
        self.rate = _INITIAL_RATE               # submissions/s this worker decides
        self.store_s = _INITIAL_STORE_S         # a batch's store round trip (moving average)
        self.sub: Any = None                    # the koi.jobs.submit.* subscription
        self.limits = SubmitterLimits(RateLimit(ctx.settings.submit_rate_per_s,
                                                ctx.settings.submit_burst))
        self._limit_events = 0
        self.replica = secrets.token_hex(6)     # names this replica's koi.placer.spent
        self._share: asyncio.Task | None = None
        self._spent_sub: Any = None
        self._watch: asyncio.Task | None = None
        self.shed, self._reported_at = 0, float("-inf")
        self._overload_n = 0
        self._events: asyncio.Task | None = None
        self.pipeline = Pipeline(ctx.bus.nc)

    # --- intake ------------------------------------------------------------------------
    def see(self, snapshot: ClusterSnapshot) -> None:
        """The latest snapshot: its tick and clock stamp acks and events; its jobs'
        ids are taken (a scenario job may not be on the accepted stream yet)."""
        self.tick, self.time_s = snapshot.tick, snapshot.time_s
        self.fleet = frozenset(j.id for j in snapshot.jobs)

    def backlog(self) -> int:
        """Submissions waiting here, including those the client library still holds."""
        return self.queue.qsize() + (self.sub.pending_msgs if self.sub is not None else 0)

    def limit(self) -> int:
        return int(min(QUEUE_MAX, max(QUEUE_MIN, self.rate * MAX_WAIT_S)))

    def retry_after_ms(self) -> int:
        wait_ms = 1000.0 * self.backlog() / max(self.rate, 1.0)
        return int(min(RETRY_MAX_MS, max(RETRY_MIN_MS, wait_ms)))

    def expected_s(self) -> float:
        """How long a submission queued now waits for its answer: the queue ahead of it
        at the measured rate, and a store."""
        return self.backlog() / max(self.rate, 1.0) + self.store_s

    async def on_submit(self, msg: Any) -> None:
        now = time.monotonic()
        try:
            user = subjects.submitter_of(msg.subject)
        except ValueError:  # only a server without accounts lets such a subject through
            await self.respond(msg, jobs_pb2.JobAck(
                accepted=False, tick=self.tick, reason="submit on koi.jobs.submit.<user>, "
                "<user> one token of letters, digits, '_' and '-'; nothing was stored"))
            return
        wait_s = self.limits.wait_s(user, now)
        if wait_s > 0:  # the user's own budget is spent: nothing decoded, nothing stored
            await self.respond(msg, self.rate_limited(user, wait_s))
            self.report_limited(self.limits.refused(user, now))
            return
        deadline = now + budget_s((msg.headers or {}).get(subjects.HEADER_DEADLINE_MS),
                                  MAX_AGE_S)
        why = "admission queue full"
        if late_by(now, deadline, self.expected_s()) > 0:
            why = f"cannot be stored within your deadline ({1e3 * (deadline - now):.0f} ms)"
        elif self.backlog() < self.limit():
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait((msg, deadline))
                self.limits.take(user, now)  # a token is spent only on what is queued
                return
        await self.respond(msg, self.busy(why))
        self.shed += 1

    def rate_limited(self, user: str, wait_s: float) -> jobs_pb2.JobAck:
        after = max(1, math.ceil(wait_s * 1000))  # the time until the user's next token
        return jobs_pb2.JobAck(
            accepted=False, retry_after_ms=after, tick=self.tick,
            reason=f"busy (rate limit: user {user!r} may submit "
                   f"{self.limits.limit.describe()}); nothing was stored: retry the same "
                   f"spec after {after} ms")

    def busy(self, why: str, job_id: str = "") -> jobs_pb2.JobAck:
        after = self.retry_after_ms()
        return jobs_pb2.JobAck(accepted=False, retry_after_ms=after, tick=self.tick,
                               job_id=job_id,
                               reason=f"busy ({why}); nothing was stored: retry the same "
                                      f"spec after {after} ms")

    async def respond(self, msg: Any, ack: jobs_pb2.JobAck) -> None:
        if msg.reply:
            with contextlib.suppress(Exception):  # the sender may be gone: nothing to tell
                await msg.respond(ack.SerializeToString())

    # --- the worker --------------------------------------------------------------------
    async def work(self) -> None:
        """Decide queued submissions batch by batch until cancelled."""
        while True:
            queued = [await self.queue.get()]
            while len(queued) < BATCH_MAX and not self.queue.empty():
                queued.append(self.queue.get_nowait())
            started, now = time.perf_counter(), time.monotonic()
            batch = []
            for msg, deadline in queued:  # stored only if the answer can beat the deadline
                if late_by(now, deadline, self.store_s) > 0:
                    await self.respond(msg, self.busy("your deadline ran out while queued"))
                    self.shed += 1
                else:
                    batch.append(msg)
            try:
                await self.admit_batch(batch)
            except Exception:  # a batch that fails must not end admission, nor go unanswered
                log.exception("admission_batch_failed", size=len(batch))
                for msg in batch:
                    await self.respond(msg, self.busy("admission failed; see the placer log"))
            took = max(time.perf_counter() - started, 1e-6)
            self.rate = 0.8 * self.rate + 0.2 * (len(queued) / took)
            self.report_overload()

    async def admit_batch(self, batch: list[Any]) -> None:
        later: list[Any] = []
        while batch:
            answers, pending, effects = self.decide_all(batch, later)
            stored = await self.store_all(pending)
            admitted = []
            for p, ack in zip(pending, stored, strict=True):
                answers.append((p.msg, ack))
                if ack.accepted and not ack.duplicate:
                    admitted.append(p.job)
            for msg, ack in answers:
                await self.respond(msg, ack)
            await self.emit_later(effects, admitted)
            batch, later = later, []

    def decide_all(self, batch: list[Any], later: list[Any]
                   ) -> tuple[list[tuple[Any, jobs_pb2.JobAck]], list[Pending],
                              list[Awaitable[Any]]]:
        """Answers decided in memory, stores to make, events to emit; a second
        submission of a subject already pending in this round waits for the next."""
        answers: list[tuple[Any, jobs_pb2.JobAck]] = []
        pending: dict[str, Pending] = {}
        effects: list[Awaitable[Any]] = []
        for msg in batch:
            outcome = self.decide(msg, effects)
            if isinstance(outcome, Pending):
                if outcome.subject in pending:
                    later.append(msg)
                else:
                    pending[outcome.subject] = outcome
            else:
                answers.append((msg, outcome))
        return answers, list(pending.values()), effects

    def decide(self, msg: Any, effects: list[Awaitable[Any]]) -> jobs_pb2.JobAck | Pending:
        data, tick = msg.data, self.tick
        try:
            spec = codec.decode(data, jobs_pb2.JobSpec)
        except Exception as exc:
            reason = f"undecodable JobSpec: {exc}"
            letter = hashlib.blake2b(data, digest_size=12).hexdigest()  # one per payload
            effects.append(self.ctx.bus.dead_letter(
                self.name, msg.subject, data, reason, tick=tick,
                msg_id=f"dlq.{self.name}.submit-{letter}"))
            return jobs_pb2.JobAck(accepted=False, reason=reason, tick=tick)
        try:
            with codec.bounded_errors():    # the reason is one bounded line, never the input
                job = job_from_proto(spec, catalog=self.ctx.catalog)
            subject = subjects.job_accepted_subject(job.id)
        except (InvalidSpecError, ValueError) as exc:
            field = str(getattr(exc, "field", "") or "id")
            shown = printable(spec.id, MAX_ID_LEN)
            effects.append(self.ctx.event(
                kind="rejection", severity="warning", tick=tick, key=f"submit-{shown}",
                job_id=shown, scenario_time_s=self.time_s,
                message=f"rejected at submission: {exc}"))
            return jobs_pb2.JobAck(accepted=False, job_id=shown, reason=str(exc)[:512],
                                   field=field, tick=tick)
        digest = spec_digest(spec)
        held = self.held.get(subject)
        if held is not None and held.digest:  # else: taken, spec unknown; the store asks
            return held_answer(job.id, digest, held)
        if job.id in self.fleet:
            return jobs_pb2.JobAck(
                accepted=False, job_id=job.id, field="id", tick=tick,
                reason=f"a job with id {job.id!r} is already in the fleet (a scenario job, "
                       "not submitted here); choose another id")
        return Pending(msg, data, job, digest, subject)

    async def store_all(self, pending: list[Pending]) -> list[jobs_pb2.JobAck]:
        """Store the batch's jobs (at most once per subject, by the stream's own checks)
        with their acks awaited together, and say what happened to each."""
        futures = []
        for p in pending:
            futures.append(await self.pipeline.publish(p.subject, p.data, {
                api.Header.MSG_ID: f"job-{p.job.id}",
                api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0",
                HEADER_JOB_ID: p.job.id, HEADER_DIGEST: p.digest, HEADER_TICK: str(self.tick)}))
        started = time.monotonic()
        outcomes = await self.pipeline.settle(futures, STORE_TIMEOUT_S)
        if futures:
            self.store_s = 0.8 * self.store_s + 0.2 * (time.monotonic() - started)
        answers = [self.stored(p, o) for p, o in zip(pending, outcomes, strict=True)]
        conflicts = [i for i, a in enumerate(answers) if a is None]
        resolved = await asyncio.gather(*(self.resolve_conflict(pending[i]) for i in conflicts))
        for i, ack in zip(conflicts, resolved, strict=True):
            answers[i] = ack
        return [a for a in answers if a is not None]

    def stored(self, p: Pending, outcome: Stored | BaseException | None
               ) -> jobs_pb2.JobAck | None:
        """The answer for one store; None when the subject was taken (a conflict)."""
        if not isinstance(outcome, Stored):  # no ack in time, or not sent: a retry tells
            log.warning("job_store_unconfirmed", job_id=p.job.id,
                        error=repr(outcome) if outcome else f"no ack in {STORE_TIMEOUT_S} s")
            return self.busy(f"the store of {p.job.id!r} was not confirmed", p.job.id)
        if outcome.duplicate or outcome.err_code == _ERR_WRONG_LAST_SEQUENCE:
            return None
        if not outcome.ok:
            log.warning("job_store_refused", job_id=p.job.id, error=outcome.error)
            return jobs_pb2.JobAck(accepted=False, job_id=p.job.id, tick=self.tick,
                                   reason=f"the bus refused to store the job: "
                                          f"{outcome.error}")
        self.remember(p.subject, Held(p.job.id, p.digest, self.tick))
        return jobs_pb2.JobAck(accepted=True, job_id=p.job.id, tick=self.tick)

    async def resolve_conflict(self, p: Pending) -> jobs_pb2.JobAck:
        """Someone (another replica, a retry, the sim) stored this subject first: read
        what is there and answer as a retry would be answered."""
        try:
            raw = await self.ctx.bus.js.get_last_msg(subjects.STREAM_JOBS, p.subject)
            data = await self.ctx.bus.resolve(raw)
        except Exception as err:
            log.warning("job_lookup_failed", job_id=p.job.id, error=repr(err))
            return self.busy(f"{p.job.id!r} is stored already and could not be read",
                             p.job.id)
        held = held_from(raw.headers, data) or Held("", "", -1)
        if held.job_id and held.digest:
            self.remember(p.subject, held)
        return held_answer(p.job.id, p.digest, held)

    # --- the map of taken subjects ----------------------------------------------------------
    def remember(self, subject: str, held: Held) -> None:
        """Keep ``held`` for ``subject``, forgetting the oldest beyond ``HELD_MAX`` (a
        forgotten one costs a round trip to the stream, not a wrong answer)."""
        self.held[subject] = held
        self.held.move_to_end(subject)
        while len(self.held) > HELD_MAX:
            self.held.popitem(last=False)

    # --- events --------------------------------------------------------------------------
    async def admitted_events(self, jobs: list[JobSpec]) -> list[asyncio.Future[Stored]]:
        """One ``admission`` event per admitted job, sent without waiting for each one's
        ack (ids as ``ServiceContext.event`` makes them, ``<service>:<kind>:<tick>:<key>``,
        so a replayed admission is not announced twice)."""
        subject = subjects.event_subject("info", "admission")
        out = []
        for job in jobs:
            ev = make_event(kind="admission", severity="info", service=self.name,
                            tick=self.tick, job_id=job.id, scenario_time_s=self.time_s,
                            event_id=f"{self.name}:admission:{self.tick}:{job.id}",
                            wall_time_s=time.time(),
                            message=f"accepted {job.id} ({job.model}); it joins the plan "
                                    "at the next tick")
            out.append(await self.pipeline.publish(subject, ev.SerializeToString(),
                                                   {api.Header.MSG_ID: ev.event_id}))
        return out

    async def emit_later(self, effects: list[Awaitable[Any]], admitted: list[JobSpec]
                         ) -> None:
        """Emit a batch's events while the next batch is stored; at most one batch of
        events in flight, so a slow event stream slows admission instead of piling up."""
        if self._events is not None:
            await self._events
            self._events = None
        published = await self.admitted_events(admitted)
        if effects or published:
            self._events = asyncio.create_task(self._settle_events(effects, published))

    async def _settle_events(self, effects: list[Awaitable[Any]],
                             published: list[asyncio.Future[Stored]]) -> None:
        """Run the effects and wait for the events' acks; failures are logged (an event
        lost must not stop admission)."""
        results = await asyncio.gather(*effects, return_exceptions=True)
        outcomes = await self.pipeline.settle(published, STORE_TIMEOUT_S)
        lost = sum(1 for o in outcomes if not (isinstance(o, Stored) and o.ok))
        for result in results:
            if isinstance(result, Exception):
                log.warning("admission_effect_failed", error=repr(result))
        if lost:
            log.warning("admission_events_unconfirmed", events=lost)

    def report_overload(self) -> None:
        """The first shedding at once, then at most one event per period with a count."""
        now = time.monotonic()
        if not self.shed or now - self._reported_at < OVERLOAD_EVENT_EVERY_S:
            return
        shed, span = self.shed, min(now - self._reported_at, OVERLOAD_EVENT_EVERY_S)
        self.shed, self._reported_at, self._overload_n = 0, now, self._overload_n + 1
        log.warning("admission_shed", shed=shed, span_s=round(span, 1), rate=round(self.rate))
        self._fire(self.ctx.event(
            kind="overload", severity="warning", tick=self.tick, scenario_time_s=self.time_s,
            key=f"admission-{os.getpid()}-{self._overload_n}",
            message=(f"admission busy: answered {shed} submissions 'busy, retry later' in "
                     f"the last {span:.0f} s (queue limit {self.limit()}, deciding "
                     f"{self.rate:.0f}/s)")))

    def report_limited(self, events: list[Limited]) -> None:
        """A user's rate-limited spell as ``overload`` events: its start, a count every
        minute while it lasts, its end; never one per refused submission."""
        for e in events:
            self._limit_events += 1
            log.warning("submitter_rate_limited", user=e.user, phase=e.phase,
                        refused=e.refused)
            self._fire(self.ctx.event(
                kind="overload", severity="info" if e.phase == "end" else "warning",
                tick=self.tick, scenario_time_s=self.time_s,
                message=e.message(self.limits.limit),
                key=f"rate-{e.user}-{os.getpid()}-{self._limit_events}:{e.phase}",
                attributes={"cause": "rate_limit", "user": e.user, "phase": e.phase,
                            "refused": str(e.refused)}))

    async def share_spent(self) -> None:
        """Tell the other replicas what this one admitted, every ``SHARE_EVERY_S`` (core
        NATS: a report lost lets its tokens through once more, and nothing waits on it)."""
        while True:
            await asyncio.sleep(SHARE_EVERY_S)
            spent = self.limits.unshared()
            if spent:
                try:
                    await self.ctx.bus.nc.publish(subjects.PLACER_SPENT,
                                                  codec.encode_spend(self.replica, spent))
                except Exception as err:  # a closed connection: the service is stopping
                    log.debug("spent_report_failed", error=repr(err))

    async def on_spent(self, msg: Any) -> None:
        """Another replica's report: its submitters' tokens are taken here too."""
        try:
            replica, spent = codec.decode_spend(msg.data)
        except InvalidSpecError as err:
            log.warning("spent_report_undecodable", error=str(err))
            return
        if replica != self.replica:
            self.limits.spent_elsewhere(spent, time.monotonic())

    async def watch_limits(self) -> None:
        """Fold the rate-limited spells every second, so one ends without a submission."""
        while True:
            await asyncio.sleep(LIMITS_FOLD_EVERY_S)
            self.report_limited(self.limits.fold(time.monotonic()))

    @staticmethod
    def _fire(event: Awaitable[Any]) -> None:
        """Emit an event without waiting for it (``ServiceContext.event`` logs a loss)."""
        task = asyncio.ensure_future(event)
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def start(self) -> None:
        await self.pipeline.start()
        self._watch = asyncio.create_task(self.watch_limits(), name="rate-limits")
        if not self.limits.limit.off:
            self._spent_sub = await self.ctx.bus.nc.subscribe(subjects.PLACER_SPENT,
                                                              cb=self.on_spent)
            self._share = asyncio.create_task(self.share_spent(), name="rate-limit-share")

    async def close(self) -> None:
        if self._spent_sub is not None:
            with contextlib.suppress(Exception):
                await self._spent_sub.unsubscribe()
        for task in (self._watch, self._share):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._events is not None:
            with contextlib.suppress(Exception):
                await self._events
        await self.pipeline.stop()
