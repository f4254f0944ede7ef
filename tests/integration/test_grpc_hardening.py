"""planner-api's gRPC server under load and behind TLS and a bearer token.

* 200 WatchPlans streams at once: GetPlan and Health.Check still answer, and every
  watcher receives a new plan (the former 16-thread server answered neither).
* Streams over the documented cap are refused with RESOURCE_EXHAUSTED, unary calls
  unaffected, and a closed stream frees its place.
* TLS (certificates from ``services.runtime.security.ensure_pki``): a client trusting the
  CA gets answers, a plaintext client gets none.
* Bearer token: every rpc but health needs ``authorization: Bearer <token>``; the token
  shows in no log line and no repr.
* A plaintext health-only port (``health_addr``, for probes that cannot speak TLS):
  Health.Check answers there without a token, nothing else does, the main port still
  needs TLS and the token, and the shared status turns NOT_SERVING on graceful shutdown.

Servers run in process on 127.0.0.1:0; clients are ``grpc.aio`` inside
``asyncio.wait_for`` so that no wait is unbounded.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from koi.v1 import plan_pb2, plan_service_pb2, plan_service_pb2_grpc
from services.planner_api.grpc_security import BearerToken, client_channel, server_credentials
from services.planner_api.grpc_server import MAX_WATCHERS, PlanServer, serve
from services.planner_api.readmodel import ReadModel
from services.runtime.security import ensure_pki
from services.runtime.settings import ServiceSettings

pytestmark = pytest.mark.timeout(120)

Code = grpc.StatusCode
WATCHERS = 200
TOKEN = "tok-9f2c41d7e8b3a6055c1e"


def plan(tick: int) -> plan_pb2.ClusterPlan:
    return plan_pb2.ClusterPlan(tick=tick, source_tick=tick, solver="greedy")


def model_with_a_plan() -> ReadModel:
    model = ReadModel()
    model.on_plan(plan(1))
    return model


class Served:
    def __init__(self, model: ReadModel, server: PlanServer) -> None:
        self.model, self.server = model, server


@pytest.fixture
def served() -> Iterator[Served]:
    model = model_with_a_plan()
    running = serve(model, "127.0.0.1:0")
    yield Served(model, running)
    running.stop(grace=None)


async def until(predicate: object, timeout: float) -> bool:
    """Poll ``predicate()`` every 20 ms until true or ``timeout`` s have passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate() and loop.time() < end:  # type: ignore[operator]
        await asyncio.sleep(0.02)
    return bool(predicate())  # type: ignore[operator]


async def first_new_plan(stub: plan_service_pb2_grpc.PlanServiceStub,
                         opened: list[int]) -> int:
    """Open a WatchPlans stream and return the tick of the first plan it delivers."""
    call = stub.WatchPlans(plan_service_pb2.WatchPlansRequest())
    opened.append(1)
    try:
        async for resp in call:
            return resp.plan.tick
        return -1
    finally:
        call.cancel()


# --- defect 4: streams must not starve unary calls ------------------------------------

def test_200_watchers_leave_get_plan_and_health_answering(served: Served) -> None:
    server = served.server

    async def scenario() -> None:
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(10)]
        opened: list[int] = []
        watchers = [asyncio.create_task(first_new_plan(
            plan_service_pb2_grpc.PlanServiceStub(channels[i % 10]), opened))
            for i in range(WATCHERS)]
        try:
            registered = await until(lambda: served.model.watching == WATCHERS, 15)
            # the former server held 16 (its thread pool), the others queued behind them
            assert registered, f"{served.model.watching} of {WATCHERS} streams started"
            probe = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
            got = await plan_service_pb2_grpc.PlanServiceStub(probe).GetPlan(
                plan_service_pb2.GetPlanRequest(), timeout=5)
            assert got.plan.tick == 1
            health = await health_pb2_grpc.HealthStub(probe).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            await probe.close()
            served.model.on_plan(plan(2))  # from the feed's thread, as on the bus
            ticks = await asyncio.wait_for(asyncio.gather(*watchers), timeout=20)
            assert ticks == [2] * WATCHERS
        finally:
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            for c in channels:
                await c.close()
        assert await until(lambda: served.model.watching == 0, 10)

    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


