"""The compact fleet context a round's models read, quoted as data.

``build_context(snapshot, catalog, ...)`` gathers what a root model needs — jobs with
their SLOs, load, what runs them and their SLO risk; the fleet's offerings with prices
and free GPUs; the playbook's applicable mechanisms; the largest residuals the learnt
model still has; the DRO radii; recent events — into one JSON document, bounded to
``max_chars`` by dropping the least important items first (and saying how many went).
Every string a user or the fleet wrote (job ids, model names, reasons, event lines) is
only ever a JSON string value inside the ``<fleet_data>`` block (``jsontext.quote_data``),
never spliced into an instruction. ``job_ids`` restricts it to some jobs (a
sub-model's context). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from koi.catalog import Catalog
from koi.causal.scope import scope_of
from koi.causal.store import BeliefStore
from koi.cluster import ClusterSnapshot, DeploymentState, JobStatus
from koi.dro import SLO_OUTCOMES, DroCalibrator
from koi.jobs import BatchJob, OnlineJob
from koi.rlm.jsontext import quote_data
from koi.rlm.prompts import DATA_CLOSE, DATA_OPEN
from koi.safe_text import printable

TEXT_LIMIT = 160          # characters of any one string from outside
MAX_JOBS = 60
MAX_RESIDUALS = 12
MAX_MECHANISMS = 16
MAX_EVENTS = 20
# what goes first when the document is too long (least important first)
TRIM_ORDER = ("events", "residuals", "mechanisms", "fleet", "jobs")
# a small budget keeps the evidence (residuals) over the price list: the compact answer
# schema names the fleet's accelerators anyway
COMPACT_TRIM_ORDER = ("events", "mechanisms", "fleet", "residuals", "jobs")


@dataclass(frozen=True)
class FleetContext:
    """The data block and what it was built from."""

    tick: int
    data: dict[str, Any]
    block: str                      # "<fleet_data>\n{json}\n</fleet_data>"
    job_ids: tuple[str, ...]
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.block.encode()).hexdigest()[:16]

    @property
    def chars(self) -> int:
        return len(self.block)


def _s(text: object) -> str:
    return printable(str(text), TEXT_LIMIT)


def rounded(x: float, digits: int = 3) -> float | None:
    """Rounded to ``digits`` significant digits; None for NaN/inf (JSON has neither)."""
    x = float(x)
    if not math.isfinite(x):
        return None
    return 0.0 if x == 0 else round(x, digits - 1 - math.floor(math.log10(abs(x))))


_r = rounded


def config_label(cfg: Any) -> str:
    parts = [cfg.accelerator, f"tp{cfg.tp}"] + ([f"pp{cfg.pp}"] if cfg.pp > 1 else [])
    parts += [str(cfg.weight_precision), cfg.engine]
    if str(cfg.kv_dtype) == "fp8":
        parts.append("fp8-kv")
    return " ".join([*parts, f"seqs{cfg.max_num_seqs}"])


def _slo_risk(calibrator: DroCalibrator | None, job_id: str) -> dict[str, float | None]:
    if calibrator is None:
        return {}
    out = {}
    for o in SLO_OUTCOMES:
        risk = calibrator.slo_risk(o, calibrator.radius(o), job_id)
        if risk is not None:
            out[o] = _r(risk)
    return out


def _worst_risk(calibrator: DroCalibrator | None, job_id: str) -> float:
    return max((r for r in _slo_risk(calibrator, job_id).values() if r is not None),
               default=0.0)


def _job(job: JobStatus, snapshot: ClusterSnapshot, calibrator: DroCalibrator | None
         ) -> dict[str, Any]:
    spec = job.spec
    doc: dict[str, Any] = {
        "id": _s(job.id), "kind": spec.kind, "model": _s(spec.model),
        "priority": spec.priority,
        "status": "rejected" if job.rejected else ("admitted" if job.admitted else "pending"),
        "input_len": _r(spec.input_len.mean_value()),
        "output_len": _r(spec.output_len.mean_value()),
    }
    if job.reason:
        doc["reason"] = _s(job.reason)
    if isinstance(spec, OnlineJob):
        doc.update(slo_ttft_p95_ms=spec.slo.ttft_ms, slo_tpot_p95_ms=spec.slo.tpot_ms,
                   rate_rps=_r(job.observed_rate_rps or spec.arrival.mean_rate()))
        risk = _slo_risk(calibrator, job.id)
        if risk:
            doc["slo_risk"] = risk
    elif isinstance(spec, BatchJob):
        total = max(spec.total_output_tokens, 1)
        doc.update(progress=_r(job.output_tokens_done / total),
                   deadline_left_s=_r(spec.due_s - snapshot.time_s))
    running = [{"deployment": _s(d.id), "config": config_label(d.config),
                "offering": _s(d.offering), "replicas": d.replicas_ready,
                "starting": d.replicas_starting, "state": d.state.value}
               for d in snapshot.deployments_of(job.id)
               if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING)]
    if running:
        doc["running"] = running
    return doc


def _fleet(snapshot: ClusterSnapshot, catalog: Catalog) -> tuple[list[dict], dict]:
    fleet, parts = [], {}
    for c in snapshot.capacity:
        if c.total_gpus <= 0:
            continue
        off = catalog.offerings.get(c.offering)
        if off is None:
            fleet.append({"offering": _s(c.offering), "gpus_total": c.total_gpus,
                          "gpus_free": c.free_gpus})
            continue
        fleet.append({"offering": off.id, "accelerator": off.accelerator,
                      "market": off.market.value, "usd_per_gpu_hour": off.usd_per_gpu_hour,
                      "gpus_total": c.total_gpus, "gpus_free": c.free_gpus})
        a = catalog.accelerators[off.accelerator]
        parts[a.id] = {"family": a.family, "memory_gb": a.memory_gb,
                       "bf16_tflops": a.bf16_tflops, "fp8": a.supports_fp8,
                       "interconnect": a.interconnect.value, "gpus_per_node": a.gpus_per_node}
    return fleet, parts


def _mechanisms(beliefs: BeliefStore, snapshot: ClusterSnapshot, catalog: Catalog,
                job_ids: Collection[str] | None) -> list[dict[str, Any]]:
    scopes = [scope_of(d.config, catalog) for d in snapshot.deployments
              if (job_ids is None or d.job_id in job_ids) and d.config.model in catalog.models
              and d.config.accelerator in catalog.accelerators]
    found = beliefs.applicable_mechanisms(scopes) if scopes else beliefs.active_mechanisms()
    return [{"id": m.id, "line": m.line(), "source": m.source,
             "edge": f"{m.edge[0]}→{m.edge[1]}"} for m in found[:MAX_MECHANISMS]]


def _residuals(beliefs: BeliefStore | None, calibrator: DroCalibrator | None,
               job_ids: Collection[str] | None) -> list[dict[str, Any]]:
    """The largest |log(observed / corrected prediction)| of the calibrator's window."""
    if calibrator is None or not calibrator.observations:
        return []
    rows = []
    for obs in calibrator.observations:
        if job_ids is not None and obs.job_id not in job_ids:
            continue
        res = beliefs.corrected_residuals(obs) if beliefs is not None else {}
        for outcome, r in res.items():
            if math.isfinite(r):
                rows.append((abs(r), obs.tick, obs, outcome, r))
    rows.sort(key=lambda row: (-row[0], -row[1], row[2].deployment_id, row[3]))
    out, seen = [], set()
    for _, tick, obs, outcome, r in rows:
        key = (obs.deployment_id, outcome)  # the latest-largest per deployment and outcome
        if key in seen:
            continue
        seen.add(key)
        out.append({"job": _s(obs.job_id), "deployment": _s(obs.deployment_id), "tick": tick,
                    "outcome": outcome, "log_residual": _r(r),
                    "observed_over_predicted": _r(math.exp(r)), "scope": obs.scope.label()})
        if len(out) >= MAX_RESIDUALS:
            break
    return out


