"""The oracle's predictor table is fitted to the run's hidden world."""

from __future__ import annotations

from koi.catalog import load_catalog
from koi.policies.oracle import fitted_world_calibration, world_calibration, world_cases
from koi.predictor.accuracy import predict_cases
from koi.predictor.calibration import load_calibration
from koi.sim.testing import online_job, tiny_scenario
from koi.sim.world import load_world


def _median_ape(cases, calibration) -> float:
    import statistics

    results = predict_cases(cases, calibration=calibration)
    return statistics.median(abs(r.predicted - r.case.value) / r.case.value for r in results)


def test_the_world_fit_predicts_the_world_better_than_the_public_fit() -> None:
    cat = load_catalog()
    scenario = tiny_scenario([online_job("chat", model="llama-3.1-8b", inp=1024, out=256),
                              online_job("summarise", model="llama-3.1-8b", inp=3000, out=60)],
                             fleet={"aws/us-east-1/l40s/on_demand": 8})
    # a world unlike the default one: the public fit cannot know it, the oracle does
    world = load_world({"mem_eff": {"l40s": 0.5}, "engine_mult": {"vllm": 1.3}})
    cases = world_cases(world, scenario, cat)
    ours = [c for c in cases if c.label.startswith("world ")]
    assert {c.config.accelerator for c in ours} == {"l40s"}
    assert {c.workload.input_len for c in ours} == {1024, 3000}
    assert {c.metric for c in ours} == {"output_throughput_tok_s", "ttft_ms", "tpot_ms"}
    assert all(c.value > 0 for c in cases)

    oracle = fitted_world_calibration(world, scenario, cat, cases)
    assert oracle.meta["world_cases"] == len(cases)
    fitted = _median_ape(ours, oracle)
    assert fitted < _median_ape(ours, load_calibration())
    assert fitted < _median_ape(ours, world_calibration(world))


def test_the_true_oracle_measures_alternatives_on_every_accelerator() -> None:
    """The top-k by tokens per dollar may all sit on one cheap accelerator; the best few
    of every other accelerator are measured too, so a stock-out there leaves somewhere
    to go (gen-medium-1: three online jobs stranded on Gaudi2)."""
    from types import SimpleNamespace

    from koi.planner.propose import Proposal
    from koi.policies.oracle import TruthMeasure
    from koi.space import DeploymentConfig

    cat = load_catalog()
    job = online_job("chat", model="llama-3.1-8b", inp=1024, out=256)
    cheap = [DeploymentConfig(model="llama-3.1-8b", accelerator="l40s", max_num_seqs=n)
             for n in (16, 32, 64, 128, 256)]
    dear = [DeploymentConfig(model="llama-3.1-8b", accelerator="h100-sxm", max_num_seqs=n)
            for n in (16, 32, 64)]
    ev = SimpleNamespace(proposals=tuple(Proposal("chat", c, "") for c in cheap + dear))

    class Truth:  # every l40s config is worth more per dollar than any h100 one
        def saturated_tok_s(self, cfg, job, off) -> float:
            return (1e6 if cfg.accelerator == "l40s" else 1.0) + cfg.max_num_seqs

    offers = {a: [o for o in cat.offerings.values() if o.accelerator == a][:1]
              for a in ("l40s", "h100-sxm")}
    measure = TruthMeasure(Truth(), cat, top_k=3, per_accelerator=2)  # type: ignore[arg-type]
    chosen = [ev.proposals[i].config for i in measure._chosen(job, list(range(8)), ev,
                                                               offers, set())]
    assert [c.max_num_seqs for c in chosen if c.accelerator == "l40s"] == [64, 128, 256]
    assert [c.max_num_seqs for c in chosen if c.accelerator == "h100-sxm"] == [32, 64]
    # without the per-accelerator floor the h100s would not be measured at all
    only_top = TruthMeasure(Truth(), cat, top_k=3, per_accelerator=0)  # type: ignore[arg-type]
    assert {ev.proposals[i].config.accelerator
            for i in only_top._chosen(job, list(range(8)), ev, offers, set())} == {"l40s"}
