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

from bisect import bisect_left, bisect_right
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
    base = current.with_(offering="", replicas=1) if current is not None else None
    # per accelerator its candidates best-first; the running configuration joins its own
    # accelerator's list with the first priority
    parts: dict[str, _Part] = {}
    for accel in sorted(set(accelerators)):
        parts[accel] = _Part.of(_grid_sorted(model, accel, catalog, *_grid_args(lim)),
                                [m for m in mechanisms if m.accelerator in ("*", accel)])
    if base is not None:
        if base.accelerator not in parts:
            parts[base.accelerator] = _Part.of(_SortedGrid.of(()), ())
        parts[base.accelerator].drop(base)
        parts[base.accelerator].keep(base)
    mediated = _mediators_point(current, hints)

    def proposal(cfg: DeploymentConfig, priority: float) -> Proposal:
        if cfg is base:
            return Proposal(job_id, cfg, "keep the running configuration", priority=priority)
        mech_ids, why = parts[cfg.accelerator].said(cfg)
        guide_why = _mediator_priority(cfg, current, hints, catalog)[1] if mediated else []
        return Proposal(job_id, cfg, "; ".join(guide_why + why) or "explore the space",
                        mech_ids, priority)

    ranked = [proposal(cfg, score) for cfg, score in _interleave(parts, lim.max_per_job)]
    # (guide, its order in the evidence-free ranking, config, priority) of each
    # candidate the running deployment's mediators point at
    guided: list[tuple[float, tuple, DeploymentConfig, float]] = []
    for accel, part in parts.items() if mediated else ():
        for r in range(len(part.order)):
            cfg = part.config(r)
            if cfg is base:
                continue
            guide = _mediator_priority(cfg, current, hints, catalog)[0]
            if guide > 0:
                score = part.scores[r]
                guided.append((guide, (-max(score, 0.0), r, accel), cfg, score))
    if not guided:
        return ranked
    # the running configuration, the best-guided candidates, then the capped set the
    # evidence-free order gives (guided ones on top of it, not instead of its members)
    picks = sorted(guided, key=lambda g: (-g[0], g[1]))[: lim.guided]
    chosen = {cfg for _, _, cfg, _ in picks}
    head = ranked[:1] if base is not None else []
    rest = [p for p in ranked[len(head):] if p.config not in chosen]
    return head + [proposal(cfg, score + guide) for guide, _, cfg, score in picks] + rest


def _mediators_point(current: DeploymentConfig | None, hints: Hints | None) -> bool:
    """Whether ``_mediator_priority`` can promote any candidate (its conditions on the
    running deployment's mediators, without the candidate)."""
    if current is None or hints is None:
        return False
    preempting = hints.kv_preemptions is None or hints.kv_preemptions > 0
    return ((hints.kv_pressure > 0.85 and preempting) or hints.comm_overhead_frac > 0.25
            or hints.queue_util > 0.85)


_KEEP = 100.0  # the running configuration's priority: first in its part, always kept


class _Part:
    """One accelerator's candidates for a job, best-first (priority down, then
    ``_tiebreak``): positions into the part's key-sorted grid (``_grid_sorted``), -1 for
    the running configuration when it joins."""

    __slots__ = ("base", "grid", "order", "said_by", "scores")

    def __init__(self, grid: _SortedGrid, order: list[int], scores: list[float],
                 said_by: dict[tuple[str, int], _Said]) -> None:
        self.grid, self.order, self.scores, self.said_by = grid, order, scores, said_by
        self.base: DeploymentConfig | None = None

    @classmethod
    def of(cls, grid: _SortedGrid, mechanisms: Sequence[MechanismHint]) -> _Part:
        """The part's grid ordered by what ``mechanisms`` (those that can apply on this
        part) say of each (engine, tp): a stable sort of the key-sorted grid by priority
        is the (priority, key) order."""
        said_by = {combo: _mechanism_priority([m for m in mechanisms
                                               if _in_scope(*combo, m)])
                   for combo in grid.by_combo} if mechanisms else {}
        if not any(said[0] for said in said_by.values()):
            return cls(grid, list(range(len(grid.configs))), [0.0] * len(grid.configs),
                       said_by)
        order: list[int] = []
        scores: list[float] = []
        levels = sorted({said[0] for said in said_by.values()}, reverse=True)
        for level in levels:
            at = sorted(i for combo, said in said_by.items() if said[0] == level
                        for i in grid.by_combo[combo])
            order += at
            scores += [level] * len(at)
        return cls(grid, order, scores, said_by)

    def config(self, r: int) -> DeploymentConfig:
        i = self.order[r]
        return self.grid.configs[i] if i >= 0 else self.base  # type: ignore[return-value]

    def drop(self, cfg: DeploymentConfig) -> None:
        """Leave out the grid's copy of ``cfg`` (the running configuration joins with its
        own priority)."""
        i = self.grid.position.get(cfg)
        if i is not None:
            r = self.order.index(i)
            del self.order[r], self.scores[r]

    def keep(self, base: DeploymentConfig) -> None:
        """Add the running configuration at its place in the (priority, key) order."""
        key = (-_KEEP, _tiebreak(base))
        r = bisect_left(range(len(self.order)), key,
                        key=lambda r: (-self.scores[r], self.grid.keys[self.order[r]]))
        self.base = base
        self.order.insert(r, -1)
        self.scores.insert(r, _KEEP)

    def said(self, cfg: DeploymentConfig) -> tuple[tuple[str, ...], list[str]]:
        """The mechanisms cited for ``cfg`` and the words for why."""
        said = self.said_by.get((cfg.engine, cfg.tp))
        return (said[2], said[1]) if said else ((), [])

    def runs(self) -> list[tuple[float, int, int]]:
        """(level, first position, end) of each run of one ``max(priority, 0)``: each
        promoted priority's positions, then every one at or below 0 (the scores are in
        descending order)."""
        out: list[tuple[float, int, int]] = []
        scores, n, r = self.scores, len(self.scores), 0
        while r < n:
            level = max(scores[r], 0.0)
            if level == 0.0:
                out.append((0.0, r, n))
                break
            end = bisect_right(range(n), -level, lo=r, key=lambda i: -scores[i])
            out.append((level, r, end))
            r = end
        return out


