"""The fault suite (``make chaos``): what Koi promises when parts of it fail, checked.

Each case runs the same short scenario through the bus (every service a supervised
process, an embedded NATS and valkey of its own, loopback only), submits one job over
the bus at tick 2, injects one fault at tick 4, and checks the promises every case makes:

* the run completes (every tick of the horizon is simulated and placed);
* no admitted job is lost (the job acked as accepted is in the run's jobs);
* no plan over capacity (no snapshot holds more GPUs on an offering than it has, unless
  the world itself took capacity away that tick);
* the cause is visible in the event log (the event kinds the case names appear after the
  fault);
* recovery within N ticks (after the fault clears, a tick placed from a fresh plan comes
  within ``recover_ticks``);
* no tick applied twice (the tick stream holds at most one ``actions`` message a tick).

Faults: ``kill -9`` of each service (its supervisor restarts it), of NATS (restarted on
the same port and store) and of valkey (not restarted); with two replicas each of
proposer, evaluator and placer, ``kill -9`` of the placer holding the lease and of one
replica of the proposer and of the evaluator, mid-tick (no tick lost, none applied
twice: each tick's actions are stored once); a network partition of one
service from NATS and a slow link, both through a loopback TCP proxy
(``services/runtime/proxy.py``); forged messages (a plan's actions, the placer lease, an
accepted job and far-future observations, each sent by a user who may not send it, and
far-future observations sent by the one who may). NATS runs as ``make demo`` runs it:
TLS, one user per service; the suite submits as ``client`` and reads back as ``admin``.
Every case is bounded (``timeout_s``) and stops by
itself. Results print as a table and go to ``out/chaos/chaos.json``; docs/RELIABILITY.md
quotes them.

    python -m services.chaos [--case NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nats.errors

from koi import subjects
from koi.catalog import load_catalog
from koi.jobs import load_jobs_yaml
from koi.v1 import events_pb2, jobs_pb2
from koi.wire import planning
from koi.wire.codec import encode_job
from services.runtime.busrun import BusRun
from services.runtime.embedded import EmbeddedServer, start_nats, start_valkey
from services.runtime.launcher import Supervisor
from services.runtime.permissions import ADMIN, CLIENT
from services.runtime.proxy import TcpProxy
from services.runtime.security import connect_nats

SCENARIO = "hetero-3h"
HORIZON_S = 900.0            # 15 ticks of a minute
TICKS = 15
FAULT_TICK = 4
SUBMIT_TICK = 2
STAGE_DEADLINE_S = 10.0
EXAMPLE_JOB = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "chat-online.yaml"
SUBMITTED_ID = "chaos-submitted-chat"


@dataclass
class Faults:
    """What one case has to hand when its fault fires (all on loopback)."""

    sup: Supervisor
    nats: EmbeddedServer
    valkey: EmbeddedServer
    proxy: TcpProxy | None
    cleared_at: int = -1          # tick at which the fault was over
    forged: dict[str, bool] = field(default_factory=dict)   # forgery -> refused
    killed: str = ""              # which process a kill took, when it had to be found


@dataclass(frozen=True)
class Case:
    name: str
    promise: str
    inject: Callable[[Faults, int], None]
    cause_kinds: tuple[str, ...] = ()     # event kinds that must say what happened
    recover_ticks: int = 3
    proxied: str = ""                     # service whose NATS link goes through a proxy
    replicas: tuple[tuple[str, int], ...] = ()   # (service, processes) beyond one each


@dataclass
class Outcome:
    case: str
    promise: str
    completed: bool
    ticks: int
    job_acked: bool
    job_kept: bool
    over_capacity_ticks: list[int]
    degraded_ticks: list[int]
    recovered_in: int | None          # ticks from the fault clearing to a fresh plan
    cause_events: dict[str, int]
    cause_visible: bool
    restarts: dict[str, int]
    wall_s: float
    forged_refused: dict[str, bool] = field(default_factory=dict)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    applied_twice: list[int] = field(default_factory=list)  # ticks with > 1 actions stored
    ticks_with_actions: int = 0                             # ticks with any stored

    @property
    def kept(self) -> bool:
        return (self.completed and self.job_acked and self.job_kept
                and not self.over_capacity_ticks and self.cause_visible
                and self.recovered_in is not None and not self.error
                and all(self.forged_refused.values()) and not self.applied_twice)


# --- faults ---------------------------------------------------------------------------
def _kill(service: str) -> Callable[[Faults, int], None]:
    def inject(f: Faults, tick: int) -> None:
        f.sup.kill(service)
        f.cleared_at = tick
    return inject


def _kill_placer_leader(f: Faults, tick: int) -> None:
    """kill -9 of the placer replica that holds the lease (its pid is in the holder)."""
    pid = asyncio.run(_placer_leader_pid(f.nats))
    leader = next((c for c in f.sup.children
                   if c.service == "placer" and c.proc is not None and c.proc.pid == pid), None)
    if leader is None:
        raise RuntimeError(f"no placer process holds the lease (holder pid {pid})")
    f.sup.kill("placer", leader.replica)
    f.killed = f"placer-{leader.replica} (pid {pid}, the leader)"
    f.cleared_at = tick


async def _placer_leader_pid(server: EmbeddedServer) -> int:
    """The pid in the placer lease's holder (``placer-<host>-<pid>-<nonce>``)."""
    nc = await connect_nats(server.url, server.security.auth(ADMIN), connect_timeout=5)
    try:
        kv = await nc.jetstream().key_value(subjects.KV_LEASES)
        entry = await kv.get(subjects.KEY_PLACER_LEASE)
        holder = str(json.loads(entry.value or b"{}")["holder"])
    finally:
        await nc.close()
    return int(holder.rsplit("-", 2)[1])


