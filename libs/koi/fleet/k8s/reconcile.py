"""From a tick's decision and what runs, the operations that make the cluster so.

``plan_decision(decision, running, ...)`` takes a ``PlanDecision`` and the Koi objects
the cluster runs now (``observe.Running``, listed from the API, never remembered) and
returns a ``Plan``: the operations (apply, scale, delete) in the order they must run,
one ``ActionOutcome`` per action (refused ones with the reason, as the simulator refuses
them) and a human-readable diff of each operation against what runs.

Make-before-break, level-triggered. A SWAP applies the new object annotated
``koi.dev/replaces: <Kind>/<name>`` and leaves the old one alone; ``converge(running)``
(run with every plan, and on its own by the backend) drains the old object only once
the new one has all its replicas ready, and deletes a drained object once its pods are
gone. So a swap whose new deployment never becomes ready keeps the old one serving,
and a restarted backend finishes what a previous one began by reading the annotations.
A RELAUNCH keeps its object and is rolled out by Kubernetes itself (the objects'
strategy adds one new replica before removing an old one); a relaunch that changes
the object's kind (a replica that now spans nodes) goes the swap way.

Pure: no API calls, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from koi.action_checks import ActionRefused, placed_config
from koi.catalog import Catalog, Offering
from koi.cluster import Action, ActionKind, ActionOutcome, PlanDecision
from koi.fleet.k8s import names as N
from koi.fleet.k8s.engines import ManifestError
from koi.fleet.k8s.manifests import (
    KIND_SERVICE,
    ManifestOptions,
    Rendered,
    Workload,
    render,
    render_service,
)
from koi.fleet.k8s.observe import Running
from koi.space import DeploymentConfig


class Op(StrEnum):
    APPLY = "apply"    # server-side apply of a whole object
    SCALE = "scale"    # the scale subresource: spec.replicas only
    DELETE = "delete"


# the order operations run in: new capacity first, removal last
PHASE = {Op.APPLY: 0, Op.SCALE: 1, Op.DELETE: 3}


@dataclass(frozen=True, slots=True)
class Operation:
    op: Op
    kind: str
    name: str
    body: Mapping[str, Any] | None = field(default=None, repr=False)  # APPLY
    replicas: int = 0                     # SCALE
    action: int = -1                      # index of the action it carries out; -1: converge
    why: str = ""
    diff: tuple[str, ...] = ()
    draining: bool = False                # an APPLY that drains (runs after new capacity)

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def phase(self) -> int:
        return 2 if self.draining else PHASE[self.op]


@dataclass(frozen=True, slots=True)
class Plan:
    tick: int
    operations: tuple[Operation, ...]
    outcomes: tuple[ActionOutcome, ...]
    new_ids: Mapping[int, str] = field(default_factory=dict)  # action index -> new dep id

    def for_action(self, index: int) -> list[Operation]:
        return [o for o in self.operations if o.action == index]

    @property
    def housekeeping(self) -> list[Operation]:
        return [o for o in self.operations if o.action < 0]

    def diff(self) -> list[str]:
        return [line for o in self.operations for line in o.diff]


Refused = ActionRefused   # an action that cannot be carried out; the message is the reason


NewId = Callable[[Action, int], str]


def default_new_id(tick: int) -> NewId:
    """Deployment ids for new deployments: ``<job>-t<tick>-<action index>``."""
    return lambda action, index: f"{action.job_id}-t{tick}-{index}"


@dataclass
class _Ctx:
    decision: PlanDecision
    running: Sequence[Running]
    catalog: Catalog
    options: ManifestOptions
    services: set[str]
    new_id: NewId
    taken: set[str]
    ops: list[Operation] = field(default_factory=list)
    new_ids: dict[int, str] = field(default_factory=dict)


def plan_decision(decision: PlanDecision, running: Sequence[Running], catalog: Catalog,
                  options: ManifestOptions, *, services: Sequence[str] = (),
                  new_id: NewId | None = None) -> Plan:
    """The operations that carry out ``decision`` on a cluster running ``running`` (and
    the Services named in ``services``), plus ``converge``'s housekeeping."""
    ctx = _Ctx(decision, running, catalog, options, set(services),
               new_id or default_new_id(decision.tick),
               {r.deployment_id for r in running})
    outcomes = []
    for i, a in enumerate(decision.actions):
        try:
            HANDLERS[a.kind](ctx, i, a)
        except (Refused, ManifestError) as e:
            outcomes.append(ActionOutcome(a, False, str(e)))
            continue
        outcomes.append(ActionOutcome(a, True, ""))
    touched = {o.ref for o in ctx.ops}
    ctx.ops += [o for o in converge(running, catalog, options, decision.tick)
                if o.ref not in touched]
    ordered = sorted(enumerate(ctx.ops), key=lambda p: (p[1].phase, p[0]))
    return Plan(decision.tick, tuple(o for _, o in ordered), tuple(outcomes),
                dict(ctx.new_ids))


