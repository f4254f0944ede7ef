"""Who may say what on the bus: one NATS user per service, least privilege (DESIGN §9).

``permissions(role)`` is the table, built only from the names in ``koi.subjects`` (no
subject is spelt here that a service spells elsewhere, except the few KV keys and
durable names noted below); ``accounts_block(password_hashes, submitters)`` turns it
into the ``accounts { KOI { … } }`` section of a nats-server configuration.

Submitters: ``client`` and each user ``koi security init --submitter NAME`` adds may
publish a job on its own ``koi.jobs.submit.<user>`` and on no other's, so the placer's
per-user rate limit (``services/placer/admission.py``) charges the user who sent it: one
submitter cannot spend another's budget. Each may also read events and the jobs stream.

What it rests on (checked against nats-server 2.15 and nats-py 2.16 in
tests/integration/test_bus_security.py):

- a JetStream publish is a core request on the subject, so the publish permission on
  ``koi.tick.*.actions`` is what keeps a forged plan out of the stream;
- a KV write is a publish on ``$KV.<bucket>.<key>`` (the placer lease is
  ``$KV.koi_leases.placer``); KV reads go through ``$JS.API.DIRECT.GET.KV_<bucket>…``
  or ``$JS.API.STREAM.MSG.GET.KV_<bucket>``;
- a durable consumer is created, read and acked through subjects that carry its stream
  and name, so each service may only create, fetch from and ack *its own* durables;
- answering a request needs ``allow_responses``, granted only to the responders (the
  placer answers ``koi.jobs.submit.*``, proposer and evaluator their work items), and only
  they may subscribe to those subjects, so nobody else can answer in their place.

Nobody but ``admin`` may delete, purge or update a stream or delete a consumer (the
one exception: services purge in the two blob object stores, as an object put or delete
must). A
holder of one service's credentials can still publish what that service publishes
(e.g. the evaluator's user can publish a plan), create Koi's streams if they are missing,
read every Koi stream and subscribe to ``koi.>`` and ``_INBOX.>`` (the bus carries no
secrets), and publish events and dead letters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koi import subjects
from services.runtime.settings import SERVICES

ADMIN = "admin"    # stream set-up and reset: `koi demo`, the tests, delete_koi_state
CLIENT = subjects.DEFAULT_SUBMITTER  # `koi submit`, `koi events follow`: a submitter
ROLES: tuple[str, ...] = (*SERVICES, CLIENT, ADMIN)
ACCOUNT = "KOI"

_API = "$JS.API"
_ACK = "$JS.ACK"
_FLOW_CONTROL = "$JS.FC"
_INBOX = "_INBOX.>"
# KV keys written by one service each; the constants live in the service modules
# (services/evaluator/main.py KEY_CACHE_STATS, services/planner_api/main.py KEY_ADDR):
# tests/unit/test_permissions.py checks they agree
KEY_EVALUATOR_CACHE = "evaluator-cache"
KEY_PLANNER_API_ADDR = "planner-api"
# the durable consumers each service reads through (stream, durable name), as the
# services name them in their `consume` / `pull_subscribe` calls
DURABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "sim": ((subjects.STREAM_JOBS, "sim-jobs"),),
    "telemetry-ingest": ((subjects.STREAM_TELEMETRY, "telemetry-ingest"),),
    "causal-store": ((subjects.STREAM_TICKS, "causal-store"),),
    "proposer": ((subjects.STREAM_TICKS, "proposer"),),
    "evaluator": ((subjects.STREAM_TICKS, "evaluator"),),
    "placer": ((subjects.STREAM_TICKS, "placer"), (subjects.STREAM_TICKS, "placer-deadline")),
    "engine-metrics": ((subjects.STREAM_TICKS, "engine-metrics"),),
}
# request/reply subjects and the one role that answers each
RESPONDERS: dict[str, str] = {
    subjects.JOBS_SUBMIT_ANY: "placer",
    subjects.WORK_PROPOSE: "proposer",
    subjects.WORK_EVALUATE: "evaluator",
}


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    subscribe_deny: tuple[str, ...] = ()
    responds: bool = False  # may answer requests (allow_responses)

    def as_config(self) -> dict[str, object]:
        """The ``permissions`` map of a nats-server user."""
        sub: dict[str, object] = {"allow": list(self.subscribe)}
        if self.subscribe_deny:
            sub["deny"] = list(self.subscribe_deny)
        out: dict[str, object] = {"publish": {"allow": list(self.publish)}, "subscribe": sub}
        if self.responds:
            out["allow_responses"] = True
        return out


def kv_subject(bucket: str, key: str) -> str:
    """The subject a KV write to ``bucket``/``key`` is published on."""
    return f"$KV.{bucket}.{key}"


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


# the object stores holding payloads too large for one message (services/runtime/blobs.py)
_BLOB_BUCKETS = (subjects.OBJ_BLOBS, subjects.OBJ_KV_BLOBS)


def _all_streams() -> tuple[str, ...]:
    return (*subjects.STREAMS, *(_kv_stream(b) for b in subjects.KV_BUCKETS),
            *(f"OBJ_{b}" for b in _BLOB_BUCKETS))


def _reads(streams: Iterable[str]) -> list[str]:
    """Reading a stream: its info, last-message and direct gets, an ephemeral (ordered)
    consumer on it and that consumer's flow-control replies."""
    out = [f"{_API}.INFO", f"{_API}.STREAM.NAMES"]
    for s in streams:
        out += [f"{_API}.STREAM.INFO.{s}", f"{_API}.STREAM.MSG.GET.{s}",
                f"{_API}.DIRECT.GET.{s}", f"{_API}.DIRECT.GET.{s}.>",
                f"{_API}.CONSUMER.CREATE.{s}", f"{_FLOW_CONTROL}.{s}.>"]
    return out


