"""The deterministic proposer: per job, the candidate configurations worth evaluating.

Enumerates the decision space a job can use on the accelerators the fleet offers —
tensor parallelism, weight precision, KV-cache dtype, engine, batch limits — keeps only
configurations that validate (memory fit, engine support, fp8 hardware, …) and orders
them so that the ones the evidence points to come first:

* the job's running configuration (staying put is always a candidate);
* when the running deployment is KV-bound: more TP and an fp8 KV cache;
* when it is communication-bound: fewer ranks; when its queue is near saturation, a
  candidate with more capacity per replica gains a little. At most
  ``ProposerLimits.guided`` of these mediator-guided candidates come right after the
  running configuration, *on top of* the capped evidence-free set, so that a deployment
  that is always KV-bound (a saturated batch job) cannot crowd the cheap options on
  other parts out of it;
* mechanisms from the playbook that say a scope does better (or worse) than the
  prior move those candidates up (or down) and are cited in the hypothesis.

Each ``Proposal`` carries the hypothesis behind it, so explanations and the event log
can say why a configuration was considered. Offerings (cloud, region, market) are not
chosen here: a proposal is priced per offering later. No prediction, no scoring.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from koi.catalog import Catalog
from koi.space import DeploymentConfig, engine_default_config, validate


@dataclass(frozen=True, slots=True)
class Hints:
    """What the last tick measured on the job's running deployment (mediators)."""

    kv_pressure: float = 0.0
    comm_overhead_frac: float = 0.0
    queue_util: float = 0.0
    # KV-overflow preemptions (recomputes) in the window; None = not reported. A full
    # KV cache alone is how a busy engine runs; KV-*bound* is a full cache that preempts
    kv_preemptions: float | None = None


@dataclass(frozen=True, slots=True)
class MechanismHint:
    """A playbook mechanism as the proposer uses it: a scope and a signed effect."""

    id: str
    accelerator: str = "*"
    engine: str = "*"
    tp: int = 0                 # 0 = any
    effect: float = 1.0         # multiplier on latency (<1 better, >1 worse)
    text: str = ""


@dataclass(frozen=True, slots=True)
class Proposal:
    job_id: str
    config: DeploymentConfig    # offering left empty; replicas = 1 (sized later)
    hypothesis: str
    mechanism_ids: tuple[str, ...] = ()
    priority: float = 0.0       # higher = considered first when the set is capped


@dataclass(frozen=True, slots=True)
class ProposerLimits:
    tps: tuple[int, ...] = (1, 2, 4, 8)
    precisions: tuple[str, ...] = ("bf16", "fp8", "int4")
    engines: tuple[str, ...] = ("vllm", "sglang", "trtllm")
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    max_num_seqs: tuple[int, ...] = (64, 256)
    max_per_job: int = 240
    # at most this many more, promoted by the running deployment's mediators (the capped
    # set keeps the evidence-free order, so every part of the fleet stays in)
    guided: int = 16
    extra_engine_defaults: bool = True  # also try each engine's own max_num_seqs default
    notes: dict[str, str] = field(default_factory=dict)


def propose(job_id: str, model: str, accelerators: Iterable[str], catalog: Catalog, *,
            current: DeploymentConfig | None = None, hints: Hints | None = None,
            mechanisms: Sequence[MechanismHint] = (),
            limits: ProposerLimits | None = None) -> list[Proposal]:
    """Valid candidate configurations for one job, best-first: ``max_per_job`` of them,
    plus up to ``guided`` that the running deployment's mediators point at."""
    lim = limits or ProposerLimits()
    # (proposal, tiebreak key) pairs; grid configs are unique, so only the running
    # configuration can appear twice
    items: list[tuple[Proposal, tuple]] = []
    guided: list[tuple[float, Proposal]] = []  # (mediator score, proposal)
    base = current.with_(offering="", replicas=1) if current is not None else None
    if base is not None:
        items.append((Proposal(job_id, base, "keep the running configuration",
                               priority=100.0), _tiebreak(base)))
    for accel in sorted(set(accelerators)):
        grid, grid_keys = _grid_cached(model, accel, catalog, *_grid_args(lim))
        # the mechanisms that can apply on this part, and what they say, found once per
        # (engine, tp)
        here = [m for m in mechanisms if m.accelerator in ("*", accel)]
        in_scope: dict[tuple[str, int], tuple[float, list[str], tuple[str, ...]]] = {}
        for cfg, key in zip(grid, grid_keys, strict=True):
            if base is not None and key == items[0][1] and cfg == base:
                continue
            said = in_scope.get((cfg.engine, cfg.tp))
            if said is None:
                said = in_scope[(cfg.engine, cfg.tp)] = _mechanism_priority(
                    [m for m in here if _in_scope(cfg, m)])
            score, why, mech_ids = said
            guide, guide_why = _mediator_priority(cfg, current, hints, catalog)
            text = "; ".join(guide_why + why) or "explore the space"
            items.append((Proposal(job_id, cfg, text, mech_ids, score), key))
            if guide > 0:
                guided.append((guide, Proposal(job_id, cfg, text, mech_ids, score + guide)))
    ranked = _interleave(items)
    if not guided:
        return ranked[: lim.max_per_job]
    # the running configuration, the best-guided candidates, then the capped set the
    # evidence-free order gives (guided ones on top of it, not instead of its members)
    rank = {p.config: i for i, p in enumerate(ranked)}
    picks = [p for _, p in sorted(guided, key=lambda g: (-g[0], rank[g[1].config]))
             ][: lim.guided]
    chosen = {p.config for p in picks}
    head = ranked[:1] if base is not None else []
    rest = [p for p in ranked[len(head): lim.max_per_job] if p.config not in chosen]
    return head + picks + rest


