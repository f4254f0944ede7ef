"""A belief store that has learnt a configuration's passes are slower than the model's,
as the causal store learns it (telemetry inverted along the pass curves); shared by the
tests of the evaluator and of the one robust prediction."""

from __future__ import annotations

from koi.catalog import Catalog
from koi.causal import BeliefStore, OutcomeObservation, scope_of
from koi.predictor.api import evaluate_matrix
from koi.predictor.columns import OUT
from koi.predictor.features import build_inputs
from koi.predictor.passes import pass_curves, scale_passes
from koi.predictor.types import LoadMode, Workload
from koi.space import DeploymentConfig


def learnt_pass_store(cfg: DeploymentConfig, catalog: Catalog, slower: float = 1.5,
                      ticks: int = 8) -> BeliefStore:
    """Beliefs after ``ticks`` ticks of telemetry from a world where ``cfg``'s passes take
    ``slower``× the model's, seen at 3 req/s of 1,200-in / 211-out requests."""
    run = lambda X: evaluate_matrix(X, backend="numpy")  # noqa: E731
    X = build_inputs([(cfg, Workload(input_len=1200, output_len=211, mode=LoadMode.RATE,
                                     load=3.0))], catalog)
    world = run(scale_passes(X, slower))
    observed = {"tpot_ms": float(world[OUT["tpot"], 0]) * 1e3,
                "ttft_ms": float(world[OUT["ttft"], 0]) * 1e3}
    curves = pass_curves(X, run)
    obs = OutcomeObservation("d1", "chat", 1, scope_of(cfg, catalog), {}, observed,
                             weight=5000.0, curves={o: tuple(c[0]) for o, c in curves.items()})
    store = BeliefStore()
    for tick in range(1, ticks + 1):
        store = store.update([obs], tick)
    return store
