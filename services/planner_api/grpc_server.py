"""planner-api's gRPC face: the ``koi.v1.PlanService`` servicer over a ``ReadModel``,
and ``serve``, which starts it (``grpc.aio``) with health checking and reflection.

``PlanQueries`` checks each request (INVALID_ARGUMENT naming the field and the rule or
bound broken), asks the read model, pages, and renders explanations; the read model's
``NotFound`` / ``InvalidQuery`` / ``FailedPrecondition`` become the matching status
codes, and any other exception becomes INTERNAL (logged), never an unhandled error.

The server is asynchronous so that open WatchPlans streams cost a coroutine each, not a
thread: with the former 16-thread pool, 16 watchers left no thread for GetPlan or the
health checks a liveness probe makes. It runs on its own event loop thread, so a burst
of bus replay in the service's main loop cannot delay a health check either; what-if
predictions and job listings run on a small worker pool off that loop. Streams are capped
(``MAX_WATCHERS``, RESOURCE_EXHAUSTED beyond). TLS and a bearer token are optional
(``grpc_security``); an optional second, plaintext listener serves health checks alone
(same status) for probes that cannot speak TLS. No NATS code and no planning logic here.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from koi.jobs.bounds import (
    MAX_HORIZON_S,
    MAX_ID_LEN,
    MAX_RATE_RPS,
    MAX_REQUEST_TOKENS,
    MAX_TPOT_MS,
    MAX_TTFT_MS,
)
from koi.v1 import plan_service_pb2, plan_service_pb2_grpc, prediction_pb2
from services.planner_api.grpc_security import BearerToken
from services.planner_api.hypotheses import summary_lines as hypothesis_lines
from services.planner_api.readmodel import (
    FailedPrecondition,
    InvalidQuery,
    NotFound,
    QueryError,
    ReadModel,
)
from services.planner_api.render import (
    decode_token,
    encode_token,
    explain_summary,
    select_mechanisms,
)
from services.planner_api.watch import PlanWatch

log = structlog.get_logger(__name__)

SERVICE_NAME = plan_service_pb2.DESCRIPTOR.services_by_name["PlanService"].full_name
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
JOB_KINDS = ("", "online", "batch")
# Open WatchPlans streams one server holds; one more is refused with RESOURCE_EXHAUSTED.
# A stream costs a coroutine and a queue of shared plan references (~10 KiB measured).
MAX_WATCHERS = 1000
# Largest request accepted (the biggest, a WhatIf, is a few hundred bytes).
MAX_REQUEST_BYTES = 64 * 1024
MAX_PAGE_TOKEN_LEN = 1024
QUERY_THREADS = 4  # what-if predictions at once; more wait their turn
HEALTH_STOP_GRACE_S = 1.0  # the most the health-only listener waits for its streams
# WhatIf workload bounds: the physical bounds jobs are admitted with (koi.jobs.bounds).
# A request/s load is bounded by a job's rate; clients, batch or burst sizes by the
# requests a minute at that rate brings (what the simulator materialises per tick).
MAX_REQUESTS_IN_FLIGHT = MAX_RATE_RPS * 60
_LOAD_BOUND = {prediction_pb2.LOAD_MODE_RATE: (MAX_RATE_RPS, "requests/s")}
_WORKLOAD_BOUNDS = {"input_len_tokens": MAX_REQUEST_TOKENS,
                    "output_len_tokens": MAX_REQUEST_TOKENS,
                    "window_s": MAX_HORIZON_S, "slo_ttft_ms": MAX_TTFT_MS,
                    "slo_tpot_ms": MAX_TPOT_MS}
_CODES: dict[type[QueryError], grpc.StatusCode] = {
    InvalidQuery: grpc.StatusCode.INVALID_ARGUMENT, NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION}
_LAGGED = ("this watcher fell too far behind the plans; watch again with from_tick set to"
           " the last tick received + 1")


def _status(e: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(e, QueryError):
        return _CODES.get(type(e), grpc.StatusCode.INVALID_ARGUMENT), str(e)
    log.exception("rpc_failed", rpc=rpc)
    return grpc.StatusCode.INTERNAL, f"{rpc} failed inside planner-api ({type(e).__name__})"


def _tick(request: Any, field: str = "tick") -> int | None:
    """An optional tick field: None when absent; negative is invalid."""
    if not request.HasField(field):
        return None
    value = getattr(request, field)
    if value < 0:
        raise InvalidQuery(f"{field} must be >= 0 (got {value})")
    return int(value)


def _job_id(value: str, field: str = "job_id") -> str:
    if not value:
        raise InvalidQuery(f"{field} is required (got an empty string)")
    if len(value) > MAX_ID_LEN:  # no job has a longer id: admission refuses it
        raise InvalidQuery(f"{field} must be at most {MAX_ID_LEN} characters"
                           f" (got {len(value)})")
    return value


def check_workload(w: prediction_pb2.Workload, field: str = "workload") -> None:
    """Every numeric field of a what-if workload within its physical bound (NaN, lower
    bounds and the mode are ``workload_from_proto``'s to refuse)."""
    for name, bound in _WORKLOAD_BOUNDS.items():
        value = getattr(w, name)
        if value > bound:
            raise InvalidQuery(f"{field}.{name} must be <= {bound:g} (got {value:g})")
    bound, unit = _LOAD_BOUND.get(w.mode, (MAX_REQUESTS_IN_FLIGHT, "requests"))
    if w.load > bound:
        raise InvalidQuery(f"{field}.load must be <= {bound:g} {unit} (got {w.load:g})")


class PlanQueries:
    """Every unary rpc of ``koi.v1.PlanService`` as a plain call: request in, response
    out, ``QueryError`` for a request that cannot be answered. Thread-safe."""

    def __init__(self, model: ReadModel) -> None:
        self._model = model

    def GetPlan(self, request: plan_service_pb2.GetPlanRequest
                ) -> plan_service_pb2.GetPlanResponse:
        return plan_service_pb2.GetPlanResponse(plan=self._model.plan(_tick(request)))

    def GetJob(self, request: plan_service_pb2.GetJobRequest) -> plan_service_pb2.GetJobResponse:
        return plan_service_pb2.GetJobResponse(job=self._model.job(_job_id(request.job_id)))

    def ListJobs(self, request: plan_service_pb2.ListJobsRequest
                 ) -> plan_service_pb2.ListJobsResponse:
        if request.state not in plan_service_pb2.JobState.values():
            raise InvalidQuery(f"state {request.state} is not a JobState")
        if request.kind not in JOB_KINDS:
            raise InvalidQuery(f"kind must be 'online', 'batch' or '' for both"
                               f" (got {request.kind[:32]!r})")
        if request.page_size < 0:
            raise InvalidQuery(f"page_size must be >= 0 (got {request.page_size})")
        if len(request.page_token) > MAX_PAGE_TOKEN_LEN:
            raise InvalidQuery(f"page_token must be at most {MAX_PAGE_TOKEN_LEN} characters")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        listing = f"{request.state}|{request.kind}"
        after = decode_token(request.page_token, listing) if request.page_token else None
        jobs = [j for j in self._model.jobs(request.state, request.kind)
                if after is None or j.spec.id > after]
        page = jobs[:size]
        token = encode_token(page[-1].spec.id, listing) if len(jobs) > size else ""
        return plan_service_pb2.ListJobsResponse(jobs=page, next_page_token=token)

    def Explain(self, request: plan_service_pb2.ExplainRequest
                ) -> plan_service_pb2.ExplainResponse:
        job_id = _job_id(request.job_id)
        tick, decision, version = self._model.decision(job_id, _tick(request))
        causal = self._model.causal_state()
        ids = list(dict.fromkeys(decision.explanation.mechanism_ids))
        known = {m.id: m for m in causal.mechanisms} if causal is not None else {}
        others, why_none = self._model.alternatives(tick, decision)
        hypotheses = self._model.hypotheses.for_job(job_id, tick, decision,
                                                    self._model.catalog)
        summary = "\n".join([explain_summary(tick, decision, known, causal),
                             *([why_none] if why_none else []),
                             *hypothesis_lines(hypotheses)])
        return plan_service_pb2.ExplainResponse(
            tick=tick, decision=decision, causal_state_version=version, summary=summary,
            mechanisms=[known[i] for i in ids if i in known], alternatives=others,
            hypotheses=hypotheses)

    def WhatIf(self, request: plan_service_pb2.WhatIfRequest
               ) -> plan_service_pb2.WhatIfResponse:
        if not request.HasField("config"):
            raise InvalidQuery("config is required")
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidQuery("target is required: set workload or job_id")
        if target == "job_id":
            return self._model.what_if(request.config, job_id=_job_id(request.job_id))
        check_workload(request.workload)
        return self._model.what_if(request.config, workload=request.workload)

    def ListMechanisms(self, request: plan_service_pb2.ListMechanismsRequest
                       ) -> plan_service_pb2.ListMechanismsResponse:
        floor = request.min_confidence
        if not (math.isfinite(floor) and 0.0 <= floor <= 1.0):
            raise InvalidQuery(f"min_confidence must be in [0, 1] (got {floor})")
        causal = self._model.causal_state()
        if causal is None:  # an empty playbook is an answer, not an error
            return plan_service_pb2.ListMechanismsResponse(causal_state_version=0)
        return plan_service_pb2.ListMechanismsResponse(
            causal_state_version=causal.version,
            mechanisms=select_mechanisms(causal, request.scope, request.include_retired,
                                         floor))


# Unary rpcs that call the predictor or copy every job: off the event loop (where health
# checks and streams run), on the query pool. The others are a lookup under a lock.
_OFFLOADED = frozenset({"Explain", "WhatIf", "ListJobs"})


def _sync_rpc(name: str) -> Callable[..., Any]:
    def rpc(self: PlanServiceServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return getattr(self.queries, name)(request)
        except Exception as e:
            code, message = _status(e, name)
        context.abort(code, message)
    rpc.__name__ = name
    return rpc


def _async_rpc(name: str) -> Callable[..., Any]:
    async def rpc(self: AsyncPlanServiceServicer, request: Any,
                  context: grpc.aio.ServicerContext) -> Any:
        call = getattr(self.queries, name)
        try:
            if name in _OFFLOADED:
                return await asyncio.get_running_loop().run_in_executor(None, call, request)
            return call(request)
        except Exception as e:
            code, message = _status(e, name)
        await context.abort(code, message)
    rpc.__name__ = name
    return rpc


class PlanServiceServicer(plan_service_pb2_grpc.PlanServiceServicer):
    """The synchronous servicer (one thread per call): for in-process callers and tests
    that drive the rpcs without a server. ``serve`` uses ``AsyncPlanServiceServicer``."""

    def __init__(self, model: ReadModel) -> None:
        self._model = model
        self.queries = PlanQueries(model)

    GetPlan = _sync_rpc("GetPlan")
    GetJob = _sync_rpc("GetJob")
    ListJobs = _sync_rpc("ListJobs")
    Explain = _sync_rpc("Explain")
    WhatIf = _sync_rpc("WhatIf")
    ListMechanisms = _sync_rpc("ListMechanisms")

    def WatchPlans(self, request: plan_service_pb2.WatchPlansRequest,
                   context: grpc.ServicerContext
                   ) -> Iterator[plan_service_pb2.WatchPlansResponse]:
        try:
            watch = self._model.watch(_tick(request, "from_tick"))
        except Exception as e:
            context.abort(*_status(e, "WatchPlans"))
        # A client that goes away ends the RPC; closing the watch unblocks this thread.
        context.add_callback(lambda: self._model.unwatch(watch))
        for plan in watch:
            yield plan_service_pb2.WatchPlansResponse(plan=plan)
        if watch.lagged:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _LAGGED)


class AsyncPlanServiceServicer(plan_service_pb2_grpc.PlanServiceServicer):
    """The servicer ``serve`` runs: the same answers, each stream a coroutine."""

    def __init__(self, model: ReadModel, max_watchers: int = MAX_WATCHERS) -> None:
        self._model, self._max_watchers = model, max_watchers
        self.queries = PlanQueries(model)
        self.streams = 0  # open WatchPlans streams (touched on the server's loop only)

    GetPlan = _async_rpc("GetPlan")
    GetJob = _async_rpc("GetJob")
    ListJobs = _async_rpc("ListJobs")
    Explain = _async_rpc("Explain")
    WhatIf = _async_rpc("WhatIf")
    ListMechanisms = _async_rpc("ListMechanisms")

    async def WatchPlans(self, request: plan_service_pb2.WatchPlansRequest,
                         context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[plan_service_pb2.WatchPlansResponse]:
        if self.streams >= self._max_watchers:
            log.warning("watch_refused", open=self.streams, cap=self._max_watchers)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.streams} WatchPlans streams are open, the most this"
                                f" server holds ({self._max_watchers}); retry later")
        loop, wake = asyncio.get_running_loop(), asyncio.Event()

        def notify() -> None:  # on the read model's feed thread: wake this coroutine
            loop.call_soon_threadsafe(wake.set)

        try:
            watch = self._model.watch(_tick(request, "from_tick"), notify=notify)
        except Exception as e:
            await context.abort(*_status(e, "WatchPlans"))
        self.streams += 1
        try:
            async for plan in _follow(watch, wake):
                yield plan_service_pb2.WatchPlansResponse(plan=plan)
        finally:  # ended, cancelled by the client, or the server stopping
            self.streams -= 1
            self._model.unwatch(watch)
        if watch.lagged:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _LAGGED)


