"""The fixed causal graph (DESIGN §6), scopes and the back-off lattice."""

from __future__ import annotations

import pytest

from koi.catalog import load_catalog
from koi.causal import graph
from koi.causal.graph import BELIEF_EDGES, EDGES, NODES, Kind, children, parents
from koi.causal.scope import GLOBAL, Scope, contains, generalisations, scope_of, size_class
from koi.space import DeploymentConfig


def test_edges_are_exactly_design_section_6() -> None:
    expected = set()
    for ps, cs in [
        ("tp pp weight_precision kv_dtype gpu_mem_fraction input_len output_len "
         "max_num_seqs", "kv_pressure"),
        ("tp pp ep interconnect", "comm_overhead"),
        ("accelerator weight_precision max_batched_tokens chunked_prefill",
         "compute_util membw_util"),
        ("arrival_rate burstiness replicas throughput", "queue_util"),
        ("kv_pressure", "tpot throughput"), ("comm_overhead", "tpot ttft"),
        ("compute_util", "ttft"), ("membw_util", "tpot"), ("queue_util", "ttft"),
        ("prefix_share prefix_caching", "ttft"), ("spec_decode", "tpot"),
        ("market region", "preemption_exposure"),
        ("preemption_exposure", "availability goodput"), ("region", "network_latency"),
        ("network_latency", "ttft"), ("throughput accelerator market", "cost_per_token"),
    ]:
        expected |= {(p, c) for p in ps.split() for c in cs.split()}
    assert set(EDGES) == expected
    assert len(EDGES) == len(expected)  # no duplicates


def test_graph_is_a_dag_and_parents_children_agree() -> None:
    order = graph.topological_order()
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[p] < pos[c] for p, c in EDGES)
    assert set(parents("ttft")) == {"comm_overhead", "compute_util", "queue_util",
                                    "prefix_share", "prefix_caching", "network_latency"}
    assert children("kv_pressure") == ("tpot", "throughput")
    with pytest.raises(ValueError, match="cycle"):
        graph.topological_order((*EDGES, ("ttft", "tp")))
    with pytest.raises(KeyError):
        parents("nope")


def test_node_kinds_and_belief_edges() -> None:
    assert graph.nodes_of(Kind.OUTCOME) == ("ttft", "tpot", "throughput", "goodput",
                                            "cost_per_token", "availability")
    assert len(graph.nodes_of(Kind.MEDIATOR)) == 8
    assert all(NODES[n].unit for n in NODES)
    for p, c in BELIEF_EDGES:
        assert NODES[p].kind == Kind.MEDIATOR and NODES[c].kind == Kind.OUTCOME
        assert (p, c) in EDGES or (p, c) == graph.BATCH_EFFICIENCY_EDGE


def test_scope_of_buckets() -> None:
    cat = load_catalog()
    s = scope_of(DeploymentConfig(model="llama-3.1-8b", accelerator="l4", tp=1), cat)
    assert s == Scope("l4", "vllm", "≤10B", "tp1", family="ada")
    assert s.label() == "{l4, vllm, ≤10B, tp1}"
    big = scope_of(DeploymentConfig(model="llama-3.1-70b", accelerator="h100-sxm", tp=4,
                                    engine="sglang"), cat)
    assert (big.size_class, big.parallelism, big.family) == ("40–100B", "tp4", "hopper")
    assert scope_of(DeploymentConfig(model="llama-3.1-405b", tp=8, pp=2), cat).parallelism \
        == "pp>1"
    assert [size_class(x) for x in (8, 10, 32, 70, 405)] == \
        ["≤10B", "≤10B", "10–40B", "40–100B", ">100B"]


def test_generalisations_back_off_order() -> None:
    s = Scope("l4", "vllm", "≤10B", "tp1", family="ada")
    gens = generalisations(s)
    assert len(gens) == 24 and len(set(gens)) == 24
    assert gens[0] == s and gens[-1] == GLOBAL
    assert gens[1] == Scope("l4", "*", "≤10B", "tp1", family="ada")  # engine goes first
    assert gens[4] == Scope("*", "vllm", "≤10B", "tp1", family="ada")  # part → family
    specificity = [g.specificity for g in gens]
    assert specificity == sorted(specificity, reverse=True)
    assert all(contains(g, s) for g in gens)
    assert generalisations(s) == gens  # deterministic
    assert generalisations(GLOBAL) == (GLOBAL,)


def test_contains_is_a_partial_order() -> None:
    s = Scope("l4", "vllm", "≤10B", "tp1", family="ada")
    assert contains(GLOBAL, s) and contains(s, s)
    assert not contains(s, GLOBAL)
    assert contains(Scope(family="ada"), s)
    assert not contains(Scope(family="hopper"), s)
    assert not contains(Scope(engine="sglang"), s)
    assert Scope.from_key(s.key()) == s
