"""Plan stability: what keeps Koi from moving a job more often than its gain is worth.

The holds, each with a setting in ``ChurnSettings`` (``KOI_CHURN_<FIELD>`` overrides):

* **scale-down stabilisation** (``scale_down_window_s``, as the Kubernetes HPA's): the
  placer keeps a job at the highest replica count planned for its placement over the
  window, so a replica added for a burst is not taken away the next tick and added back
  the one after; growth is immediate. With ``scale_down_band`` the count must also fall
  more than that many replicas below what runs (a dead band: a plan that wavers
  between n and n+1 on a noisy rate keeps n+1);
* **one step down** (``scale_down_gap_s``): a job scales down only once its last move
  is that long ago, so a count falling with the sliding window steps down once;
* **scale-up confirmation** (``scale_up_confirm``): a scale-up of the same placement
  waits for that many plans in a row asking for more, to the fewest they asked (a
  count that jumps for one tick — a risk margin bought with GPUs spare that tick, a
  pass estimate's wobble — is not followed);
* **scale-up margin** (``scale_up_margin``): a scale-up goes a share beyond the count
  planned and the band widens to the same share, so a count that creeps up a replica a
  tick (a batch job behind its pace) moves once for several ticks;
* **planned rate** (``rate_window_s``, ``rate_rise_s``; ``planned_rate``): an online
  job is planned for the mean of its observed rates over a window, or over the last
  minutes where that is higher, not for the last tick's thinned count;
* **cool-down** (``cooldown_s``): a job placed (launched or swapped) less than this long
  ago keeps its configuration and offering in the composer (it may still scale);
* **operator limits** from the job spec: ``pinned`` (never moved; scales only) and
  ``max_moves_per_hour`` (its swaps, relaunches and scale changes in the last hour; at
  the limit the placer keeps what it runs);
* the composer prices each move (``move_value_h`` hours of the job's demand value,
  ``koi.compose``), so a move must gain more than a few minutes of the job's worth to
  be made; and, with ``uncertainty_z``, values a running job's options at their
  capacity less ``z`` posterior sds of the estimate behind it (``estimate_sd``), so an
  untried scope that inherits a broad belief does not win on less than its uncertainty.

``held_jobs`` (the composer's holds) reads the snapshot alone, so every evaluator
replica agrees; ``stabilise`` (the placer's) needs ``ChurnMemory`` — the plans and moves
of earlier ticks, brought up to date by ``remember`` — which the in-process planner keeps
in ``KoiState`` and the bus placer in its process. Each hold's reason reaches the plan's
choice or the action, and so ``koi explain`` and the event log. Pure: no I/O, time
comes from the snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from koi.causal.observe import attribute
from koi.causal.scope import Scope
from koi.causal.store import BeliefStore
from koi.cluster import ClusterSnapshot, Deployment, DeploymentState
from koi.planner.churn_settings import ENV_PREFIX, ChurnSettings
from koi.planner.place import Target
from koi.planner.propose import Proposal
from koi.space import DeploymentConfig

HOUR_S = 3600.0
SERVED_IN_FULL = 0.99   # a plan serving less of a job's demand leaves it under-provisioned


@dataclass(frozen=True)
class ChurnMemory:
    """What the placer's holds remember between ticks (the bus placer keeps its own: it
    is the single leader that sees every tick, as the HPA's controller keeps its window)."""

    # job → ((time, placement key, planned replicas), …) of the plans within the window
    plans: Mapping[str, tuple[tuple[float, str, int], ...]] = field(default_factory=dict)
    # deployment id → (job, placement key, planned replicas) at the last snapshot
    seen: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    # job → times of its moves (any kind) within the last hour
    moves: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # online job → ((time, observed rate), …) within the last hour, newest last
    rates: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # job → (time, replicas before it) of its last scale-down within the last hour
    downs: Mapping[str, tuple[float, int]] = field(default_factory=dict)


def _key(config: DeploymentConfig, offering: str) -> str:
    return f"{config.with_(offering='', replicas=1)!r}@{offering}"


def _live(snapshot: ClusterSnapshot) -> list[Deployment]:
    return [d for d in snapshot.deployments
            if d.state in (DeploymentState.RUNNING, DeploymentState.STARTING)]