def _interleave(parts: dict[str, _Part], k: int) -> list[tuple[DeploymentConfig, float]]:
    """The first ``k`` (config, priority) pairs, best-first and every part of the fleet
    represented under the cap: promoted candidates (priority > 0) first; then the
    accelerators in turn, each part's own candidates best-first — a mechanism that
    demotes a part's candidates moves them down that part's list, never out of the capped
    set (the evaluator prices what the beliefs learnt; dropping a part would leave a job
    nowhere to go when the rest cannot serve it). The order is (−max(priority, 0),
    position in its part, accelerator)."""
    runs: dict[float, list[tuple[str, int, int]]] = {}
    for accel in sorted(parts):
        for level, first, end in parts[accel].runs():
            runs.setdefault(level, []).append((accel, first, end))
    out: list[tuple[DeploymentConfig, float]] = []
    for level in sorted(runs, reverse=True):
        at = runs[level]
        for r in range(min(f for _, f, _ in at), max(e for _, _, e in at)):
            for accel, first, end in at:
                if first <= r < end:
                    part = parts[accel]
                    out.append((part.config(r), part.scores[r]))
                    if len(out) == k:
                        return out
    return out


def _tiebreak(cfg: DeploymentConfig) -> tuple:
    """Deterministic order among equal priorities: fewer GPUs, then names."""
    return (cfg.gpus_per_replica, cfg.accelerator, cfg.engine, cfg.weight_precision.value,
            cfg.kv_dtype.value, cfg.max_num_seqs)


def _grid_args(lim: ProposerLimits) -> tuple:
    return (lim.tps, lim.precisions, lim.engines, lim.kv_dtypes, lim.max_num_seqs,
            lim.extra_engine_defaults)


_Said = tuple[float, list[str], tuple[str, ...]]  # _mechanism_priority's answer


@dataclass(frozen=True)
class _SortedGrid:
    """An accelerator's grid in ``_tiebreak`` order (stable: equal keys keep the grid's
    order), with each config's position and the positions of each (engine, tp)."""

    configs: tuple[DeploymentConfig, ...]
    keys: tuple[tuple, ...]
    position: dict[DeploymentConfig, int]
    by_combo: dict[tuple[str, int], list[int]]

    @classmethod
    def of(cls, grid: Sequence[DeploymentConfig]) -> _SortedGrid:
        keyed = sorted(((_tiebreak(c), c) for c in grid), key=lambda kc: kc[0])
        configs = tuple(c for _, c in keyed)
        by_combo: dict[tuple[str, int], list[int]] = {}
        for i, c in enumerate(configs):
            by_combo.setdefault((c.engine, c.tp), []).append(i)
        return cls(configs, tuple(k for k, _ in keyed),
                   {c: i for i, c in enumerate(configs)}, by_combo)


@lru_cache(maxsize=4096)
def _grid_sorted(model: str, accelerator: str, catalog: Catalog, *grid_args: object
                 ) -> _SortedGrid:
    """``_grid`` sorted (cached: pure)."""
    return _SortedGrid.of(_grid(model, accelerator, catalog, *grid_args))  # type: ignore[arg-type]


def _grid(model: str, accelerator: str, catalog: Catalog, tps: tuple[int, ...],
                 precisions: tuple[str, ...], engines: tuple[str, ...],
                 kv_dtypes: tuple[str, ...], seqs: tuple[int, ...],
                 engine_defaults: bool
                 ) -> list[DeploymentConfig]:
    """Every valid combination of the knobs the proposer varies."""
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
    return out


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


def _in_scope(engine: str, tp: int, m: MechanismHint) -> bool:
    """Whether ``m`` (one that can apply on the part) holds an (engine, tp) of it."""
    return m.engine in ("*", engine) and m.tp in (0, tp)