def test_watchers_over_the_cap_are_refused_and_unary_calls_still_answer() -> None:
    running = serve(model_with_a_plan(), "127.0.0.1:0", max_watchers=3)

    async def scenario() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        stub = plan_service_pb2_grpc.PlanServiceStub(channel)
        calls = [stub.WatchPlans(plan_service_pb2.WatchPlansRequest(from_tick=0))
                 for _ in range(3)]
        for call in calls:  # each replays the held plan: the stream is open
            assert (await call.read()).plan.tick == 1
        extra = stub.WatchPlans(plan_service_pb2.WatchPlansRequest())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await extra.read()
        assert info.value.code() == Code.RESOURCE_EXHAUSTED
        assert "3 WatchPlans streams are open, the most this server holds (3)" in \
            info.value.details()
        got = await stub.GetPlan(plan_service_pb2.GetPlanRequest(), timeout=5)
        assert got.plan.tick == 1
        calls[0].cancel()
        assert await until(lambda: running.servicer.streams == 2, 10)
        again = stub.WatchPlans(plan_service_pb2.WatchPlansRequest(from_tick=0))
        assert (await again.read()).plan.tick == 1
        for call in (*calls[1:], again):
            call.cancel()
        await channel.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    finally:
        running.stop(grace=None)
    assert MAX_WATCHERS >= WATCHERS  # the default cap serves the load tested above


# --- defect 3: TLS and a bearer token ---------------------------------------------------

def get_plan(channel: grpc.Channel) -> int:
    stub = plan_service_pb2_grpc.PlanServiceStub(channel)
    return stub.GetPlan(plan_service_pb2.GetPlanRequest(), timeout=5).plan.tick


def test_tls_only_when_a_certificate_and_key_are_set(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    running = serve(model_with_a_plan(), "127.0.0.1:0",
                    credentials=server_credentials(str(pki.server_cert),
                                                   str(pki.server_key)))
    try:
        with client_channel(f"127.0.0.1:{running.port}", ca=pki.ca_cert) as channel:
            assert get_plan(channel) == 1
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as plain:
            with pytest.raises(grpc.RpcError) as info:
                get_plan(plain)
            assert info.value.code() == Code.UNAVAILABLE
    finally:
        running.stop(grace=None)


def test_tls_needs_both_files(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    assert server_credentials("", "") is None
    with pytest.raises(ValueError, match=re.escape("KOI_GRPC_TLS_CERT and KOI_GRPC_TLS_KEY go together")):
        server_credentials(str(pki.server_cert), "")
    with pytest.raises(ValueError, match=re.escape("KOI_GRPC_TLS_KEY '/nope/key.pem' cannot be read")):
        server_credentials(str(pki.server_cert), "/nope/key.pem")


def reflect(channel: grpc.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        list_services="")]), timeout=5)
    return [s.name for s in next(iter(reply)).list_services_response.service]


def test_bearer_token_guards_every_rpc_but_health(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    with structlog.testing.capture_logs() as logs:
        running = serve(model_with_a_plan(), "127.0.0.1:0", token=TOKEN,
                        credentials=server_credentials(str(pki.server_cert),
                                                       str(pki.server_key)))
        addr = f"127.0.0.1:{running.port}"
        try:
            for token in (None, "wrong", TOKEN + "x"):
                with client_channel(addr, ca=pki.ca_cert, token=token) as channel:
                    for call in (get_plan, reflect, lambda c: next(iter(
                            plan_service_pb2_grpc.PlanServiceStub(c).WatchPlans(
                                plan_service_pb2.WatchPlansRequest(from_tick=0), timeout=5)))):
                        with pytest.raises(grpc.RpcError) as info:
                            call(channel)
                        assert info.value.code() == Code.UNAUTHENTICATED, token
                        assert TOKEN not in (info.value.details() or "")
                    health = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=5)
                    assert health.status == health_pb2.HealthCheckResponse.SERVING
            with client_channel(addr, ca=pki.ca_cert, token=TOKEN) as channel:
                assert get_plan(channel) == 1
                assert "koi.v1.PlanService" in reflect(channel)
        finally:
            running.stop(grace=None)
    assert any(e["event"] == "rpc_unauthenticated" for e in logs)
    assert TOKEN not in repr(logs) and TOKEN not in repr(BearerToken(TOKEN))


