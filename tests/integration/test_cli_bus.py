"""The bus side of the CLI against a real NATS: ``koi submit``, ``koi events follow``,
``koi serve`` with a bad name."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from koi import subjects
from koi.v1 import jobs_pb2
from koi.wire.planning import make_event
from services import cli
from services.runtime.bus import Bus

JOB = "examples/jobs/chat-online.yaml"


async def _answer(bus: Bus, ack: jobs_pb2.JobAck, seen: list) -> None:
    async def reply(msg) -> None:
        seen.append(jobs_pb2.JobSpec.FromString(msg.data))
        await msg.respond(ack.SerializeToString())

    await bus.nc.subscribe(subjects.JOBS_SUBMIT_ANY, cb=reply)
    await bus.nc.flush()


@pytest.mark.asyncio
async def test_submit_prints_the_ack_and_exits_zero(bus: Bus, nats_url: str, capsys):
    seen: list = []
    await _answer(bus, jobs_pb2.JobAck(accepted=True, job_id="chat-online", tick=3), seen)
    code = await cli._submit(Path(JOB), nats_url, 5.0,
                             cli.Console(file=io.StringIO()))
    assert code == 0
    assert seen and seen[0].id and seen[0].model


@pytest.mark.asyncio
async def test_submit_rejected_exits_one_with_the_reason(bus: Bus, nats_url: str):
    await _answer(bus, jobs_pb2.JobAck(accepted=False, job_id="x", reason="bad SLO",
                                       field="online.slo.ttft_ms"), [])
    out = io.StringIO()
    code = await cli._submit(Path(JOB), nats_url, 5.0,
                             cli.Console(file=out, width=200))
    assert code == 1
    assert "bad SLO" in out.getvalue() and "online.slo.ttft_ms" in out.getvalue()


@pytest.mark.asyncio
async def test_submit_with_nobody_listening_gives_up_with_a_message(bus: Bus, nats_url: str):
    out = io.StringIO()
    code = await cli._submit(Path(JOB), nats_url, 1.0,
                             cli.Console(file=out, width=200))
    assert code == 1 and "no answer" in out.getvalue()


@pytest.mark.asyncio
async def test_events_follow_filters_by_severity_and_job(bus: Bus, nats_url: str):
    for i, (sev, job) in enumerate([("info", "a"), ("warning", "a"), ("error", "b")]):
        await bus.emit(make_event(kind="deferral", severity=sev, service="placer",
                                  message=f"m{i}", tick=i, job_id=job, event_id=f"e{i}",
                                  mechanism_ids=("mech-1",) if i == 2 else ()))
    out = io.StringIO()
    shown = await cli._follow(nats_url, None, "warning", "all", False, out)
    lines = out.getvalue().splitlines()
    assert shown == 2 and len(lines) == 2
    assert "WARNING" in lines[0] and "m1" in lines[0]
    assert "ERROR" in lines[1] and "[mech-1]" in lines[1]
    out = io.StringIO()
    assert await cli._follow(nats_url, "a", "debug", "all", False, out) == 2


def test_parse_since():
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert cli.parse_since("10m", now) == now - timedelta(minutes=10)
    assert cli.parse_since("2h", now) == now - timedelta(hours=2)
    assert cli.parse_since("all", now) is None
    assert cli.parse_since("2026-01-01T11:00:00", now) == datetime(2026, 1, 1, 11, tzinfo=UTC)
    with pytest.raises(ValueError, match="--since"):
        cli.parse_since("yesterday", now)


def test_serve_unknown_service_names_the_known_ones():
    with pytest.raises(SystemExit, match="known: sim"):
        cli.serve("nope")


@pytest.mark.asyncio
async def test_the_sim_refuses_to_carry_on_another_run(bus: Bus):
    from types import SimpleNamespace as NS

    from services.sim.main import claim_run

    def ctx(seed: int):
        return NS(settings=NS(seed=seed), bus=bus)

    sim = NS(scenario=NS(name="hetero-3h", horizon_s=900.0), fraction=0.5)
    await claim_run(ctx(1), sim)
    await claim_run(ctx(1), sim)  # the same run again (a restart): fine
    with pytest.raises(SystemExit, match="holds another run"):
        await claim_run(ctx(2), sim)
