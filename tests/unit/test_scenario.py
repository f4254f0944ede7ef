"""Unit tests for koi.scenario: the shipped scenarios' shapes, round trips, and every error
path naming the file, the line and the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from koi.catalog import load_catalog
from koi.errors import InvalidSpecError
from koi.jobs import BatchJob, OnlineJob
from koi.scenario import (
    format_duration,
    gpus_by,
    list_scenarios,
    load_scenario,
    parse_duration,
    parse_scenario,
    scenario_to_dict,
)
from koi.scenario.world import validate_world_overrides

CATALOG = load_catalog()
SHIPPED = ("hetero-3h", "hetero-12h", "homog-mixed-12h", "real-104", "trace-azure")


def _by(s, attribute: str) -> dict[str, int]:
    return gpus_by(s.fleet, attribute, CATALOG)


def _online(s) -> list[OnlineJob]:
    return [j for j in s.jobs if isinstance(j, OnlineJob)]


def _batch(s) -> list[BatchJob]:
    return [j for j in s.jobs if isinstance(j, BatchJob)]


# --- shipped scenarios -----------------------------------------------------------------

def test_list_scenarios_has_the_shipped_ones() -> None:
    assert set(SHIPPED) <= set(list_scenarios())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenario_loads_and_is_consistent(name: str) -> None:
    s = load_scenario(name)
    assert s.name == name
    assert len(s.description) > 200  # says what it exercises and how the world departs
    assert s.ticks * s.tick_s == pytest.approx(s.horizon_s)
    assert all(j.model in CATALOG.models for j in s.jobs)
    assert all(f.offering in CATALOG.offerings for f in s.fleet)
    assert all(j.submit_s < s.horizon_s for j in s.jobs)
    assert all(j.due_s <= s.horizon_s for j in _batch(s))
    assert s.world  # every shipped world departs from the defaults somewhere


def test_hetero_3h_shape() -> None:
    s = load_scenario("hetero-3h")
    assert (s.horizon_s, s.tick_s, s.total_gpus) == (3 * 3600, 60, 400)
    assert _by(s, "accelerator") == {"a100-40gb": 16, "a100-80gb": 72, "a10g": 40,
                                     "h100-sxm": 136, "h200": 48, "l4": 40, "l40s": 48}
    assert _by(s, "cloud") == {"aws": 200, "azure": 72, "gcp": 104, "lambda": 8, "runpod": 16}
    assert _by(s, "market") == {"on_demand": 232, "spot": 168}
    assert (len(_online(s)), len(_batch(s))) == (18, 7)
    assert len({j.model for j in s.jobs}) >= 5
    assert sum(j.submit_s > 0 for j in _online(s)) >= 3  # some arrive mid-run
    for j in _online(s):
        assert 0.5 <= j.arrival.mean_rate() <= 20
        assert 500 <= j.slo.ttft_ms <= 2000 and 50 <= j.slo.tpot_ms <= 100
    assert all(3600 <= j.deadline_s <= 3 * 3600 for j in _batch(s))


def test_hetero_12h_shape() -> None:
    s = load_scenario("hetero-12h")
    assert (s.horizon_s, s.tick_s, s.total_gpus) == (12 * 3600, 120, 800)
    assert len(_by(s, "accelerator")) >= 6 and len(_by(s, "cloud")) >= 3
    assert set(_by(s, "market")) == {"on_demand", "spot"}
    assert (len(_online(s)), len(_batch(s))) == (23, 14)
    diurnal = [j for j in _online(s) if j.arrival.kind == "diurnal"]
    assert len(diurnal) >= 15
    assert all(j.arrival.period_s in (12 * 3600, 24 * 3600) for j in diurnal)
    shocks = [e for e in s.capacity_events if e.delta_gpus < 0]
    assert len(shocks) >= 3
    start = {f.offering: f.gpus for f in s.fleet}
    for e in shocks:  # 25-50% of the offering, and it comes back later
        assert 0.25 <= -e.delta_gpus / start[e.offering] <= 0.5
        assert any(r.offering == e.offering and r.delta_gpus == -e.delta_gpus and r.t_s > e.t_s
                   for r in s.capacity_events)
    assert [e.t_s for e in s.capacity_events] == sorted(e.t_s for e in s.capacity_events)


def test_homog_mixed_12h_shape() -> None:
    s = load_scenario("homog-mixed-12h")
    assert s.horizon_s == 12 * 3600 and s.total_gpus == 256
    assert _by(s, "accelerator") == {"h100-sxm": 256}
    assert set(_by(s, "market")) == {"on_demand", "spot"}
    assert len(_online(s)) >= 5 and len(_batch(s)) >= 4


def test_real_104_shape() -> None:
    s = load_scenario("real-104")
    assert (s.horizon_s, s.total_gpus) == (3 * 3600, 104)
    assert _by(s, "accelerator") == {"a100-80gb": 16, "a10g": 16, "h100-sxm": 32, "l4": 16,
                                     "l40s": 24}
    assert (len(_online(s)), len(_batch(s))) == (10, 4)
    assert s.randomize_world and s.world["noise_sigma"] > 0


def test_trace_azure_replays_the_shared_traces() -> None:
    s = load_scenario("trace-azure")
    assert s.horizon_s == 2 * 3600 and s.total_gpus == 104
    assert s.jobs and all(j.arrival.kind == "trace" for j in _online(s))
    used = {Path(j.arrival.trace_path).name for j in _online(s)}
    assert used == {"azure_llm_2023_conv.csv", "azure_llm_2023_code.csv",
                    "mooncake_fast25_conversation.csv"}
    assert all(j.arrival.trace_path.startswith("shared:traces/") for j in _online(s))
    for j in _online(s):  # each replay fills the horizon
        assert j.arrival.loop or j.arrival.trace.duration_s * j.arrival.time_scale >= s.horizon_s


def test_world_validation_of_shipped_files() -> None:
    for name in SHIPPED:
        assert validate_world_overrides(load_scenario(name).world) == []


# --- round trips -----------------------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_dict(name: str) -> None:
    s = load_scenario(name)
    assert parse_scenario(scenario_to_dict(s), source=s.source) == s


@pytest.mark.parametrize("name", ["hetero-3h", "trace-azure"])
def test_round_trip_yaml_file(name: str, tmp_path: Path) -> None:
    s = load_scenario(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(scenario_to_dict(s), sort_keys=False), encoding="utf-8")
    assert load_scenario(path) == dataclasses.replace(s, source=str(path))


# --- the format ------------------------------------------------------------------------

BASE = """\
name: tiny
horizon: 3h
tick: 60s
seed: 7
fleet:
  - {offering: aws/us-east-1/h100-sxm/on_demand, gpus: 16}
  - {offering: aws/us-east-1/l4/spot, gpus: 4}
