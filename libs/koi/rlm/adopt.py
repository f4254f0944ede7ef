"""What accepted hypotheses may change: extra candidates, and weak priors on beliefs.

* ``candidate_proposals`` — each hypothesis's test configurations (and explorations) as
  ``koi.planner.propose.Proposal``s per job, citing the hypothesis; ``widen`` adds them
  to the deterministic proposer's list, on top of it, never instead of any of it. The
  evaluator and composer score them like every other candidate.
* ``priors`` / ``with_priors`` — a hypothesis on a belief edge sets a *weak* prior on
  that (edge, scope) belief: its log size as the prior mean, with a precision half that
  of the weakest single observation the store learns from (``hypothesis_precision``).
  One observation outweighs it; it adds no support, so lookups ignore it until
  telemetry arrives (``LOOKUP_MIN_SUPPORT``) and only telemetry promotes a mechanism
  (one that started from such a prior records ``source="rlm"``). Expired priors are
  taken off again.

Pure functions over frozen values; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from koi.catalog import Catalog
from koi.causal.beliefs import Belief, BeliefConfig
from koi.causal.graph import BELIEF_EDGES, Edge
from koi.causal.observe import MIN_REQUESTS
from koi.causal.scope import Scope
from koi.causal.store import BeliefStore
from koi.cluster import JobStatus
from koi.planner.propose import Proposal
from koi.rlm.hypothesis import Hypothesis, SearchSpace, exploration_configs
from koi.safe_text import printable
from koi.space import DeploymentConfig

CANDIDATE_PRIORITY = 0.5  # after the running configuration, before the plain grid


def candidate_proposals(hypotheses: Sequence[Hypothesis], jobs: Mapping[str, JobStatus],
                        space: SearchSpace, catalog: Catalog, *, per_job: int = 8
                        ) -> dict[str, list[Proposal]]:
    """Per job, the distinct valid configurations the hypotheses would test (at most
    ``per_job``, in hypothesis order), each citing its hypothesis."""
    out: dict[str, list[Proposal]] = {}
    seen: dict[str, set[DeploymentConfig]] = {}
    for h in hypotheses:
        pairs = [(t.job_id, t.config) for t in h.tests]
        for e in h.explore:
            made, _ = exploration_configs(e, jobs, space, catalog)
            pairs += [(e.job_id, c) for c in made]
        why = printable(f"language-model hypothesis {h.id} ({h.source_model}): {h.label()}"
                        + (f" — {h.statement}" if h.statement else ""), 400)
        cited = tuple(w.partition(":")[2].strip() for w in h.why
                      if w.partition(":")[0].strip() == "mechanism")
        for job_id, cfg in pairs:
            cfg = cfg.with_(offering="", replicas=1)
            have = seen.setdefault(job_id, set())
            if job_id not in jobs or cfg in have or len(have) >= per_job \
                    or cfg.accelerator not in space.accelerators or space.check(cfg, catalog):
                continue
            have.add(cfg)
            out.setdefault(job_id, []).append(
                Proposal(job_id, cfg, why, cited, priority=CANDIDATE_PRIORITY))
    return out


def widen(proposals: Sequence[Proposal], extra: Mapping[str, Sequence[Proposal]]
          ) -> list[Proposal]:
    """``proposals`` (the proposer's, grouped by job) with each job's ``extra``
    candidates after its own, leaving out configurations it already has. Jobs the
    proposer did not plan get nothing."""
    by_job: dict[str, list[Proposal]] = {}
    for p in proposals:
        by_job.setdefault(p.job_id, []).append(p)
    out: list[Proposal] = []
    for job_id, mine in by_job.items():
        have = {p.config for p in mine}
        out += mine
        for p in extra.get(job_id, ()):
            if p.config not in have:
                have.add(p.config)
                out.append(p)
    return out


# --- weak priors --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HypothesisPrior:
    """A weak prior on the belief (edge, scope): N(log_mean, 1/precision) in log space."""

    edge: Edge
    scope: Scope
    log_mean: float
    precision: float
    expires_tick: int
    hypothesis_id: str


def weakest_observation_precision(config: BeliefConfig) -> float:
    """Precision one observation adds at the least: the fewest requests the store
    learns from (``MIN_REQUESTS``) and the noisiest outcome."""
    noisiest = max(sd for _, sd in (*config.noise_sd, *config.tail_noise_sd))
    return config.obs_weight(MIN_REQUESTS) / noisiest ** 2


def hypothesis_precision(config: BeliefConfig) -> float:
    """A hypothesis's prior precision: half the weakest observation's, so that any
    single observation the store accepts outweighs it twice over."""
    return 0.5 * weakest_observation_precision(config)


def priors(hypotheses: Sequence[Hypothesis], config: BeliefConfig
           ) -> tuple[HypothesisPrior, ...]:
    """The weak priors of the hypotheses whose edge carries beliefs (the others only
    widen the candidate set)."""
    p = hypothesis_precision(config)
    return tuple(HypothesisPrior(h.edge, h.scope, math.log(h.size), p, h.expires_tick, h.id)
                 for h in hypotheses if h.edge in BELIEF_EDGES)


def with_priors(store: BeliefStore, active: Sequence[HypothesisPrior], tick: int
                ) -> BeliefStore:
    """``store`` with exactly the unexpired ``active`` priors set (every other belief back
    on the predictor's prior). Several priors on one belief average, at the precision of
    one. A new version only when something changed (predictions cached by version)."""
    cfg = store.config
    base = cfg.prior_sd ** -2
    wanted: dict[tuple[Edge, Scope], list[HypothesisPrior]] = {}
    for pr in active:
        if pr.expires_tick > tick and pr.edge in BELIEF_EDGES and math.isfinite(pr.log_mean):
            wanted.setdefault((pr.edge, pr.scope), []).append(pr)
    beliefs = dict(store.beliefs)
    changed = False
    for key, b in store.beliefs.items():
        if key not in wanted and (b.prior_sum != 0.0 or b.prior_precision != base):
            beliefs[key] = replace(b, prior_precision=base, prior_sum=0.0)
            changed = True
    for key, group in wanted.items():
        precision = min(pr.precision for pr in group)
        mean = sum(pr.log_mean for pr in group) / len(group)
        b = beliefs.get(key) or Belief.prior(key[0], key[1], cfg, store.tick)
        target = replace(b, prior_precision=base + precision, prior_sum=precision * mean)
        if target != beliefs.get(key):
            beliefs[key] = target
            changed = True
    if not changed:
        return store
    return replace(store, beliefs=beliefs, version=store.version + 1)
