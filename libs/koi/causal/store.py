"""The belief store: every scoped belief, the KV-cliff beliefs and the playbook.

``BeliefStore`` is immutable: ``update(observations, tick)`` returns the next store (a new
``version``). Each observation's outcome residuals go to the edge ``attribute`` picks
and update that edge's belief in *every* scope containing the deployment's scope, so
general scopes learn from everything and specific ones only from their own. Reads back
off from the most specific scope with enough support (``lookup``); ``correction`` gives
the multipliers the evaluator applies to a raw prediction. Beside the edge beliefs,
``tails`` holds each scope's belief on how much longer a p95 is than its mean, relative
to the predictor's (the p95 multiplier is the mean's times the tail's). ``to_bytes``/``from_bytes``
round-trip the whole state losslessly (sorted-key JSON, zlib).

No I/O and no clock: the tick is passed in.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from koi.causal.beliefs import Belief, BeliefConfig, ThresholdBelief
from koi.causal.graph import BELIEF_EDGES, LEARNT_OUTCOMES, Edge
from koi.causal.mechanisms import Mechanism, evaluate
from koi.causal.observe import (
    GRAPH_OUTCOME,
    TAIL_EDGES,
    OutcomeObservation,
    Regimes,
    attribute,
    curve_residual,
    log_residuals,
    pass_noise,
    pass_residual,
    tail_residuals,
)
from koi.causal.scope import GLOBAL, Scope, contains, generalisations
from koi.compress import inflate
from koi.predictor.types import Prediction

FORMAT = "koi.causal/1"
LOOKUP_MIN_SUPPORT = 3  # observations a scope needs before a lookup trusts it


@dataclass(frozen=True, slots=True)
class MechanismCounts:
    active: int
    applicable: int
    discovered: int  # cumulative: every mechanism ever promoted, retired ones included


@dataclass(frozen=True, slots=True)
class BeliefStore:
    """All beliefs (each as of ``tick``), KV-cliff beliefs per scope, and mechanisms.

    The mappings are never mutated after construction; ``update`` builds new ones.
    """

    config: BeliefConfig = field(default_factory=BeliefConfig)
    regimes: Regimes = field(default_factory=Regimes)
    tick: int = 0
    version: int = 0
    beliefs: Mapping[tuple[Edge, Scope], Belief] = field(default_factory=dict)
    cliffs: Mapping[Scope, ThresholdBelief] = field(default_factory=dict)
    # p95 outcome's tail pseudo-edge (TAIL_EDGES) × scope → belief on the tail factor
    tails: Mapping[tuple[Edge, Scope], Belief] = field(default_factory=dict)
    mechanisms: Mapping[str, Mechanism] = field(default_factory=dict)

    # --- learning ---------------------------------------------------------------------

    def update(self, observations: Iterable[OutcomeObservation], tick: int) -> BeliefStore:
        """The store after one tick's observations (decay to ``tick``, then update)."""
        if tick < self.tick:
            raise ValueError(f"tick {tick} is before the store's tick {self.tick}")
        cfg, gamma = self.config, self.config.decay
        beliefs = {k: b.decayed(tick, gamma) for k, b in self.beliefs.items()}
        cliffs = {k: c.decayed(tick, gamma) for k, c in self.cliffs.items()}
        tails = {k: b.decayed(tick, gamma) for k, b in self.tails.items()}
        # Evidence per (edge, scope), in a sorted order so that the float sums do not
        # depend on message arrival order; each belief is then rebuilt once.
        evidence: dict[tuple[Edge, Scope], list[tuple[float, float, float, str]]] = {}
        kv_evidence: dict[Scope, list[tuple[float, float, float]]] = {}
        tail_evidence: dict[tuple[Edge, Scope], list[tuple[float, float, float, str]]] = {}
        for obs in sorted(observations, key=_order):
            w = cfg.obs_weight(obs.weight)
            if w <= 0.0:
                continue
            mediators = obs.mediators()
            residuals = log_residuals(obs)
            scopes = generalisations(obs.scope)
            source = obs.scope.key()
            passed = pass_residual(obs)  # None unless online, with a TPOT curve
            if obs.curves:
                residuals = _online_residuals(obs, residuals, passed)
            for outcome in LEARNT_OUTCOMES:
                if outcome == "tpot" and passed is not None:
                    # the model inverted: the pass multiplier that explains the mean TPOT,
                    # its noise TPOT's over the curve's slope
                    edge = attribute(outcome, None, self.regimes)
                    item = (passed[0], pass_noise(cfg.noise(outcome), passed[1]), w, source)
                elif outcome not in residuals:
                    continue
                else:
                    # online: TTFT beyond the pass, in the base regime the plan reads it in
                    edge = attribute(outcome, None if obs.curves else mediators, self.regimes)
                    item = (residuals[outcome], cfg.noise(outcome), w, source)
                for scope in scopes:
                    evidence.setdefault((edge, scope), []).append(item)
            if "tpot" in residuals:
                for scope in scopes:
                    kv_evidence.setdefault(scope, []).append(
                        (mediators["kv_pressure"], residuals["tpot"], w))
            for p95, r in tail_residuals(obs).items():
                item = (r, cfg.noise(p95), w, source)
                for scope in scopes:
                    tail_evidence.setdefault((TAIL_EDGES[p95], scope), []).append(item)
        for (edge, scope), items in evidence.items():
            b = beliefs.get((edge, scope)) or Belief.prior(edge, scope, cfg, tick)
            beliefs[(edge, scope)] = b.observe_many(items, tick)
        for scope, kv_items in kv_evidence.items():
            c = cliffs.get(scope) or ThresholdBelief(scope=scope, as_of=tick)
            cliffs[scope] = c.observe_many(kv_items, tick)
        for (edge, scope), items in tail_evidence.items():
            b = tails.get((edge, scope)) or Belief.prior(edge, scope, cfg, tick)
            tails[(edge, scope)] = b.observe_many(items, tick)
        mechanisms = evaluate(beliefs.values(), self.mechanisms, tick, cfg, self.regimes)
        return replace(self, tick=tick, version=self.version + 1, beliefs=beliefs,
                       cliffs=cliffs, tails=tails, mechanisms=mechanisms)

    # --- reading ----------------------------------------------------------------------

    def belief(self, edge: Edge, scope: Scope) -> Belief | None:
        """The belief filed exactly under (edge, scope), if any."""
        return self.beliefs.get((edge, scope))

    def lookup(self, edge: Edge, scope: Scope, min_support: int = LOOKUP_MIN_SUPPORT
               ) -> Belief:
        """The most specific belief containing ``scope`` with support ≥ ``min_support``;
        the prior (θ = 0 at ``*``) when no scope has that much evidence."""
        return _back_off(self.beliefs, edge, scope, min_support, self.config, self.tick)

    def tail(self, p95: str, scope: Scope, min_support: int = LOOKUP_MIN_SUPPORT) -> Belief:
        """``lookup`` for the tail factor of ``p95`` (``"ttft_p95"`` or ``"tpot_p95"``)."""
        return _back_off(self.tails, TAIL_EDGES[p95], scope, min_support, self.config,
                         self.tick)

    def correction(self, scope: Scope, mediators: Mapping[str, float] | None = None,
                   min_support: int = LOOKUP_MIN_SUPPORT) -> dict[str, float]:
        """Multipliers on the raw prediction: ``{"ttft", "tpot", "throughput"}`` →
        exp(posterior mean) of the belief on the edge ``attribute`` picks for these
        mediators (graph or Prediction names; None = base regime); ``"ttft_p95"`` and
        ``"tpot_p95"`` → their mean's multiplier times the scope's tail factor. Cost per
        token scales with 1 / throughput."""
        mult = {o: self.lookup(attribute(o, mediators, self.regimes), scope,
                               min_support).multiplier for o in LEARNT_OUTCOMES}
        for p95 in TAIL_EDGES:
            mult[p95] = mult[GRAPH_OUTCOME[p95]] * self.tail(p95, scope, min_support).multiplier
        return mult

    def corrected_residuals(self, obs: OutcomeObservation,
                            min_support: int = LOOKUP_MIN_SUPPORT) -> dict[str, float]:
        """log(observed / corrected prediction) per outcome — what calibration sees.
        Call on the store *before* it learns from ``obs``."""
        # an online observation was filed in the base regime (update), a batch one in its
        mult = self.correction(obs.scope, None if obs.curves else obs.mediators(),
                               min_support)
        out = {o: r - math.log(mult[o]) for o, r in log_residuals(obs).items()}
        if not obs.curves:
            return out
        # an online observation: its means re-predicted on the learnt pass (along its
        # curves), TTFT times the learnt TTFT multiplier, p95s times the tail factors
        online = self.online_correction(obs.scope, min_support)
        theta = math.log(online["pass"])
        tails = tail_residuals(obs)
        for outcome, extra in (("tpot", 1.0), ("ttft", online["ttft"])):
            r = curve_residual(obs, outcome, theta)
            if r is None:
                continue
            out[outcome] = r - math.log(extra)
            p95 = outcome + "_p95"
            if p95 in tails:
                out[p95] = out[outcome] + tails[p95] \
                    - math.log(self.tail(p95, obs.scope, min_support).multiplier)
        return out

    def candidate_correction(self, scope: Scope, mediators: Mapping[str, float] | None
                             ) -> dict[str, float]:
        """A candidate's corrections: online (``mediators`` None) ``online_correction``;
        batch ``correction`` in the regime its saturated ``mediators`` put it in."""
        return self.online_correction(scope) if mediators is None \
            else self.correction(scope, mediators)

    def online_correction(self, scope: Scope, min_support: int = LOOKUP_MIN_SUPPORT
                          ) -> dict[str, float]:
        """What an online candidate is predicted with: ``"pass"`` — how many times as long
        its passes take (``koi.predictor.passes.scale_passes``; the base regime's TPOT
        belief, which online observations file their ``pass_residual`` under);
        ``"ttft"`` — TTFT's multiplier on the scaled prediction (base regime);
        ``"ttft_p95"`` — that times the tail factor; ``"tpot_p95"`` — the tail factor;
        ``"throughput"`` — the base regime's multiplier."""
        mult = {o: self.lookup(attribute(o, None, self.regimes), scope, min_support)
                .multiplier for o in LEARNT_OUTCOMES}
        return {"pass": mult["tpot"], "ttft": mult["ttft"],
                "ttft_p95": mult["ttft"] * self.tail("ttft_p95", scope, min_support).multiplier,
                "tpot_p95": self.tail("tpot_p95", scope, min_support).multiplier,
                "throughput": mult["throughput"]}

    def kv_cliff(self, scope: Scope, min_support: int = LOOKUP_MIN_SUPPORT
                 ) -> tuple[float, float] | None:
        """(cliff position, P(a cliff exists)) from the most specific scope with support."""
        for s in generalisations(scope):
            c = self.cliffs.get(s)
            if c is not None and c.support >= min_support:
                return c.cliff(self.config.noise("tpot"), self.config.prior_sd)
        return None

    # --- the playbook -----------------------------------------------------------------

    def active_mechanisms(self) -> tuple[Mechanism, ...]:
        return tuple(m for _, m in sorted(self.mechanisms.items()) if m.active)

    def applicable_mechanisms(self, scopes: Iterable[Scope]) -> tuple[Mechanism, ...]:
        """Active mechanisms whose scope contains at least one of ``scopes``, strongest
        effect first."""
        targets = tuple(scopes)
        found = [m for m in self.active_mechanisms()
                 if any(contains(m.scope, s) for s in targets)]
        return tuple(sorted(found, key=lambda m: (-abs(math.log(m.effect)), m.id)))

    def counts(self, scopes: Iterable[Scope] = ()) -> MechanismCounts:
        return MechanismCounts(active=len(self.active_mechanisms()),
                               applicable=len(self.applicable_mechanisms(scopes)),
                               discovered=len(self.mechanisms))

    # --- serialisation ----------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return zlib.compress(json.dumps(_encode(self), sort_keys=True,
                                        separators=(",", ":")).encode(), 1)

    @staticmethod
    def from_bytes(data: bytes) -> BeliefStore:
        doc = json.loads(inflate(data))
        if doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document: format={doc.get('format')!r}")
        return _decode(doc)