def _kill_nats(f: Faults, tick: int) -> None:
    f.nats.kill()
    time.sleep(2.0)           # down long enough for every client to notice
    f.nats.restart()
    f.cleared_at = tick


def _kill_valkey(f: Faults, tick: int) -> None:
    f.valkey.kill()
    f.cleared_at = tick


def _partition(seconds: float) -> Callable[[Faults, int], None]:
    def inject(f: Faults, tick: int) -> None:
        assert f.proxy is not None
        f.proxy.cut()
        time.sleep(seconds)
        f.proxy.heal()
        f.cleared_at = tick + 1
    return inject


def _slow(seconds: float, delay_s: float, bytes_per_s: float) -> Callable[[Faults, int], None]:
    def inject(f: Faults, tick: int) -> None:
        assert f.proxy is not None
        f.proxy.slow(delay_s, bytes_per_s)
        time.sleep(seconds)
        f.proxy.heal()
        f.cleared_at = tick + 1
    return inject


FAR_TICK = 10**9


def _forge(f: Faults, tick: int) -> None:
    f.forged = asyncio.run(_forgeries(f.nats, tick))
    f.cleared_at = tick


async def _forgeries(server: EmbeddedServer, tick: int) -> dict[str, bool]:
    """Send each forged message of the incident report as a user who may not send it;
    True where the server refused it (a permissions violation reached the sender).
    Then far-future observations as telemetry-ingest, which may publish observations:
    the server lets that through and the causal store must refuse it (an ``implausible``
    event, checked as the case's cause)."""
    job = dataclasses.replace(_example_job(), id="chaos-forged")
    forgeries = [
        ("actions", CLIENT, subjects.tick_subject(tick + 1, "actions"), b"forged"),
        ("placer-lease", "telemetry-ingest",
         f"$KV.{subjects.KV_LEASES}.{subjects.KEY_PLACER_LEASE}", b"forged"),
        ("accepted-job", CLIENT, subjects.job_accepted_subject(job.id), encode_job(job)),
        ("observations", "proposer", subjects.tick_subject(FAR_TICK, "observations"),
         planning.encode_observations(FAR_TICK, [])),
    ]
    refused = {}
    for name, role, subject, data in forgeries:
        refused[name] = await _refused(server, role, subject, data)
    nc = await connect_nats(server.url, server.security.auth("telemetry-ingest"),
                            connect_timeout=5)
    try:
        await nc.jetstream().publish(subjects.tick_subject(FAR_TICK, "observations"),
                                     planning.encode_observations(FAR_TICK, []), timeout=5)
    finally:
        await nc.close()
    return refused