def remember(memory: ChurnMemory, snapshot: ClusterSnapshot) -> ChurnMemory:
    """``memory`` brought up to ``snapshot``: the moves the fleet shows happened since the
    last one (a new deployment of a job that had one, a deployment whose placement or
    planned replicas changed) and each online job's observed rate (a tick that counted
    none is not an observation: the first one, before any request), kept for an hour."""
    now = snapshot.time_s
    rates = {k: recent for k, v in memory.rates.items()
             if (recent := tuple(p for p in v if now - p[0] < HOUR_S and p[0] < now))}
    for j in snapshot.jobs:
        if j.is_online and j.observed_rate_rps > 0:
            rates[j.id] = (*rates.get(j.id, ()), (now, j.observed_rate_rps))
    had = {job for job, _, _ in memory.seen.values()}
    moves = {k: kept for k, v in memory.moves.items()
             if (kept := tuple(t for t in v if now - t < HOUR_S))}
    downs = {k: v for k, v in memory.downs.items() if now - v[0] < HOUR_S}
    seen = {}
    for d in _live(snapshot):
        key, n = _key(d.config, d.offering), d.config.replicas
        seen[d.id] = (d.job_id, key, n)
        before = memory.seen.get(d.id)
        moved = d.job_id in had if before is None else before[1:] != (key, n)
        if moved:
            moves[d.job_id] = (*moves.get(d.job_id, ()), now)
        if before is not None and before[1] == key and before[2] > n:
            downs[d.job_id] = (now, before[2])
    return replace(memory, seen=seen, moves=moves, rates=rates, downs=downs)


def planned_rate(history: Sequence[tuple[float, float]], now: float,
                 settings: ChurnSettings) -> float | None:
    """The rate to plan an online job for, from its ``(time, observed rate)`` history
    (newest last): the higher of the means over ``rate_window_s`` and over the last
    ``rate_rise_s`` (the newest observation alone where either is 0), so a rise is
    planned for within a tick or two and a fall only once the whole window saw it, and
    the count does not waver with one tick's thinned sample. None without history."""
    if not history:
        return None
    if settings.rate_window_s <= 0 or settings.rate_rise_s <= 0:
        return history[-1][1]
    window = _mean_over(history, now, settings.rate_window_s)
    recent = _mean_over(history, now, settings.rate_rise_s)
    return max(window if window is not None else 0.0,
               recent if recent is not None else history[-1][1])


def rate_rising(history: Sequence[tuple[float, float]], now: float,
                settings: ChurnSettings) -> bool:
    """Whether an online job's mean rate over the last ``rate_rise_s`` is above its mean
    over ``rate_window_s`` (``history`` as ``planned_rate`` reads it): its demand is
    rising, so a lower count now would be raised again within minutes."""
    if settings.rate_window_s <= 0 or settings.rate_rise_s <= 0:
        return False
    window = _mean_over(history, now, settings.rate_window_s)
    recent = _mean_over(history, now, settings.rate_rise_s)
    return window is not None and recent is not None and recent > window


def _mean_over(history: Sequence[tuple[float, float]], now: float, span_s: float
               ) -> float | None:
    """The mean observed rate of ``history`` over the last ``span_s``; None if none."""
    rates = [r for t, r in history if now - t < span_s]
    return sum(rates) / len(rates) if rates else None


def planning_view(snapshot: ClusterSnapshot, memory: ChurnMemory,
                  settings: ChurnSettings) -> ClusterSnapshot:
    """``snapshot`` as the plan's stages read it: each online job's ``observed_rate_rps``
    is the rate to plan it for (``planned_rate`` over ``memory``, already ``remember``-ed
    this snapshot); unchanged where the window is off."""
    if settings.rate_window_s <= 0 or settings.rate_rise_s <= 0:
        return snapshot
    jobs = []
    for j in snapshot.jobs:
        rate = planned_rate(memory.rates.get(j.id, ()), snapshot.time_s, settings) \
            if j.is_online else None
        jobs.append(j if rate is None else replace(j, observed_rate_rps=rate))
    return replace(snapshot, jobs=tuple(jobs))


