"""``koi events follow`` against a real NATS: an undecodable message in the event stream
is skipped with a warning (it used to end the command), ``--json`` prints one parsable
object per event, ``--kind`` filters and refuses unknown kinds with the list."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from google.protobuf.message import DecodeError

from koi.v1 import events_pb2
from koi.wire.planning import make_event
from services import cli
from services.runtime.bus import Bus

GARBAGE = b"\xff\xff\xff\xff\xff"  # field 0x1fffffff with wire type 7: no protobuf


async def _emit(bus: Bus, i: int, kind: str, severity: str = "warning", **extra) -> None:
    await bus.emit(make_event(kind=kind, severity=severity, service="placer", tick=i,
                              message=f"m{i}", job_id=f"job-{i}", event_id=f"e{i}",
                              scenario_time_s=3723.0, **extra))


async def _three_with_garbage_between(bus: Bus) -> None:
    await _emit(bus, 1, "deferral", mechanism_ids=("mech-1",),
                attributes={"from": "l4", "to": "h100"})
    await bus.publish("koi.events.error.dlq", GARBAGE)
    await _emit(bus, 2, "slo_breach", severity="error")


async def _follow(nats_url: str, **kw) -> tuple[int, list[str], str]:
    out, err = io.StringIO(), io.StringIO()
    shown = await asyncio.wait_for(
        cli._follow(nats_url, None, "info", "all", False, out, err=err, **kw), 20)
    return shown, out.getvalue().splitlines(), err.getvalue()


@pytest.mark.asyncio
async def test_an_undecodable_event_is_skipped_with_a_warning(bus: Bus, nats_url: str,
                                                              capsys):
    with pytest.raises(DecodeError):
        events_pb2.OperatorEvent.FromString(GARBAGE)
    await _three_with_garbage_between(bus)
    out = io.StringIO()  # the warning goes to stderr by default
    shown = await asyncio.wait_for(cli._follow(nats_url, None, "info", "all", False, out), 20)
    lines, err = out.getvalue().splitlines(), capsys.readouterr().err
    assert shown == 2 and len(lines) == 2
    assert "m1" in lines[0] and "m2" in lines[1]
    assert "skipped undecodable event" in err and "sequence 2" in err
    assert "koi.events.error.dlq" in err


@pytest.mark.asyncio
async def test_json_lines_carry_every_field_and_the_clock(bus: Bus, nats_url: str):
    await _three_with_garbage_between(bus)
    shown, lines, _ = await _follow(nats_url, as_json=True)
    assert shown == 2
    first, second = (json.loads(line) for line in lines)
    assert set(events_pb2.OperatorEvent.DESCRIPTOR.fields_by_name) <= set(first)
    assert first["kind"] == "deferral" and first["severity"] == "warning"
    assert first["tick"] == 1 and first["job_id"] == "job-1" and first["event_id"] == "e1"
    assert first["mechanism_ids"] == ["mech-1"] and first["attributes"]["to"] == "h100"
    assert first["clock"] == "01:02:03" and first["scenario_time_s"] == 3723.0
    assert first["service"] == "placer" and first["time"]  # emit sets the wall clock
    assert second["kind"] == "slo_breach" and second["severity"] == "error"


@pytest.mark.asyncio
async def test_kind_filters_repeated_or_comma_separated(bus: Bus, nats_url: str):
    await _three_with_garbage_between(bus)
    await _emit(bus, 3, "service")
    kinds = cli.parse_kinds(["slo_breach"])
    shown, lines, _ = await _follow(nats_url, kinds=kinds)
    assert shown == 1 and "slo_breach" in lines[0]
    kinds = cli.parse_kinds(["service,deferral"])
    assert kinds == cli.parse_kinds(["service", "deferral"])
    shown, lines, _ = await _follow(nats_url, kinds=kinds)
    assert shown == 2 and "m1" in lines[0] and "m3" in lines[1]


def test_an_unknown_kind_is_refused_with_the_list():
    with pytest.raises(SystemExit, match=r"unknown; known: admission, .*slo_breach.*service"):
        cli.events_follow("nats://127.0.0.1:1", None, "info", "all", False,
                          ["slo_breach,nope"])
    with pytest.raises(ValueError, match="'unspecified'"):
        cli.parse_kinds(["unspecified"])