def converge(running: Sequence[Running], catalog: Catalog, options: ManifestOptions,
             tick: int) -> list[Operation]:
    """Housekeeping that follows from what runs alone: drain an object once the one
    that replaces it is ready; delete a drained object once its pods are gone."""
    by_ref = {r.ref: r for r in running}
    ops = []
    for new in running:
        old = by_ref.get(new.replaces)
        if new.draining or old is None or old.draining or old.ref == new.ref:
            continue
        if new.is_ready:
            why = f"make-before-break: {new.ref} has {new.ready}/{new.replicas} ready"
            try:
                ops.append(_drain_op(old, catalog, options, tick, -1, why))
            except (KeyError, ManifestError):  # cannot re-render: stop new replicas
                ops.append(Operation(Op.SCALE, old.kind, old.name, replicas=0, why=why,
                                     diff=(f"~ {old.ref}: replicas {old.replicas} → 0",)))
    for r in running:
        if r.draining and r.pods == 0:
            ops.append(Operation(Op.DELETE, r.kind, r.name, why="drained: no pods left",
                                 diff=(f"- {r.ref} ({r.deployment_id}): drained, deleted",)))
    return ops


# --- actions -------------------------------------------------------------------------

def _active(ctx: _Ctx, a: Action) -> Running:
    objs = [r for r in ctx.running if r.deployment_id == a.deployment_id]
    if not objs:
        raise Refused(f"unknown deployment {a.deployment_id!r} (not running in the cluster)")
    live = [r for r in objs if not r.draining]
    target = max(live or objs, key=lambda r: r.created_s)
    if target.job_id != a.job_id:
        raise Refused(f"deployment {a.deployment_id!r} serves job {target.job_id!r},"
                      f" not {a.job_id!r}")
    return target


def _config(ctx: _Ctx, a: Action) -> tuple[DeploymentConfig, Offering]:
    return placed_config(a, ctx.catalog)


def _fresh_id(ctx: _Ctx, a: Action, i: int) -> tuple[str, Running | None]:
    """The id for the deployment an action creates, and the object that already runs
    under it when this very decision was applied before (applying it again is then an
    update, not a second deployment). Another job's object is never overwritten."""
    base = ctx.new_id(a, i)
    dep_id, n = base, 1
    while dep_id in ctx.taken:
        same = [r for r in ctx.running if r.deployment_id == dep_id and r.job_id == a.job_id
                and not r.draining]
        if same and dep_id not in ctx.new_ids.values():
            ctx.new_ids[i] = dep_id
            return dep_id, max(same, key=lambda r: r.created_s)
        n += 1
        dep_id = f"{base}-{n}"
    ctx.taken.add(dep_id)
    ctx.new_ids[i] = dep_id
    return dep_id, None


def _created(r: Rendered, dep_id: str, existing: Running | None, line: str
             ) -> tuple[str, ...]:
    if existing is None or existing.kind != r.kind:
        return (f"+ {r.ref} ({dep_id}): {line}",)
    changes = field_diff(r.body, existing.body)
    head = (f"~ {r.ref} ({dep_id}): already applied; {line}" if changes else
            f"= {r.ref} ({dep_id}): already applied, unchanged")
    return (head, *(f"    {c}" for c in changes))


def _service(ctx: _Ctx, job_id: str, i: int) -> None:
    svc = render_service(job_id, ctx.options)
    if svc.name in ctx.services:
        return
    ctx.services.add(svc.name)
    ctx.ops.append(Operation(Op.APPLY, KIND_SERVICE, svc.name, svc.body, action=i,
                             why=f"the Service of job {job_id}",
                             diff=(f"+ {svc.ref}: selects job {job_id}'s serving pods",)))


def _apply(ctx: _Ctx, i: int, rendered: Rendered, why: str, diff: tuple[str, ...]) -> None:
    ctx.ops.append(Operation(Op.APPLY, rendered.kind, rendered.name, rendered.body,
                             action=i, why=why, diff=diff))