def test_token_over_plaintext_and_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    settings = ServiceSettings.from_env({"KOI_GRPC_TOKEN_FILE": str(secret)})
    assert settings.grpc_token == TOKEN and TOKEN not in repr(settings)
    running = serve(model_with_a_plan(), "127.0.0.1:0", token=settings.grpc_token)
    try:
        with client_channel(f"127.0.0.1:{running.port}", token=TOKEN) as channel:
            assert get_plan(channel) == 1
        with client_channel(f"127.0.0.1:{running.port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                get_plan(channel)
            assert info.value.code() == Code.UNAUTHENTICATED
    finally:
        running.stop(grace=None)


@pytest.mark.parametrize(("environ", "text"), [
    ({"KOI_GRPC_TOKEN": TOKEN, "KOI_GRPC_TOKEN_FILE": "/x"},
     "set KOI_GRPC_TOKEN or KOI_GRPC_TOKEN_FILE, not both"),
    ({"KOI_GRPC_TOKEN_FILE": "/nope/token"}, "KOI_GRPC_TOKEN_FILE='/nope/token' cannot be read"),
])
def test_token_settings_errors_name_the_variable(environ: dict[str, str], text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(text)) as info:
        ServiceSettings.from_env(environ)
    assert TOKEN not in str(info.value)


# --- a plaintext health-only port beside the TLS + token one ---------------------------

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(channel: grpc.Channel, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5).status


def refused(call: object, channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(channel)  # type: ignore[operator]
    return info.value.code()


@pytest.fixture
def hardened(tmp_path: Path) -> Iterator[tuple[PlanServer, Path]]:
    """TLS and a token on the main port, a plaintext health-only port beside it."""
    pki = ensure_pki(tmp_path / "pki")
    running = serve(model_with_a_plan(), "127.0.0.1:0", token=TOKEN,
                    credentials=server_credentials(str(pki.server_cert),
                                                   str(pki.server_key)),
                    health_addr="127.0.0.1:0")
    yield running, pki.ca_cert
    running.stop(grace=None)


def test_the_health_port_answers_health_checks_in_plaintext_without_a_token(
        hardened: tuple[PlanServer, Path]) -> None:
    running, _ = hardened
    assert running.health_port not in (None, running.port)
    with grpc.insecure_channel(f"127.0.0.1:{running.health_port}") as plain:
        assert check(plain) == SERVING
        assert check(plain, "koi.v1.PlanService") == SERVING
        # health alone: no PlanService, no reflection, token or not
        assert refused(get_plan, plain) == Code.UNIMPLEMENTED
        assert refused(reflect, plain) == Code.UNIMPLEMENTED
    with client_channel(f"127.0.0.1:{running.health_port}", token=TOKEN) as with_token:
        assert refused(get_plan, with_token) == Code.UNIMPLEMENTED


def test_the_main_port_still_needs_tls_and_the_token(
        hardened: tuple[PlanServer, Path]) -> None:
    running, ca = hardened
    addr = f"127.0.0.1:{running.port}"
    with grpc.insecure_channel(addr) as plain:
        assert refused(get_plan, plain) == Code.UNAVAILABLE
        assert refused(check, plain) == Code.UNAVAILABLE
    with client_channel(addr, ca=ca) as no_token:
        assert refused(get_plan, no_token) == Code.UNAUTHENTICATED
        assert check(no_token) == SERVING
    with client_channel(addr, ca=ca, token=TOKEN) as channel:
        assert get_plan(channel) == 1


def test_the_health_port_turns_not_serving_on_graceful_shutdown(
        hardened: tuple[PlanServer, Path]) -> None:
    running, _ = hardened
    with grpc.insecure_channel(f"127.0.0.1:{running.health_port}") as plain:
        watch = health_pb2_grpc.HealthStub(plain).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=20)
        assert next(watch).status == SERVING
        stopping = threading.Thread(target=running.stop, args=(1.0,))
        stopping.start()
        try:
            assert next(watch).status == NOT_SERVING  # the main server's status, shared
        finally:
            stopping.join(timeout=15)
    assert not stopping.is_alive()
    with grpc.insecure_channel(f"127.0.0.1:{running.health_port}") as plain:
        assert refused(check, plain) == Code.UNAVAILABLE  # stopped with the main server
