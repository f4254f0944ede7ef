"""``koi plan --backend k8s``: recommend, then apply.

Replays a scenario in-process with a planning policy up to a tick (as ``koi explain``
does), takes that tick's decision, and shows for each action the manifests it becomes,
the diff against what the cluster runs (listed from the API server at ``--kube-url`` or
the kubeconfig's), and the planner's reason. ``--dry-run`` (the default) applies nothing
(``--server-dry-run`` also has the API server validate every write without persisting
it); ``--apply`` applies, in make-before-break order.

The decision comes from the simulated world of the scenario, not from the cluster: the
diff says how far the cluster is from what the planner would have it run. New
deployments get the simulator's ids, so a later tick's SCALE or SWAP names objects an
earlier ``--apply`` created. ``services.koi_command`` declares the command and imports
this module only when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
import yaml

from koi.catalog import Catalog, load_catalog
from koi.cluster import ActionKind, PlanDecision
from koi.fleet.k8s.engines import IMAGES
from koi.fleet.k8s.manifests import ManifestOptions
from koi.fleet.k8s.reconcile import Operation, Plan
from koi.safe_text import printable
from koi.scenario import load_scenario
from koi.scenario.types import Scenario

BACKENDS = ("k8s",)
OPTION_KEYS = ("checkpoints", "draft_models", "images", "hf_token_secret", "shm_size",
               "termination_grace_s", "progress_deadline_s")


@dataclass(frozen=True)
class TickDecision:
    scenario: Scenario
    decision: PlanDecision
    new_ids: Mapping[int, str] = field(default_factory=dict)  # action index -> sim dep id


def decision_at(scenario: str, policy: str, seed: int, tick: int, catalog: Catalog,
                progress: Callable[[int], None] | None = None) -> TickDecision:
    """Run ``policy`` on the scenario's simulated world and return its decision at
    ``tick`` (the ticks before it are decided, applied and simulated)."""
    from koi.policies import make_policy
    from koi.sim import Simulator

    scn = load_scenario(scenario)
    if not 0 <= tick < scn.ticks:
        raise ValueError(f"--tick must be in [0, {scn.ticks - 1}] for {scn.name}")
    pol = make_policy(policy, catalog=catalog, seed=seed)
    pol.prepare(scn, seed)
    sim = Simulator(scn, seed=seed, catalog=catalog)
    telemetry: list[Any] = []
    while True:
        snap = sim.snapshot()
        decision = pol.decide(snap, telemetry)
        before = set(sim.fleet.deps)
        outcomes = sim.apply(decision)
        if snap.tick >= tick:
            break
        telemetry = sim.advance()
        if progress is not None:
            progress(sim.tick)
    created = [d for d in sim.fleet.deps if d not in before]
    makers = [i for i, o in enumerate(outcomes)
              if o.applied and o.action.kind in (ActionKind.LAUNCH, ActionKind.SWAP)]
    return TickDecision(scn, decision, dict(zip(makers, created, strict=False)))


def load_options(path: Path | None, namespace: str) -> ManifestOptions:
    """Manifest options from a YAML file (checkpoints, draft_models, images as
    ``engine/vendor: image``, hf_token_secret, shm_size, termination_grace_s)."""
    opts = ManifestOptions(namespace=namespace)
    if path is None:
        return opts
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    unknown = sorted(set(data) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; known: {', '.join(OPTION_KEYS)}")
    if "images" in data:
        images = dict(IMAGES)
        for key, image in (data["images"] or {}).items():
            engine, _, vendor = str(key).partition("/")
            images[(engine, vendor)] = str(image)
        data["images"] = images
    for key in ("checkpoints", "draft_models"):
        if key in data:
            data[key] = {str(k): str(v) for k, v in (data[key] or {}).items()}
    return replace(opts, **data)


def plan_command(*, backend: str, apply: bool, server_dry_run: bool, scenario: str,
                 tick: int, seed: int, policy: str, kube_url: str | None,
                 kubeconfig: str | None, namespace: str, options_file: Path | None,
                 echo: Callable[[str], None] = typer.echo) -> int:
    """Print (and with ``apply`` carry out) one tick's actions; the exit code."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    from services.k8s_backend import (
        KubernetesBackend,
        api_client,
        describe_failure,
        server_of,
    )
    from services.runtime.settings import ServiceSettings

    if backend not in BACKENDS:
        echo(f"koi plan: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        return 2
    if apply and server_dry_run:
        echo("koi plan: --server-dry-run goes with --dry-run, not --apply")
        return 2
    catalog = load_catalog()
    try:
        options = load_options(options_file, namespace)
        td = decision_at(scenario, policy, seed, tick, catalog)
    except (ValueError, KeyError, OSError, yaml.YAMLError) as e:
        echo(f"koi plan: {printable(str(e.args[0] if e.args else e))}")
        return 2
    mode = "" if apply else ("server" if server_dry_run else "local")
    try:
        settings = ServiceSettings.from_env()
        api = api_client(kube_url, kubeconfig=kubeconfig, retries=settings.k8s_retries)
    except Exception as e:  # a missing or broken kubeconfig, a bad KOI_K8S_* value
        echo(f"koi plan: no cluster: {printable(str(e))}")
        return 2
    k8s = KubernetesBackend(api, catalog, options=options, fleet=td.scenario.fleet,
                            jobs=td.scenario.jobs, dry_run=mode,
                            tick_s=td.scenario.tick_s, horizon_s=td.scenario.horizon_s,
                            connect_timeout_s=settings.k8s_connect_timeout_s,
                            read_timeout_s=settings.k8s_read_timeout_s)
    new_ids = td.new_ids
    where = server_of(api)
    try:
        plan = k8s.plan(td.decision, new_id=lambda a, i: new_ids.get(
            i, f"{a.job_id}-t{td.decision.tick}-{i}"))
    except (ApiException, urllib3.exceptions.HTTPError) as e:
        failure = describe_failure(e, where)
        echo(f"koi plan: cannot read the cluster: {printable(failure.line(), 800)}")
        return 2
    what = ("apply" if apply else "server dry run (validated, nothing persisted)"
            if server_dry_run else "dry run (nothing applied)")
    echo(f"koi plan · {td.scenario.name} · tick {tick} · {policy} · seed {seed} ·"
         f" namespace {namespace} · {printable(where, 200)} · {what}")
    show_plan(plan, echo)
    if not apply and not server_dry_run:
        return 0
    outcomes = k8s.execute(plan)
    failed = [o for o, planned in zip(outcomes, plan.outcomes, strict=True)
              if planned.applied and not o.applied and not o.reason.startswith("dry run")]
    for o in failed:
        echo(f"FAILED {o.action.kind.value} {printable(o.action.job_id, 200)}:"
             f" {printable(o.reason)}")
    echo(f"{'applied' if apply else 'server dry run'}: {len(plan.operations)} operations,"
         f" {len(failed)} actions failed")
    return 1 if failed else 0


def show_plan(plan: Plan, echo: Callable[[str], None]) -> None:
    n = len(plan.outcomes)
    for i, outcome in enumerate(plan.outcomes):
        a = outcome.action
        target = plan.new_ids.get(i) or a.deployment_id
        echo("")
        echo(f"[{i + 1}/{n}] {a.kind.value} {printable(a.job_id, 200)}"
             f"{f' → {printable(target, 200)}' if target else ''}")
        echo(f"  why: {printable(a.reason)}")
        if not outcome.applied:
            echo(f"  outcome: refused — {printable(outcome.reason)}")
            continue
        ops = plan.for_action(i)
        echo(f"  outcome: planned, {len(ops)} operation(s)" if ops else
             "  outcome: nothing to change in the cluster")
        _show_ops(ops, echo)
    rest = plan.housekeeping
    if rest:
        echo("")
        echo("[converge] what the running objects say is under way")
        _show_ops(rest, echo)
    planned = sum(o.applied for o in plan.outcomes)
    echo("")
    echo(f"{n} actions: {planned} planned, {n - planned} refused;"
         f" {len(plan.operations)} operations")


def _show_ops(ops: list[Operation], echo: Callable[[str], None]) -> None:
    if not ops:
        return
    echo("  diff against the cluster:")
    for op in ops:
        for line in op.diff:
            echo(f"    {printable(line, 2000)}")
    bodies = [op for op in ops if op.body is not None]
    if bodies:
        echo("  manifests:")
    for op in bodies:
        echo(f"# {op.op.value} {op.ref}")
        echo("---")
        echo(yaml.safe_dump(dict(op.body or {}), sort_keys=False, width=10**6).rstrip())
        echo("...")
