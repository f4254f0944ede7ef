"""The bus refuses what a role may not say (DESIGN §9), on a real nats-server with TLS.

Each forged message of the incident report is sent by a user who may not send it and
must be refused by the server: a permissions violation reaches the sender, a JetStream
publish gets no ack, and the stream and KV hold the real state only. Also: no login
without a password, no plain TCP to a TLS server, no destructive stream API for a
service, no submitter can submit on another's subject (and so spend its rate limit), the
CLI works as the ``client`` user and as another submitter, and a short pipeline runs
with one user per service without a single permissions violation in the server's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
from collections.abc import Callable

import nats.errors
import pytest
from nats.js import api

from koi import subjects
from koi.v1 import events_pb2, jobs_pb2
from services import cli
from services.runtime.bus import Bus
from services.runtime.busrun import BusRun
from services.runtime.connection import connect
from services.runtime.embedded import EmbeddedServer, start_nats
from services.runtime.lease import Lease
from services.runtime.permissions import ADMIN, CLIENT
from services.runtime.security import connect_nats
from services.runtime.settings import SERVICES, NatsAuth

pytestmark = pytest.mark.timeout(60)

REFUSED_S = 0.5  # how long a refused JetStream request waits for the answer it never gets
ACTIONS = subjects.tick_subject(1, "actions")
LEASE = f"$KV.{subjects.KV_LEASES}.{subjects.KEY_PLACER_LEASE}"
FORGED_JOB = subjects.job_accepted_subject("forged")
FAR_TICK = subjects.tick_subject(10**9, "observations")
# who may publish each stage of a tick (DESIGN §9)
STAGE_PUBLISHERS = {"snapshot": {"sim"}, "observations": {"telemetry-ingest"},
                    "causal": {"causal-store"}, "candidates": {"proposer"},
                    "plan": {"evaluator"}, "actions": {"placer"},
                    "hypotheses": {"proposer"}}


class Session:
    """One connection as one role, with the asynchronous errors the server sent it."""

    def __init__(self, nc, errors: list[str]) -> None:
        # refused API requests wait for their answer this long, not the default 5 s
        self.nc, self.js, self.errors = nc, nc.jetstream(timeout=1.0), errors

    async def refused(self, subject: str, data: bytes = b"forged") -> None:
        """Publish to a stream subject and expect the server to refuse it."""
        with pytest.raises(nats.errors.TimeoutError):
            await self.js.publish(subject, data, timeout=REFUSED_S)
        await _eventually(lambda: self.violated(f'publish to "{subject}"'))

    def violated(self, what: str) -> bool:
        # nats-py lower-cases the server's error text
        return f"permissions violation for {what}".lower() in " ".join(self.errors).lower()


async def _as(server: EmbeddedServer, role: str) -> Session:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await connect_nats(server.url, server.security.auth(role), error_cb=on_error,
                            connect_timeout=5)
    return Session(nc, errors)


async def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _stored(bus: Bus, stream: str, subject: str) -> int:
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


# --- who may connect ------------------------------------------------------------------
@pytest.mark.asyncio
async def test_no_password_or_a_wrong_one_is_refused(secure_nats: EmbeddedServer) -> None:
    ca = str(secure_nats.security.ca_file(CLIENT))
    for auth in (NatsAuth(ca_file=ca), NatsAuth("placer", "not-the-password", ca),
                 NatsAuth("intruder", "x", ca)):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await connect_nats(secure_nats.url, auth, connect_timeout=2, allow_reconnect=False)


def test_a_plain_tcp_client_gets_nothing_from_a_tls_server(secure_nats: EmbeddedServer
                                                          ) -> None:
    password = secure_nats.security.auth(ADMIN).password
    with socket.create_connection(("127.0.0.1", secure_nats.port), timeout=5) as sock:
        connect_line = json.dumps({"user": ADMIN, "pass": password, "verbose": True})
        sock.sendall(f"CONNECT {connect_line}\r\nPING\r\n".encode())
        answer = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := sock.recv(4096):  # until the server hangs up
                answer += chunk
    # TLS comes first: not even the server's INFO is sent in the clear
    assert b"INFO" not in answer and b"+OK" not in answer and b"PONG" not in answer


@pytest.mark.asyncio
async def test_a_client_never_sends_its_password_to_a_plaintext_impostor(secure_nats
                                                                         ) -> None:
    received = bytearray()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # what a plaintext server says: no tls_required
        writer.write(b'INFO {"server_id":"IMPOSTOR","version":"2.10.0","proto":1,'
                     b'"max_payload":1048576,"headers":true}\r\n')
        with contextlib.suppress(Exception):
            await writer.drain()
            while chunk := await asyncio.wait_for(reader.read(4096), 3):
                received.extend(chunk)
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    auth = secure_nats.security.auth("placer")
    try:
        for url in (f"tls://127.0.0.1:{port}", f"nats://127.0.0.1:{port}"):
            with pytest.raises(Exception):  # noqa: B017 - whatever fails, it must not log in
                nc = await connect_nats(url, auth, connect_timeout=2, allow_reconnect=False)
                await nc.close()
    finally:
        server.close()
    assert received, "the client never reached the impostor"
    leaked = auth.password.encode() in received
    assert not leaked, "the password reached a plaintext impostor"  # (never print it)


# --- the forged messages of the incident ----------------------------------------------
@pytest.mark.asyncio
async def test_forged_actions_are_refused_and_the_placers_stay(secure_nats, secure_bus) -> None:
    placer, client, evaluator = [await _as(secure_nats, r)
                                 for r in ("placer", CLIENT, "evaluator")]
    ack = await placer.js.publish(ACTIONS, b"the real actions", timeout=5)
    assert ack.stream == subjects.STREAM_TICKS
    await client.refused(ACTIONS)
    await evaluator.refused(ACTIONS, b"a plan of its own")
    assert await secure_bus.get_last(ACTIONS) == b"the real actions"
    assert await _stored(secure_bus, subjects.STREAM_TICKS, ACTIONS) == 1
    for s in (placer, client, evaluator):
        await s.nc.close()


@pytest.mark.asyncio
async def test_the_placer_lease_cannot_be_overwritten(secure_nats, secure_bus) -> None:
    placer_bus = await connect(secure_nats.url, "placer", auth=secure_nats.security.auth(
        "placer"), wait_s=5)
    lease = Lease(placer_bus, subjects.KEY_PLACER_LEASE, "placer-a", ttl_s=30)
    assert await lease.acquire()
    forged = json.dumps({"holder": "intruder", "expires_at": time.time() + 3600}).encode()
    for role in (CLIENT, "evaluator", "sim", "planner-api"):
        session = await _as(secure_nats, role)
        await session.refused(LEASE, forged)
        await session.nc.close()
    value, _ = await secure_bus.kv_get(subjects.KV_LEASES, subjects.KEY_PLACER_LEASE)
    assert json.loads(value)["holder"] == "placer-a"
    assert await lease.renew()  # the leader never noticed
    await placer_bus.close()


@pytest.mark.asyncio
async def test_only_a_proposer_holds_the_hypothesis_rounds_lease(secure_nats,
                                                                 secure_bus) -> None:
    proposer_bus = await connect(secure_nats.url, "proposer", auth=secure_nats.security.auth(
        "proposer"), wait_s=5)
    lease = Lease(proposer_bus, subjects.KEY_RLM_LEASE, "proposer-a", ttl_s=30)
    assert await lease.acquire()
    forged = json.dumps({"holder": "intruder", "expires_at": time.time() + 3600}).encode()
    rlm_lease = f"$KV.{subjects.KV_LEASES}.{subjects.KEY_RLM_LEASE}"
    for role in (CLIENT, "evaluator", "placer", "planner-api"):
        session = await _as(secure_nats, role)
        await session.refused(rlm_lease, forged)
        await session.nc.close()
    value, _ = await secure_bus.kv_get(subjects.KV_LEASES, subjects.KEY_RLM_LEASE)
    assert json.loads(value)["holder"] == "proposer-a"
    assert await lease.renew()
    # nor may the proposer take the placer's
    session = await _as(secure_nats, "proposer")
    await session.refused(LEASE, forged)
    await session.nc.close()
    await proposer_bus.close()


@pytest.mark.asyncio
async def test_a_job_cannot_bypass_admission(secure_nats, secure_bus) -> None:
    client, evaluator = await _as(secure_nats, CLIENT), await _as(secure_nats, "evaluator")
    await client.refused(FORGED_JOB, b"a job nobody admitted")
    await evaluator.refused(FORGED_JOB, b"a job nobody admitted")
    assert await secure_bus.get_last(FORGED_JOB) is None
    # nor answer submissions in the placer's place
    for s in (client, evaluator):
        await s.nc.subscribe(subjects.JOBS_SUBMIT_ANY)
        await s.nc.flush()
        await _eventually(lambda s=s: s.violated(
            f'subscription to "{subjects.JOBS_SUBMIT_ANY}"'))
    # what a client may do: ask the placer
    placer = await _as(secure_nats, "placer")

    async def admit(msg) -> None:
        await msg.respond(jobs_pb2.JobAck(accepted=True, job_id="j").SerializeToString())

    await placer.nc.subscribe(subjects.JOBS_SUBMIT_ANY, queue="placer", cb=admit)
    await placer.nc.flush()
    reply = await client.nc.request(subjects.job_submit_subject(CLIENT), b"", timeout=10)
    assert jobs_pb2.JobAck.FromString(reply.data).accepted
    for s in (client, evaluator, placer):
        await s.nc.close()


async def _accepting_placer(secure_nats, job_id: str):
    """A session as the placer answering every submission accepted, and the subjects it
    was asked on."""
    placer = await _as(secure_nats, "placer")
    seen: list[str] = []

    async def admit(msg) -> None:
        seen.append(msg.subject)
        await msg.respond(jobs_pb2.JobAck(accepted=True, job_id=job_id).SerializeToString())

    await placer.nc.subscribe(subjects.JOBS_SUBMIT_ANY, queue="placer", cb=admit)
    await placer.nc.flush()
    return placer, seen


@pytest.mark.asyncio
async def test_a_submitter_cannot_submit_on_another_users_subject(secure_nats,
                                                                  secure_bus) -> None:
    """Each submitter's only submit subject is its own, so nobody can spend another's
    rate limit: the server refuses the forged one, and the placer never sees it."""
    placer, seen = await _accepting_placer(secure_nats, "j")
    alice, client = await _as(secure_nats, "alice"), await _as(secure_nats, CLIENT)
    for session, other in ((alice, "bob"), (alice, CLIENT), (client, "alice")):
        forged = subjects.job_submit_subject(other)
        with pytest.raises(nats.errors.TimeoutError):
            await session.nc.request(forged, b"", timeout=REFUSED_S)
        await _eventually(lambda s=session, f=forged: s.violated(f'publish to "{f}"'))
    # nor on the bare prefix, nor below another's subject
    for forged in (subjects.JOBS_SUBMIT_PREFIX, f"{subjects.JOBS_SUBMIT_PREFIX}.bob.x"):
        with pytest.raises(nats.errors.TimeoutError):
            await alice.nc.request(forged, b"", timeout=REFUSED_S)
    reply = await alice.nc.request(subjects.job_submit_subject("alice"), b"", timeout=10)
    assert jobs_pb2.JobAck.FromString(reply.data).accepted
    assert seen == [subjects.job_submit_subject("alice")]  # nothing forged reached it
    for s in (placer, alice, client):
        await s.nc.close()


@pytest.mark.asyncio
async def test_observations_from_far_ahead_are_refused_unless_from_ingest(secure_nats,
                                                                          secure_bus) -> None:
    for role in (CLIENT, "placer", "causal-store", "sim"):
        session = await _as(secure_nats, role)
        await session.refused(FAR_TICK, b"tick 1e9")
        await session.nc.close()
    assert await secure_bus.get_last(FAR_TICK) is None
    ingest = await _as(secure_nats, "telemetry-ingest")
    await ingest.js.publish(FAR_TICK, b"stored: the consumers judge plausibility", timeout=5)
    await ingest.nc.close()
    assert await secure_bus.get_last(FAR_TICK) is not None


@pytest.mark.asyncio
async def test_each_stage_is_published_by_its_service_only(secure_nats, secure_bus) -> None:
    sessions = {role: await _as(secure_nats, role) for role in (*SERVICES, CLIENT)}

    async def attempt(role: str, stage: str) -> None:
        subject = subjects.tick_subject(7, stage)
        if role in STAGE_PUBLISHERS[stage]:
            await sessions[role].js.publish(subject, role.encode(), timeout=5)
        else:
            await sessions[role].refused(subject, role.encode())

    await asyncio.gather(*(attempt(role, stage) for role in sessions
                           for stage in STAGE_PUBLISHERS))
    for stage, (publisher,) in STAGE_PUBLISHERS.items():
        subject = subjects.tick_subject(7, stage)
        assert await secure_bus.get_last(subject) == publisher.encode(), stage
        assert await _stored(secure_bus, subjects.STREAM_TICKS, subject) == 1, stage
    for s in sessions.values():
        await s.nc.close()


@pytest.mark.asyncio
async def test_services_cannot_delete_purge_or_reconfigure(secure_nats, secure_bus) -> None:
    await secure_bus.publish(subjects.tick_subject(1, "plan"), b"kept")
    await secure_bus.js.add_consumer(subjects.STREAM_TICKS, api.ConsumerConfig(
        durable_name="causal-store", name="causal-store",
        filter_subject=subjects.tick_filter("observations")))
    placer = await _as(secure_nats, "placer")
    config = (await secure_bus.js.stream_info(subjects.STREAM_TICKS)).config
    attempts = {
        "delete stream": placer.js.delete_stream(subjects.STREAM_TICKS),
        "purge stream": placer.js.purge_stream(subjects.STREAM_TICKS),
        "delete message": placer.js.delete_msg(subjects.STREAM_TICKS, 1),
        "update stream": placer.js.update_stream(dataclasses.replace(config, max_msgs=1)),
        "delete another's consumer": placer.js.delete_consumer(subjects.STREAM_TICKS,
                                                               "causal-store"),
        "delete a bucket": placer.js.delete_key_value(subjects.KV_LEASES),
    }
    for what, call in attempts.items():
        with pytest.raises(nats.errors.TimeoutError):
            await asyncio.wait_for(call, 10)
        assert placer.violated("publish to"), what
    assert await secure_bus.get_last(subjects.tick_subject(1, "plan")) == b"kept"
    assert (await secure_bus.js.stream_info(subjects.STREAM_TICKS)).config.max_msgs == -1
    await secure_bus.js.consumer_info(subjects.STREAM_TICKS, "causal-store")
    await placer.nc.close()


# --- the client user is enough for the CLI --------------------------------------------
@pytest.mark.asyncio
async def test_koi_submit_and_events_follow_work_as_the_client_user(secure_nats, secure_bus,
                                                                    monkeypatch, tmp_path
                                                                    ) -> None:
    for name, value in secure_nats.security.env_for(CLIENT).items():
        monkeypatch.setenv(name, value)
    placer, seen = await _accepting_placer(secure_nats, "chat")
    from rich.console import Console

    code = await cli._submit(cli.Path("examples/jobs/chat-online.yaml"), secure_nats.url, 5.0,
                             Console(file=(tmp_path / "out.txt").open("w")))
    assert code == 0
    for name, value in secure_nats.security.env_for("bob").items():  # another submitter
        monkeypatch.setenv(name, value)
    code = await cli._submit(cli.Path("examples/jobs/chat-online.yaml"), secure_nats.url, 5.0,
                             Console(file=(tmp_path / "out.txt").open("w")))
    assert code == 0 and seen == [subjects.job_submit_subject(u) for u in (CLIENT, "bob")]
    await secure_bus.emit(events_pb2.OperatorEvent(
        severity=events_pb2.SEVERITY_WARNING, kind=events_pb2.EVENT_KIND_DLQ, message="m"))
    out = (tmp_path / "events.txt").open("w")
    assert await asyncio.wait_for(cli._follow(secure_nats.url, None, "info", "all", False,
                                              out), 20) == 1
    await placer.nc.close()


# --- a run with one user per service ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_pipeline_runs_with_one_user_per_service(redis_url, tmp_path) -> None:
    server = start_nats(secure=True)
    try:
        # telemetry read from the sim's engine pages, so engine-metrics runs too
        busrun = BusRun(server.url, tmp_path / "logs", "hetero-3h", 1, 300.0, redis_url,
                        security=server.security, timeout_s=500, telemetry="http")
        run = busrun.run()
        log = server.log_tail(100_000)
    finally:
        server.stop()
    assert run.summary.ticks == 5 and sorted(run.decisions) == [0, 1, 2, 3, 4]
    assert run.summary.metrics["overall_score"] > 0
    violations = [line for line in log.splitlines() if "Violation" in line]
    assert not violations, violations[:5]
    assert set(busrun.services()) == set(SERVICES)
    for service in SERVICES:  # each ran as its own user, over TLS
        started = (tmp_path / "logs" / f"{service}-0.log").read_text()
        assert f'"nats_user": "{service}"' in started and '"nats_tls": true' in started
