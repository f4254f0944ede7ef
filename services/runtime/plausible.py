"""Plausibility of a tick-stage message: refuse a tick that cannot be true, never believe it.

A consumer that folds ticks in order (the causal store keeps "the last tick learnt")
would be poisoned for good by one message claiming tick 10**9: every later, genuine
tick would look stale. So before acting on a message its tick is checked against two
things it cannot disagree with:

* the tick in its subject (``koi.tick.<n>.<stage>``, ``koi.telemetry.<n>``) must equal
  the tick in its body — the subject is what de-duplication, the DLQ and every reader go
  by, the body is what the handler would act on;
* the clock: the tick of the latest ``koi.tick.<n>.snapshot`` the simulator (or fleet
  backend) published. A tick is a snapshot first; the sim publishes ``snapshot n``
  before ``telemetry n``, and telemetry-ingest reads ``snapshot n`` before it publishes
  ``observations n``, so no genuine stage message is ahead of the clock. ``ahead`` is
  the margin a consumer allows (see ``check_tick``).

A refused message is parked on ``koi.dlq.<service>`` (same headers as an undecodable
one) with an ``implausible`` operator event, and acked: the service carries on. Only
the check itself is pure; the clock lookup (``ticks.clock_tick``) and the refusal are
the bus plumbing around it. No decisions about what a message means here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from nats.js import api

from koi import subjects
from services.runtime.app import ServiceContext
from services.runtime.bus import HEADER_ERROR, HEADER_ORIGINAL_SUBJECT

EVENT_KIND = "implausible"


def check_tick(subject_tick: int | None, body_tick: int, clock_tick: int | None, *,
               ahead: int = 0) -> str | None:
    """Why a message's tick is implausible (one line), or None when it is plausible.

    ``clock_tick`` is the latest published snapshot's tick (None: none yet). ``ahead``
    is how many ticks past the clock the consumer accepts: 0 where the input is only
    made after its tick's snapshot exists (observations), 1 where an edge adapter may
    report a tick's telemetry just before that snapshot lands (the consumer then waits
    for it, as it always has, up to its stage deadline).
    """
    if subject_tick is None:
        return "the subject's tick is not a plain decimal number"
    if body_tick != subject_tick:
        return f"body tick {body_tick} differs from the subject's tick {subject_tick}"
    if body_tick < 0:
        return f"tick {body_tick} is negative"
    limit = (-1 if clock_tick is None else clock_tick) + ahead
    if body_tick > limit:
        clock = "no snapshot yet" if clock_tick is None else f"the clock is at {clock_tick}"
        return f"tick {body_tick} is ahead of the clock ({clock}; {ahead} tick(s) allowed)"
    return None


def letter_id(service: str, subject: str, data: bytes,
              headers: Mapping[str, str] | None) -> str:
    """A de-duplication id for the refusal that a redelivery of the message repeats."""
    msg_id = (headers or {}).get(api.Header.MSG_ID)
    if not msg_id:
        msg_id = hashlib.sha256(subject.encode() + b"\0" + data).hexdigest()[:24]
    return f"implausible.{service}.{msg_id}"


async def refuse(ctx: ServiceContext, subject: str, data: bytes,
                 headers: Mapping[str, str] | None, reason: str, clock: int | None) -> None:
    """Park the message on the service's DLQ subject and emit an ``implausible`` event.

    Raises if the letter cannot be stored, so the message is redelivered, not lost.
    The event's tick is the clock's (the message's own tick is what is in doubt)."""
    letter = letter_id(ctx.name, subject, data, headers)
    await ctx.bus.publish(subjects.dlq_subject(ctx.name), data, msg_id=letter,
                          headers={HEADER_ORIGINAL_SUBJECT: subject,
                                   HEADER_ERROR: f"implausible: {reason}"})
    ctx.log.warning("implausible_refused", subject=subject, reason=reason, clock=clock)
    await ctx.event(kind=EVENT_KIND, severity="error", tick=max(clock or 0, 0), key=letter,
                    message=f"refused {subject}: {reason}",
                    attributes={"subject": subject, "reason": reason,
                                "clock_tick": str(clock), "bytes": str(len(data))})
