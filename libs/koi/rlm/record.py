"""A round's record on disk: its inputs, then its transcript — replayable without a model.

A recorded round is one JSON-lines text: first an ``inputs`` record — the snapshot (as
plain JSON: jobs in their YAML form, configurations as knob dicts), the planner state the
round read (the belief store's and the calibrator's own bytes, base64), the planner
variant the tools score with, the last plan's explanations, the event lines, and the
layer's settings without the endpoint or the key — then the round's ``Transcript``
records (``round_start`` … ``round_end``). ``read_round`` rebuilds the round's inputs and
tools; ``replay_text`` runs it again against the recorded answers (``hierarchy.replay``):
the same requests, tool results and hypotheses, no model. Conversions only; the caller
reads and writes the file.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from koi.catalog import Catalog
from koi.causal.store import BeliefStore
from koi.cluster import (
    ClusterSnapshot,
    Deployment,
    DeploymentState,
    JobStatus,
    OfferingCapacity,
)
from koi.dro import DroCalibrator
from koi.jobs import job_to_dict, parse_job
from koi.planner.explain import Explanation
from koi.planner.tick import KoiState
from koi.rlm.hierarchy import RoundInputs, RoundResult, replay
from koi.rlm.settings import RlmSettings
from koi.rlm.tools import Toolbox, ToolContext
from koi.rlm.transcript import Transcript
from koi.space import config_from_dict, config_to_dict

FORMAT = "koi.rlm.round/1"
# settings that are about where the model is, not what the round does: never recorded
NOT_RECORDED = frozenset({"api_key", "base_url", "transcripts"})
_PAIRS = ("multipliers", "radii")
_LISTS = ("mechanisms", "mechanism_ids")


# --- snapshot ⇄ JSON ----------------------------------------------------------------------

def snapshot_to_json(s: ClusterSnapshot) -> dict[str, Any]:
    return {"tick": s.tick, "time_s": s.time_s, "tick_s": s.tick_s, "horizon_s": s.horizon_s,
            "capacity": [[c.offering, c.total_gpus, c.used_gpus] for c in s.capacity],
            "deployments": [{"id": d.id, "job_id": d.job_id, "config": config_to_dict(d.config),
                             "offering": d.offering, "state": d.state.value,
                             "replicas_ready": d.replicas_ready,
                             "replicas_starting": d.replicas_starting,
                             "started_s": d.started_s} for d in s.deployments],
            "jobs": [{"spec": job_to_dict(j.spec), "admitted": j.admitted,
                      "rejected": j.rejected, "reason": j.reason,
                      "output_tokens_done": j.output_tokens_done,
                      "observed_rate_rps": j.observed_rate_rps,
                      "requests_done": j.requests_done} for j in s.jobs]}


def snapshot_from_json(d: Mapping[str, Any]) -> ClusterSnapshot:
    """The snapshot back; numbers keep their JSON type (an int horizon stays an int, so
    the context a replay builds is the recorded one, character for character)."""
    return ClusterSnapshot(
        tick=int(d["tick"]), time_s=d["time_s"], tick_s=d["tick_s"], horizon_s=d["horizon_s"],
        capacity=tuple(OfferingCapacity(str(o), int(t), int(u)) for o, t, u in d["capacity"]),
        deployments=tuple(Deployment(
            x["id"], x["job_id"], config_from_dict(x["config"]), x["offering"],
            DeploymentState(x["state"]), int(x["replicas_ready"]),
            int(x["replicas_starting"]), x["started_s"]) for x in d["deployments"]),
        jobs=tuple(JobStatus(parse_job(j["spec"], source="recorded round"), bool(j["admitted"]),
                             bool(j["rejected"]), str(j["reason"]), j["output_tokens_done"],
                             j["observed_rate_rps"], j["requests_done"]) for j in d["jobs"]))


def _explanation(d: Mapping[str, Any]) -> Explanation:
    fixed: dict[str, Any] = {k: tuple(tuple(p) for p in v) if k in _PAIRS
                             else tuple(v) if k in _LISTS else v for k, v in d.items()}
    return Explanation(**fixed)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- writing ------------------------------------------------------------------------------

def inputs_record(snapshot: ClusterSnapshot, state: KoiState, settings: RlmSettings, *,
                  round_id: str, planner: str = "koi", backend: str = "numba",
                  explanations: Sequence[Explanation] = (),
                  events: Sequence[str] = ()) -> dict[str, Any]:
    """Everything a round read, as one JSON record (no endpoint, no key)."""
    return {"kind": "inputs", "format": FORMAT, "round_id": round_id, "planner": planner,
            "backend": backend,
            "settings": settings.model_dump(mode="json", exclude=set(NOT_RECORDED)),
            "snapshot": snapshot_to_json(snapshot), "state_tick": state.tick,
            "beliefs": _b64(state.beliefs.to_bytes()),
            "calibrator": _b64(state.calibrator.to_bytes()),
            "explanations": [asdict(e) for e in explanations], "events": list(events)}


def round_text(inputs: Mapping[str, Any], transcript: Transcript) -> str:
    """The file: the inputs line, then the transcript's lines."""
    return json.dumps(inputs, sort_keys=True, ensure_ascii=False) + "\n" + transcript.to_jsonl()


# --- reading and replaying ------------------------------------------------------------------

@dataclass(frozen=True)
class RecordedRound:
    inputs: RoundInputs
    toolbox: Toolbox
    settings: RlmSettings
    transcript: Transcript

    @property
    def recorded_end(self) -> dict[str, Any]:
        """The transcript's ``round_end`` record ({} when the round never ended)."""
        ends = self.transcript.of_kind("round_end")
        return ends[-1] if ends else {}


def read_round(text: str, catalog: Catalog) -> RecordedRound:
    """A recorded round's inputs, tools and transcript; ``ValueError`` saying what is
    wrong with a file that is not one."""
    try:
        transcript = Transcript.from_jsonl(text)
    except ValueError as err:
        raise ValueError(f"not a JSON-lines file: {err}") from None
    heads = transcript.of_kind("inputs")
    if not heads or heads[0].get("format") != FORMAT:
        raise ValueError(f"no '{FORMAT}' inputs record: a transcript written by"
                         " koi-rlm or the proposer starts with one")
    d = heads[0]
    from koi.planner.settings import settings_for

    try:
        settings = RlmSettings(**d["settings"])
        planner = replace(settings_for(d["planner"]), backend=d["backend"])
        snapshot = snapshot_from_json(d["snapshot"])
        state = KoiState(beliefs=BeliefStore.from_bytes(base64.b64decode(d["beliefs"])),
                         calibrator=DroCalibrator.from_bytes(base64.b64decode(d["calibrator"])),
                         tick=int(d["state_tick"]))
        explanations = {e.job_id: e for e in map(_explanation, d["explanations"])}
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"the inputs record cannot be read: {type(err).__name__}: "
                         f"{str(err)[:200]}") from None
    inputs = RoundInputs.of(snapshot, catalog, state, settings, events=d["events"],
                            round_id=d["round_id"])
    toolbox = Toolbox(ToolContext(snapshot, catalog, state, planner, explanations))
    return RecordedRound(inputs, toolbox, settings, transcript)


def replay_text(text: str, catalog: Catalog) -> tuple[RecordedRound, RoundResult]:
    """The recorded round, and the round run again against its recorded answers."""
    rec = read_round(text, catalog)
    return rec, replay(rec.inputs, rec.transcript, rec.toolbox, rec.settings)
