"""Job admission against a real NATS: acks that tell the truth (issue 25, defects 6, 8).

The placer (one or two replicas, run in this loop on their own connections) must answer
a retried submission with its first answer (``duplicate``), refuse another spec under a
taken id saying who holds it, give two racing replicas' senders one story, shed a flood
with "busy, retry after N ms" while storing every accepted job exactly once, dead-letter
an undecodable submission, stamp admissions with the scenario clock, and say which stage
a degraded tick is missing. ``koi submit`` must look a job up before reporting failure,
and print one line, not a traceback, when the file is unreadable.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from koi import subjects
from koi.catalog import load_catalog
from koi.cluster import ClusterSnapshot
from koi.jobs import load_jobs_yaml
from koi.v1 import events_pb2, jobs_pb2
from koi.wire import planning
from koi.wire.jobs import job_to_proto
from services import cli
from services.placer import main as placer
from services.runtime.app import ServiceContext
from services.runtime.bus import Bus
from services.runtime.connection import connect
from services.runtime.settings import ServiceSettings

pytestmark = pytest.mark.timeout(90)

JOB = Path("examples/jobs/chat-online.yaml")


def _spec(job_id: str, priority: int | None = None) -> jobs_pb2.JobSpec:
    spec = job_to_proto(load_jobs_yaml(JOB, catalog=load_catalog())[0])
    spec.id = job_id
    if priority is not None:
        spec.priority = priority
    return spec


async def _ask(bus: Bus, data: bytes, timeout_s: float = 10.0,
               user: str = subjects.DEFAULT_SUBMITTER) -> jobs_pb2.JobAck:
    reply = await bus.nc.request(subjects.job_submit_subject(user), data, timeout=timeout_s)
    return jobs_pb2.JobAck.FromString(reply.data)


async def _stored(bus: Bus, filter_subject: str, stream: str = subjects.STREAM_JOBS
                  ) -> dict[str, int]:
    info = await bus.js.stream_info(stream, subjects_filter=filter_subject)
    return dict(info.state.subjects or {})


async def _events(bus: Bus, kind: str) -> list[events_pb2.OperatorEvent]:
    """Every stored event of one kind (read with an ordered consumer)."""
    pattern = f"{subjects.EVENTS_PREFIX}.*.{kind}"
    total = sum((await _stored(bus, pattern, subjects.STREAM_EVENTS)).values())
    out: list[events_pb2.OperatorEvent] = []
    if total:
        sub = await bus.js.subscribe(pattern, ordered_consumer=True)
        try:
            while len(out) < total:
                msg = await sub.next_msg(timeout=5)
                out.append(events_pb2.OperatorEvent.FromString(msg.data))
        finally:
            await sub.unsubscribe()
    return out


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _snapshot(tick: int, time_s: float) -> bytes:
    return planning.encode_snapshot(ClusterSnapshot(
        tick=tick, time_s=time_s, tick_s=60.0, horizon_s=24 * 3600.0, capacity=(),
        deployments=(), jobs=()))


@pytest_asyncio.fixture
async def placers(bus: Bus, nats_url: str) -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """Start placer replicas in this loop (``start(n, **env)``), each on its own
    connection, and wait until each has subscribed; all are stopped afterwards."""
    running: list[tuple[ServiceContext, asyncio.Task[None]]] = []

    async def start(n: int = 1, **env: str) -> None:
        for i in range(n):
            settings = ServiceSettings.from_env({"KOI_NATS_URL": nats_url,
                                                 "KOI_REPLICA": str(i), **env})
            own = await connect(nats_url, f"test-placer-{i}", wait_s=10)
            ctx = ServiceContext(placer.NAME, settings, own, load_catalog())
            running.append((ctx, asyncio.create_task(placer.run(ctx))))
        for ctx, _ in running[-n:]:
            await _eventually(lambda c=ctx: _answers_submissions(c.bus))

    yield start
    for ctx, task in running:
        ctx.stopping.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        await ctx.bus.close()


async def _answers_submissions(own: Bus) -> bool:
    """True once this connection subscribes to ``koi.jobs.submit.*`` and the server knows
    (a probe request would be answered by any replica, so it proves nothing for two)."""
    subscribed = any(s.subject == subjects.JOBS_SUBMIT_ANY for s in own.nc._subs.values())
    if subscribed:
        await own.nc.flush()
    return subscribed


# --- idempotency ---------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_a_retry_of_the_same_spec_returns_the_first_answer_marked_duplicate(
        bus: Bus, placers) -> None:
    await placers(1)
    data = _spec("retry-me").SerializeToString()
    first = await _ask(bus, data)
    again = await _ask(bus, data)
    assert first.accepted and not first.duplicate, first
    assert again.accepted and again.duplicate and again.tick == first.tick, again
    assert await _stored(bus, "koi.jobs.accepted.>") == {"koi.jobs.accepted.retry-me": 1}
    await asyncio.sleep(0.5)  # the batch's events are published after the answers
    assert [e.job_id for e in await _events(bus, "admission")] == ["retry-me"]


@pytest.mark.asyncio
async def test_another_spec_under_a_taken_id_is_refused_saying_who_holds_it(
        bus: Bus, placers) -> None:
    await placers(1)
    assert (await _ask(bus, _spec("taken", priority=3).SerializeToString())).accepted
    other = await _ask(bus, _spec("taken", priority=9).SerializeToString())
    assert not other.accepted and not other.duplicate and other.field == "id"
    assert "'taken'" in other.reason and "different spec" in other.reason, other.reason
    assert await _stored(bus, "koi.jobs.accepted.>") == {"koi.jobs.accepted.taken": 1}


@pytest.mark.asyncio
async def test_two_replicas_racing_for_ids_give_every_sender_one_story(
        bus: Bus, placers) -> None:
    """10 ids, each sent 12 times at once (half of the sends of the odd ids with another
    spec) to two replicas: per id one spec is stored once, and every sender of it is
    told "accepted" (one of them not as a duplicate), every sender of the other refused."""
    await placers(2, KOI_SUBMIT_RATE_PER_S="0")  # 120 at once from one user: not its limit
    specs = {}
    for k in range(10):
        a = _spec(f"race-{k}", priority=3).SerializeToString()
        b = _spec(f"race-{k}", priority=9).SerializeToString() if k % 2 else a
        specs[f"race-{k}"] = [a, b] * 6
    sends = [(jid, data) for jid, datas in specs.items() for data in datas]
    acks = await asyncio.gather(*(_ask(bus, data) for _, data in sends))
    stored = await _stored(bus, "koi.jobs.accepted.>")
    assert stored == {f"koi.jobs.accepted.{jid}": 1 for jid in specs}
    for jid in specs:
        raw = await bus.js.get_last_msg(subjects.STREAM_JOBS, f"koi.jobs.accepted.{jid}")
        mine = [(data, ack) for (j, data), ack in zip(sends, acks, strict=True) if j == jid]
        winners = [ack for data, ack in mine if data == raw.data]
        losers = [ack for data, ack in mine if data != raw.data]
        assert all(a.accepted for a in winners), (jid, winners)
        assert sum(not a.duplicate for a in winners) == 1, (jid, winners)
        assert all(not a.accepted and a.field == "id" for a in losers), (jid, losers)


# --- overload ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_a_flood_beyond_the_queue_is_answered_busy_and_every_acked_job_stored_once(
        bus: Bus, placers, monkeypatch) -> None:
    from services.placer import admission

    monkeypatch.setattr(admission, "QUEUE_MIN", 4)
    monkeypatch.setattr(admission, "MAX_WAIT_S", 0.0)
    await placers(1, KOI_SUBMIT_RATE_PER_S="0")  # the queue's shedding, not a user's limit
    datas = {f"flood-{i}": _spec(f"flood-{i}").SerializeToString() for i in range(300)}
    acks = dict(zip(datas, await asyncio.gather(*(_ask(bus, d) for d in datas.values())),
                    strict=True))
    busy = {j: a for j, a in acks.items() if a.retry_after_ms}
    assert busy, "a flood 75 times the queue got no busy answer"
    assert all(not a.accepted and "busy" in a.reason for a in busy.values())
    accepted = {j for j, a in acks.items() if a.accepted}
    assert accepted | set(busy) == set(datas)  # every submission answered, one way or other
    stored = await _stored(bus, "koi.jobs.accepted.>")
    assert set(stored) == {f"koi.jobs.accepted.{j}" for j in accepted}  # busy: not stored
    # the flood is over (room for all); senders that retry after the time they were
    # given all get in, each once
    monkeypatch.setattr(admission, "QUEUE_MIN", 1000)
    while busy:
        await asyncio.sleep(max(a.retry_after_ms for a in busy.values()) / 1000)
        again = await asyncio.gather(*(_ask(bus, datas[j]) for j in busy))
        busy = {j: a for j, a in zip(busy, again, strict=True) if not a.accepted}
        assert all(a.retry_after_ms for a in busy.values()), busy
    stored = await _stored(bus, "koi.jobs.accepted.>")
    assert stored == {f"koi.jobs.accepted.{j}": 1 for j in datas}


# --- per-user rate limits ----------------------------------------------------------------------

@pytest.mark.asyncio
async def test_one_user_flooding_is_answered_busy_by_its_limit_while_another_gets_in(
        bus: Bus, placers) -> None:
    """40 submissions at once from one user with a burst of 5 and 2/s: its burst is
    admitted, the rest are told busy with the time to its next token (≤ 500 ms) and are
    not stored; another user's submission is admitted meanwhile; one event says the
    flooder is limited, not one per refusal; the flooder gets in again once it waits
    for what it was told, and its retry of an admitted spec is answered duplicate."""
    await placers(1, KOI_SUBMIT_RATE_PER_S="2", KOI_SUBMIT_BURST="5")
    datas = {f"rl-{i}": _spec(f"rl-{i}").SerializeToString() for i in range(40)}
    started = time.monotonic()
    acks = dict(zip(datas, await asyncio.gather(
        *(_ask(bus, d, user="flood") for d in datas.values())), strict=True))
    took = time.monotonic() - started
    other = await _ask(bus, _spec("other-user").SerializeToString(), user="alice")
    assert other.accepted and not other.duplicate, other
    accepted = sorted(j for j, a in acks.items() if a.accepted)
    busy = {j: a for j, a in acks.items() if not a.accepted}
    # the burst, plus at most the tokens the flood's own duration earned
    assert 5 <= len(accepted) <= 5 + int(took * 2) + 1, (len(accepted), took)
    assert busy and all(0 < a.retry_after_ms <= 500 and "rate limit" in a.reason
                        and "'flood'" in a.reason for a in busy.values()), busy
    stored = await _stored(bus, "koi.jobs.accepted.>")
    assert set(stored) == {f"koi.jobs.accepted.{j}" for j in [*accepted, "other-user"]}

    async def limited_events() -> list[events_pb2.OperatorEvent]:
        return [e for e in await _events(bus, "overload")
                if e.attributes.get("cause") == "rate_limit"]

    async def announced() -> bool:
        return bool(await limited_events())

    await _eventually(announced)
    (start,) = await limited_events()
    assert start.attributes["user"] == "flood" and start.attributes["phase"] == "start"
    assert "rate limited" in start.message and start.severity == events_pb2.SEVERITY_WARNING
    # told to wait N ms: after N ms the same spec gets in, and a retry of an admitted
    # one is answered as the first time, not stored again
    retry = min(busy, key=lambda j: busy[j].retry_after_ms)
    await asyncio.sleep(max(a.retry_after_ms for a in busy.values()) / 1000)
    assert (await _ask(bus, datas[retry], user="flood")).accepted
    await asyncio.sleep(0.5)
    again = await _ask(bus, datas[accepted[0]], user="flood")
    assert again.accepted and again.duplicate, again
    stored = await _stored(bus, "koi.jobs.accepted.>")
    assert stored == {f"koi.jobs.accepted.{j}": 1 for j in [*accepted, "other-user", retry]}
    # one start for the whole spell (an end may follow once it has been quiet 5 s)
    assert [e.attributes["phase"] for e in await limited_events()] in (["start"],
                                                                       ["start", "end"])


@pytest.mark.asyncio
async def test_two_replicas_hold_one_user_to_one_budget_not_two(bus: Bus, placers) -> None:
    """One user floods two placer replicas (a queue group: each answers about half) for
    3 s at burst 2, 5/s: together they admit what one bucket allows, give or take what
    they had not yet told each other (koi.placer.spent every 50 ms), not twice it; and
    they do not starve it either."""
    burst, rate = 2, 5.0
    await placers(2, KOI_SUBMIT_RATE_PER_S=str(rate), KOI_SUBMIT_BURST=str(burst))
    started, acks, i = time.monotonic(), [], 0
    while time.monotonic() - started < 3.0:
        wave = [_spec(f"two-{i + k}").SerializeToString() for k in range(6)]
        i += len(wave)
        acks += await asyncio.gather(*(_ask(bus, d, user="flood") for d in wave))
        await asyncio.sleep(0.05)
    took = time.monotonic() - started
    admitted = sum(a.accepted for a in acks)
    one_budget = burst + rate * took
    # what was not yet heard of: the other's burst, and each one's last share interval
    unheard = burst + 2 * rate * 0.05
    assert 0.7 * one_budget <= admitted <= one_budget + unheard + 2, (admitted, took)
    assert all("rate limit" in a.reason for a in acks if not a.accepted)
    assert await _stored(bus, "koi.jobs.accepted.>") == {
        f"koi.jobs.accepted.{a.job_id}": 1 for a in acks if a.accepted}


# --- koi submit ------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_koi_submit_reports_accepted_after_looking_up_a_job_stored_without_an_answer(
        bus: Bus, nats_url: str) -> None:
    async def store_and_stay_silent(msg) -> None:
        spec = jobs_pb2.JobSpec.FromString(msg.data)
        await bus.publish(subjects.job_accepted_subject(spec.id), msg.data,
                          msg_id=f"job-{spec.id}")

    await bus.nc.subscribe(subjects.JOBS_SUBMIT_ANY, cb=store_and_stay_silent)
    await bus.nc.flush()
    out = io.StringIO()
    code = await cli._submit(JOB, nats_url, 2.5, cli.Console(file=out, width=300))
    assert code == 0, out.getvalue()
    assert "accepted" in out.getvalue() and "stored" in out.getvalue(), out.getvalue()


@pytest.mark.asyncio
async def test_koi_submit_with_nothing_stored_says_so(bus: Bus, nats_url: str) -> None:
    out = io.StringIO()
    code = await cli._submit(JOB, nats_url, 1.0, cli.Console(file=out, width=300))
    assert code == 1 and "not stored" in out.getvalue(), out.getvalue()


def test_koi_submit_prints_one_line_for_an_unreadable_file(tmp_path: Path, capsys) -> None:
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81 kind: online\n" * 4)
    code = cli.submit(binary, "nats://127.0.0.1:1", 1.0)
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "job.yaml" in lines[0], lines
    assert "Traceback" not in out.out + out.err
    with pytest.raises(Exception):  # noqa: B017 - --debug: the error itself, traceback and all
        cli.submit(binary, "nats://127.0.0.1:1", 1.0, debug=True)


# --- undecodable, the scenario clock, the degraded tick ----------------------------------------

@pytest.mark.asyncio
async def test_an_undecodable_submission_is_answered_dead_lettered_and_reported(
        bus: Bus, placers) -> None:
    await placers(1)
    garbage = b"\xff\xff\xff\xff not a JobSpec"
    ack = await _ask(bus, garbage)
    assert not ack.accepted and "undecodable" in ack.reason
    dlq = subjects.dlq_subject(placer.NAME)

    async def parked() -> bool:
        return bool(await _stored(bus, dlq, subjects.STREAM_DLQ)) and \
            bool(await _events(bus, "dlq"))

    await _eventually(parked)
    letter = await bus.js.get_last_msg(subjects.STREAM_DLQ, dlq)
    assert letter.data == garbage
    assert (letter.headers or {}).get("Koi-Original-Subject") == \
        subjects.job_submit_subject(subjects.DEFAULT_SUBMITTER)


@pytest.mark.asyncio
async def test_the_admission_event_is_on_the_scenario_clock(bus: Bus, placers) -> None:
    await placers(1)
    await bus.publish(subjects.tick_subject(7, "snapshot"), _snapshot(7, 7 * 3600.0 + 120),
                      msg_id="snapshot-7")

    async def admitted() -> bool:
        ack = await _ask(bus, _spec("clocked").SerializeToString())
        return ack.tick == 7  # the placer has seen the snapshot (a retry is a duplicate)

    await _eventually(admitted)
    await _eventually(lambda: _has_events(bus, "admission"))
    (ev,) = await _events(bus, "admission")
    assert ev.job_id == "clocked" and ev.tick == 7
    assert ev.scenario_time_s == pytest.approx(7 * 3600.0 + 120)
    assert planning.event_line(ev).startswith("07:02:00")


async def _has_events(bus: Bus, kind: str) -> bool:
    return bool(await _events(bus, kind))


@pytest.mark.asyncio
async def test_a_degraded_tick_names_the_stage_it_stalled_at(bus: Bus, placers) -> None:
    await placers(1, KOI_STAGE_DEADLINE_S="1", KOI_LEASE_TTL_S="1")
    tick = 41
    await bus.publish(subjects.tick_subject(tick, "snapshot"), _snapshot(tick, tick * 60.0),
                      msg_id=f"snapshot-{tick}")
    for stage in ("observations", "causal"):  # the proposer never answers
        await bus.publish(subjects.tick_subject(tick, stage), b"\x08\x01",
                          msg_id=f"{stage}-{tick}")
    await _eventually(lambda: _has_events(bus, "degraded_tick"))
    (ev,) = await _events(bus, "degraded_tick")
    assert ev.tick == tick
    assert f"no candidates for tick {tick} (proposer): the tick stalled after causal" \
        in ev.message, ev.message


def test_bench_admission_runs_as_deployed_and_reads_the_stream_back(tmp_path: Path) -> None:
    """``koi bench admission`` end to end at a low rate, on a secure NATS with a placer
    process: every submission answered and accepted, every accepted job stored once."""
    from services.bench_admission import format_row, run_rate

    row = run_rate(50.0, 1.0, 5.0, 1, "smoke", tmp_path, secure=True)
    assert (row.accepted, row.timeouts, row.busy, row.rejected) == (50, 0, 0, 0), \
        format_row(row)
    assert (row.stored, row.lost, row.duplicated, row.unacked) == (50, 0, 0, 0)
    assert row.p99_ms > 0 and row.holds() and row.answered_pct == 100.0


# --- the sender's deadline ---------------------------------------------------------------------

async def _ask_within(bus: Bus, data: bytes, budget_ms: int | None,
                      wait_s: float = 10.0) -> jobs_pb2.JobAck:
    headers = None if budget_ms is None else {subjects.HEADER_DEADLINE_MS: str(budget_ms)}
    reply = await bus.nc.request(subjects.job_submit_subject(subjects.DEFAULT_SUBMITTER), data,
                                 timeout=wait_s, headers=headers)
    return jobs_pb2.JobAck.FromString(reply.data)


@pytest.mark.asyncio
async def test_a_deadline_the_queue_cannot_meet_is_answered_busy_at_once_and_nothing_stored(
        bus: Bus, placers, monkeypatch) -> None:
    from services.placer import admission

    monkeypatch.setattr(admission, "_INITIAL_STORE_S", 3.0)  # a store is believed to take 3 s
    await placers(1)
    for jid, budget in (("short-1", 1000), ("short-0", 0), ("short-none", None)):
        ack = await _ask_within(bus, _spec(jid).SerializeToString(), budget)
        assert not ack.accepted and ack.retry_after_ms, (jid, ack)
        assert "deadline" in ack.reason and "nothing was stored" in ack.reason, ack.reason
    long = await _ask_within(bus, _spec("long").SerializeToString(), 20_000)
    assert long.accepted, long
    assert await _stored(bus, "koi.jobs.accepted.>") == {"koi.jobs.accepted.long": 1}


@pytest.mark.asyncio
async def test_a_submission_whose_deadline_passes_in_the_queue_is_answered_busy_not_stored(
        bus: Bus, placers, monkeypatch) -> None:
    """A slow store holds the worker; a submission queued behind it with a 300 ms budget
    is answered busy when its turn comes, and is not stored after its sender gave up."""
    from services.placer import admission

    storing, original = asyncio.Event(), admission.Admission.store_all

    async def slow_store(self, pending):
        storing.set()
        await asyncio.sleep(0.8)
        return await original(self, pending)

    monkeypatch.setattr(admission.Admission, "store_all", slow_store)
    await placers(1)
    first = asyncio.create_task(_ask_within(bus, _spec("ahead").SerializeToString(), 20_000))
    await asyncio.wait_for(storing.wait(), 10)
    behind = await _ask_within(bus, _spec("behind").SerializeToString(), 300)
    assert not behind.accepted and behind.retry_after_ms, behind
    assert "ran out while queued" in behind.reason, behind.reason
    assert (await first).accepted
    assert await _stored(bus, "koi.jobs.accepted.>") == {"koi.jobs.accepted.ahead": 1}


@pytest.mark.asyncio
async def test_koi_submit_sends_each_attempts_wait_as_its_deadline(
        bus: Bus, nats_url: str) -> None:
    seen: list[str | None] = []

    async def answer(msg) -> None:
        seen.append((msg.headers or {}).get(subjects.HEADER_DEADLINE_MS))
        spec = jobs_pb2.JobSpec.FromString(msg.data)
        await msg.respond(jobs_pb2.JobAck(accepted=True, job_id=spec.id).SerializeToString())

    await bus.nc.subscribe(subjects.JOBS_SUBMIT_ANY, cb=answer)
    await bus.nc.flush()
    out = io.StringIO()
    assert await cli._submit(JOB, nats_url, 30.0, cli.Console(file=out, width=300)) == 0
    assert seen and all(s is not None and 0 < int(s) <= 2000 for s in seen), seen