async def _refused(server: EmbeddedServer, role: str, subject: str, data: bytes) -> bool:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err).lower())

    nc = await connect_nats(server.url, server.security.auth(role), error_cb=on_error,
                            connect_timeout=5)
    try:
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await nc.jetstream().publish(subject, data, timeout=1.0)
            return False          # acked: the stream took it
        want = f'permissions violation for publish to "{subject}"'.lower()
        for _ in range(50):
            if any(want in e for e in errors):
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await nc.close()


SERVICES = ("sim", "telemetry-ingest", "causal-store", "proposer", "evaluator", "placer",
            "planner-api")
# the stateless stages and the leader-elected placer, two processes each (queue groups)
REPLICATED: tuple[tuple[str, int], ...] = (("proposer", 2), ("evaluator", 2), ("placer", 2))

CASES: tuple[Case, ...] = (
    *(Case(f"kill-{s}", f"kill -9 of {s}: restarted, the run goes on, nothing lost",
           _kill(s), cause_kinds=("service",)) for s in SERVICES),
    Case("kill-nats", "kill -9 of NATS (restarted on its store): every service reconnects "
         "and says for how long it was cut off, the run goes on, nothing lost", _kill_nats,
         cause_kinds=("bus_error",), recover_ticks=3),
    Case("kill-valkey", "kill -9 of valkey: the cache costs speed, never a decision; the "
         "evaluator says the cache is gone", _kill_valkey, cause_kinds=("service",),
         recover_ticks=0),
    Case("partition-evaluator", "the evaluator cut off from NATS for 25 s: ticks degrade on "
         "the last good plan, the cause is in the event log, fresh plans within 3 ticks",
         _partition(25.0), cause_kinds=("degraded_tick", "bus_error"), proxied="evaluator"),
    Case("partition-causal-store", "the causal store cut off for 25 s: ticks degrade, the "
         "cause is in the event log, fresh plans within 3 ticks", _partition(25.0),
         cause_kinds=("degraded_tick", "bus_error"), proxied="causal-store"),
    Case("slow-telemetry-ingest", "telemetry-ingest on a 50 ms, 256 kB/s link for 30 s: "
         "slower ticks, never a stopped one", _slow(30.0, 0.05, 256_000),
         proxied="telemetry-ingest"),
    Case("replicas-kill-placer-leader", "two replicas of proposer, evaluator and placer; "
         "kill -9 of the placer holding the lease mid-tick: the standby takes over, no "
         "tick lost or applied twice, nothing lost", _kill_placer_leader,
         cause_kinds=("service",), replicas=REPLICATED),
    *(Case(f"replicas-kill-{s}", f"two replicas of proposer, evaluator and placer; kill -9 "
           f"of one {s} mid-tick: its twin takes the work, no tick lost or applied twice",
           _kill(s), cause_kinds=("service",), replicas=REPLICATED)
      for s in ("proposer", "evaluator")),
    Case("forged-messages", "forged actions, placer lease, accepted job and observations "
         "refused by the server; far-future observations from a permitted user refused by "
         "the causal store with an event; the run goes on, nothing lost", _forge,
         cause_kinds=("implausible",), recover_ticks=0),
)


