"""The fixed causal graph of DESIGN.md §6: decisions → mediators → outcomes.

Nodes carry a kind, a unit and a direction; ``EDGES`` is exactly the edge list of
DESIGN §6 (each "a, b → c, d" expands to every pair). The graph is checked to be acyclic
at import. ``BELIEF_EDGES`` are the (mediator → outcome) edges that carry scoped beliefs
learnt from telemetry: those whose outcome the engines measure every tick.

This module is the structure only: no beliefs, no numbers learnt, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    DECISION = "decision"
    CONTEXT = "context"
    MEDIATOR = "mediator"
    OUTCOME = "outcome"


class Direction(StrEnum):
    HIGHER_BETTER = "higher_better"
    HIGHER_WORSE = "higher_worse"
    NEUTRAL = "neutral"  # a choice, not a score


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    kind: Kind
    unit: str
    direction: Direction = Direction.NEUTRAL


Edge = tuple[str, str]  # (parent, child)

_D, _C, _M, _O = Kind.DECISION, Kind.CONTEXT, Kind.MEDIATOR, Kind.OUTCOME
_B, _W = Direction.HIGHER_BETTER, Direction.HIGHER_WORSE

NODES: dict[str, Node] = {n.name: n for n in (
    # decisions
    Node("accelerator", _D, "catalog id"),
    Node("interconnect", _D, "nvlink|pcie|infinity_fabric|roce (implied by accelerator)"),
    Node("tp", _D, "ranks"),
    Node("pp", _D, "stages"),
    Node("ep", _D, "ranks"),
    Node("replicas", _D, "replicas"),
    Node("engine", _D, "vllm|sglang|trtllm"),
    Node("max_num_seqs", _D, "sequences"),
    Node("max_batched_tokens", _D, "tokens"),
    Node("chunked_prefill", _D, "bool"),
    Node("prefix_caching", _D, "bool"),
    Node("weight_precision", _D, "dtype"),
    Node("kv_dtype", _D, "dtype"),
    Node("gpu_mem_fraction", _D, "fraction"),
    Node("spec_decode", _D, "method"),
    Node("pd_disaggregation", _D, "bool"),
    Node("market", _D, "on_demand|spot|reserved"),
    Node("region", _D, "cloud region"),
    # context: the workload, not chosen
    Node("arrival_rate", _C, "req/s"),
    Node("burstiness", _C, "coefficient of variation"),
    Node("input_len", _C, "tokens"),
    Node("output_len", _C, "tokens"),
    Node("prefix_share", _C, "fraction"),
    # mediators
    Node("kv_pressure", _M, "KV demand / KV capacity", _W),
    Node("comm_overhead", _M, "share of a step in collectives", _W),
    Node("compute_util", _M, "fraction of peak FLOP/s", _W),
    Node("membw_util", _M, "fraction of peak HBM bandwidth", _W),
    Node("queue_util", _M, "ρ (offered / service rate)", _W),
    Node("batch_efficiency", _M, "fraction", _B),
    Node("preemption_exposure", _M, "replica-hours lost", _W),
    Node("network_latency", _M, "ms client ↔ region", _W),
    # outcomes
    Node("ttft", _O, "ms", _W),
    Node("tpot", _O, "ms", _W),
    Node("throughput", _O, "output tok/s", _B),
    Node("goodput", _O, "tok/s within SLO", _B),
    Node("cost_per_token", _O, "$ per million output tokens", _W),
    Node("availability", _O, "fraction", _B),
)}


def _expand(groups: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]) -> tuple[Edge, ...]:
    return tuple((p, c) for parents, kids in groups for p in parents for c in kids)


# DESIGN §6 "Edges", in its order. Do not add an edge here without changing DESIGN §6.
EDGES: tuple[Edge, ...] = _expand((
    (("tp", "pp", "weight_precision", "kv_dtype", "gpu_mem_fraction", "input_len",
      "output_len", "max_num_seqs"), ("kv_pressure",)),
    (("tp", "pp", "ep", "interconnect"), ("comm_overhead",)),
    (("accelerator", "weight_precision", "max_batched_tokens", "chunked_prefill"),
     ("compute_util", "membw_util")),
    (("arrival_rate", "burstiness", "replicas", "throughput"), ("queue_util",)),
    (("kv_pressure",), ("tpot", "throughput")),
    (("comm_overhead",), ("tpot", "ttft")),
    (("compute_util",), ("ttft",)),
    (("membw_util",), ("tpot",)),
    (("queue_util",), ("ttft",)),
    (("prefix_share", "prefix_caching"), ("ttft",)),
    (("spec_decode",), ("tpot",)),
    (("market", "region"), ("preemption_exposure",)),
    (("preemption_exposure",), ("availability", "goodput")),
    (("region",), ("network_latency",)),
    (("network_latency",), ("ttft",)),
    (("throughput", "accelerator", "market"), ("cost_per_token",)),
))

# The one belief edge DESIGN §6 does not list: §6 names `batch_efficiency` as a mediator
# but gives it no edges, while the predictor scales throughput by it. Below the KV cliff
# a throughput residual has no other parent to go to; see docs/CAUSAL.md.
BATCH_EFFICIENCY_EDGE: Edge = ("batch_efficiency", "throughput")

# Mediator → outcome edges that carry scoped beliefs (the outcomes measured every tick).
BELIEF_EDGES: tuple[Edge, ...] = (
    ("kv_pressure", "tpot"),
    ("kv_pressure", "throughput"),
    ("comm_overhead", "tpot"),
    ("comm_overhead", "ttft"),
    ("compute_util", "ttft"),
    ("membw_util", "tpot"),
    ("queue_util", "ttft"),
    BATCH_EFFICIENCY_EDGE,
)

# Outcomes the belief edges end in, in a fixed order.
LEARNT_OUTCOMES: tuple[str, ...] = ("ttft", "tpot", "throughput")


def parents(node: str) -> tuple[str, ...]:
    """Direct causes of ``node`` in the fixed graph (DESIGN §6 order)."""
    _known(node)
    return tuple(p for p, c in EDGES if c == node)


def children(node: str) -> tuple[str, ...]:
    """Direct effects of ``node`` in the fixed graph (DESIGN §6 order)."""
    _known(node)
    return tuple(c for p, c in EDGES if p == node)


def nodes_of(kind: Kind) -> tuple[str, ...]:
    return tuple(n.name for n in NODES.values() if n.kind == kind)


def topological_order(edges: tuple[Edge, ...] = EDGES) -> tuple[str, ...]:
    """Kahn's algorithm over ``NODES`` (ties broken by declaration order).

    Raises ``ValueError`` naming the nodes on a cycle when there is one.
    """
    indeg = {n: 0 for n in NODES}
    for _, c in edges:
        indeg[c] += 1
    ready = [n for n in NODES if indeg[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for p, c in edges:
            if p == n:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
    if len(order) != len(NODES):
        stuck = sorted(n for n in NODES if n not in order)
        raise ValueError(f"causal graph has a cycle through {', '.join(stuck)}")
    return tuple(order)


def _known(node: str) -> None:
    if node not in NODES:
        raise KeyError(f"unknown causal node {node!r}")


def _check() -> None:
    for p, c in (*EDGES, *BELIEF_EDGES):
        _known(p)
        _known(c)
    for p, c in BELIEF_EDGES:
        if NODES[p].kind != Kind.MEDIATOR or NODES[c].kind != Kind.OUTCOME:
            raise ValueError(f"belief edge {p} → {c} is not mediator → outcome")
    topological_order()


_check()