def held_jobs(snapshot: ClusterSnapshot, settings: ChurnSettings) -> dict[str, str]:
    """Jobs the composer may not move this tick → why, from the snapshot alone (so every
    evaluator replica agrees): pinned by their spec, or placed less than ``cooldown_s``
    ago (their newest live deployment's start: a swap's successor, or a first launch)."""
    now = snapshot.time_s
    newest: dict[str, float] = {}
    for d in _live(snapshot):
        newest[d.job_id] = max(newest.get(d.job_id, d.started_s), d.started_s)
    out = {}
    for j in snapshot.jobs:
        if j.spec.pinned:
            out[j.id] = "held back: pinned by its spec (it scales only)"
        elif j.id in newest and settings.cooldown_s > 0 \
                and now - newest[j.id] < settings.cooldown_s:
            out[j.id] = (f"held back: cooling down, placed {now - newest[j.id]:.0f} s ago"
                         f" (cool-down {settings.cooldown_s:.0f} s)")
    return out


def binding_holds(held: Mapping[str, str], proposals: Sequence[Proposal],
                  feasible: Sequence[bool], snapshot: ClusterSnapshot) -> dict[str, str]:
    """The ``held`` jobs' holds that bind this tick: a cooling-down job is held only while
    a configuration it runs still meets its SLO robustly (``feasible``, aligned with the
    evaluated ``proposals``). Offered only a placement that misses, the composer rejected
    it and the placer stopped it — an online outage and a relaunch elsewhere the next
    tick, which the hold was there to prevent (hetero-3h s1: code-review-70b stopped 8
    times); so too where its offering has no GPUs left (a stock-out). A pinned job
    stays held: its operator said so."""
    running: dict[str, set[DeploymentConfig]] = {}
    gone = {c.offering for c in snapshot.capacity if c.total_gpus <= 0}
    for d in _live(snapshot):
        shapes = running.setdefault(d.job_id, set())
        if d.offering not in gone:   # an offering gone (a stock-out) offers nothing
            shapes.add(d.config.with_(offering="", replicas=1))
    pinned = {j.id for j in snapshot.jobs if j.spec.pinned}
    ok = {p.job_id for p, f in zip(proposals, feasible, strict=True)
          if f and p.config in running.get(p.job_id, ())}
    return {j: why for j, why in held.items() if j in ok or j in pinned or j not in running}


def estimate_sd(beliefs: BeliefStore, scope: Scope) -> float:
    """The uncertainty (log sd) of what the plan reads for ``scope``: the posterior sd of
    the pass (base-regime TPOT) belief the lookup finds, widened by the prior's sd when
    that belief is a broader scope's (the scope may differ from its average by that
    much) — so an untried scope inheriting a broad belief is as uncertain as it is."""
    found = beliefs.lookup(attribute("tpot", None, beliefs.regimes), scope)
    if found.scope == scope:
        return found.sd
    return math.hypot(found.sd, beliefs.config.prior_sd)


def stabilise(targets: Sequence[Target], snapshot: ClusterSnapshot, memory: ChurnMemory,
              settings: ChurnSettings) -> tuple[list[Target], ChurnMemory]:
    """The placer's holds on the plan's ``targets`` (``memory`` already ``remember``-ed
    this snapshot): a job at its move limit keeps what it runs; a scale-down keeps the
    highest count planned for the same placement within ``scale_down_window_s``. Each
    held target's reason says so. Returns the targets and the memory with this plan."""
    now = snapshot.time_s
    window = settings.scale_down_window_s
    primary: dict[str, Deployment] = {}
    by_key: dict[tuple[str, str], Deployment] = {}
    for live in _live(snapshot):
        if live.state == DeploymentState.RUNNING and live.job_id not in primary:
            primary[live.job_id] = live
        by_key.setdefault((live.job_id, _key(live.config, live.offering)), live)
    keep_s = max(window, max(settings.scale_up_confirm, settings.scale_up_after_down_confirm)
                 * snapshot.tick_s)
    plans = {k: kept for k, v in memory.plans.items()
             if (kept := tuple(p for p in v if now - p[0] < keep_s))}
    jobs = {j.id: j for j in snapshot.jobs}
    spare = _spare(targets, snapshot)
    newcomers = _newcomers(targets, snapshot) if settings.scale_down_yield_new else {}
    out = []
    for t in targets:
        # the deployment the target would resize: the job's on the same placement, still
        # starting or not (a fresh launch, a swap's successor), else its running one
        key = _key(t.config, t.offering) if t.config is not None else ""
        d = by_key.get((t.job_id, key)) or primary.get(t.job_id)
        if t.decision != "place" or t.config is None or d is None:
            if t.decision == "place" and t.config is not None and window > 0:
                # a launch's count is a plan for its placement too: without it a fresh
                # launch scaled down the next tick, on its first rate (gen-medium-5:
                # 15 -> 12 a minute after launch, back to 16 within 6 minutes)
                plans[t.job_id] = (*plans.get(t.job_id, ()), (now, key, t.replicas))
            out.append(t)
            continue
        planned = d.config.replicas
        same = key == _key(d.config, d.offering)
        status = jobs.get(t.job_id)
        limit = (status.spec.max_moves_per_hour if status is not None else 0.0) \
            or settings.default_max_moves_per_hour
        recent = len(memory.moves.get(t.job_id, ()))
        if limit and recent >= limit and not (same and t.replicas == planned):
            out.append(replace(t, config=d.config, offering=d.offering, replicas=planned,
                               reason=f"{t.reason}; held back: {recent} moves in the last"
                                      f" hour, its limit is {limit:g} per hour"))
            continue
        if window > 0 or settings.scale_up_confirm > 1:
            plans[t.job_id] = (*plans.get(t.job_id, ()), (now, key, t.replicas))
        margin = settings.scale_up_margin
        if same and t.replicas > planned:
            t = _confirmed(t, plans.get(t.job_id, ()), key, planned,
                           _confirm(t, memory, now, settings))
        if same and t.replicas > planned and margin > 0:
            t = _beyond(t, margin, spare)
        elif same and t.replicas < planned and window > 0:
            t = _held_down(t, planned, plans[t.job_id], key, memory, now, settings,
                           spare, newcomers)
        out.append(t)
    return out, replace(memory, plans=plans)


