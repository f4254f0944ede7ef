"""The causal graph, its scoped beliefs and the playbook of mechanisms (DESIGN §3, §6).

``graph`` is the fixed DAG; ``scope`` the back-off lattice; ``observe`` the input type
and the residual attribution; ``beliefs`` the posterior math; ``mechanisms`` the
playbook; ``store`` the immutable, serialisable ``BeliefStore`` that ties them together.
Pure domain code: no I/O, no transport imports; the tick is always passed in.
"""

from __future__ import annotations

from koi.causal.beliefs import Belief, BeliefConfig, ThresholdBelief
from koi.causal.graph import BELIEF_EDGES, EDGES, NODES, Edge, Kind, children, parents
from koi.causal.mechanisms import Mechanism, mechanism_id
from koi.causal.observe import (
    OutcomeObservation,
    Regimes,
    attribute,
    log_residuals,
    observation_from_telemetry,
)
from koi.causal.scope import GLOBAL, Scope, contains, generalisations, scope_of
from koi.causal.store import BeliefStore, MechanismCounts, apply_correction

__all__ = [
    "BELIEF_EDGES",
    "EDGES",
    "GLOBAL",
    "NODES",
    "Belief",
    "BeliefConfig",
    "BeliefStore",
    "Edge",
    "Kind",
    "Mechanism",
    "MechanismCounts",
    "OutcomeObservation",
    "Regimes",
    "Scope",
    "ThresholdBelief",
    "apply_correction",
    "attribute",
    "children",
    "contains",
    "generalisations",
    "log_residuals",
    "mechanism_id",
    "observation_from_telemetry",
    "parents",
    "scope_of",
]
