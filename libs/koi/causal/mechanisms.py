"""Mechanisms: the playbook — beliefs confident and material enough to act and explain on.

A belief becomes a mechanism when |θ| ≥ material, P(sign) ≥ confidence and support ≥
min_support, unless a more general active mechanism on the same edge already says the
same (within ``material``): then the specific one adds nothing and is not listed. A
general scope is promoted only as far as its evidence reaches: it must be the tightest
scope covering the deployment scopes behind it, and none of those may disagree with it
materially (an average over an l4 at ×1.5 and an h100 at ×1.0 is no mechanism). An
active mechanism is retired when its belief falls below the retire thresholds (a little
below the promotion ones, so that noise does not make it flicker) or becomes subsumed.
Mechanisms keep their id (a stable hash of edge and scope) across retire/re-promote.

Pure functions over frozen values; no I/O.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koi.causal.beliefs import MAX_SOURCES, Belief, BeliefConfig
from koi.causal.graph import Edge
from koi.causal.observe import Regimes, condition_text
from koi.causal.scope import Scope, generalisations, join

LEAF_MIN_SUPPORT = 2  # a deployment scope's observations before it can object to a general one
OUTCOME_LABEL = {"ttft": "TTFT", "tpot": "TPOT", "throughput": "throughput"}


def mechanism_id(edge: Edge, scope: Scope) -> str:
    blob = f"{edge[0]}->{edge[1]}@{scope.key()}".encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Mechanism:
    """One playbook entry: in ``scope``, under ``condition``, ``edge`` scales its outcome
    by ``effect`` (a multiplier on the predictor's value)."""

    id: str
    scope: Scope
    edge: Edge
    condition: str
    effect: float
    support: int
    confidence: float
    first_seen: int
    last_confirmed: int
    active: bool = True
    retired_at: int = -1  # last tick it was retired (-1 = never)
    # "data": found in telemetry alone; "rlm": its belief started from a language-model
    # hypothesis's weak prior (telemetry still had to promote it). Kept from first promotion
    source: str = "data"

    def line(self) -> str:
        """Operator line, e.g. ``kv_pressure > 0.85 → TPOT ×1.6 on {l4, vllm, ≤10B, tp1}
        (support 14, conf 0.93)``."""
        label = OUTCOME_LABEL.get(self.edge[1], self.edge[1])
        return (f"{self.condition} → {label} ×{_fmt_effect(self.effect)} on "
                f"{self.scope.label()} (support {self.support}, conf {self.confidence:.2f})")


def _fmt_effect(x: float) -> str:
    text = f"{x:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _qualifies(b: Belief, config: BeliefConfig, active: bool) -> bool:
    """Material, confident and supported (with hysteresis for an active one)."""
    if b.support < config.min_support:
        return False
    if active:
        return abs(b.mean) >= config.retire_material and b.confidence >= config.retire_confidence
    return abs(b.mean) >= config.material and b.confidence >= config.confidence


def _generalises(b: Belief, leaves: Mapping[tuple[Edge, str], Belief],
                 config: BeliefConfig) -> bool:
    """Whether ``b`` is a generalisation its evidence supports.

    Its scope must be the tightest one covering the deployment scopes behind it (a wider
    scope holds the same evidence and claims more), and none of those deployment scopes
    with ≥ LEAF_MIN_SUPPORT observations may disagree with it by ``material`` or more
    (then the average hides a difference, and the deployment scopes speak for themselves).
    """
    # With the sources capped the join is unknown: judge by consistency only.
    if len(b.sources) < MAX_SOURCES and join(Scope.from_key(k) for k in b.sources) != b.scope:
        return False
    for key in b.sources:
        leaf = leaves.get((b.edge, key))
        if leaf is not None and leaf is not b and leaf.support >= LEAF_MIN_SUPPORT \
                and abs(leaf.mean - b.mean) >= config.material:
            return False
    return True


def evaluate(beliefs: Iterable[Belief], previous: Mapping[str, Mechanism], tick: int,
             config: BeliefConfig, regimes: Regimes) -> dict[str, Mechanism]:
    """Every mechanism ever discovered, with its state at ``tick``.

    ``beliefs`` must already be decayed to ``tick``. General scopes are judged first so
    that a specific scope can be recognised as saying what a general one already does.
    """
    out = dict(previous)
    effects: dict[tuple[Edge, Scope], float] = {}  # active mechanisms' θ, by (edge, scope)
    ordered = sorted(beliefs, key=lambda b: (b.scope.specificity, b.edge, b.scope.key()))
    leaves = {(b.edge, b.scope.key()): b for b in ordered}
    for b in ordered:
        mid = mechanism_id(b.edge, b.scope)
        prev = previous.get(mid)
        was_active = prev is not None and prev.active
        active = (_qualifies(b, config, was_active) and _generalises(b, leaves, config)
                  and not any(abs(b.mean - effects[(b.edge, g)]) < config.material
                              for g in generalisations(b.scope)[1:] if (b.edge, g) in effects))
        if active:
            effects[(b.edge, b.scope)] = b.mean
        if prev is None and not active:
            continue
        out[mid] = Mechanism(
            id=mid, scope=b.scope, edge=b.edge, condition=condition_text(b.edge, regimes),
            effect=math.exp(b.mean), support=b.support, confidence=b.confidence,
            first_seen=prev.first_seen if prev is not None else tick,
            last_confirmed=b.last_confirmed, active=active,
            retired_at=tick if (was_active and not active) else
            (prev.retired_at if prev is not None else -1),
            source=prev.source if prev is not None else ("rlm" if b.seeded else "data"))
    return out

