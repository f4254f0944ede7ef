"""Whole runs through the bus: every service as its own process, real NATS and Redis.

* parity: the bus run and the in-process planner make the same decisions every tick
  and end with the same metrics (also with two proposer/evaluator/placer replicas, the
  proposers' work items run on both, as ``koi bench bus --proposers`` reads the logs);
* a job submitted over the bus is acked, planned and counted;
* malformed messages go to the dead-letter subject with an event, the service lives on
  (these two read one shared run, fed both inputs);
* Redis killed mid-run, and ``kill -9`` of any one service mid-run: the run completes,
  the killed service was restarted, no submitted job is lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import time
from types import SimpleNamespace

import grpc
import pytest

from koi import subjects
from koi.catalog import load_catalog
from koi.jobs import load_jobs_yaml
from koi.v1 import events_pb2, jobs_pb2, plan_service_pb2, plan_service_pb2_grpc
from koi.wire import planning
from koi.wire.codec import encode_job
from services.bench import logged, propose_ticks
from services.runtime.busrun import BusRun
from services.runtime.launcher import ALL
from services.runtime.security import connect_nats
from support import bus_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCENARIO = "hetero-3h"
HORIZON_S = 900.0          # 15 ticks of a minute
# one fault at tick 3-5 (a kill -9, Redis killed, the placer leader frozen, a stage past
# its deadline): ticks up to 7 run after it, on the restarted, surviving or resumed
# service; the full 15-tick horizon of every kill is `make chaos`'s
FAULT_HORIZON_S = 480.0    # 8 ticks
FAULT_TICKS = 8
EXAMPLE_JOB = "examples/jobs/chat-online.yaml"
# no NATS accounts here: jobs go in as the default submitter, as `koi submit` sends them
SUBMIT = subjects.job_submit_subject(subjects.DEFAULT_SUBMITTER)


def in_process(horizon_s: float, seed: int = 1):
    return bus_runs.in_process(SCENARIO, horizon_s, seed)


def _job():
    job = load_jobs_yaml(EXAMPLE_JOB, catalog=load_catalog())[0]
    return dataclasses.replace(job, id="bus-submitted-chat")


def _request(url: str, subject: str, data: bytes) -> bytes:
    async def go() -> bytes:
        nc = await connect_nats(url)
        try:
            for _ in range(60):  # the placer may be restarting
                try:
                    return (await nc.request(subject, data, timeout=2)).data
                except Exception:
                    await asyncio.sleep(0.5)
            raise TimeoutError(f"no reply on {subject}")
        finally:
            await nc.close()
    return asyncio.run(go())


def _publish(url: str, subject: str, data: bytes) -> None:
    async def go() -> None:
        nc = await connect_nats(url)
        await nc.jetstream().publish(subject, data)
        await nc.close()
    asyncio.run(go())


def _stored(url: str, stream: str, subject: str) -> list:
    async def go() -> list:
        nc = await connect_nats(url)
        js = nc.jetstream()
        sub = await js.subscribe(subject, ordered_consumer=True)
        out = []
        try:
            while True:
                out.append(await sub.next_msg(timeout=1.0))
        except Exception:
            pass
        await nc.close()
        return out
    return asyncio.run(go())


def _assert_same(bus_decisions, local_decisions) -> None:
    assert sorted(bus_decisions) == sorted(local_decisions)
    for tick, local in local_decisions.items():
        assert bus_decisions[tick].actions == local.actions, f"tick {tick} differs"


@pytest.mark.parametrize("replicas", [{}, {"proposer": 2, "evaluator": 2, "placer": 2}],
                         ids=["one-each", "scaled-out"])
def test_bus_run_matches_in_process(nats_for_run, redis_url, tmp_path, replicas):
    local_decisions, local_metrics = in_process(HORIZON_S)
    run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, HORIZON_S, redis_url,
                 replicas=replicas).run()
    _assert_same(run.decisions, local_decisions)
    for name, value in run.summary.metrics.items():
        if name != "wall_s":
            assert value == pytest.approx(getattr(local_metrics, name), rel=1e-12, abs=1e-12), name
    # every tick was proposed once, and every proposer replica ran some of its items
    assert [t.tick for t in propose_ticks(run.log_dir)] == sorted(local_decisions)
    ran = {int(r) for r, in logged(run.log_dir, "proposer", "propose_item", ("replica",))}
    assert ran == set(range(replicas.get("proposer", 1)))
    # every service process's peak memory was read (koi bench bus prints it)
    assert set(run.peak_rss_mib) == set(run.restarts)
    assert all(20 < mib < 4096 for mib in run.peak_rss_mib.values()), run.peak_rss_mib


def _grpc_addr(url: str) -> str:
    async def go() -> str:
        nc = await connect_nats(url)
        kv = await nc.jetstream().key_value(subjects.KV_PLAN)
        entry = await kv.get("planner-api")
        await nc.close()
        return entry.value.decode()
    return asyncio.run(go())


@pytest.fixture(scope="module")
def outside_inputs_run(module_nats_for_run, redis_url, tmp_path_factory):
    """One run fed from outside while it goes, what two tests check: a job submitted over
    the bus at tick 2 (again as a retry, and once more under its id with another spec),
    malformed messages at tick 3, and the planner-api asked over gRPC at tick 10. Neither
    input touches what the other test looks at (the junk is for tick 9999 and goes to the
    dead-letter stream), so one run serves both; what they read back is read here."""
    url = module_nats_for_run
    acks, answers = [], {}

    def at_tick(tick: int, sup) -> None:
        if tick == 10 and not answers:  # the planner-api, over gRPC, mid-run
            with grpc.insecure_channel(_grpc_addr(url)) as channel:
                stub = plan_service_pb2_grpc.PlanServiceStub(channel)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    answers["plan"] = stub.GetPlan(plan_service_pb2.GetPlanRequest(), timeout=5)
                    if answers["plan"].plan.tick >= 8:
                        break
                    time.sleep(0.2)
                answers["job"] = stub.GetJob(
                    plan_service_pb2.GetJobRequest(job_id="bus-submitted-chat"), timeout=5)
        if tick == 2 and not acks:
            job = _job()
            acks.append(jobs_pb2.JobAck.FromString(
                _request(url, SUBMIT, encode_job(job))))
            # the same spec again is a retry, answered as the first time (issue 25); another
            # spec under the same id is refused with the reason
            acks.append(jobs_pb2.JobAck.FromString(
                _request(url, SUBMIT, encode_job(job))))
            other = dataclasses.replace(job, priority=job.priority % 9 + 1)
            acks.append(jobs_pb2.JobAck.FromString(
                _request(url, SUBMIT, encode_job(other))))
        if tick == 3:
            _publish(url, subjects.telemetry_subject(9999), b"\xff\x00 not protobuf")
            _publish(url, subjects.tick_subject(9999, "observations"), b"\x0a\xff")

    run = BusRun(url, tmp_path_factory.mktemp("outside") / "logs", SCENARIO, 1, HORIZON_S,
                 redis_url).run(at_tick)
    planned = [planning.decode_plan_targets(m.data)[1]
               for m in _stored(url, subjects.STREAM_TICKS, subjects.tick_filter("plan"))]
    dead = {m.subject for m in _stored(url, subjects.STREAM_DLQ, "koi.dlq.>")}
    events = [events_pb2.OperatorEvent.FromString(m.data)
              for m in _stored(url, subjects.STREAM_EVENTS, "koi.events.*.dlq")]
    return SimpleNamespace(run=run, acks=acks, answers=answers, planned=planned, dead=dead,
                           dlq_events=events)


def test_submitted_job_is_acked_planned_and_counted(outside_inputs_run):
    acks, answers = outside_inputs_run.acks, outside_inputs_run.answers
    run = outside_inputs_run.run
    assert acks[0].accepted and acks[0].job_id == "bus-submitted-chat"
    assert acks[1].accepted and acks[1].duplicate and acks[1].tick == acks[0].tick
    assert not acks[2].accepted and "different spec" in acks[2].reason
    assert "bus-submitted-chat" in run.summary.submitted_jobs
    planned = outside_inputs_run.planned
    assert any(t.job_id == "bus-submitted-chat" for targets in planned for t in targets)
    assert answers["plan"].plan.tick >= 8
    assert answers["job"].job.spec.id == "bus-submitted-chat"


def test_malformed_messages_go_to_the_dlq_and_services_carry_on(outside_inputs_run):
    assert outside_inputs_run.run.summary.ticks == 15
    assert {"koi.dlq.telemetry-ingest", "koi.dlq.causal-store"} <= outside_inputs_run.dead
    events = outside_inputs_run.dlq_events
    assert {e.service for e in events} >= {"telemetry-ingest", "causal-store"}


def test_redis_killed_mid_run_costs_nothing_but_speed(nats_for_run, own_valkey, tmp_path):
    cache = own_valkey()
    # the same reference as test_engine_metrics_bus's (computed once, bus_runs.in_process)
    local_decisions, _ = in_process(FAULT_HORIZON_S)

    def at_tick(tick: int, sup) -> None:
        if tick == 5 and cache.running:
            cache.kill()

    run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, FAULT_HORIZON_S,
                 cache.url).run(at_tick)
    assert not cache.running
    _assert_same(run.decisions, local_decisions)


@pytest.mark.parametrize("service", ALL)
def test_kill_9_any_service_mid_run(nats_for_run, redis_url, tmp_path, service):
    acks = []

    def at_tick(tick: int, sup) -> None:
        if tick == 2 and not acks:
            acks.append(jobs_pb2.JobAck.FromString(
                _request(nats_for_run, SUBMIT, encode_job(_job()))))
        if tick == 4 and sup.child(service).restarts == 0:
            sup.kill(service)

    run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, FAULT_HORIZON_S, redis_url,
                 extra_env={"KOI_STAGE_DEADLINE_S": "30"}).run(at_tick)
    assert acks and acks[0].accepted
    assert run.restarts[f"{service}-0"] >= 1, "the killed service was not restarted"
    assert run.summary.ticks == FAULT_TICKS
    assert "bus-submitted-chat" in run.summary.submitted_jobs


def _lease_holder(url: str) -> str:
    async def go() -> str:
        nc = await connect_nats(url)
        kv = await nc.jetstream().key_value(subjects.KV_LEASES)
        entry = await kv.get(subjects.KEY_PLACER_LEASE)
        await nc.close()
        return json.loads(entry.value)["holder"]
    return asyncio.run(go())


def test_standby_placer_takes_over_from_a_frozen_leader(nats_for_run, redis_url, tmp_path):
    frozen = []

    def at_tick(tick: int, sup) -> None:
        if tick == 3 and not frozen:
            holder = _lease_holder(nats_for_run)
            leader = next(c for c in sup.children
                          if c.service == "placer" and f"-{c.proc.pid}-" in holder)
            leader.proc.send_signal(signal.SIGSTOP)  # alive but silent: not restarted
            frozen.append(leader)

    try:
        run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, FAULT_HORIZON_S, redis_url,
                     replicas={"placer": 2}).run(at_tick)
    finally:
        for c in frozen:
            c.proc.send_signal(signal.SIGCONT)
    assert frozen and run.summary.ticks == FAULT_TICKS
    standby = 1 - frozen[0].replica
    log = (tmp_path / "logs" / f"placer-{standby}.log").read_text()
    assert "placer_leading" in log
    # it took over with the churn memory of the ticks its predecessor placed
    replayed = [int(m) for m in re.findall(r'replayed_ticks\W+(\d+)', log)]
    assert replayed and max(replayed) >= 1, log[-2000:]


def test_a_stage_past_its_deadline_degrades_the_tick_and_the_run_goes_on(
        nats_for_run, redis_url, tmp_path):
    paused = []

    def at_tick(tick: int, sup) -> None:
        if tick == 4 and not paused:
            ev = sup.child("evaluator")
            ev.proc.send_signal(signal.SIGSTOP)
            paused.append(ev)
            time.sleep(8.0)  # past the 3 s deadline: the placer keeps the last good plan
            ev.proc.send_signal(signal.SIGCONT)

    run = BusRun(nats_for_run, tmp_path / "logs", SCENARIO, 1, FAULT_HORIZON_S, redis_url,
                 extra_env={"KOI_STAGE_DEADLINE_S": "3"}).run(at_tick)
    assert run.summary.ticks == FAULT_TICKS
    degraded = [n for n, d in run.decisions.items() if "degraded" in d.notes]
    assert degraded, "no tick was degraded"
    events = [events_pb2.OperatorEvent.FromString(m.data) for m in
              _stored(nats_for_run, subjects.STREAM_EVENTS, "koi.events.*.degraded_tick")]
    assert any("last good plan" in e.message for e in events)