def build_context(snapshot: ClusterSnapshot, catalog: Catalog, *,
                  beliefs: BeliefStore | None = None, calibrator: DroCalibrator | None = None,
                  events: Sequence[str] = (), job_ids: Collection[str] | None = None,
                  max_chars: int = 24_000,
                  trim_order: Sequence[str] = TRIM_ORDER) -> FleetContext:
    """The context of ``snapshot`` (only ``job_ids``' jobs when given), at most
    ``max_chars`` characters of JSON."""
    wanted = None if job_ids is None else set(job_ids)
    jobs = [j for j in snapshot.jobs if wanted is None or j.id in wanted]
    # riskiest and most important first: what survives trimming
    jobs.sort(key=lambda j: (j.rejected, -_worst_risk(calibrator, j.id), -j.spec.priority,
                             j.id))
    fleet, parts = _fleet(snapshot, catalog)
    data: dict[str, Any] = {
        "tick": snapshot.tick, "time_s": snapshot.time_s, "tick_s": snapshot.tick_s,
        "horizon_s": snapshot.horizon_s,
        "jobs": [_job(j, snapshot, calibrator) for j in jobs[:MAX_JOBS]],
        "fleet": fleet, "accelerators": parts,
        "mechanisms": (_mechanisms(beliefs, snapshot, catalog, wanted)
                       if beliefs is not None else []),
        "residuals": _residuals(beliefs, calibrator, wanted),
        "dro_radius_log": ({o: _r(r) for o, r in calibrator.radii().items()}
                           if calibrator is not None else {}),
        "events": [_s(e) for e in list(events)[-MAX_EVENTS:]],
    }
    dropped = {"jobs": max(len(jobs) - MAX_JOBS, 0)} if len(jobs) > MAX_JOBS else {}
    text = quote_data(data)
    for name in trim_order:
        items = data[name]
        while len(text) > max_chars and items:
            # events drop oldest first, the rest from the end (least important)
            items.pop(0 if name == "events" else -1)
            dropped[name] = dropped.get(name, 0) + 1
            data["dropped"] = dict(dropped)
            text = quote_data(data)
    if dropped:
        data["dropped"] = dict(dropped)
        text = quote_data(data)
    return FleetContext(tick=snapshot.tick, data=data,
                        block=f"{DATA_OPEN}\n{text}\n{DATA_CLOSE}",
                        job_ids=tuple(j.id for j in jobs[:len(data["jobs"])]),
                        dropped=dropped)
