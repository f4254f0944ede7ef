"""The proposer's order is its definition: the indexed implementation in
``koi.planner.propose`` gives exactly what the plain one below gives (sort every valid
grid configuration by priority and tiebreak, interleave the accelerators, promote what
the mediators point at), for any fleet, running configuration, hints, mechanisms and cap.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from koi.catalog import load_catalog
from koi.planner.propose import (
    Hints,
    MechanismHint,
    Proposal,
    ProposerLimits,
    _grid,
    _grid_args,
    _mechanism_priority,
    _mediator_priority,
    _tiebreak,
    propose,
)
from koi.space import engine_default_config

CAT = load_catalog()
ACCELS = ("h100-sxm", "a100-80gb", "l40s", "l4", "mi300x", "h200", "a10g")
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-32b")


def reference(job_id, model, accelerators, catalog, *, current=None, hints=None,
              mechanisms=(), limits=None) -> list[Proposal]:
    """The proposer as first written: a Proposal for every grid configuration, sorted."""
    lim = limits or ProposerLimits()
    items, guided = [], []
    base = current.with_(offering="", replicas=1) if current is not None else None
    if base is not None:
        items.append((Proposal(job_id, base, "keep the running configuration",
                               priority=100.0), _tiebreak(base)))
    for accel in sorted(set(accelerators)):
        here = [m for m in mechanisms if m.accelerator in ("*", accel)]
        for cfg in _grid(model, accel, catalog, *_grid_args(lim)):
            if cfg == base:
                continue
            score, why, mech_ids = _mechanism_priority(
                [m for m in here if m.engine in ("*", cfg.engine) and m.tp in (0, cfg.tp)])
            guide, guide_why = _mediator_priority(cfg, current, hints, catalog)
            text = "; ".join(guide_why + why) or "explore the space"
            items.append((Proposal(job_id, cfg, text, mech_ids, score), _tiebreak(cfg)))
            if guide > 0:
                guided.append((guide, Proposal(job_id, cfg, text, mech_ids, score + guide)))
    by_accel: dict = {}
    for p, _ in sorted(items, key=lambda item: (-item[0].priority, item[1])):
        by_accel.setdefault(p.config.accelerator, []).append(p)
    rank_in = {id(p): i for group in by_accel.values() for i, p in enumerate(group)}
    ranked = sorted((p for p, _ in items), key=lambda p: (-max(p.priority, 0.0),
                                                         rank_in[id(p)], p.config.accelerator))
    if not guided:
        return ranked[: lim.max_per_job]
    rank = {p.config: i for i, p in enumerate(ranked)}
    picks = [p for _, p in sorted(guided, key=lambda g: (-g[0], rank[g[1].config]))
             ][: lim.guided]
    chosen = {p.config for p in picks}
    head = ranked[:1] if base is not None else []
    return head + picks + [p for p in ranked[len(head): lim.max_per_job]
                           if p.config not in chosen]


mechanisms = st.builds(
    MechanismHint, id=st.sampled_from(("m1", "m2", "m3", "m4")),
    accelerator=st.sampled_from(("*", *ACCELS[:4])),
    engine=st.sampled_from(("*", "vllm", "sglang", "trtllm")), tp=st.sampled_from((0, 1, 2, 4)),
    effect=st.sampled_from((0.7, 1.3)))
hints = st.builds(Hints, kv_pressure=st.sampled_from((0.2, 0.9, 0.99)),
                  comm_overhead_frac=st.sampled_from((0.05, 0.4)),
                  queue_util=st.sampled_from((0.3, 0.9)),
                  kv_preemptions=st.sampled_from((None, 0.0, 3.0)))


@st.composite
def currents(draw):
    model = draw(st.sampled_from(MODELS))
    accel = draw(st.sampled_from(ACCELS))
    engine = "sglang" if accel == "mi300x" else draw(st.sampled_from(("vllm", "trtllm")))
    cfg = engine_default_config(model, accel, engine, CAT, tp=draw(st.sampled_from((1, 2, 4, 8))),
                                max_num_seqs=draw(st.sampled_from((64, 100, 256))),
                                replicas=draw(st.integers(1, 4)), offering="some/offer")
    return model, cfg


@settings(max_examples=60, deadline=None)
@given(fleet=st.sets(st.sampled_from(ACCELS), min_size=1, max_size=5), running=currents(),
       with_current=st.booleans(), hint=st.one_of(st.none(), hints),
       mechs=st.lists(mechanisms, max_size=4), cap=st.sampled_from((1, 7, 40, 240, 5000)),
       guided=st.sampled_from((0, 3, 16)))
def test_the_proposer_orders_as_its_definition_does(fleet, running, with_current, hint, mechs,
                                                     cap, guided) -> None:
    model, current = running
    lim = ProposerLimits(max_per_job=cap, guided=guided)
    kw = dict(current=current if with_current else None, hints=hint, mechanisms=mechs,
              limits=lim)
    assert propose("j", model, sorted(fleet), CAT, **kw) == \
        reference("j", model, sorted(fleet), CAT, **kw)