async def _follow(watch: PlanWatch, wake: asyncio.Event) -> AsyncIterator[Any]:
    """The watch's plans as they come, until it is closed."""
    while True:
        wake.clear()  # before draining: a push after the drain sets it again
        plans, closed = watch.drain()
        for plan in plans:
            yield plan
        if closed:
            return
        if not plans:
            await wake.wait()


# --- the server -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Started:
    """What ``_start`` brought up on the server's loop."""

    server: grpc.aio.Server
    health_server: grpc.aio.Server | None  # the plaintext, health-only listener
    health: health.aio.HealthServicer  # one servicer behind both: one status
    servicer: AsyncPlanServiceServicer
    port: int
    health_port: int | None


class PlanServer:
    """A started PlanService (with health and reflection) on its own event-loop thread;
    ``port`` is the bound port, ``health_port`` that of the plaintext health-only
    listener (None without one), ``health`` the (asyncio) health servicer both share,
    ``servicer`` the PlanService servicer. ``stop`` marks health NOT_SERVING, refuses new
    RPCs and ends every WatchPlans stream cleanly before the grace period runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 started: _Started, model: ReadModel) -> None:
        self._loop, self._thread, self._model = loop, thread, model
        self._server, self._health_server = started.server, started.health_server
        self._stopped = False
        self.health, self.servicer = started.health, started.servicer
        self.port, self.health_port = started.port, started.health_port

    def stop(self, grace: float | None) -> None:
        """Stop serving (idempotent); returns once the servers and their loop are down."""
        if self._stopped:
            return
        self._stopped = True
        done = asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        try:
            done.result(timeout=(grace or 0.0) + 10.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
        log.info("planner_api_stopped", port=self.port, health_port=self.health_port,
                 grace_s=grace)

    async def _stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()  # every service NOT_SERVING from here
        stopping = asyncio.ensure_future(self._server.stop(grace))
        await asyncio.sleep(0)  # new RPCs are refused from here on
        self._model.close_watches()  # streams end with OK instead of being cut at grace
        await stopping
        # Last, so that probes read NOT_SERVING through the grace instead of a refusal;
        # a moment's grace lets a Health.Watch stream deliver that NOT_SERVING.
        if self._health_server is not None:
            await self._health_server.stop(
                None if grace is None else min(grace, HEALTH_STOP_GRACE_S))


def _listen(server: grpc.aio.Server, addr: str,
            credentials: grpc.ServerCredentials | None) -> int:
    """Bind ``addr`` (TLS when ``credentials`` are given); the bound port."""
    try:
        port = (server.add_secure_port(addr, credentials) if credentials is not None
                else server.add_insecure_port(addr))
    except RuntimeError as e:
        raise RuntimeError(f"planner-api cannot listen on {addr}: {e}") from None
    if port == 0:
        raise RuntimeError(f"planner-api cannot listen on {addr}")
    return port


def _new_server(interceptors: list[grpc.aio.ServerInterceptor] | None = None
                ) -> grpc.aio.Server:
    return grpc.aio.server(interceptors=interceptors,
                           options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])


async def _start(model: ReadModel, addr: str, credentials: grpc.ServerCredentials | None,
                 token: str | None, max_watchers: int, health_addr: str | None) -> _Started:
    server = _new_server([BearerToken(token)] if token else None)
    servicer = AsyncPlanServiceServicer(model, max_watchers)
    plan_service_pb2_grpc.add_PlanServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = _listen(server, addr, credentials)
    # Health checks only, in plaintext, without a token: for probes that cannot speak TLS
    # (Kubernetes' grpc probes). No PlanService and no reflection here.
    health_server, health_port = None, None
    if health_addr:
        health_server = _new_server()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = _listen(health_server, health_addr, None)
    for listener in (server, health_server):
        if listener is not None:
            await listener.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return _Started(server, health_server, health_servicer, servicer, port, health_port)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def serve(model: ReadModel, addr: str, *, credentials: grpc.ServerCredentials | None = None,
          token: str | None = None, max_watchers: int = MAX_WATCHERS,
          health_addr: str | None = None) -> PlanServer:
    """Start PlanService on ``addr`` (``host:0`` picks a free port: see ``.port``), with
    the standard health service ("" and koi.v1.PlanService SERVING) and reflection;
    TLS only when ``credentials`` are given, and every RPC but health checks needing
    ``authorization: Bearer <token>`` when ``token`` is. With ``health_addr``, the same
    health status is also served there, in plaintext and alone (``.health_port``)."""
    if max_watchers < 1:
        raise ValueError(f"max_watchers must be >= 1 (got {max_watchers})")
    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(QUERY_THREADS,
                                                 thread_name_prefix="planner-api-query"))
    thread = threading.Thread(target=_run_loop, args=(loop,), name="planner-api-grpc",
                              daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(
            _start(model, addr, credentials, token, max_watchers, health_addr),
            loop).result(timeout=30)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        raise
    log.info("planner_api_serving", addr=addr, port=started.port,
             tls=credentials is not None, token_required=bool(token),
             max_watchers=max_watchers, health_addr=health_addr or None,
             health_port=started.health_port)
    return PlanServer(loop, thread, started, model)