def _online_residuals(obs: OutcomeObservation, residuals: Mapping[str, float],
                      passed: tuple[float, float] | None) -> dict[str, float]:
    """An online observation's ``residuals`` with TTFT's replaced by its error beyond the
    pass: log(observed / predicted) with passes as long as its TPOT says (``passed``;
    without it, the raw residual)."""
    out = {k: v for k, v in residuals.items() if k != "ttft"}
    r = curve_residual(obs, "ttft", passed[0] if passed is not None else 0.0)
    if r is not None:
        out["ttft"] = r
    return out


def _back_off(beliefs: Mapping[tuple[Edge, Scope], Belief], edge: Edge, scope: Scope,
              min_support: int, config: BeliefConfig, tick: int) -> Belief:
    for s in generalisations(scope):
        b = beliefs.get((edge, s))
        if b is not None and b.support >= min_support:
            return b
    return Belief.prior(edge, GLOBAL, config, tick)


def _order(o: OutcomeObservation) -> tuple:
    """A total order on observations (ties in id broken by content)."""
    return (o.deployment_id, o.job_id, o.tick, o.scope.key(), o.weight,
            sorted(o.predicted.items()), sorted(o.observed.items()))


def apply_correction(prediction: Prediction, multipliers: Mapping[str, float]) -> Prediction:
    """``prediction`` with ``correction`` multipliers applied to its outcomes (latency
    means, percentiles and e2e latency; throughputs and rates; cost per token ∝ 1/tput).
    A p95 takes its own multiplier where ``multipliers`` has one, else its mean's."""
    t, p, x = (multipliers.get(k, 1.0) for k in LEARNT_OUTCOMES)
    t95, p95 = multipliers.get("ttft_p95", t), multipliers.get("tpot_p95", p)
    decode_ms = max(prediction.e2e_latency_s * 1000.0 - prediction.ttft_ms, 0.0)
    return replace(
        prediction, ttft_ms=prediction.ttft_ms * t, ttft_p50_ms=prediction.ttft_p50_ms * t,
        ttft_p95_ms=prediction.ttft_p95_ms * t95, tpot_ms=prediction.tpot_ms * p,
        tpot_p50_ms=prediction.tpot_p50_ms * p, tpot_p95_ms=prediction.tpot_p95_ms * p95,
        e2e_latency_s=(prediction.ttft_ms * t + decode_ms * p) / 1000.0,
        output_throughput_tok_s=prediction.output_throughput_tok_s * x,
        total_throughput_tok_s=prediction.total_throughput_tok_s * x,
        cost_per_mtok_usd=prediction.cost_per_mtok_usd / x)