def _held_down(t: Target, planned: int, plans: Sequence[tuple[float, str, int]], key: str,
               memory: ChurnMemory, now: float, settings: ChurnSettings,
               spare: dict[str, int], newcomers: dict[str, int]) -> Target:
    """A scale-down ``t`` of a job running ``planned`` replicas on placement ``key``, as
    the holds allow: to the most planned within the window (``plans``, this one
    included) plus the band or the headroom; not at all within the gap after a move,
    while the rate rises, or where the plan serves less than the job's demand; less
    what another job's growth (or a newcomer's) needs, with a yield."""
    window = settings.scale_down_window_s
    peak = max(r for when, k, r in plans if k == key and now - when < window)
    band = max(settings.scale_down_band, math.floor(settings.scale_up_margin * peak))
    floor = max(peak + band, math.ceil(peak * (1.0 + settings.scale_down_headroom) - 1e-9))
    keep = planned if floor >= planned else max(t.replicas, floor)
    last = max(memory.moves.get(t.job_id, ()), default=None)
    recent = last is not None and now - last < settings.scale_down_gap_s
    if recent:
        keep = planned
    rising = settings.scale_down_rising_hold and keep < planned and rate_rising(
        memory.rates.get(t.job_id, ()), now, settings)
    short = settings.scale_down_short_hold and keep < planned and t.served < SERVED_IN_FULL
    if rising or short:
        keep = planned
    wanted = keep
    if settings.scale_down_yield:
        keep = _yield(t, keep, spare)
    elif newcomers:
        keep = _yield_new(t, keep, spare, newcomers)
    if keep == t.replicas == wanted:
        return t
    why = f"; its last move {now - (last or 0.0):.0f} s ago" if recent else ""
    if rising:
        why += "; its rate is rising"
    if short:
        why += f"; the plan serves {t.served:.0%} of its demand"
    if keep < wanted:
        why += f"; {wanted - keep} given back for another job's growth"
    return replace(t, replicas=keep, reason=f"{t.reason}; scale-down held: {t.replicas} "
                   f"planned, keeping {keep} (the most planned in the last {window:.0f} s:"
                   f" {peak}" + (f", and a band of {band}" if band else "") + f"{why})")