def _launch(ctx: _Ctx, i: int, a: Action) -> None:
    cfg, off = _config(ctx, a)
    n = a.replicas or cfg.replicas
    if n < 1:
        raise Refused(f"replicas must be >= 1 (got {n})")
    dep_id, existing = _fresh_id(ctx, a, i)
    r = render(Workload(a.job_id, dep_id, cfg, off, n, ctx.decision.tick, a.reason),
               ctx.catalog, ctx.options)
    _service(ctx, a.job_id, i)
    _apply(ctx, i, r, a.reason, _created(r, dep_id, existing, describe(cfg, n, off.id)))


def _scale(ctx: _Ctx, i: int, a: Action) -> None:
    t = _active(ctx, a)
    if t.draining:
        raise Refused(f"deployment {t.deployment_id} is draining")
    if a.replicas < 1:
        raise Refused(f"replicas must be >= 1 (got {a.replicas}); use DRAIN or STOP")
    ctx.ops.append(Operation(Op.SCALE, t.kind, t.name, replicas=a.replicas, action=i,
                             why=a.reason,
                             diff=(f"~ {t.ref} ({t.deployment_id}): replicas {t.replicas}"
                                   f" → {a.replicas}",)))


def _swap(ctx: _Ctx, i: int, a: Action) -> None:
    old = _active(ctx, a)
    cfg, off = _config(ctx, a)
    n = a.replicas or cfg.replicas or old.replicas
    dep_id, existing = _fresh_id(ctx, a, i)
    if dep_id == old.deployment_id:
        raise Refused(f"swap would replace {old.ref} with itself")
    r = render(Workload(a.job_id, dep_id, cfg, off, n, ctx.decision.tick, a.reason,
                        replaces=old.ref), ctx.catalog, ctx.options)
    _service(ctx, a.job_id, i)
    _apply(ctx, i, r, a.reason, (
        *_created(r, dep_id, existing, describe(cfg, n, off.id)),
        f"= {old.ref} ({old.deployment_id}): kept serving until {r.ref} has all {n}"
        f" replicas ready, then drained (make-before-break)"))


def _relaunch(ctx: _Ctx, i: int, a: Action) -> None:
    t = _active(ctx, a)
    cfg, off = _config(ctx, a)
    if off.id != t.offering:
        raise Refused(f"relaunch keeps the GPUs of {t.offering}; use SWAP to move to"
                      f" {off.id}")
    n = a.replicas if a.replicas > 0 else t.replicas
    w = Workload(a.job_id, t.deployment_id, cfg, off, n, ctx.decision.tick, a.reason)
    r = render(w, ctx.catalog, ctx.options)
    if r.kind == t.kind:
        lines = (f"~ {r.ref} ({t.deployment_id}): rolling update to"
                 f" {describe(cfg, n, off.id)} (one new replica ready before an old one"
                 " goes)", *(f"    {d}" for d in field_diff(r.body, t.body)))
        _apply(ctx, i, r, a.reason, lines)
        return
    r = render(Workload(a.job_id, t.deployment_id, cfg, off, n, ctx.decision.tick,
                        a.reason, replaces=t.ref), ctx.catalog, ctx.options)
    _apply(ctx, i, r, a.reason, (
        f"+ {r.ref} ({t.deployment_id}): {describe(cfg, n, off.id)}",
        f"= {t.ref}: kept serving until {r.ref} is ready, then drained"))


def _drain_op(t: Running, catalog: Catalog, options: ManifestOptions, tick: int,
              i: int, why: str) -> Operation:
    if t.config is None:
        # without its config it cannot be re-rendered; at least stop new replicas
        return Operation(Op.SCALE, t.kind, t.name, replicas=0, action=i, why=why,
                         diff=(f"~ {t.ref}: replicas {t.replicas} → 0 ({t.problem})",))
    off = catalog.offering(t.offering)
    r = render(Workload(t.job_id, t.deployment_id, t.config, off, t.replicas, tick, why,
                        replaces=t.replaces, draining=True), catalog, options)
    return Operation(Op.APPLY, r.kind, r.name, r.body, action=i, why=why, draining=True,
                     diff=(f"~ {t.ref} ({t.deployment_id}): draining — replicas"
                           f" {t.replicas} → 0, each pod finishes in-flight requests"
                           f" within {options.termination_grace_s}s; deleted once empty",))


def _drain(ctx: _Ctx, i: int, a: Action) -> None:
    t = _active(ctx, a)
    try:
        ctx.ops.append(_drain_op(t, ctx.catalog, ctx.options, ctx.decision.tick, i,
                                 a.reason))
    except KeyError as e:
        raise Refused(f"cannot re-render {t.ref}: {e}") from None