def _durable(stream: str, name: str) -> list[str]:
    """Creating, inspecting, fetching from and acking one durable consumer."""
    consumer = f"{stream}.{name}"
    return [f"{_API}.CONSUMER.CREATE.{consumer}", f"{_API}.CONSUMER.CREATE.{consumer}.>",
            f"{_API}.CONSUMER.DURABLE.CREATE.{consumer}", f"{_API}.CONSUMER.INFO.{consumer}",
            f"{_API}.CONSUMER.MSG.NEXT.{consumer}", f"{_ACK}.{consumer}.>"]


def _own_publishes() -> dict[str, list[str]]:
    """What each service alone publishes (stream subjects, core subjects, KV keys)."""
    tick, accepted = subjects.tick_filter, f"{subjects.JOBS_ACCEPTED_PREFIX}.>"
    telemetry = f"{subjects.TELEMETRY_PREFIX}.>"
    return {
        # the world: snapshots, telemetry, and the scenario's own jobs as they arrive
        "sim": [tick("snapshot"), telemetry, subjects.SIM_STATUS, accepted,
                kv_subject(subjects.KV_SIM, ">")],
        "telemetry-ingest": [tick("observations")],   # it reads telemetry, publishes none
        "causal-store": [tick("causal"),
                         kv_subject(subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE)],
        # candidates, and the hypothesis rounds it runs (every service may read them)
        "proposer": [tick("candidates"), tick(subjects.HYPOTHESES), subjects.WORK_PROPOSE,
                     kv_subject(subjects.KV_LEASES, subjects.KEY_RLM_LEASE)],
        "evaluator": [tick("plan"), subjects.WORK_EVALUATE,
                      kv_subject(subjects.KV_PLAN, KEY_EVALUATOR_CACHE)],
        "placer": [tick("actions"), accepted, subjects.PLACER_SPENT,
                   kv_subject(subjects.KV_PLAN, subjects.KEY_LATEST_PLAN),
                   kv_subject(subjects.KV_LEASES, subjects.KEY_PLACER_LEASE)],
        "planner-api": [kv_subject(subjects.KV_PLAN, KEY_PLANNER_API_ADDR)],
        # the engine adapter: a tick's telemetry read from the engines (snapshots in)
        "engine-metrics": [telemetry],
    }