def _yield(t: Target, keep: int, spare: dict[str, int]) -> int:
    """The count a held scale-down ``t`` keeps (``keep``, more than it plans) once it
    gives back the GPUs the plan's growth on its offering needs beyond the free ones
    (``spare`` below 0): a hold never keeps GPUs the composer gave another job, which
    would then wait for them (gen-medium-3: a new job deferred 12 ticks)."""
    assert t.config is not None
    per = t.config.gpus_per_replica
    short = max(-spare.get(t.offering, 0), 0)
    back = min(keep - t.replicas, -(-short // per))
    if back > 0:
        spare[t.offering] = spare.get(t.offering, 0) + back * per
    return keep - max(back, 0)


def _confirm(t: Target, memory: ChurnMemory, now: float, settings: ChurnSettings) -> int:
    """Plans in a row a scale-up ``t`` needs: ``scale_up_after_down_confirm`` within the
    gap after the job's last scale-down, while it asks for no more than the job ran
    before it (a rise beyond is not the noise the scale-down misread), else
    ``scale_up_confirm``."""
    confirm = settings.scale_up_confirm
    down = memory.downs.get(t.job_id)
    after = settings.scale_up_after_down_confirm
    if after and settings.scale_down_window_s > 0 and down is not None \
            and now - down[0] < max(settings.scale_down_gap_s, settings.scale_down_window_s) \
            and t.replicas <= down[1]:
        return max(confirm, after)
    return confirm


def _newcomers(targets: Sequence[Target], snapshot: ClusterSnapshot) -> dict[str, int]:
    """GPUs per offering the plan gives jobs that hold none there or anywhere (a launch,
    a job relaunching after a stock-out)."""
    holding = {d.job_id for d in _live(snapshot) if d.gpus > 0}
    need: dict[str, int] = {}
    for t in targets:
        if t.decision == "place" and t.config is not None and t.job_id not in holding:
            need[t.offering] = need.get(t.offering, 0) + t.replicas * t.config.gpus_per_replica
    return need


def _yield_new(t: Target, keep: int, spare: dict[str, int], newcomers: dict[str, int]) -> int:
    """``_yield`` for jobs holding no GPUs only: a held scale-down ``t`` gives back what
    the plan's growth on its offering lacks beyond the free GPUs, but no more than the
    newcomers there (``newcomers``, taken from) were planned."""
    assert t.config is not None
    per = t.config.gpus_per_replica
    short = min(max(-spare.get(t.offering, 0), 0), newcomers.get(t.offering, 0))
    back = min(keep - t.replicas, -(-short // per))
    if back <= 0:
        return keep
    spare[t.offering] = spare.get(t.offering, 0) + back * per
    newcomers[t.offering] = max(newcomers.get(t.offering, 0) - back * per, 0)
    return keep - back


def _confirmed(t: Target, plans: Sequence[tuple[float, str, int]], key: str, running: int,
               confirm: int) -> Target:
    """A scale-up ``t`` of a job running ``running`` replicas as the last ``confirm`` plans
    (``plans``, newest last, this one included) confirm it: to the fewest they asked for
    if each asked for more than runs on the same placement, else kept at ``running``."""
    if confirm <= 1:
        return t
    last = plans[-confirm:]
    asked = min(r for _, _, r in last) if len(last) == confirm \
        and all(k == key for _, k, _ in last) else running
    asked = max(asked, running)
    if asked == t.replicas:
        return t
    return replace(t, replicas=asked, reason=f"{t.reason}; scale-up held: {t.replicas} "
                   f"planned, {asked} asked for by each of the last {confirm} plans")


def _spare(targets: Sequence[Target], snapshot: ClusterSnapshot) -> dict[str, int]:
    """GPUs per offering that ``targets`` leave free: the free ones less what each target
    adds beyond the GPUs its job holds there."""
    spare = {c.offering: c.free_gpus for c in snapshot.capacity}
    held: dict[tuple[str, str], int] = {}
    for d in _live(snapshot):
        held[d.job_id, d.offering] = held.get((d.job_id, d.offering), 0) + d.gpus
    for t in targets:
        if t.decision == "place" and t.config is not None:
            need = t.replicas * t.config.gpus_per_replica - held.get((t.job_id, t.offering), 0)
            spare[t.offering] = spare.get(t.offering, 0) - max(need, 0)
    return spare


def _beyond(t: Target, margin: float, spare: dict[str, int]) -> Target:
    """A scale-up ``t`` taken ``margin`` beyond its count (rounded down), as far as the
    ``spare`` GPUs of its offering allow (and taken from them)."""
    assert t.config is not None
    per = t.config.gpus_per_replica
    extra = min(math.floor(margin * t.replicas), max(spare.get(t.offering, 0), 0) // per)
    if extra <= 0:
        return t
    spare[t.offering] -= extra * per
    return replace(t, replicas=t.replicas + extra, reason=f"{t.reason}; scaled up {extra}"
                   f" beyond the {t.replicas} planned (margin {margin:g})")


__all__ = ["ENV_PREFIX", "ChurnMemory", "ChurnSettings", "binding_holds", "estimate_sd",
           "held_jobs", "planned_rate", "planning_view", "remember", "stabilise"]