# --- one case -------------------------------------------------------------------------
def run_case(case: Case, work: Path, timeout_s: float = 420.0, ticks: int = TICKS
             ) -> Outcome:
    """One case over ``ticks`` ticks (the fault at ``FAULT_TICK``; the suite's test may
    run fewer than ``make chaos``)."""
    if ticks <= FAULT_TICK + 2:
        raise ValueError(f"ticks must leave room after the fault at tick {FAULT_TICK}")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with start_nats(store_dir=work / "js", secure=True) as server, \
            start_valkey() as cache, contextlib.ExitStack() as stack:
        proxy = stack.enter_context(TcpProxy(server.port, scheme="tls")) \
            if case.proxied else None
        service_env = ({case.proxied: {"KOI_NATS_URL": proxy.url}} if proxy else {})
        acks: list[jobs_pb2.JobAck] = []
        faults: list[Faults] = []

        def at_tick(tick: int, sup: Supervisor) -> None:
            if tick == SUBMIT_TICK and not acks:
                acks.append(_submit(server))
            if tick == FAULT_TICK and not faults:
                f = Faults(sup, server, cache, proxy)
                faults.append(f)
                case.inject(f, tick)

        run = BusRun(server.url, work / "logs", SCENARIO, 1, HORIZON_S * ticks / TICKS,
                     cache.url, replicas=dict(case.replicas),
                     extra_env={"KOI_STAGE_DEADLINE_S": f"{STAGE_DEADLINE_S:g}"},
                     timeout_s=timeout_s, service_env=service_env,
                     security=server.security)
        try:
            result = run.run(at_tick)
        except Exception as exc:  # a broken promise is a result, not a crash of the suite
            return Outcome(case.name, case.promise, False, 0, bool(acks and acks[0].accepted),
                           False, [], [], None, {}, False, {}, time.perf_counter() - t0,
                           error=f"{type(exc).__name__}: {exc}"[:300])
        snaps, events, actions = asyncio.run(_read_back(server, ticks))
    wall = time.perf_counter() - t0
    cleared = faults[0].cleared_at if faults else FAULT_TICK
    degraded = sorted(n for n, d in result.decisions.items() if "degraded" in d.notes)
    after = [e for e in events if e.tick >= FAULT_TICK]
    kinds = {k: sum(planning.EVENT_KINDS.get(k) == e.kind for e in after)
             for k in case.cause_kinds}
    return Outcome(
        case=case.name, promise=case.promise,
        completed=result.summary.ticks == ticks, ticks=result.summary.ticks,
        job_acked=bool(acks and acks[0].accepted),
        job_kept=SUBMITTED_ID in result.summary.submitted_jobs,
        over_capacity_ticks=over_capacity(snaps), degraded_ticks=degraded,
        recovered_in=recovery(degraded, cleared, ticks, case.recover_ticks),
        cause_events=kinds, cause_visible=all(kinds.values()),
        restarts={k: v for k, v in result.restarts.items() if v}, wall_s=round(wall, 1),
        forged_refused=faults[0].forged if faults else {},
        applied_twice=sorted(n for n, count in actions.items() if count > 1),
        ticks_with_actions=len(actions),
        notes=[f"killed {faults[0].killed}"] if faults and faults[0].killed else [])


def over_capacity(snaps: dict[int, object]) -> list[int]:
    """Ticks whose snapshot holds more GPUs on an offering than it has, where the world
    did not take that capacity away since the tick before."""
    bad: list[int] = []
    before: dict[str, Any] = {}
    for n in sorted(snaps):
        caps = {c.offering: c for c in snaps[n].capacity}  # type: ignore[attr-defined]
        for off, c in caps.items():
            shrank = off in before and c.total_gpus < before[off].total_gpus
            if c.used_gpus > c.total_gpus and not shrank:
                bad.append(n)
                break
        before = caps
    return bad


def recovery(degraded: list[int], cleared: int, ticks: int, allowed: int) -> int | None:
    """Ticks after ``cleared`` until the first tick placed from a fresh plan; None when
    that takes longer than ``allowed`` (or never happens)."""
    for n in range(cleared, ticks):
        if n not in degraded:
            gap = max(0, n - cleared)
            return gap if gap <= allowed else None
    return None


def _example_job():
    return load_jobs_yaml(EXAMPLE_JOB, catalog=load_catalog())[0]


