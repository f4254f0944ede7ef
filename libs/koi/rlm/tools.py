"""The tools a round's models may call, as thin adapters over Koi's own functions.

* ``predict(config, workload)`` — the prior model's prediction and the learnt model's
  (``koi.planner.robust.robust_predictions`` without radii: the planner's own use of the
  beliefs — the learnt pass for a rate, the regime's multipliers when saturated);
* ``score(job, config)`` — ``koi.planner.tick.evaluate_stage``: the evaluator's robust
  scoring of the candidate (and of the job's running configuration beside it), with the
  cheapest offering of its part in the fleet;
* ``playbook(scope)`` — the store's mechanisms that apply to the scope and its belief
  multipliers on each belief edge (``BeliefStore.lookup``);
* ``explain(job)`` — the last plan's ``Explanation`` of the job, else what the snapshot says.

``Toolbox.call(name, arguments)`` answers every call with JSON text (quoted like the
context): an unknown tool, arguments that are not JSON or not what the tool takes, an
invalid configuration or a failure inside a tool all come back as ``{"error": ...}`` for
the model to read — never an exception. ``recurse`` is the round's (``hierarchy``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koi.catalog import Catalog
from koi.causal.graph import BELIEF_EDGES
from koi.causal.scope import contains
from koi.cluster import ClusterSnapshot
from koi.planner.explain import Explanation
from koi.planner.propose import Proposal
from koi.planner.robust import robust_predictions, robustness_fn
from koi.planner.settings import KoiSettings
from koi.planner.tick import KoiState, TickReport, active_jobs, evaluate_stage, tick_inputs
from koi.predictor.types import LoadMode, Workload
from koi.rlm.context import config_label, rounded
from koi.rlm.hypothesis import Problem, config_for_job, scope_from_json
from koi.rlm.jsontext import quote_data
from koi.safe_text import printable
from koi.space import validate as validate_config

RESULT_LIMIT = 6000   # characters of one tool result
TOOL_NAMES = ("predict", "score", "playbook", "explain")


@dataclass(frozen=True)
class ToolContext:
    """The planner state the tools read (all frozen): the tick's snapshot, the causal
    beliefs and calibrator, the planner's settings, the last plan's explanations."""

    snapshot: ClusterSnapshot
    catalog: Catalog
    state: KoiState
    settings: KoiSettings = field(default_factory=KoiSettings)
    explanations: Mapping[str, Explanation] = field(default_factory=dict)

    @staticmethod
    def after_tick(snapshot: ClusterSnapshot, catalog: Catalog, state: KoiState,
                   settings: KoiSettings, report: TickReport | None = None) -> ToolContext:
        """The tools' view after a planning tick (its report's explanations by job)."""
        explained = {e.job_id: e for e in report.explanations} if report is not None else {}
        return ToolContext(snapshot, catalog, state, settings, explained)


def _r(x: float) -> float | None:
    return rounded(x, 4)


def error(message: str) -> str:
    return quote_data({"error": printable(message, 400)})


class Toolbox:
    """The tools over one ``ToolContext``."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        self._jobs = {j.id: j for j in ctx.snapshot.jobs}

    def call(self, name: str, arguments: str) -> str:
        """The tool's answer as JSON text; errors are answers too."""
        if name not in TOOL_NAMES:
            return error(f"unknown tool {printable(name, 60)!r}; tools: "
                         f"{', '.join((*TOOL_NAMES, 'recurse'))}")
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return error(f"{name}: arguments are not JSON")
        if not isinstance(args, dict):
            return error(f"{name}: arguments must be a JSON object")
        try:
            result = getattr(self, "_" + name)(args)
        except Problem as problem:
            return error(f"{name}: {problem}")
        except Exception as err:  # a tool must never take the round down
            return error(f"{name} failed: {type(err).__name__}: {printable(str(err), 200)}")
        text = quote_data(result)
        if len(text) > RESULT_LIMIT:
            return quote_data({"truncated": True, "partial": text[:RESULT_LIMIT]})
        return text

    # --- the tools --------------------------------------------------------------------

    def _job(self, job_id: Any) -> Any:
        if not isinstance(job_id, str) or job_id not in self._jobs:
            raise Problem(f"unknown job {printable(str(job_id), 80)!r}")
        return self._jobs[job_id]

    def _config_for(self, args: dict[str, Any], job_id: str | None) -> Any:
        knobs = args.get("config")
        if not isinstance(knobs, dict):
            raise Problem("config must be an object of DeploymentConfig knobs")
        jobs = {job_id: self._jobs[job_id]} if job_id else {}
        if job_id is None and not knobs.get("model"):
            raise Problem("config needs a model (or give workload.job_id)")
        cfg = config_for_job(job_id or "", knobs, jobs, self.ctx.catalog)
        errors = validate_config(cfg, self.ctx.catalog)
        if errors:
            raise Problem("invalid config: " + "; ".join(str(e) for e in errors[:3]))
        return cfg

    def _predict(self, args: dict[str, Any]) -> dict[str, Any]:
        wl = args.get("workload") or {}
        if not isinstance(wl, dict):
            raise Problem("workload must be an object")
        job_id = wl.get("job_id")
        job = self._job(job_id) if job_id is not None else None
        cfg = self._config_for(args, job.id if job is not None else None)
        i_len = wl.get("input_len") or (job.spec.input_len.mean_value() if job else None)
        o_len = wl.get("output_len") or (job.spec.output_len.mean_value() if job else None)
        if not (isinstance(i_len, int | float) and isinstance(o_len, int | float)
                and 1 <= i_len <= 1e6 and 1 <= o_len <= 1e6):
            raise Problem("workload needs input_len and output_len in 1..1e6 tokens")
        rate = wl.get("rate_rps")
        if rate is None and job is not None and job.is_online:
            rate = job.observed_rate_rps or job.spec.arrival.mean_rate()
        if rate is not None and not (isinstance(rate, int | float) and 0 < rate <= 1e5):
            raise Problem("workload.rate_rps must be in (0, 1e5]")
        workload = Workload(input_len=float(i_len), output_len=float(o_len),
                            mode=LoadMode.RATE if rate else LoadMode.SATURATED,
                            load=float(rate or 0.0))
        s, beliefs = self.ctx.settings, self.ctx.state.beliefs
        robustness = robustness_fn(beliefs if s.use_beliefs else None, {}, self.ctx.catalog)
        raw, learnt, r = robust_predictions([(cfg, workload)], robustness,
                                            catalog=self.ctx.catalog,
                                            calibration=s.calibration, backend=s.backend)[0]
        mult = {"pass": r.pass_mult, "ttft": r.ttft_mean_mult, "ttft_p95": r.ttft_mult,
                "tpot": r.tpot_mean_mult, "tpot_p95": r.tpot_mult, "throughput": r.tput_mult}
        keys = ("ttft_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "cost_per_mtok_usd",
                "kv_pressure", "comm_overhead_frac", "compute_util", "membw_util",
                "queue_util", "weights_gb_per_gpu", "kv_capacity_tokens")
        return {"config": config_label(cfg), "workload": {
                    "input_len": i_len, "output_len": o_len, "rate_rps": rate},
                "predicted": {k: _r(getattr(raw, k)) for k in keys},
                "with_beliefs": {k: _r(getattr(learnt, k)) for k in keys[:4]},
                "belief_multipliers": {k: _r(v) for k, v in sorted(mult.items())}}

    def _score(self, args: dict[str, Any]) -> dict[str, Any]:
        job = self._job(args.get("job"))
        if job not in active_jobs(self.ctx.snapshot):
            raise Problem(f"job {job.id!r} is not active (finished, rejected or not yet"
                          " submitted)")
        cfg = self._config_for(args, job.id)
        proposals = [Proposal(job.id, cfg, "language-model tool call")]
        running = [d for d in self.ctx.snapshot.deployments_of(job.id) if d.replicas_ready]
        if running:
            current = running[0].config.with_(offering="", replicas=1)
            if current != cfg:
                proposals.append(Proposal(job.id, current, "running"))
        st, s = self.ctx.state, self.ctx.settings
        ev = evaluate_stage(proposals, tick_inputs(self.ctx.snapshot, st.beliefs,
                                                   st.calibrator, s, self.ctx.catalog))
        rows: dict[str, list[dict[str, Any]]] = {}
        for i, p in enumerate(ev.proposals):
            name = "candidate" if p.hypothesis != "running" else "running"
            rows.setdefault(name, []).append({
                "config": config_label(p.config), "gpus_per_replica": int(ev.gpus[i]),
                "robust_max_rate_rps_per_replica": _r(float(ev.max_rate_rps[i])),
                "goodput_tok_s_per_replica": _r(float(ev.goodput_tok_s[i])),
                "ttft_p95_ms_at_job_load": _r(float(ev.ttft_p95_ms[i])),
                "tpot_p95_ms_at_job_load": _r(float(ev.tpot_p95_ms[i])),
                "slo_risk": _r(float(ev.slo_risk[i])),
                "slo_feasible": bool(ev.slo_feasible[i]),
                "usd_per_replica_hour_cheapest": self._cheapest(p.config)})
        return rows

    def _cheapest(self, cfg: Any) -> float | None:
        prices = [self.ctx.catalog.offerings[c.offering].usd_per_gpu_hour
                  for c in self.ctx.snapshot.capacity
                  if c.total_gpus > 0 and c.offering in self.ctx.catalog.offerings
                  and self.ctx.catalog.offerings[c.offering].accelerator == cfg.accelerator]
        return _r(min(prices) * cfg.gpus_per_replica) if prices else None

    def _playbook(self, args: dict[str, Any]) -> dict[str, Any]:
        scope = scope_from_json(args.get("scope"), self.ctx.catalog)
        beliefs = self.ctx.state.beliefs
        mechs = [m for m in beliefs.active_mechanisms()
                 if contains(m.scope, scope) or contains(scope, m.scope)]
        found = {}
        for edge in BELIEF_EDGES:
            b = beliefs.lookup(edge, scope)
            found[f"{edge[0]}→{edge[1]}"] = {"multiplier": _r(b.multiplier),
                                             "support": b.support,
                                             "confidence": _r(b.confidence),
                                             "from_scope": b.scope.label()}
        return {"scope": scope.label(),
                "mechanisms": [{"id": m.id, "line": m.line(), "source": m.source}
                               for m in mechs[:16]],
                "beliefs": found}

    def _explain(self, args: dict[str, Any]) -> dict[str, Any]:
        job = self._job(args.get("job"))
        exp = self.ctx.explanations.get(job.id)
        if exp is not None:
            return {"job": job.id, "explanation": printable(exp.text().replace("\n", " | "),
                                                            3000)}
        deps = [f"{config_label(d.config)} ×{d.replicas_ready} on {d.offering} ({d.state})"
                for d in self.ctx.snapshot.deployments_of(job.id)]
        return {"job": job.id, "admitted": job.admitted, "rejected": job.rejected,
                "reason": printable(job.reason, 300), "deployments": deps,
                "explanation": "no plan explanation for this job yet"}
