"""planner-api's view of the language-model hypothesis rounds, for Explain.

``HypothesisBook`` holds the last ``max_rounds`` ``HypothesisRound`` messages heard on
``koi.tick.<n>.hypotheses`` (a re-delivery of a round replaces it) and answers, for one
job, the hypotheses that concern it (``JobHypothesis``): accepted ones whose tests or
explorations name the job, or whose scope covers the configuration the job is placed on;
dropped ones that named the job, with the reason. Newest round first; an accepted one
says whether it was in force at the explained tick. Thread-safe (the feed runs on the
NATS loop, Explain on gRPC's).

Reads only: no NATS or gRPC code and no planning decision here.
"""

from __future__ import annotations

import threading

from koi.catalog import Catalog
from koi.errors import InvalidConfigError, KoiError
from koi.space import DeploymentConfig
from koi.v1 import hypotheses_pb2, plan_pb2, plan_service_pb2
from koi.wire.config import config_from_proto
from services.planner_api.alternatives import scope_covers

MAX_ROUNDS = 64        # rounds kept: at one every few ticks, hours of a fleet's life
MAX_PER_JOB = 32       # hypotheses listed in one Explain
_PLACE = plan_pb2.DECISION_KIND_PLACE


def _named(h: hypotheses_pb2.Hypothesis) -> set[str]:
    return {t.job_id for t in h.tests} | {e.job_id for e in h.explore}


class HypothesisBook:
    """The rounds heard, and the hypotheses among them that concern a job."""

    def __init__(self, max_rounds: int = MAX_ROUNDS) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1 (got {max_rounds})")
        self._max = max_rounds
        self._lock = threading.Lock()
        self._rounds: dict[str, hypotheses_pb2.HypothesisRound] = {}  # round id → round

    def on_round(self, msg: hypotheses_pb2.HypothesisRound) -> None:
        """Hold a round (a copy); past ``max_rounds`` the oldest (by the tick it enters)
        goes."""
        held = hypotheses_pb2.HypothesisRound()
        held.CopyFrom(msg)
        with self._lock:
            self._rounds[held.round_id] = held
            while len(self._rounds) > self._max:
                oldest = min(self._rounds.values(), key=lambda r: (r.tick, r.round_id))
                del self._rounds[oldest.round_id]

    @property
    def rounds(self) -> int:
        with self._lock:
            return len(self._rounds)

    def for_job(self, job_id: str, tick: int, decision: plan_pb2.Decision | None = None,
                catalog: Catalog | None = None) -> list[plan_service_pb2.JobHypothesis]:
        """The hypotheses concerning ``job_id`` as of the plan of ``tick`` (``decision``:
        the job's decision there, whose configuration a scope may cover), newest round
        first, at most ``MAX_PER_JOB``."""
        with self._lock:
            rounds = sorted(self._rounds.values(), key=lambda r: (-r.tick, r.round_id))
        placed = _placed_config(decision, catalog)
        out: list[plan_service_pb2.JobHypothesis] = []
        for r in rounds:
            for h in r.accepted:
                if job_id in _named(h):
                    relation = "test"
                elif placed is not None and catalog is not None \
                        and scope_covers(h.scope, placed, catalog):
                    relation = "scope"
                else:
                    continue
                item = _item(r, relation, accepted=True, in_force=r.tick <= tick < h.expires_tick)
                item.hypothesis.CopyFrom(h)
                out.append(item)
            for d in r.dropped:
                if job_id in d.job_ids:
                    item = _item(r, "test", accepted=False, in_force=False)
                    item.dropped.CopyFrom(d)
                    out.append(item)
        return out[:MAX_PER_JOB]


def _item(r: hypotheses_pb2.HypothesisRound, relation: str, *, accepted: bool,
          in_force: bool) -> plan_service_pb2.JobHypothesis:
    return plan_service_pb2.JobHypothesis(
        round_id=r.round_id, round_tick=r.round_tick, enters_tick=r.tick, model=r.model,
        accepted=accepted, in_force=in_force, relation=relation)


def _placed_config(decision: plan_pb2.Decision | None, catalog: Catalog | None
                   ) -> DeploymentConfig | None:
    """The decision's configuration when it places the job (None otherwise, or when it
    does not decode here)."""
    if decision is None or catalog is None or decision.kind != _PLACE \
            or not decision.HasField("config"):
        return None
    try:
        return config_from_proto(decision.config, catalog=catalog)
    except (InvalidConfigError, KoiError, ValueError):
        return None


def summary_lines(items: list[plan_service_pb2.JobHypothesis]) -> list[str]:
    """Explain's summary lines for the hypotheses (the first few of each verdict)."""
    lines = []
    for j in [i for i in items if i.accepted][:4]:
        h = j.hypothesis
        state = "in force" if j.in_force else "not in force"
        lines.append(
            f"model hypothesis {h.id} ({j.model}, round {j.round_id}, {state}, expires tick"
            f" {h.expires_tick}, by {j.relation}): {h.edge.cause} → {h.edge.effect}"
            f" ×{h.size:.2f} [{h.size_low:.2f}–{h.size_high:.2f}]"
            + (f" — {h.statement}" if h.statement else ""))
    for j in [i for i in items if not i.accepted][:4]:
        d = j.dropped
        lines.append(f"dropped model hypothesis #{d.index} of round {j.round_id} ({j.model}):"
                     f" {d.reason}")
    return lines