def _submit(server: EmbeddedServer) -> jobs_pb2.JobAck:
    """Submit one job as ``koi submit`` does (the client user), waiting out a restart."""
    data = encode_job(dataclasses.replace(_example_job(), id=SUBMITTED_ID))

    async def go() -> jobs_pb2.JobAck:
        nc = await connect_nats(server.url, server.security.auth(CLIENT), connect_timeout=5)
        try:
            for _ in range(60):   # the placer may be restarting
                try:
                    reply = await nc.request(subjects.job_submit_subject(CLIENT), data,
                                             timeout=2)
                    ack = jobs_pb2.JobAck.FromString(reply.data)
                    if ack.accepted or not ack.retry_after_ms:
                        return ack
                    await asyncio.sleep(ack.retry_after_ms / 1000)     # busy: retry
                except Exception:
                    await asyncio.sleep(0.5)
            return jobs_pb2.JobAck(accepted=False, reason="no answer")
        finally:
            await nc.close()
    return asyncio.run(go())


async def _read_back(server: EmbeddedServer, ticks: int = TICKS
                     ) -> tuple[dict[int, object], list[events_pb2.OperatorEvent],
                                dict[int, int]]:
    """Each tick's snapshot, every operator event, and how many ``actions`` messages the
    tick stream stores for each tick (one: applied once)."""
    nc = await connect_nats(server.url, server.security.auth(ADMIN), connect_timeout=10)
    js = nc.jetstream()
    snaps: dict[int, object] = {}
    events: list[events_pb2.OperatorEvent] = []
    actions: dict[int, int] = {}
    try:
        for n in range(ticks + 1):
            with contextlib.suppress(Exception):
                msg = await js.get_last_msg(subjects.STREAM_TICKS,
                                            subjects.tick_subject(n, "snapshot"))
                snaps[n] = planning.decode_snapshot(msg.data)
        sub = await js.subscribe(f"{subjects.EVENTS_PREFIX}.>", ordered_consumer=True)
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:
                break
            with contextlib.suppress(Exception):
                events.append(events_pb2.OperatorEvent.FromString(msg.data))
        sub = await js.subscribe(subjects.tick_filter("actions"), ordered_consumer=True)
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:
                break
            n = subjects.tick_of(msg.subject)
            actions[n] = actions.get(n, 0) + 1
    finally:
        await nc.close()
    return snaps, events, actions


# --- the suite ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.chaos",
                                     description="Koi's fault suite (loopback only).")
    parser.add_argument("--case", action="append", default=[],
                        help=f"run only these (repeatable): {', '.join(c.name for c in CASES)}")
    parser.add_argument("--out", type=Path, default=Path("out/chaos"))
    args = parser.parse_args(argv)
    known = {c.name: c for c in CASES}
    unknown = [n for n in args.case if n not in known]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    cases = [known[n] for n in args.case] or list(CASES)
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="koi-chaos-") as tmp:
        for i, case in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {case.name}: {case.promise}", flush=True)
            out = run_case(case, Path(tmp) / case.name)
            outcomes.append(out)
            print(f"    {'kept' if out.kept else 'BROKEN'}: {_summary(out)}", flush=True)
    (args.out / "chaos.json").write_text(json.dumps([asdict(o) | {"kept": o.kept}
                                                     for o in outcomes], indent=2))
    broken = [o.case for o in outcomes if not o.kept]
    print(f"{len(outcomes) - len(broken)} kept, {len(broken)} broken"
          + (f": {', '.join(broken)}" if broken else ""))
    return 1 if broken else 0


def _summary(o: Outcome) -> str:
    if o.error:
        return o.error
    return (f"ticks {o.ticks}, job acked {o.job_acked} kept {o.job_kept}, "
            f"over capacity {o.over_capacity_ticks or 'none'}, "
            f"degraded {o.degraded_ticks or 'none'}, recovered in {o.recovered_in}, "
            f"cause {o.cause_events or '-'}, restarts {o.restarts or '-'}, "
            + (f"forged refused {o.forged_refused}, " if o.forged_refused else "")
            + f"actions stored for {o.ticks_with_actions} ticks"
            + (f" (twice: {o.applied_twice}), " if o.applied_twice else ", ")
            + "".join(f"{n}, " for n in o.notes)
            + f"{o.wall_s:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