def _stop(ctx: _Ctx, i: int, a: Action) -> None:
    _active(ctx, a)
    for r in ctx.running:
        if r.deployment_id == a.deployment_id:
            ctx.ops.append(Operation(Op.DELETE, r.kind, r.name, action=i, why=a.reason,
                                     diff=(f"- {r.ref} ({r.deployment_id}): deleted now",)))


def _nothing(ctx: _Ctx, i: int, a: Action) -> None:
    """REJECT and DEFER: the job has no objects to change."""


HANDLERS: dict[ActionKind, Callable[[_Ctx, int, Action], None]] = {
    ActionKind.LAUNCH: _launch, ActionKind.SCALE: _scale, ActionKind.SWAP: _swap,
    ActionKind.RELAUNCH: _relaunch, ActionKind.DRAIN: _drain, ActionKind.STOP: _stop,
    ActionKind.REJECT: _nothing, ActionKind.DEFER: _nothing,
}


# --- diff ----------------------------------------------------------------------------

def describe(cfg: DeploymentConfig, replicas: int, offering: str) -> str:
    return (f"{replicas} × {cfg.accelerator} tp{cfg.tp} pp{cfg.pp}"
            f"{f' dp{cfg.dp_attention}' if cfg.dp_attention > 1 else ''} {cfg.engine}"
            f" {cfg.weight_precision.value} on {offering}")


# fields that change with every apply and say nothing about what runs
_NOISE = {f"metadata.annotations.{N.ANN_REASON}", f"metadata.labels.{N.LABEL_PLAN_TICK}",
          f"metadata.annotations.{N.ANN_CONFIG}"}


def field_diff(desired: Mapping[str, Any], actual: Mapping[str, Any], path: str = ""
               ) -> list[str]:
    """What applying ``desired`` changes in ``actual``, one line per leaf. Only fields
    ``desired`` sets are compared (the server adds defaults to what it returns)."""
    out: list[str] = []
    for key, want in desired.items():
        p = f"{path}.{key}" if path else str(key)
        if p in _NOISE:
            continue
        have = actual.get(key) if isinstance(actual, Mapping) else None
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            out += field_diff(want, have, p)
        elif isinstance(want, list) and isinstance(have, list) and want != have:
            out += _list_diff(p, want, have)
        elif want != have:
            out.append(f"{p}: {_short(have)} → {_short(want)}")
    return out


def _list_diff(path: str, want: list[Any], have: list[Any]) -> list[str]:
    if len(want) == len(have) and all(isinstance(x, Mapping) for x in want + have):
        out = []
        for k, (w, h) in enumerate(zip(want, have, strict=True)):
            out += field_diff(w, h, f"{path}[{k}]")
        return out
    if path.endswith((".args", ".command")):
        return _args_diff(path, [str(x) for x in want], [str(x) for x in have])
    if all(not isinstance(x, Mapping | list) for x in want + have):
        gone = [x for x in have if x not in want]
        new = [x for x in want if x not in have]
        words = " ".join([*(f"-{x}" for x in gone), *(f"+{x}" for x in new)])
        return [f"{path}: {words or 'reordered'}"]
    return [f"{path}: {_short(have)} → {_short(want)}"]


def _flags(tokens: list[str]) -> dict[str, str]:
    """Command-line tokens as flag -> value ('' for a bare flag; positionals by place)."""
    out: dict[str, str] = {}
    k = 0
    while k < len(tokens):
        tok = tokens[k]
        if tok.startswith("--"):
            nxt = tokens[k + 1] if k + 1 < len(tokens) else None
            has_value = nxt is not None and not nxt.startswith("--")
            out[tok] = nxt if has_value and nxt is not None else ""
            k += 2 if has_value else 1
        else:
            out[f"#{k}"] = tok
            k += 1
    return out


def _args_diff(path: str, want: list[str], have: list[str]) -> list[str]:
    w, h = _flags(want), _flags(have)
    out = []
    for flag in [*h, *(f for f in w if f not in h)]:
        if w.get(flag) == h.get(flag):
            continue
        name = "" if flag.startswith("#") else f"{flag} "
        if flag not in w:
            out.append(f"{path}: -{name}{h[flag]}".rstrip())
        elif flag not in h:
            out.append(f"{path}: +{name}{w[flag]}".rstrip())
        else:
            out.append(f"{path}: {name}{_short(h[flag])} → {_short(w[flag])}")
    return out or [f"{path}: reordered"]


def _short(x: Any, limit: int = 80) -> str:
    text = "(unset)" if x is None else str(x)
    return text if len(text) <= limit else text[:limit - 1] + "…"
