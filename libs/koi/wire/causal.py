"""The belief store and the DRO calibrator ⇄ their protobuf messages, field by field.

``store_to_proto`` / ``store_from_proto`` (``BeliefStoreState``; the mechanisms travel in
``CausalState.mechanisms``, which lists every one) and ``calibrator_to_proto`` /
``calibrator_from_proto`` (``CalibratorState``) are lossless: floats travel as doubles
(NaN included; an int where the domain holds a float comes back a float), and the
store's beliefs, tails and cliffs come back in the order its own JSON document
(``BeliefStore.to_bytes``) gives them — sorted by edge and scope key, with
observations' string→number mappings sorted by name — so a decoded store equals and
serialises as the original. ``koi.wire.planning`` puts them in the ``CausalState``. No
transport, no decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from koi.causal.beliefs import Belief, BeliefConfig, Edge, ThresholdBelief
from koi.causal.mechanisms import Mechanism
from koi.causal.observe import OutcomeObservation, Regimes
from koi.causal.scope import Scope
from koi.causal.store import BeliefStore
from koi.dro import DroCalibrator
from koi.v1 import causal_pb2, common_pb2
from koi.wire.scope import scope_from_proto, scope_to_proto


def _edge(edge: Edge) -> common_pb2.Edge:
    return common_pb2.Edge(cause=edge[0], effect=edge[1])


def _named(pairs: Iterable[tuple[str, float]]) -> list[causal_pb2.NamedNumber]:
    return [causal_pb2.NamedNumber(name=k, value=v) for k, v in pairs]


def _pairs(msgs: Iterable[causal_pb2.NamedNumber]) -> tuple[tuple[str, float], ...]:
    return tuple((m.name, m.value) for m in msgs)


# --- the belief store ---------------------------------------------------------------------

def _belief_to_proto(b: Belief) -> causal_pb2.BeliefStats:
    return causal_pb2.BeliefStats(
        edge=_edge(b.edge), scope=scope_to_proto(b.scope), prior_precision=b.prior_precision,
        data_precision=b.data_precision, data_sum=b.data_sum, weight=b.weight,
        support=b.support, first_seen=b.first_seen, last_confirmed=b.last_confirmed,
        as_of=b.as_of, sources=list(b.sources), prior_sum=b.prior_sum)


def _belief_from_proto(m: causal_pb2.BeliefStats) -> Belief:
    return Belief(edge=(m.edge.cause, m.edge.effect), scope=scope_from_proto(m.scope),
                  prior_precision=m.prior_precision, data_precision=m.data_precision,
                  data_sum=m.data_sum, weight=m.weight, support=m.support,
                  first_seen=m.first_seen, last_confirmed=m.last_confirmed, as_of=m.as_of,
                  sources=tuple(m.sources), prior_sum=m.prior_sum)


def _by_edge_and_scope(beliefs: Iterable[Belief]) -> list[Belief]:
    return sorted(beliefs, key=lambda b: (b.edge[0], b.edge[1], b.scope.key()))


def store_to_proto(store: BeliefStore) -> causal_pb2.BeliefStoreState:
    """Everything ``store`` keeps but its mechanisms."""
    c = store.config
    msg = causal_pb2.BeliefStoreState(
        config=causal_pb2.BeliefModelConfig(
            prior_sd=c.prior_sd, noise_sd=_named(c.noise_sd),
            tail_noise_sd=_named(c.tail_noise_sd), half_life_ticks=c.half_life_ticks,
            full_weight_requests=c.full_weight_requests, material=c.material,
            confidence=c.confidence, min_support=c.min_support,
            retire_material=c.retire_material, retire_confidence=c.retire_confidence),
        regimes=causal_pb2.RegimeThresholds(kv_cliff=store.regimes.kv_cliff,
                                            comm_bound=store.regimes.comm_bound,
                                            queue_bound=store.regimes.queue_bound),
        tick=store.tick, version=store.version)
    msg.beliefs.extend(_belief_to_proto(b) for b in _by_edge_and_scope(store.beliefs.values()))
    msg.tails.extend(_belief_to_proto(b) for b in _by_edge_and_scope(store.tails.values()))
    for scope in sorted(store.cliffs, key=Scope.key):
        t = store.cliffs[scope]
        msg.cliffs.add(scope=scope_to_proto(scope), n=t.n, s=t.s, q=t.q,
                       n_above=list(t.n_above), s_above=list(t.s_above),
                       q_above=list(t.q_above), support=t.support, as_of=t.as_of)
    return msg


def store_from_proto(msg: causal_pb2.BeliefStoreState,
                     mechanisms: Sequence[causal_pb2.Mechanism]) -> BeliefStore:
    """The store ``store_to_proto`` was given, with ``mechanisms`` (every one, by id)."""
    c = msg.config
    config = BeliefConfig(
        prior_sd=c.prior_sd, noise_sd=_pairs(c.noise_sd), tail_noise_sd=_pairs(c.tail_noise_sd),
        half_life_ticks=c.half_life_ticks, full_weight_requests=c.full_weight_requests,
        material=c.material, confidence=c.confidence, min_support=c.min_support,
        retire_material=c.retire_material, retire_confidence=c.retire_confidence)
    beliefs = {(b.edge, b.scope): b for b in map(_belief_from_proto, msg.beliefs)}
    tails = {(b.edge, b.scope): b for b in map(_belief_from_proto, msg.tails)}
    cliffs = {}
    for t in msg.cliffs:
        scope = scope_from_proto(t.scope)
        cliffs[scope] = ThresholdBelief(scope=scope, n=t.n, s=t.s, q=t.q,
                                        n_above=tuple(t.n_above), s_above=tuple(t.s_above),
                                        q_above=tuple(t.q_above), support=t.support,
                                        as_of=t.as_of)
    mechs = {}
    for m in sorted(mechanisms, key=lambda m: m.id):
        mechs[m.id] = Mechanism(
            id=m.id, scope=scope_from_proto(m.scope), edge=(m.edge.cause, m.edge.effect),
            condition=m.condition, effect=m.effect_size, support=m.support,
            confidence=m.confidence, first_seen=m.first_seen_tick,
            last_confirmed=m.last_confirmed_tick, active=m.active, retired_at=m.retired_tick,
            source=m.source)
    return BeliefStore(config=config,
                       regimes=Regimes(kv_cliff=msg.regimes.kv_cliff,
                                       comm_bound=msg.regimes.comm_bound,
                                       queue_bound=msg.regimes.queue_bound),
                       tick=msg.tick, version=msg.version, beliefs=beliefs, cliffs=cliffs,
                       tails=tails, mechanisms=mechs)


# --- the DRO calibrator -------------------------------------------------------------------

def _observation_to_proto(o: OutcomeObservation) -> causal_pb2.ObservationRecord:
    return causal_pb2.ObservationRecord(
        deployment_id=o.deployment_id, job_id=o.job_id, tick=o.tick,
        scope=scope_to_proto(o.scope), predicted=_named(sorted(o.predicted.items())),
        observed=_named(sorted(o.observed.items())), weight=o.weight,
        curves=[causal_pb2.NamedSeries(name=k, values=list(v))
                for k, v in sorted(o.curves.items())])


def _observation_from_proto(m: causal_pb2.ObservationRecord) -> OutcomeObservation:
    return OutcomeObservation(
        deployment_id=m.deployment_id, job_id=m.job_id, tick=m.tick,
        scope=scope_from_proto(m.scope), predicted=dict(_pairs(m.predicted)),
        observed=dict(_pairs(m.observed)), weight=m.weight,
        curves={c.name: tuple(c.values) for c in m.curves})


def calibrator_to_proto(cal: DroCalibrator) -> causal_pb2.CalibratorState:
    """Everything ``cal`` keeps; per-outcome windows sorted by outcome."""
    def items(mapping: Mapping[str, Sequence]) -> list:
        return sorted(mapping.items())

    return causal_pb2.CalibratorState(
        coverage=cal.coverage, window=cal.window, prior_radius=cal.prior_radius,
        outcomes=list(cal.outcomes), tick=cal.tick, version=cal.version,
        residuals=[causal_pb2.NamedSeries(name=k, values=list(v))
                   for k, v in items(cal.residuals)],
        hits=[causal_pb2.HitSeries(name=k, values=list(v)) for k, v in items(cal.hits)],
        spreads=[causal_pb2.NamedSeries(name=k, values=list(v))
                 for k, v in items(cal.spreads)],
        jobs=[causal_pb2.JobSeries(name=k, values=list(v)) for k, v in items(cal.jobs)],
        observations=[_observation_to_proto(o) for o in cal.observations])


def calibrator_from_proto(msg: causal_pb2.CalibratorState) -> DroCalibrator:
    return DroCalibrator(
        coverage=msg.coverage, window=msg.window, prior_radius=msg.prior_radius,
        outcomes=tuple(msg.outcomes), tick=msg.tick, version=msg.version,
        residuals={s.name: tuple(s.values) for s in msg.residuals},
        hits={s.name: tuple(s.values) for s in msg.hits},
        spreads={s.name: tuple(s.values) for s in msg.spreads},
        jobs={s.name: tuple(s.values) for s in msg.jobs},
        observations=tuple(_observation_from_proto(o) for o in msg.observations))