capacity_events:
  - {at: 1h, offering: aws/us-east-1/l4/spot, delta_gpus: -2, note: stock-out}
jobs:
  - id: chat
    model: llama-3.1-8b
    arrival: {rate_rps: 5}
    input_len: 800
    output_len: 200
    slo: {ttft_ms: 1000, tpot_ms: 50}
  - id: nightly
    model: llama-3.1-8b
    total_output_tokens: 1000000
    input_len: 1000
    output_len: 250
    deadline: 2h
    submit: 30m
"""


def _write(tmp_path: Path, text: str, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_base_scenario_and_sugar(tmp_path: Path) -> None:
    s = load_scenario(_write(tmp_path, BASE))
    assert (s.name, s.horizon_s, s.tick_s, s.seed, s.ticks) == ("tiny", 10800, 60, 7, 180)
    nightly = s.jobs[1]
    assert isinstance(nightly, BatchJob)
    assert (nightly.submit_s, nightly.deadline_s, nightly.due_s) == (1800, 7200, 9000)
    assert s.capacity_events[0].t_s == 3600 and s.capacity_events[0].note == "stock-out"
    assert (s.sample_fraction, s.randomize_world, s.world) == (None, False, {})  # None: the simulator picks


def test_compact_fleet_form_resolves_to_the_offering(tmp_path: Path) -> None:
    text = BASE.replace("{offering: aws/us-east-1/l4/spot, gpus: 4}",
                        "{cloud: aws, region: us-east-1, accelerator: l4, market: spot, gpus: 4}")
    s = load_scenario(_write(tmp_path, text))
    assert s.fleet[1].offering == "aws/us-east-1/l4/spot"
    assert scenario_to_dict(s)["fleet"][1] == {"offering": "aws/us-east-1/l4/spot", "gpus": 4}


@pytest.mark.parametrize(("text", "seconds"), [
    (3600, 3600.0), (2.5, 2.5), ("3h", 10800.0), ("90m", 5400.0), ("45s", 45.0),
    ("1h30m", 5400.0), ("1.5h", 5400.0), ("-3h", -10800.0), ("600", 600.0), ("250ms", 0.25)])
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["3 hours", "h", "", True, None, "1h-2m"])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration() -> None:
    assert [format_duration(x) for x in (10800, 5400, 45, 2.5, 7260)] == \
        ["3h", "1h30m", "45s", "2.5s", "2h1m"]


# --- errors name the file, the line and the field --------------------------------------

def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


ERRORS = [
    # (old, new, field path, words the reason must contain[, the line it must point at:
    # by default the first line of `new` that `old` lacks])
    ("{offering: aws/us-east-1/l4/spot, gpus: 4}", "{offering: aws/us-east-1/h100/spot, gpus: 8}",
     "fleet[1].offering", "unknown offering 'aws/us-east-1/h100/spot'; did you mean"
                          " aws/us-east-1/h100-sxm/spot?"),
    ("{offering: aws/us-east-1/l4/spot, gpus: 4}",
     "{cloud: aws, region: us-east-1, accelerator: h100-sx, market: spot, gpus: 8}",
     "fleet[1].accelerator", "did you mean h100-sxm?"),
    ("{offering: aws/us-east-1/l4/spot, gpus: 4}",
     "{cloud: aws, region: us-east-1, accelerator: mi300x, market: on_demand, gpus: 8}",
     "fleet[1].accelerator", "aws does not sell mi300x"),
    ("{offering: aws/us-east-1/l4/spot, gpus: 4}",
     "{cloud: aws, region: us-east-1, accelerator: l4, market: spott, gpus: 4}",
     "fleet[1].market", "did you mean spot?"),
    ("h100-sxm/on_demand, gpus: 16}", "h100-sxm/on_demand, gpus: 12}",
     "fleet[0].gpus", "not a whole number of aws/us-east-1/h100-sxm/on_demand instances"),
    ("h100-sxm/on_demand, gpus: 16}", "h100-sxm/on_demand, gpus: 0}", "fleet[0].gpus",
     "in 1..1,000,000"),
    ("h100-sxm/on_demand, gpus: 16}", "h100-sxm/on_demand, gpus: 1.0e+308}", "fleet[0].gpus",
     "in 1..1,000,000 (got 1e+308)"),
    ("delta_gpus: -2,", "delta_gpus: -8.0e+12,", "capacity_events[0].delta_gpus",
     "within ±1,000,000"),
    ("  - {offering: aws/us-east-1/l4/spot, gpus: 4}",
     "  - {offering: aws/us-east-1/l4/spot, gpus: 4}\n  - {offering: aws/us-east-1/l4/spot, gpus: 2}",
     "fleet[2].offering", "already in fleet[1]"),
    ("{at: 1h, offering: aws/us-east-1/l4/spot,", "{at: 1h, offering: gcp/us-central1/l4/spot,",
     "capacity_events[0].offering", "not in the fleet"),
    ("delta_gpus: -2,", "delta_gpus: -8,", "capacity_events[0].delta_gpus", "below 0"),
    ("{at: 1h,", "{at: 5h,", "capacity_events[0].at", "within the horizon"),
    ("rate_rps: 5}", "rate_rps: -3}", "jobs[0].arrival.rate_rps", "must be > 0 (got -3"),
    ("horizon: 3h", "horizon: -3h", "horizon", "must be > 0"),
    ("tick: 60s", "tick: -60s", "tick", "must be > 0"),
    ("tick: 60s", "tick: 7m", "tick", "does not divide the horizon 3h"),
    ("tick: 60s", "tick: soon", "tick", "not a duration"),
    ("  - id: nightly", "  - id: chat", "jobs[1].id", "duplicate job id 'chat' (also jobs[0])"),
    ("    submit: 30m", "    submit: 4h", "jobs[1].submit", "not before the horizon"),
    ("    submit: 30m", "    submit: 30m\n    submit_s: 60", "jobs[1].submit", "not both",
     "submit: 30m"),
    ("    deadline: 2h", "    deadline: -2h", "jobs[1].deadline", ">= 0"),
    ("    model: llama-3.1-8b\n    arrival", "    model: llama-3-8b\n    arrival",
     "jobs[0].model", "did you mean llama-3.1-8b?"),
    ("seed: 7", "seed: 7\ncolour: red", "colour", "unknown key"),
    ("seed: 7", "seed: 7\nseed: 8", "seed", "duplicate key"),
    ("seed: 7", "seed: -1", "seed", ">= 0"),
    ("seed: 7", "seed: 7\nsample_fraction: 1.5", "sample_fraction", "(0, 1]"),
]


@pytest.mark.parametrize(("old", "new", "field", "reason", "needle"),
                         [(*e, "") if len(e) == 4 else e for e in ERRORS],
                         ids=[f"{e[2]}:{e[3][:24]}" for e in ERRORS])
def test_error_names_file_line_and_field(tmp_path: Path, old: str, new: str, field: str,
                                         reason: str, needle: str) -> None:
    assert old in BASE
    text = BASE.replace(old, new, 1)
    path = _write(tmp_path, text)
    with pytest.raises(InvalidSpecError) as info:
        load_scenario(path)
    message = str(info.value)
    new_lines = new.splitlines()
    changed = next((i for i, s in enumerate(new_lines) if s not in old.splitlines()), 0)
    if needle:
        changed = next(i for i, s in enumerate(new_lines) if needle in s)
    line = BASE[:BASE.index(old)].count("\n") + 1 + changed
    assert message.startswith(f"{path} line {line}: {field}: "), message
    assert reason in message, message
    assert info.value.field == field


def test_missing_section_points_at_the_document(tmp_path: Path) -> None:
    text = BASE.split("capacity_events:")[0].replace("fleet:", "fleeet:")
    path = _write(tmp_path, text)
    with pytest.raises(InvalidSpecError, match=r"tiny.yaml line \d+: fleeet: unknown key; "
                                               r"did you mean fleet\?"):
        load_scenario(path)


def test_trace_with_bad_row_reports_trace_line_and_field(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOI_TRACES_DIR", str(tmp_path))  # traces resolve only there
    trace = tmp_path / "bad.csv"
    trace.write_text("ts_s,input_tokens,output_tokens\n0.0,100,20\n1.5,200,abc\n",
                     encoding="utf-8")
    job = ("  - id: replay\n    model: llama-3.1-8b\n    arrival: {trace: bad.csv, loop: true}\n"
           "    slo: {ttft_ms: 1000, tpot_ms: 50}\n")
    text = BASE + job
    path = _write(tmp_path, text)
    with pytest.raises(InvalidSpecError) as info:
        load_scenario(path)
    message = str(info.value)
    line = _line_of(text, "arrival: {trace: bad.csv")
    assert message.startswith(f"{path} line {line}: jobs[2].arrival.trace: "), message
    assert f"{trace.resolve()} line 3: output_tokens: not an integer" in message


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    text = BASE.replace("tick: 60s", "tick: [60s")
    path = _write(tmp_path, text)
    with pytest.raises(InvalidSpecError, match=rf"{path.name} line \d+: yaml: not valid YAML"):
        load_scenario(path)


def test_unknown_scenario_name_suggests_a_shipped_one() -> None:
    with pytest.raises(InvalidSpecError, match="did you mean hetero-3h"):
        load_scenario("hetero-3hh")


def test_missing_file() -> None:
    with pytest.raises(InvalidSpecError, match="scenario file not found"):
        load_scenario("/nonexistent/x.yaml")


def test_a_binary_scenario_file_is_refused_in_one_line(tmp_path: Path) -> None:
    # coverage-guided fuzzing found a non-UTF-8 byte raising UnicodeDecodeError
    path = tmp_path / "s.yaml"
    path.write_bytes(BASE.encode() + b"\x87")
    with pytest.raises(InvalidSpecError, match=r"is not UTF-8 text \(byte \d+; a binary"):
        load_scenario(path)


def test_a_scenario_file_over_a_mebibyte_is_refused_unparsed(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "#" * (1 << 20), encoding="utf-8")
    with pytest.raises(InvalidSpecError, match="the most a scenario file may hold"):
        load_scenario(path)


def test_parse_scenario_dict_errors_name_the_field() -> None:
    data = yaml.safe_load(BASE)
    data["fleet"][0]["gpus"] = 12
    with pytest.raises(InvalidSpecError, match=r"^<dict>: fleet\[0\]\.gpus: 12 is not a whole"):
        parse_scenario(data)
    del data["name"]
    data["fleet"][0]["gpus"] = 16
    with pytest.raises(InvalidSpecError, match="name: missing"):
        parse_scenario(data)


# --- world overrides -------------------------------------------------------------------

def test_world_errors_name_the_field(tmp_path: Path) -> None:
    for world, field in (("{noise_sigmaa: 0.1}", "world.noise_sigmaa"),
                         ("{engine_drift: {vllm: 99}}", "world.engine_drift.vllm")):
        text = BASE.replace("seed: 7", f"seed: 7\nworld: {world}")
        path = _write(tmp_path, text)
        with pytest.raises(InvalidSpecError) as info:
            load_scenario(path)
        assert str(info.value).startswith(f"{path} line {_line_of(text, 'world:')}: {field}: ")
