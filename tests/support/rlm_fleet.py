"""Small builders for the language-model layer's tests: a fleet snapshot, planner state,
and hypothesis JSON as a model would write it. Builders only; no test logic."""

from __future__ import annotations

from typing import Any

from koi.catalog import Catalog, load_catalog
from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus, OfferingCapacity
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState
from koi.sim.testing import batch_job, online_job
from koi.space import engine_default_config

H100_OD = "aws/us-east-1/h100-sxm/on_demand"
L4_OD = "aws/us-east-1/l4/on_demand"
TICK = 10
PLANNER = KoiSettings(backend="numpy")  # the reference kernel: no numba compile in tests


def catalog() -> Catalog:
    return load_catalog()


def snapshot(*, extra_jobs: tuple[JobStatus, ...] = (), tick: int = TICK) -> ClusterSnapshot:
    """An H100 and an L4 offering; ``chat-eu`` (online, llama-3.1-8b) runs on two H100
    replicas, ``batch-sum`` (batch) waits."""
    cat = catalog()
    running = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", cat,
                                    offering=H100_OD, replicas=2)
    jobs = (JobStatus(online_job("chat-eu", rate=3.0), True, False, observed_rate_rps=3.0),
            JobStatus(batch_job("batch-sum"), True, False), *extra_jobs)
    return ClusterSnapshot(
        tick=tick, time_s=60.0 * tick, tick_s=60.0, horizon_s=3600.0,
        capacity=(OfferingCapacity(H100_OD, 16, 2), OfferingCapacity(L4_OD, 8, 0)),
        deployments=(Deployment("dep-1", "chat-eu", running, H100_OD, DeploymentState.RUNNING,
                                2, 0, 0.0),),
        jobs=jobs)


def state() -> KoiState:
    return KoiState.initial(PLANNER)


def hostile_job(job_id: str) -> JobStatus:
    """An online job whose id is ``job_id`` as given, past the spec's DNS-label check (as
    if a backend had let it through): what an injection attempt looks like."""
    spec = online_job("placeholder", rate=1.0)
    object.__setattr__(spec, "id", job_id)
    return JobStatus(spec, True, False, observed_rate_rps=1.0)


def hypothesis_doc(**override: Any) -> dict[str, Any]:
    """A valid hypothesis (at ``TICK``): KV thrash on L4 for small models under vLLM,
    tested with an L4 configuration the proposer's grid does not hold (96 sequences)."""
    doc: dict[str, Any] = {
        "claim": {"cause": "kv_pressure", "effect": "tpot",
                  "scope": {"accelerator": "l4", "engine": "vllm", "size_class": "<=10B"},
                  "direction": "increase", "size": 1.5, "size_low": 1.2, "size_high": 2.0},
        "statement": "L4 thrashes its KV cache earlier than predicted",
        "why": ["residual:chat-eu/tpot_p95", "telemetry:dep-1"],
        "test": {"configs": [{"job_id": "chat-eu",
                              "config": {"accelerator": "l4", "tp": 1, "max_num_seqs": 96}}]},
        "expires_tick": TICK + 20,
    }
    for key, value in override.items():
        if key in doc["claim"]:
            doc["claim"][key] = value
        else:
            doc[key] = value
    return doc
