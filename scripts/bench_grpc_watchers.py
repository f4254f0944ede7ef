"""Measure planner-api's unary latency while many WatchPlans streams are open.

Starts the gRPC server (``services.planner_api.grpc_server.serve``) in a child process
over a small read model that gains a plan every ``--plan-every`` seconds, opens
``--watchers`` WatchPlans streams (spread over ``--channels`` connections, as separate
clients would be), then times ``--calls`` sequential GetPlan and Health.Check calls
(each with a ``--call-timeout`` deadline) and counts the watchers that received a new
plan. Prints p50/p99 latency, timeouts, the watchers served and the server's RSS.

    .venv/bin/python scripts/bench_grpc_watchers.py --watchers 200

To measure another copy of the server (e.g. the code before a change), put it first
on PYTHONPATH: the child imports ``services.planner_api`` from there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from koi.v1 import plan_pb2, plan_service_pb2, plan_service_pb2_grpc

REPO = Path(__file__).resolve().parents[1]


def child(plan_every: float) -> None:
    """The server process: serve, print the port, add a plan every ``plan_every`` s."""
    import logging

    import structlog

    from services.planner_api.grpc_server import serve
    from services.planner_api.readmodel import ReadModel

    # stdout carries the port: keep the server's debug lines off it
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    model = ReadModel()
    tick = 0
    model.on_plan(plan_pb2.ClusterPlan(tick=tick, solver="greedy"))
    server = serve(model, "127.0.0.1:0")
    print(server.port, flush=True)
    while True:
        time.sleep(plan_every)
        tick += 1
        model.on_plan(plan_pb2.ClusterPlan(tick=tick, solver="greedy"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def watch(stub: plan_service_pb2_grpc.PlanServiceStub, got: list[int], i: int) -> None:
    try:
        async for resp in stub.WatchPlans(plan_service_pb2.WatchPlansRequest()):
            got[i] = max(got[i], resp.plan.tick)
    except grpc.aio.AioRpcError as e:
        got[i] = -1 if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else got[i]


async def timed(calls: int, timeout: float, call: object, request: object) -> dict:
    lat, timeouts, errors = [], 0, 0
    for _ in range(calls):
        t0 = time.perf_counter()
        try:
            await call(request, timeout=timeout)  # type: ignore[operator]
            lat.append((time.perf_counter() - t0) * 1e3)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                timeouts += 1
            else:
                errors += 1
    lat.sort()

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None
    return {"ok": len(lat), "timeouts": timeouts, "errors": errors,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99)}


async def measure(port: int, pid: int, args: argparse.Namespace) -> dict:
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(args.channels)]
    rss0 = rss_mib(pid)
    got = [0] * args.watchers
    tasks = [asyncio.create_task(watch(plan_service_pb2_grpc.PlanServiceStub(
        channels[i % len(channels)]), got, i)) for i in range(args.watchers)]
    await asyncio.sleep(args.settle)
    probe = channels[0]
    out = {"watchers": args.watchers, "rss_mib_before": round(rss0, 1),
           "rss_mib_with_watchers": round(rss_mib(pid), 1)}
    start_tick = max(got, default=0)
    out["get_plan"] = await timed(args.calls, args.call_timeout,
                                  plan_service_pb2_grpc.PlanServiceStub(probe).GetPlan,
                                  plan_service_pb2.GetPlanRequest())
    out["health_check"] = await timed(args.calls, args.call_timeout,
                                      health_pb2_grpc.HealthStub(probe).Check,
                                      health_pb2.HealthCheckRequest(service=""))
    await asyncio.sleep(2 * args.plan_every + 0.5)
    out["watchers_refused"] = sum(g < 0 for g in got)
    out["watchers_with_new_plans"] = sum(g > start_tick for g in got)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--watchers", type=int, default=200)
    p.add_argument("--channels", type=int, default=20)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--call-timeout", type=float, default=1.0)
    p.add_argument("--plan-every", type=float, default=0.5)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.plan_every)
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), str(REPO), str(REPO / "libs")]).strip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--plan-every",
                             str(args.plan_every)], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        print(json.dumps(asyncio.run(measure(port, proc.pid, args)), indent=1))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
