"""planner-api's gRPC face: the ``koi.v1.PlanService`` servicer over a ``ReadModel``,
and ``serve``, which starts it with health checking and server reflection.

The servicer checks requests (INVALID_ARGUMENT with the field and the rule broken),
asks the read model, pages, and renders explanations; the read model's ``NotFound`` /
``InvalidQuery`` / ``FailedPrecondition`` become the matching status codes, and any
other exception becomes INTERNAL (logged), never an unhandled error. No NATS code and
no planning logic here.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from koi.v1 import causal_pb2, plan_pb2, plan_service_pb2, plan_service_pb2_grpc
from services.planner_api.readmodel import (
    FailedPrecondition,
    InvalidQuery,
    NotFound,
    QueryError,
    ReadModel,
)

log = structlog.get_logger(__name__)

SERVICE_NAME = plan_service_pb2.DESCRIPTOR.services_by_name["PlanService"].full_name
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
JOB_KINDS = ("", "online", "batch")
_CODES: dict[type[QueryError], grpc.StatusCode] = {
    InvalidQuery: grpc.StatusCode.INVALID_ARGUMENT, NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION}
_KIND_WORD = {plan_pb2.DECISION_KIND_PLACE: "place", plan_pb2.DECISION_KIND_DEFER: "defer",
              plan_pb2.DECISION_KIND_REJECT: "reject"}

F = TypeVar("F", bound=Callable[..., Any])


def _status(e: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(e, QueryError):
        return _CODES.get(type(e), grpc.StatusCode.INVALID_ARGUMENT), str(e)
    log.exception("rpc_failed", rpc=rpc)
    return grpc.StatusCode.INTERNAL, f"{rpc} failed inside planner-api ({type(e).__name__})"


def _guarded(method: F) -> F:
    """Run a unary handler; a raised error becomes its status code and message."""
    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as e:
            code, message = _status(e, method.__name__)
        context.abort(code, message)
    return wrapper  # type: ignore[return-value]


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
    return value


class PlanServiceServicer(plan_service_pb2_grpc.PlanServiceServicer):
    """Every rpc of ``koi.v1.PlanService``, answered from one ``ReadModel``."""

    def __init__(self, model: ReadModel) -> None:
        self._model = model

    @_guarded
    def GetPlan(self, request: plan_service_pb2.GetPlanRequest,
                context: grpc.ServicerContext) -> plan_service_pb2.GetPlanResponse:
        return plan_service_pb2.GetPlanResponse(plan=self._model.plan(_tick(request)))

    @_guarded
    def GetJob(self, request: plan_service_pb2.GetJobRequest,
               context: grpc.ServicerContext) -> plan_service_pb2.GetJobResponse:
        return plan_service_pb2.GetJobResponse(job=self._model.job(_job_id(request.job_id)))

    @_guarded
    def ListJobs(self, request: plan_service_pb2.ListJobsRequest,
                 context: grpc.ServicerContext) -> plan_service_pb2.ListJobsResponse:
        if request.state not in plan_service_pb2.JobState.values():
            raise InvalidQuery(f"state {request.state} is not a JobState")
        if request.kind not in JOB_KINDS:
            raise InvalidQuery(f"kind must be 'online', 'batch' or '' for both"
                               f" (got {request.kind!r})")
        if request.page_size < 0:
            raise InvalidQuery(f"page_size must be >= 0 (got {request.page_size})")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        listing = f"{request.state}|{request.kind}"
        after = _decode_token(request.page_token, listing) if request.page_token else None
        jobs = [j for j in self._model.jobs(request.state, request.kind)
                if after is None or j.spec.id > after]
        page = jobs[:size]
        token = _encode_token(page[-1].spec.id, listing) if len(jobs) > size else ""
        return plan_service_pb2.ListJobsResponse(jobs=page, next_page_token=token)

    @_guarded
    def Explain(self, request: plan_service_pb2.ExplainRequest,
                context: grpc.ServicerContext) -> plan_service_pb2.ExplainResponse:
        job_id = _job_id(request.job_id)
        tick, decision, version = self._model.decision(job_id, _tick(request))
        causal = self._model.causal_state()
        ids = list(dict.fromkeys(decision.explanation.mechanism_ids))
        known = {m.id: m for m in causal.mechanisms} if causal is not None else {}
        return plan_service_pb2.ExplainResponse(
            tick=tick, decision=decision, causal_state_version=version,
            summary=explain_summary(tick, decision, known, causal),
            mechanisms=[known[i] for i in ids if i in known])

    @_guarded
    def WhatIf(self, request: plan_service_pb2.WhatIfRequest,
               context: grpc.ServicerContext) -> plan_service_pb2.WhatIfResponse:
        if not request.HasField("config"):
            raise InvalidQuery("config is required")
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidQuery("target is required: set workload or job_id")
        if target == "job_id":
            return self._model.what_if(request.config, job_id=_job_id(request.job_id))
        return self._model.what_if(request.config, workload=request.workload)

    @_guarded
    def ListMechanisms(self, request: plan_service_pb2.ListMechanismsRequest,
                       context: grpc.ServicerContext
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
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "this watcher fell too far behind the plans; watch again with"
                          " from_tick set to the last tick received + 1")


# --- page tokens ---------------------------------------------------------------------

def _encode_token(after: str, listing: str) -> str:
    doc = json.dumps({"after": after, "listing": listing}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode()


def _decode_token(token: str, listing: str) -> str:
    """The last job id of the previous page; the token must come from the same listing."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        after, issued_for = doc["after"], doc["listing"]
        if not isinstance(after, str) or not isinstance(issued_for, str):
            raise TypeError
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise InvalidQuery("page_token is not a token this server issued: pass the"
                           " next_page_token of the previous ListJobs response") from None
    if issued_for != listing:
        raise InvalidQuery("page_token was issued for a different state/kind filter:"
                           " repeat the filter of the request that returned it")
    return after


