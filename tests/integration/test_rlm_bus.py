"""The hypothesis layer on the bus: every service as its own process, real NATS, the
proposer pointed at a loopback model server that answers (a scripted valid hypothesis)
only once the simulator has finished three ticks — the stronger form of "a slow model
never slows a tick": were a tick waiting for the round, the answer would never come.
Tied to ticks rather than to a fixed 5 s, it holds on a fast machine and a loaded one
alike. The round's hypotheses are published on ``koi.tick.<n>.hypotheses`` with its
events, widen a later tick's candidates, show in planner-api's gRPC Explain of the job
(asked mid-run, the service its own process), and its transcript replays."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest

from koi import subjects
from koi.catalog import load_catalog
from koi.rlm.record import replay_text
from koi.v1 import events_pb2, plan_service_pb2, plan_service_pb2_grpc
from koi.wire import planning
from koi.wire.hypotheses import decode_hypotheses
from services.runtime.bus import Bus
from services.runtime.busrun import BusRun
from services.runtime.security import connect_nats
from support import rlm_fleet as F
from support.bus_runs import stored_messages
from support.openai_replay import ReplayServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HORIZON_S = 480.0   # 8 ticks: the answer comes after tick 2 and enters tick 4 or 5
GATE_TICKS = 3      # ticks the simulator finishes before the model answers
JOB = "chat-us-8b"  # hetero-3h, llama-3.1-8b, active from tick 0
HYPOTHESIS = F.hypothesis_doc(
    expires_tick=60, why=[f"residual:{JOB}/tpot_p95"], test={"configs": [{"job_id": JOB, "config": {
        "accelerator": "l4", "tp": 1, "max_num_seqs": 96}}]})
# a part no catalog has: dropped, with the reason, and still about the job
HALLUCINATED = F.hypothesis_doc(
    expires_tick=60, why=[f"residual:{JOB}/tpot_p95"], scope={"accelerator": "h900"}, test={"configs": [{"job_id": JOB, "config": {
        "accelerator": "l4", "tp": 1, "max_num_seqs": 64}}]})


async def _planner_api(url: str) -> str:
    nc = await connect_nats(url)
    try:
        got = await Bus(nc, "test").kv_get(subjects.KV_PLAN, "planner-api")
        return got[0].decode()
    finally:
        await nc.close()


def _explain_with_hypotheses(url: str, deadline_s: float = 20.0):
    """gRPC Explain of JOB, asked until it lists hypotheses (or the deadline passes)."""
    deadline = time.monotonic() + deadline_s
    with grpc.insecure_channel(asyncio.run(_planner_api(url))) as channel:
        stub = plan_service_pb2_grpc.PlanServiceStub(channel)
        while True:
            try:
                resp = stub.Explain(plan_service_pb2.ExplainRequest(job_id=JOB), timeout=5)
                if resp.hypotheses or time.monotonic() > deadline:
                    return resp
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


def test_a_slow_round_never_holds_a_tick_and_its_hypotheses_enter_a_later_one(
        nats_for_run, tmp_path) -> None:
    gate = threading.Event()
    script = [{"wait": gate, "wait_s": 120,
               "content": json.dumps({"hypotheses": [HYPOTHESIS, HALLUCINATED]})}]
    explained: list = []

    def on_tick(done: int, sup) -> None:  # ticks the simulator has finished
        if done >= GATE_TICKS:
            gate.set()
        if done >= GATE_TICKS + 3 and not explained:
            explained.append(_explain_with_hypotheses(nats_for_run))

    env = {"KOI_RLM_BASE_URL": "", "KOI_RLM_MODEL": "replay-model",
           "KOI_RLM_COOLDOWN_TICKS": "1000",  # one round: the first tick's
           "KOI_RLM_TRANSCRIPTS": str(tmp_path / "rlm")}
    with ReplayServer(script) as srv:
        env["KOI_RLM_BASE_URL"] = srv.base_url
        run = BusRun(nats_for_run, tmp_path / "logs", "hetero-3h", 1, HORIZON_S,
                     extra_env=env).run(on_tick)
        asked_at = srv.requests[0]["at"] if srv.requests else None
    ticks = run.summary.ticks
    assert asked_at is not None and len(run.decisions) == ticks

    ticks_stream = asyncio.run(stored_messages(nats_for_run, "koi.tick.>"))
    seq = {s: n for s, n, _ in ticks_stream}
    rounds = [(s, n, decode_hypotheses(d)) for s, n, d in ticks_stream
              if s.endswith(".hypotheses")]
    assert len(rounds) == 1, [s for s, _, _ in rounds]
    subject, round_seq, outcome = rounds[0]
    assert outcome.ok and outcome.round_tick == 0 and "first round" in outcome.triggers
    assert [t.job_id for h in outcome.hypotheses for t in h.tests] == [JOB]
    assert subjects.tick_of(subject) == outcome.enters_tick > outcome.round_tick
    # the round's own tick and the next ones were planned while the model thought
    for tick in range(outcome.round_tick, GATE_TICKS):
        for stage in ("candidates", "plan", "actions"):
            assert seq[subjects.tick_subject(tick, stage)] < round_seq, (tick, stage)
    # and the ticks after it: the hypothesis's configuration is among their candidates
    hid = outcome.hypotheses[0].id
    widened = [subjects.tick_of(s) for s, _, d in ticks_stream if s.endswith(".candidates")
               and any(hid in p.hypothesis for p in planning.decode_candidates(d)[2])]
    assert widened and min(widened) >= outcome.enters_tick
    assert outcome.enters_tick < ticks - 1, "the round ended too late to be taken up"

    events = [events_pb2.OperatorEvent.FromString(d)
              for _, _, d in asyncio.run(stored_messages(nats_for_run, "koi.events.>"))]
    mine = [(e.attributes.get("phase") or e.attributes.get("verdict"), e.service)
            for e in events if e.kind in (events_pb2.EVENT_KIND_RLM_ROUND,
                                          events_pb2.EVENT_KIND_HYPOTHESIS)]
    assert mine == [("started", "proposer"), ("finished", "proposer"),
                    ("accepted", "proposer"), ("dropped", "proposer")]
    (dropped,) = [e for e in events if e.attributes.get("verdict") == "dropped"]
    assert dropped.job_id == JOB and "hallucinated accelerator" in dropped.attributes["reason"]

    # planner-api's gRPC Explain, asked mid-run, listed both for the job
    (resp,) = explained
    assert [(h.accepted, h.relation, h.round_id) for h in resp.hypotheses] == [
        (True, "test", outcome.round_id), (False, "test", outcome.round_id)]
    accepted, refused = resp.hypotheses
    assert accepted.hypothesis.id == hid and accepted.model == "replay-model"
    assert accepted.hypothesis.tests[0].config.accelerator == "l4"
    assert accepted.hypothesis.expires_tick == 60 and accepted.enters_tick == outcome.enters_tick
    assert "hallucinated accelerator" in refused.dropped.reason
    assert f"model hypothesis {hid}" in resp.summary

    (path,) = (tmp_path / "rlm").glob("*.jsonl")
    rec, again = replay_text(path.read_text(), load_catalog())
    assert again.ok and [h.id for h in again.hypotheses] == [hid]
    assert rec.recorded_end["accepted"] == [hid]
