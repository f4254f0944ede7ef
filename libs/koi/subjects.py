"""Every NATS subject, JetStream stream, KV bucket and queue group Koi uses: one module.

Pure names and small helpers that build them; no transport imports (the services in
``services/`` import these, and so do the CLI and the tests). DESIGN §2 is the map:

    sim ──koi.tick.<n>.snapshot, koi.telemetry.<n>──► telemetry-ingest
    telemetry-ingest ──koi.tick.<n>.observations──► causal-store
    causal-store ──koi.tick.<n>.causal (+ KV koi_causal)──► proposer
    proposer ──koi.tick.<n>.candidates──► evaluator
    proposer ──koi.tick.<n>.hypotheses──► proposers, causal-store, evaluator, planner-api
    evaluator ──koi.tick.<n>.plan──► placer
    placer ──koi.tick.<n>.actions (+ KV koi_plan)──► sim (the cluster)

Jobs come in on ``koi.jobs.submit.<user>`` (request/reply, ``JobSpec`` → ``JobAck``; the
last token names the submitter, whose NATS user may publish on that subject only) and
are kept on ``koi.jobs.accepted.<id>``; operator events on ``koi.events.<severity>.<kind>``;
undecodable messages on ``koi.dlq.<service>``.
"""

from __future__ import annotations

import re

PREFIX = "koi"

# --- jobs ------------------------------------------------------------------------------
JOBS_SUBMIT_PREFIX = "koi.jobs.submit"          # koi.jobs.submit.<user>: JobSpec → JobAck
JOBS_SUBMIT_ANY = f"{JOBS_SUBMIT_PREFIX}.*"     # what the placer answers (queue "placer")
# the submitter of a process with no NATS user (a server without accounts, where the
# subject cannot prove who sent it), and the NATS user `koi submit` runs as by default
DEFAULT_SUBMITTER = "client"
# the sender's remaining budget for this request, whole ms from when it sent it (a budget,
# not a time of day: clocks differ between hosts); koi.jobs.intake reads it
HEADER_DEADLINE_MS = "Koi-Deadline-Ms"
# what each placer replica admitted per submitter lately (SubmitSpend, core NATS, every
# replica subscribes): so N replicas share one rate limit per user (koi.jobs.rate_limit)
PLACER_SPENT = "koi.placer.spent"
JOBS_ACCEPTED_PREFIX = "koi.jobs.accepted"      # koi.jobs.accepted.<job id> (JobSpec)
STREAM_JOBS = "KOI_JOBS"
STREAM_JOBS_SUBJECTS = ("koi.jobs.accepted.>",)

# --- telemetry -------------------------------------------------------------------------
TELEMETRY_PREFIX = "koi.telemetry"              # koi.telemetry.<tick> (TelemetryBatch)
STREAM_TELEMETRY = "KOI_TELEMETRY"
STREAM_TELEMETRY_SUBJECTS = ("koi.telemetry.>",)

# --- the tick --------------------------------------------------------------------------
TICK_PREFIX = "koi.tick"                        # koi.tick.<n>.<stage>
STREAM_TICKS = "KOI_TICKS"
STREAM_TICKS_SUBJECTS = ("koi.tick.>",)
STAGES = ("snapshot", "observations", "causal", "candidates", "plan", "actions",
          "hypotheses")
# a language-model round's accepted and dropped hypotheses (HypothesisRound), published on
# the tick they enter first; not a pipeline stage: a tick never waits for one
HYPOTHESES = "hypotheses"

# --- operator events and dead letters --------------------------------------------------
EVENTS_PREFIX = "koi.events"                    # koi.events.<severity>.<kind>
STREAM_EVENTS = "KOI_EVENTS"
STREAM_EVENTS_SUBJECTS = ("koi.events.>",)
DLQ_PREFIX = "koi.dlq"                          # koi.dlq.<service>
STREAM_DLQ = "KOI_DLQ"
STREAM_DLQ_SUBJECTS = ("koi.dlq.>",)

# --- work sharing (core NATS request/reply in queue groups) -----------------------------
WORK_PROPOSE = "koi.work.propose"
WORK_EVALUATE = "koi.work.evaluate"
QUEUE_PROPOSER = "proposer"
QUEUE_EVALUATOR = "evaluator"

# --- control ---------------------------------------------------------------------------
SIM_STATUS = "koi.sim.status"                   # the simulator's progress (SimStatus)