def _blob_writes() -> list[str]:
    # a put writes chunks and metadata; superseding or deleting an object purges them
    out = []
    for b in _BLOB_BUCKETS:
        out += [f"$O.{b}.C.>", f"$O.{b}.M.>", f"{_API}.STREAM.PURGE.OBJ_{b}"]
    return out


def _service(role: str) -> Permissions:
    streams = _all_streams()
    # every process marks itself ready and running/stopped in koi_sim (app.ready_key,
    # app.process_key: tests/unit/test_security.py checks these patterns cover them)
    publish = [*_own_publishes()[role], f"{subjects.EVENTS_PREFIX}.>",
               f"{subjects.DLQ_PREFIX}.>", kv_subject(subjects.KV_SIM, f"ready.{role}"),
               kv_subject(subjects.KV_SIM, f"process.{role}.*"),
               # running/stopped per replica: services.runtime.app.process_key
               kv_subject(subjects.KV_SIM, f"process.{role}.*"),
               *(f"{_API}.STREAM.CREATE.{s}" for s in streams), *_reads(streams)]
    for stream, name in DURABLES.get(role, ()):
        publish += _durable(stream, name)
    if role != "planner-api":
        publish += _blob_writes()
    deny = tuple(subject for subject, who in RESPONDERS.items() if who != role)
    return Permissions(publish=tuple(dict.fromkeys(publish)),
                       subscribe=(f"{subjects.PREFIX}.>", _INBOX), subscribe_deny=deny,
                       responds=role in RESPONDERS.values())


def permissions(role: str) -> Permissions:
    """The permissions of one role: a service name, ``client`` or ``admin``."""
    if role == ADMIN:
        return Permissions(publish=(">",), subscribe=(">",), responds=True)
    if role == CLIENT:
        return submitter(CLIENT)
    if role in SERVICES:
        return _service(role)
    raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")


def submitter_name(user: str) -> str:
    """``user`` if it can be a submitter: a NATS user name that is one subject token
    (letters, digits, '_', '-'; at most 64) and no service's or admin's name."""
    if len(user) > 64 or (user in ROLES and user != CLIENT):
        raise ValueError(f"{user!r} cannot be a submitter: at most 64 characters, and "
                         f"none of {', '.join(r for r in ROLES if r != CLIENT)}")
    return subjects.token(user)


def submitter(user: str) -> Permissions:
    """A submitter's permissions: submit on its own ``koi.jobs.submit.<user>`` (and no
    other submitter's), read events and the jobs stream (``koi events follow``, the
    look-up of ``koi submit``)."""
    reads = _reads((subjects.STREAM_EVENTS, subjects.STREAM_JOBS))
    return Permissions(publish=(subjects.job_submit_subject(submitter_name(user)),
                                *dict.fromkeys(reads)),
                       subscribe=(_INBOX,))


def accounts_block(password_hashes: Mapping[str, str], submitters: Iterable[str] = ()
                   ) -> str:
    """The ``accounts`` section of a nats-server config: account KOI with JetStream and
    one user per role and per extra submitter, each with its password's bcrypt hash
    (``security.hash_password``): the configuration holds no password in clear. The file
    stays 0600 all the same."""
    for role, hashed in password_hashes.items():
        if not hashed.startswith("$2"):
            raise ValueError(f"the password of NATS user {role!r} is not a bcrypt hash")
    extra = [submitter_name(u) for u in dict.fromkeys(submitters) if u != CLIENT]
    users = [{"user": role, "password": password_hashes[role],
              "permissions": permissions(role).as_config()} for role in ROLES]
    users += [{"user": user, "password": password_hashes[user],
               "permissions": submitter(user).as_config()} for user in extra]
    return (f"accounts {{\n  {ACCOUNT} {{\n    jetstream: enabled\n"
            f"    users: {json.dumps(users, indent=2)}\n  }}\n}}\n")
