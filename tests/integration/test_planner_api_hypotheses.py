"""planner-api's Explain with the language-model hypotheses that concern the job.

Two ways in: the read model fed hand-built ``HypothesisRound``s and asked through a real
gRPC channel (which hypotheses concern a job, in force or not, newest first, bounded);
and the service itself (``services.planner_api.main.run``) on real NATS, following
``koi.tick.*.hypotheses`` from the stream, asked over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from test_planner_api import CATALOG, Running, fed_model, placed, plan

from koi import subjects
from koi.catalog import load_catalog
from koi.rlm.hypothesis import Dropped
from koi.rlm.loop import RoundOutcome
from koi.v1 import plan_service_pb2, plan_service_pb2_grpc
from koi.wire.hypotheses import encode_hypotheses, hypotheses_to_proto
from services.planner_api.hypotheses import HypothesisBook
from services.planner_api.main import run as run_planner_api
from services.runtime.app import ServiceContext
from services.runtime.settings import ServiceSettings
from support import rlm_fleet as F

pytestmark = pytest.mark.timeout(60)


def _hypothesis(job: str, accelerator: str = "h100-sxm", expires: int = 30, **claim):
    """A parsed, accepted hypothesis naming ``job`` in its test."""
    from koi.rlm.hypothesis import parse_hypothesis

    doc = F.hypothesis_doc(expires_tick=expires, **claim)
    doc["test"] = {"configs": [{"job_id": job, "config": {"accelerator": accelerator,
                                                           "tp": 1, "max_num_seqs": 96}}]}
    jobs = {j.id: j for j in F.snapshot().jobs}
    h = parse_hypothesis(doc, jobs=jobs, catalog=load_catalog(), source_model="qwen-test",
                         round_id="r5-abc")
    assert not isinstance(h, str), h
    return h


def _round(round_id: str, enters: int, accepted=(), dropped=()) -> RoundOutcome:
    return RoundOutcome(enters_tick=enters, round_id=round_id, round_tick=enters - 1,
                        model="qwen-test", ok=True, hypotheses=tuple(accepted),
                        dropped=tuple(dropped), triggers=("first round",))


def test_explain_lists_the_hypotheses_that_concern_the_job() -> None:
    model = fed_model()  # chat-a placed on h100-sxm vllm (llama-3.1-8b) at ticks 6 and 7
    tested = _hypothesis("chat-a", expires=30)
    # another job's test, but its scope {l4, vllm, ≤10B} does not cover chat-a's H100
    elsewhere = _hypothesis("chat-b", accelerator="l4")
    # scope {h100-sxm, vllm, ≤10B} covers chat-a's configuration: listed "by scope"
    covering = _hypothesis("chat-b", scope={"accelerator": "h100-sxm", "engine": "vllm",
                                            "size_class": "<=10B"})
    expired = _hypothesis("chat-a", expires=7, size=1.3)
    model.hypotheses.on_round(hypotheses_to_proto(_round("r3-abc", 4, [expired])))
    model.hypotheses.on_round(hypotheses_to_proto(_round(
        "r5-abc", 6, [tested, elsewhere, covering],
        [Dropped(3, "scope names accelerator 'h900', which the catalog does not have"
                    " (hallucinated accelerator)", "h-1", ("chat-a",), "kv_pressure → tpot"),
         Dropped(4, "claim.size must be a number", job_ids=("chat-b",))])))
    model.hypotheses.on_round(hypotheses_to_proto(_round("r9-abc", 10, [
        _hypothesis("chat-a", size=1.8)])))  # enters after the explained tick
    api = Running(model)
    try:
        resp = api.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-a"), timeout=5)
    finally:
        api.close()
    got = [(h.round_id, h.accepted, h.relation, h.in_force) for h in resp.hypotheses]
    assert got == [("r9-abc", True, "test", False),
                   ("r5-abc", True, "test", True), ("r5-abc", True, "scope", True),
                   ("r5-abc", False, "test", False),
                   ("r3-abc", True, "test", False)]  # expired at tick 7
    h = resp.hypotheses[1]
    assert (h.model, h.round_tick, h.enters_tick) == ("qwen-test", 5, 6)
    assert h.hypothesis.source_model == "qwen-test" and h.hypothesis.id == tested.id
    assert (h.hypothesis.edge.cause, h.hypothesis.edge.effect) == ("kv_pressure", "tpot")
    assert (h.hypothesis.direction, h.hypothesis.size) == ("increase", 1.5)
    assert h.hypothesis.scope.accelerator == "l4" and h.hypothesis.expires_tick == 30
    assert [(t.job_id, t.config.accelerator, t.config.max_num_seqs)
            for t in h.hypothesis.tests] == [("chat-a", "h100-sxm", 96)]
    d = resp.hypotheses[3].dropped
    assert d.index == 3 and "hallucinated accelerator" in d.reason and d.claim
    assert f"model hypothesis {tested.id} (qwen-test, round r5-abc, in force" in resp.summary
    assert "dropped model hypothesis #3 of round r5-abc (qwen-test): scope names" in resp.summary


def test_explain_without_rounds_has_no_hypotheses_and_the_book_is_bounded() -> None:
    api = Running(fed_model())
    try:
        resp = api.stub.Explain(plan_service_pb2.ExplainRequest(job_id="chat-a"), timeout=5)
    finally:
        api.close()
    assert not resp.hypotheses and "model hypothesis" not in resp.summary
    book = HypothesisBook(max_rounds=3)
    for n in range(5):
        book.on_round(hypotheses_to_proto(_round(f"r{n}-x", n + 1, [_hypothesis("chat-a")])))
    book.on_round(hypotheses_to_proto(_round("r4-x", 5, [_hypothesis("chat-a")])))  # again
    assert book.rounds == 3
    assert [j.round_id for j in book.for_job("chat-a", 9)] == ["r4-x", "r3-x", "r2-x"]


@pytest.mark.asyncio
async def test_the_service_follows_the_rounds_on_the_bus_into_explain(bus, nats_url) -> None:
    settings = ServiceSettings.from_env({"KOI_NATS_URL": nats_url,
                                         "KOI_GRPC_ADDR": "127.0.0.1:0"})
    ctx = ServiceContext("planner-api", settings, bus, CATALOG)
    data = encode_hypotheses(_round("r5-abc", 6, [_hypothesis("chat-a")], [
        Dropped(1, "expired: expires at tick 4, now is tick 5", "h-2", ("chat-a",))]))
    await bus.publish(subjects.tick_subject(7, "plan"),
                      plan(7, placed("chat-a")).SerializeToString(), msg_id="plan-7")
    await bus.publish(subjects.tick_subject(6, subjects.HYPOTHESES), data, msg_id="h-r5")
    task = asyncio.create_task(run_planner_api(ctx))
    resp = None
    try:
        deadline = time.monotonic() + 20
        while (got := await bus.kv_get(subjects.KV_PLAN, "planner-api")) is None:
            assert time.monotonic() < deadline, "planner-api never published its address"
            await asyncio.sleep(0.1)
        async with grpc.aio.insecure_channel(got[0].decode()) as channel:
            stub = plan_service_pb2_grpc.PlanServiceStub(channel)
            while resp is None or not resp.hypotheses:
                assert time.monotonic() < deadline, "Explain never showed the hypotheses"
                await asyncio.sleep(0.1)
                with contextlib.suppress(grpc.aio.AioRpcError):  # NOT_FOUND until the plan
                    resp = await stub.Explain(
                        plan_service_pb2.ExplainRequest(job_id="chat-a"), timeout=5)
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, 10)
    assert [(h.accepted, h.relation, h.in_force) for h in resp.hypotheses] == [
        (True, "test", True), (False, "test", False)]
    assert resp.hypotheses[1].dropped.reason.startswith("expired")
    assert resp.hypotheses[1].dropped.job_ids == ["chat-a"]