# --- KV buckets ------------------------------------------------------------------------
KV_CAUSAL = "koi_causal"      # key "state": the causal store's state (CausalState)
KV_PLAN = "koi_plan"          # key "latest": the last good plan (ClusterPlan)
KV_LEASES = "koi_leases"      # key "placer": the placer leader's lease; "proposer-rlm": the
                              # proposer replica that runs hypothesis rounds
KV_SIM = "koi_sim"            # key "state": the simulator's checkpoint marker
KEY_CAUSAL_STATE = "state"
KEY_LATEST_PLAN = "latest"
KEY_PLACER_LEASE = "placer"
KEY_RLM_LEASE = "proposer-rlm"

# --- object store ----------------------------------------------------------------------
# payloads larger than the server's max_payload (services/runtime/blobs.py); a message
# or KV value then carries only a reference to an object here
OBJ_BLOBS = "koi_blobs"          # stream messages' payloads; 24 h, as the streams
OBJ_KV_BLOBS = "koi_kv_blobs"    # KV values' payloads; kept while their key refers to them

STREAMS: dict[str, tuple[str, ...]] = {
    STREAM_JOBS: STREAM_JOBS_SUBJECTS,
    STREAM_TELEMETRY: STREAM_TELEMETRY_SUBJECTS,
    STREAM_TICKS: STREAM_TICKS_SUBJECTS,
    STREAM_EVENTS: STREAM_EVENTS_SUBJECTS,
    STREAM_DLQ: STREAM_DLQ_SUBJECTS,
}
KV_BUCKETS = (KV_CAUSAL, KV_PLAN, KV_LEASES, KV_SIM)

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def token(value: str) -> str:
    """``value`` as one subject token; raises ``ValueError`` if it cannot be one."""
    if not _TOKEN.match(value):
        raise ValueError(f"{value!r} is not a valid subject token "
                         "(letters, digits, '_' and '-' only)")
    return value


def tick_subject(tick: int, stage: str) -> str:
    """``koi.tick.<tick>.<stage>``, e.g. ``tick_subject(7, "plan")``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
    if tick < 0:
        raise ValueError(f"tick must be >= 0 (got {tick})")
    return f"{TICK_PREFIX}.{tick}.{stage}"


def tick_filter(stage: str) -> str:
    """The wildcard subject of one stage over every tick, ``koi.tick.*.<stage>``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
    return f"{TICK_PREFIX}.*.{stage}"


def tick_of(subject: str) -> int:
    """The tick number in a ``koi.tick.<n>.…`` or ``koi.telemetry.<n>`` subject."""
    parts = subject.split(".")
    if len(parts) >= 3 and parts[0] == PREFIX and parts[1] in ("tick", "telemetry"):
        return int(parts[2])
    raise ValueError(f"{subject!r} carries no tick")


def telemetry_subject(tick: int) -> str:
    return f"{TELEMETRY_PREFIX}.{tick}"


def job_accepted_subject(job_id: str) -> str:
    # job ids are DNS-1123 labels (koi.jobs.bounds), so one id is one token, unmapped:
    # 'dot.b' and 'dot_b' can no longer land on the same subject
    return f"{JOBS_ACCEPTED_PREFIX}.{token(job_id)}"


def job_submit_subject(user: str) -> str:
    """``koi.jobs.submit.<user>``: where ``user`` submits (its NATS user may publish on this
    subject and no other submitter's, so its rate limit is its own)."""
    return f"{JOBS_SUBMIT_PREFIX}.{token(user)}"


def submitter_of(subject: str) -> str:
    """The user a ``koi.jobs.submit.<user>`` subject names; ``ValueError`` for any other."""
    prefix, _, user = subject.rpartition(".")
    if prefix != JOBS_SUBMIT_PREFIX:
        raise ValueError(f"{subject!r} is not a {JOBS_SUBMIT_ANY} subject")
    return token(user)


def event_subject(severity: str, kind: str) -> str:
    return f"{EVENTS_PREFIX}.{token(severity.lower())}.{token(kind.lower())}"


def dlq_subject(service: str) -> str:
    return f"{DLQ_PREFIX}.{token(service)}"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for i, tok in enumerate(want):
        if tok == ">":
            return len(have) > i
        if i >= len(have) or (tok != "*" and tok != have[i]):
            return False
    return len(want) == len(have)


def stream_of(subject: str) -> str:
    """The Koi stream that stores ``subject``; ``KeyError`` when none does."""
    for stream, patterns in STREAMS.items():
        if any(subject_matches(p, subject) for p in patterns):
            return stream
    raise KeyError(f"no Koi stream stores subject {subject!r}")