# --- rendering ------------------------------------------------------------------------

def explain_summary(tick: int, d: plan_pb2.Decision, known: dict[str, causal_pb2.Mechanism],
                    causal: causal_pb2.CausalState | None) -> str:
    """A few lines an operator can read: what was decided, the numbers, why, and the
    mechanisms behind it (the planner's own lines, else the causal state's)."""
    word = _KIND_WORD.get(d.kind, "decide")
    if d.kind != plan_pb2.DECISION_KIND_PLACE:
        return f"tick {tick}: {word} job {d.job_id}: {d.reason or 'no reason given'}"
    x = d.explanation
    cfg = d.config
    label = x.config_label or f"{cfg.accelerator} tp{cfg.tp or 1} {cfg.engine}".strip()
    lines = [f"tick {tick}: place job {d.job_id} on {d.replicas}× {label}"
             f"{f' ({d.offering})' if d.offering else ''}, {d.gpus} GPUs,"
             f" {d.usd_per_hour:.2f} USD/h{', unchanged' if d.stays else ''}"]
    if d.HasField("explanation"):
        lines.append(f"robust p95 at {x.planned_rate_rps:.2f} req/s per replica: TTFT"
                     f" {x.ttft_p95_ms_robust:.0f} ms, TPOT {x.tpot_p95_ms_robust:.1f} ms;"
                     f" goodput {d.goodput_tok_s:.0f} of"
                     f" {d.demand_tok_s:.0f} tok/s demanded")
    if d.reason:
        lines.append(f"why: {d.reason}")
    if x.hypothesis:
        lines.append(f"hypothesis: {x.hypothesis}")
    if x.multipliers:
        lines.append("learnt corrections: " + ", ".join(
            f"{v.name} ×{v.value:.2f}" for v in x.multipliers) + (f" on {x.scope}" if x.scope
                                                                   else ""))
    cited = list(x.mechanisms) or [
        known[i].summary or f"{known[i].condition} → {known[i].edge.effect}"
                            f" ×{known[i].effect_size:.2f}"
        for i in x.mechanism_ids if i in known]
    lines.extend(f"because {line}" for line in cited)
    missing = [i for i in x.mechanism_ids if i not in known]
    if missing:
        where = f"causal state v{causal.version}" if causal is not None else "any causal state"
        lines.append(f"cites {', '.join(missing)}, not in {where} held here")
    return "\n".join(lines)


def select_mechanisms(causal: causal_pb2.CausalState, scope: Any, include_retired: bool,
                      min_confidence: float) -> list[causal_pb2.Mechanism]:
    """Mechanisms matching every set field of ``scope``, most confident first."""
    wanted = [(f.name, v) for f, v in scope.ListFields() if v]
    found = [m for m in causal.mechanisms
             if (m.active or include_retired) and m.confidence >= min_confidence
             and all(getattr(m.scope, name) == v for name, v in wanted)]
    return sorted(found, key=lambda m: (-m.confidence, m.id))


# --- the server -----------------------------------------------------------------------

class PlanServer(grpc.Server):
    """A started ``grpc.Server`` serving PlanService, health and reflection; ``port`` is
    the bound port, ``health`` the health servicer. ``stop`` marks health NOT_SERVING and
    ends every WatchPlans stream before the grace period runs."""

    def __init__(self, server: grpc.Server, health_servicer: health.HealthServicer,
                 model: ReadModel, port: int) -> None:
        self._server, self._model = server, model
        self.health = health_servicer
        self.port = port

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._server.add_secure_port(address, server_credentials)

    def start(self) -> None:
        self._server.start()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def stop(self, grace: float | None) -> Any:
        self.health.enter_graceful_shutdown()  # every service NOT_SERVING from here on
        done = self._server.stop(grace)  # refuses new RPCs at once
        self._model.close_watches()
        log.info("planner_api_stopped", port=self.port, grace_s=grace)
        return done


def serve(model: ReadModel, addr: str, *, max_workers: int = 16) -> PlanServer:
    """Start PlanService on ``addr`` (``host:0`` picks a free port: see ``.port``), with
    the standard health service ("" and koi.v1.PlanService SERVING) and reflection."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                    thread_name_prefix="planner-api"))
    plan_service_pb2_grpc.add_PlanServiceServicer_to_server(PlanServiceServicer(model), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        port = server.add_insecure_port(addr)
    except RuntimeError as e:
        raise RuntimeError(f"planner-api cannot listen on {addr}: {e}") from None
    if port == 0:
        raise RuntimeError(f"planner-api cannot listen on {addr}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("planner_api_serving", addr=addr, port=port)
    return PlanServer(server, health_servicer, model, port)