def _interleave(items: list[tuple[Proposal, tuple]]) -> list[Proposal]:
    """Best-first, and every part of the fleet represented under a cap: promoted
    candidates (priority > 0) first; then the accelerators in turn, each part's own
    candidates best-first — a mechanism that demotes a part's candidates moves them down
    that part's list, never out of the capped set (the evaluator prices what the beliefs
    learnt; dropping a part would leave a job nowhere to go when the rest cannot serve
    it). ``items``: (proposal, its config's ``_tiebreak`` key) pairs."""
    by_accel: dict[str, list[Proposal]] = {}
    for p, _ in sorted(items, key=lambda item: (-item[0].priority, item[1])):
        by_accel.setdefault(p.config.accelerator, []).append(p)
    rank = {id(p): i for group in by_accel.values() for i, p in enumerate(group)}
    return sorted((p for p, _ in items),
                  key=lambda p: (-max(p.priority, 0.0), rank[id(p)], p.config.accelerator))


def _tiebreak(cfg: DeploymentConfig) -> tuple:
    """Deterministic order among equal priorities: fewer GPUs, then names."""
    return (cfg.gpus_per_replica, cfg.accelerator, cfg.engine, cfg.weight_precision.value,
            cfg.kv_dtype.value, cfg.max_num_seqs)


def _grid_args(lim: ProposerLimits) -> tuple:
    return (lim.tps, lim.precisions, lim.engines, lim.kv_dtypes, lim.max_num_seqs,
            lim.extra_engine_defaults)


@lru_cache(maxsize=4096)
def _grid_cached(model: str, accelerator: str, catalog: Catalog, tps: tuple[int, ...],
                 precisions: tuple[str, ...], engines: tuple[str, ...],
                 kv_dtypes: tuple[str, ...], seqs: tuple[int, ...],
                 engine_defaults: bool
                 ) -> tuple[tuple[DeploymentConfig, ...], tuple[tuple, ...]]:
    """Every valid combination of the knobs the proposer varies, and each one's
    ``_tiebreak`` key (cached: pure)."""
    out = []
    for engine in engines:
        eng = catalog.engine(engine)
        if catalog.accelerator(accelerator).vendor not in eng.accelerator_vendors:
            continue
        seq_options = set(seqs) | ({eng.default_max_num_seqs} if engine_defaults else set())
        for tp in tps:
            for prec in precisions:
                for kv in kv_dtypes:
                    for n in sorted(seq_options):
                        cfg = engine_default_config(
                            model, accelerator, engine, catalog, tp=tp, weight_precision=prec,
                            kv_dtype=kv, max_num_seqs=n,
                            max_batched_tokens=max(eng.default_max_batched_tokens, n))
                        if not validate(cfg, catalog):
                            out.append(cfg)
    return tuple(out), tuple(_tiebreak(c) for c in out)


def _mediator_priority(cfg: DeploymentConfig, current: DeploymentConfig | None,
                       hints: Hints | None, catalog: Catalog) -> tuple[float, list[str]]:
    """How strongly the running deployment's mediators point at this candidate, and the
    words for why."""
    score = 0.0
    reasons: list[str] = []
    if current is None or hints is None:
        return score, reasons
    same_part = cfg.accelerator == current.accelerator
    preempting = hints.kv_preemptions is None or hints.kv_preemptions > 0
    if hints.kv_pressure > 0.85 and preempting and same_part:
        if cfg.tp > current.tp:
            score += 3.0
            reasons.append(f"KV-bound (kv_pressure {hints.kv_pressure:.2f}): more TP")
        if cfg.kv_dtype.value == "fp8" and current.kv_dtype.value != "fp8":
            score += 3.0
            reasons.append(f"KV-bound (kv_pressure {hints.kv_pressure:.2f}): fp8 KV")
    if hints.comm_overhead_frac > 0.25 and cfg.tp < current.tp:
        score += 3.0
        reasons.append(f"comm-bound ({hints.comm_overhead_frac:.0%} of a step in "
                       "collectives): fewer ranks")
    if hints.queue_util > 0.85 and _more_capacity(cfg, current, catalog):
        score += 1.0
        reasons.append(f"queue near saturation (ρ {hints.queue_util:.2f}): more capacity"
                       " per replica")
    return score, reasons


def _more_capacity(cfg: DeploymentConfig, current: DeploymentConfig, catalog: Catalog
                   ) -> bool:
    """More GPUs per replica, or as many of a part with more dense bf16 compute."""
    if cfg.gpus_per_replica != current.gpus_per_replica:
        return cfg.gpus_per_replica > current.gpus_per_replica
    return (catalog.accelerator(cfg.accelerator).bf16_tflops
            > catalog.accelerator(current.accelerator).bf16_tflops)


def _mechanism_priority(mechanisms: Sequence[MechanismHint]
                        ) -> tuple[float, list[str], tuple[str, ...]]:
    """How strongly the playbook points at a candidate (``mechanisms``: the ones whose
    scope holds it), the words for why and the mechanisms cited."""
    score, reasons, ids = 0.0, [], []
    for m in mechanisms:
        score += 2.0 if m.effect < 1.0 else -2.0
        ids.append(m.id)
        reasons.append(m.text or f"mechanism {m.id}")
    return score, reasons, tuple(ids)


def _in_scope(cfg: DeploymentConfig, m: MechanismHint) -> bool:
    return ((m.accelerator in ("*", cfg.accelerator)) and (m.engine in ("*", cfg.engine))
            and (m.tp in (0, cfg.tp)))
