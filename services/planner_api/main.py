"""planner-api: the gRPC ``PlanService`` over a read model fed from the bus.

Ordered (ephemeral) JetStream consumers replay and then follow the plans, snapshots
(deployments and jobs), causal states, accepted jobs and the language-model hypothesis
rounds into ``ReadModel``; the gRPC
server (reflection and health included) answers from it; ``KOI_GRPC_HEALTH_ADDR`` adds a
plaintext, health-only listener for probes that cannot speak TLS. It owns nothing: a restart
rebuilds the same view from the streams. The bound port is logged and stored in the
``koi_plan`` bucket (key ``planner-api``) so a client of an ephemeral port can find it.
"""

from __future__ import annotations

import asyncio

from koi import subjects
from koi.planner.settings import settings_for
from koi.v1 import causal_pb2, cluster_pb2, hypotheses_pb2, jobs_pb2, plan_pb2
from services.planner_api.grpc_security import server_credentials
from services.planner_api.grpc_server import serve
from services.planner_api.readmodel import ReadModel
from services.runtime.app import ServiceContext, main

NAME = "planner-api"
KEY_ADDR = "planner-api"


def feeds(model: ReadModel) -> dict:
    """Subject filter → callback turning one stored message into read-model updates."""

    def plan(subject: str, data: bytes) -> None:
        model.on_plan(plan_pb2.ClusterPlan.FromString(data))

    def snapshot(subject: str, data: bytes) -> None:
        snap = cluster_pb2.ClusterSnapshot.FromString(data)
        for status in snap.jobs:
            model.on_job(status.spec, snap.tick)
            if status.rejected:
                model.on_job_rejected(status.spec.id, status.reason, snap.tick)
        model.on_deployments(snap.tick, list(snap.deployments))

    def causal(subject: str, data: bytes) -> None:
        model.on_causal(causal_pb2.CausalState.FromString(data))

    def job(subject: str, data: bytes) -> None:
        model.on_job(jobs_pb2.JobSpec.FromString(data), -1)

    def candidates(subject: str, data: bytes) -> None:  # kept as bytes: Explain decodes
        model.on_candidates(subjects.tick_of(subject), data)

    def hypotheses(subject: str, data: bytes) -> None:
        model.hypotheses.on_round(hypotheses_pb2.HypothesisRound.FromString(data))

    return {subjects.tick_filter("plan"): plan, subjects.tick_filter("snapshot"): snapshot,
            subjects.tick_filter("causal"): causal, f"{subjects.JOBS_ACCEPTED_PREFIX}.>": job,
            subjects.tick_filter("candidates"): candidates,
            subjects.tick_filter(subjects.HYPOTHESES): hypotheses}


async def run(ctx: ServiceContext) -> None:
    model = ReadModel(catalog=ctx.catalog, settings=settings_for(ctx.settings.policy))
    settings = ctx.settings
    server = serve(model, settings.grpc_addr, token=settings.grpc_token or None,
                   credentials=server_credentials(settings.grpc_tls_cert,
                                                  settings.grpc_tls_key),
                   health_addr=settings.grpc_health_addr or None)
    host = ctx.settings.grpc_addr.rsplit(":", 1)[0]
    await ctx.bus.kv_put(subjects.KV_PLAN, KEY_ADDR, f"{host}:{server.port}".encode())
    ctx.log.info("grpc_listening", addr=f"{host}:{server.port}",
                 health_port=server.health_port)  # None: no plaintext health listener
    subs = []
    for subject, fn in feeds(model).items():
        async def cb(msg, fn=fn) -> None:
            try:
                fn(msg.subject, await ctx.bus.resolve(msg))  # a large one is a blob
            except Exception as exc:  # a read model skips what it cannot read
                ctx.log.warning("feed_skipped", subject=msg.subject, error=repr(exc))
        subs.append(await ctx.bus.js.subscribe(subject, ordered_consumer=True, cb=cb))
    try:
        await ctx.stopping.wait()
    finally:
        for s in subs:
            await s.unsubscribe()
        model.close_watches()
        await asyncio.to_thread(server.stop, 2.0)


if __name__ == "__main__":
    main(NAME, run)
