"""What planner-api's gRPC answers say in words and tokens: ListJobs' page tokens, the
operator summary of an Explain, and the mechanisms a ListMechanisms scope selects.

Pure functions over protobuf messages; no gRPC server or NATS code here.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from koi.v1 import causal_pb2, plan_pb2
from services.planner_api.readmodel import InvalidQuery

_KIND_WORD = {plan_pb2.DECISION_KIND_PLACE: "place", plan_pb2.DECISION_KIND_DEFER: "defer",
              plan_pb2.DECISION_KIND_REJECT: "reject"}


# --- page tokens ---------------------------------------------------------------------

def encode_token(after: str, listing: str) -> str:
    doc = json.dumps({"after": after, "listing": listing}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode()


def decode_token(token: str, listing: str) -> str:
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