_BELIEF_FIELDS = tuple(f.name for f in fields(Belief) if f.name not in ("edge", "scope"))
_CLIFF_FIELDS = tuple(f.name for f in fields(ThresholdBelief) if f.name != "scope")
_MECH_FIELDS = tuple(f.name for f in fields(Mechanism) if f.name not in ("scope", "edge"))


def _encode(store: BeliefStore) -> dict[str, Any]:
    cfg = asdict(store.config)
    beliefs = sorted(([*b.edge, b.scope.key(), *(getattr(b, n) for n in _BELIEF_FIELDS)]
                      for b in store.beliefs.values()), key=lambda row: row[:3])
    tails = sorted(([*b.edge, b.scope.key(), *(getattr(b, n) for n in _BELIEF_FIELDS)]
                    for b in store.tails.values()), key=lambda row: row[:3])
    cliffs = sorted(([c.scope.key(), *(getattr(c, n) for n in _CLIFF_FIELDS)]
                     for c in store.cliffs.values()), key=lambda row: row[0])
    mechs = sorted(([*m.edge, m.scope.key(), *(getattr(m, n) for n in _MECH_FIELDS)]
                    for m in store.mechanisms.values()), key=lambda row: row[3])
    return {"format": FORMAT, "tick": store.tick, "version": store.version, "config": cfg,
            "regimes": asdict(store.regimes), "belief_fields": list(_BELIEF_FIELDS),
            "beliefs": beliefs, "tails": tails, "cliff_fields": list(_CLIFF_FIELDS),
            "cliffs": cliffs,
            "mechanism_fields": list(_MECH_FIELDS), "mechanisms": mechs}


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _decode(doc: dict[str, Any]) -> BeliefStore:
    cfg = BeliefConfig(**{k: _tuples(v) for k, v in doc["config"].items()})
    beliefs = _decode_beliefs(doc["beliefs"], doc["belief_fields"], BELIEF_EDGES)
    # a document from before tail beliefs has none
    tails = _decode_beliefs(doc.get("tails", []), doc["belief_fields"],
                            tuple(TAIL_EDGES.values()))
    cliffs = {}
    for row in doc["cliffs"]:
        scope = Scope.from_key(row[0])
        vals = {k: _tuples(v) for k, v in zip(doc["cliff_fields"], row[1:], strict=True)}
        cliffs[scope] = ThresholdBelief(scope=scope, **vals)
    mechanisms = {}
    for row in doc["mechanisms"]:
        vals = dict(zip(doc["mechanism_fields"], row[3:], strict=True))
        mechanisms[vals["id"]] = Mechanism(edge=(row[0], row[1]), scope=Scope.from_key(row[2]),
                                           **vals)
    return BeliefStore(config=cfg, regimes=Regimes(**doc["regimes"]), tick=doc["tick"],
                       version=doc["version"], beliefs=beliefs, cliffs=cliffs, tails=tails,
                       mechanisms=mechanisms)


def _decode_beliefs(rows: list, names: list[str], edges: tuple[Edge, ...]
                    ) -> dict[tuple[Edge, Scope], Belief]:
    beliefs: dict[tuple[Edge, Scope], Belief] = {}
    for row in rows:
        edge, scope = (row[0], row[1]), Scope.from_key(row[2])
        if edge not in edges:
            raise ValueError(f"belief on unknown edge {edge}")
        vals = {k: _tuples(v) for k, v in zip(names, row[3:], strict=True)}
        beliefs[(edge, scope)] = Belief(edge=edge, scope=scope, **vals)
    return beliefs
