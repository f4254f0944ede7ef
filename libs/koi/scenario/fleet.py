"""The ``fleet:`` and ``capacity_events:`` sections of a scenario file.

A fleet entry names a catalog offering, either by id (``{offering: ID, gpus: N}``) or in
the compact form (``{cloud, region, accelerator, market, gpus}``), with a GPU count that
is a whole number of that offering's instances. Capacity events change an offering that
is in the fleet, and may never take it below zero. Validation only: no I/O, no clocks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from koi.catalog import Catalog, Market
from koi.jobs.parse import Ctx, check_keys, mapping
from koi.scenario._ctx import duration, integer, show, text, unknown
from koi.scenario.durations import format_duration
from koi.scenario.types import CapacityEvent, FleetEntry

COMPACT_KEYS = ("cloud", "region", "accelerator", "market")
# GPUs one offering may hold in a scenario: the largest public clusters are ~100k GPUs,
# and a fleet file with 1e308 would otherwise reach the simulator as a Python bigint.
MAX_OFFERING_GPUS = 1_000_000
FLEET_KEYS = ("offering", *COMPACT_KEYS, "gpus")
EVENT_KEYS = ("at", "offering", "delta_gpus", "note")
OFFERINGS_FILE = "libs/koi/catalog/data/offerings.yaml"


def parse_fleet(ctx: Ctx, data: Any, catalog: Catalog) -> tuple[FleetEntry, ...]:
    if not isinstance(data, list) or not data:
        raise ctx.error("", f"must be a non-empty list of {{offering: ID, gpus: N}}"
                            f" (got {show(data)})")
    entries: list[FleetEntry] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(data):
        item_ctx = ctx.at(f"[{i}]")
        entry = _parse_entry(item_ctx, item, catalog)
        if entry.offering in seen:
            raise item_ctx.error("offering", f"{entry.offering} is already in"
                                             f" {ctx.path(f'[{seen[entry.offering]}]')};"
                                             " give each offering once with its total GPUs")
        seen[entry.offering] = i
        entries.append(entry)
    return tuple(entries)


def _parse_entry(ctx: Ctx, data: Any, catalog: Catalog) -> FleetEntry:
    mapping(ctx, data)
    check_keys(ctx, data, FLEET_KEYS)
    compact = [k for k in COMPACT_KEYS if k in data]
    if "offering" in data:
        if compact:
            raise ctx.error(compact[0], "give either offering: ID or cloud/region/accelerator/"
                                        "market, not both")
        offering_id = offering(ctx, data, catalog)
    elif compact:
        offering_id = _compact_offering(ctx, data, catalog)
    else:
        raise ctx.error("offering", "missing; give offering: ID (e.g."
                                    " aws/us-east-1/h100-sxm/spot) or cloud, region,"
                                    " accelerator and market")
    gpus = integer(ctx, data, "gpus")
    if not 1 <= gpus <= MAX_OFFERING_GPUS:
        raise ctx.error("gpus", f"must be in 1..{MAX_OFFERING_GPUS:,} (got {gpus:.6g})")
    per = catalog.offering(offering_id).gpus_per_instance
    if gpus % per:
        raise ctx.error("gpus", f"{gpus} is not a whole number of {offering_id} instances"
                                f" ({per} GPUs each); use {_nearest(gpus, per)}")
    return FleetEntry(offering=offering_id, gpus=gpus)


def offering(ctx: Ctx, data: dict[str, Any], catalog: Catalog,
             within: Iterable[str] | None = None) -> str:
    """The ``offering`` id, checked against the catalog (and ``within``, if given)."""
    offering_id = text(ctx, data, "offering")
    if offering_id not in catalog.offerings:
        close = suggest_offering(offering_id, catalog)
        hint = f"did you mean {close}?" if close else f"see {OFFERINGS_FILE}"
        raise ctx.error("offering", f"unknown offering {offering_id!r}; {hint}")
    if within is not None:
        pool = list(within)
        if offering_id not in pool:
            near = difflib.get_close_matches(offering_id, pool, n=1, cutoff=0.5)
            hint = (f"did you mean {near[0]}?" if near
                    else f"fleet offerings: {', '.join(sorted(pool))}")
            raise ctx.error("offering", f"{offering_id} is not in the fleet; {hint}")
    return offering_id


def suggest_offering(offering_id: str, catalog: Catalog) -> str | None:
    """The catalog id closest to a mistyped one, matching it part by part
    (cloud/region/accelerator/market) so that ``h100`` finds ``h100-sxm``, not ``h200``."""
    parts = offering_id.split("/")

    def score(candidate: str) -> tuple[int, bool, float]:
        theirs = candidate.split("/")
        same = sum(a == b for a, b in zip(parts, theirs, strict=False))
        prefix = any(b.startswith(a) or a.startswith(b)
                     for a, b in zip(parts, theirs, strict=False) if a != b)
        return same, prefix, difflib.SequenceMatcher(None, offering_id, candidate).ratio()

    if len(parts) == 4:
        best = max(catalog.offerings, key=score)
        if score(best)[0] >= 2:
            return best
    close = difflib.get_close_matches(offering_id, list(catalog.offerings), n=1, cutoff=0.5)
    return close[0] if close else None


def _compact_offering(ctx: Ctx, data: dict[str, Any], catalog: Catalog) -> str:
    cloud, region, accel, market = (text(ctx, data, k) for k in COMPACT_KEYS)
    if accel not in catalog.accelerators:
        raise ctx.error("accelerator", unknown("accelerator", accel, catalog.accelerators))
    if cloud not in catalog.clouds:
        raise ctx.error("cloud", unknown("cloud", cloud, catalog.clouds))
    markets = [m.value for m in Market]
    if market not in markets:
        raise ctx.error("market", unknown("market", market, markets))
    offering_id = f"{cloud}/{region}/{accel}/{market}"
    if offering_id in catalog.offerings:
        return offering_id
    sold = [o for o in catalog.offerings.values() if o.accelerator == accel]
    on_cloud = [o for o in sold if o.cloud == cloud]
    where = ", ".join(sorted(o.id for o in (on_cloud or sold))) or "nowhere"
    if not on_cloud:
        raise ctx.error("accelerator", f"{cloud} does not sell {accel} in the catalog;"
                                       f" {accel} offerings: {where}")
    if not any(o.region == region for o in on_cloud):
        raise ctx.error("region", f"no {accel} offering in {cloud}/{region}; {accel} on"
                                  f" {cloud}: {where}")
    raise ctx.error("market", f"no {market} {accel} offering in {cloud}/{region};"
                              f" {accel} on {cloud}: {where}")


def _nearest(gpus: int, per: int) -> str:
    lo = gpus // per * per
    return f"{lo} or {lo + per}" if lo else str(per)


def parse_capacity_events(ctx: Ctx, data: Any, fleet: tuple[FleetEntry, ...],
                          horizon_s: float, catalog: Catalog) -> tuple[CapacityEvent, ...]:
    """Events sorted by time (stable); an offering's GPUs must stay >= 0 throughout."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ctx.error("", f"must be a list of {{at, offering, delta_gpus}} (got {show(data)})")
    start = {f.offering: f.gpus for f in fleet}
    parsed = [(_parse_event(ctx.at(f"[{i}]"), item, start, horizon_s, catalog), i)
              for i, item in enumerate(data)]
    parsed.sort(key=lambda pair: (pair[0].t_s, pair[1]))
    level = dict(start)
    for event, i in parsed:
        level[event.offering] += event.delta_gpus
        if level[event.offering] < 0:
            raise ctx.at(f"[{i}]").error(
                "delta_gpus", f"takes {event.offering} to {level[event.offering]} GPUs at"
                              f" {format_duration(event.t_s)} (fleet has {start[event.offering]}"
                              f", {level[event.offering] - event.delta_gpus} before this"
                              " event); capacity cannot go below 0")
    return tuple(event for event, _ in parsed)


def _parse_event(ctx: Ctx, data: Any, start: dict[str, int], horizon_s: float,
                 catalog: Catalog) -> CapacityEvent:
    mapping(ctx, data)
    check_keys(ctx, data, EVENT_KEYS)
    t_s = duration(ctx, data, "at")
    if not 0 <= t_s < horizon_s:
        raise ctx.error("at", f"must be within the horizon, 0 <= at < {format_duration(horizon_s)}"
                              f" (got {format_duration(t_s)})")
    offering_id = offering(ctx, data, catalog, within=start)
    delta = integer(ctx, data, "delta_gpus")
    if delta == 0:
        raise ctx.error("delta_gpus", "must not be 0 (negative: a stock-out; positive: a return)")
    if abs(delta) > MAX_OFFERING_GPUS:
        raise ctx.error("delta_gpus", f"must be within ±{MAX_OFFERING_GPUS:,} (got {delta:.6g})")
    per = catalog.offering(offering_id).gpus_per_instance
    if delta % per:
        raise ctx.error("delta_gpus", f"{delta} is not a whole number of {offering_id} instances"
                                      f" ({per} GPUs each)")
    return CapacityEvent(t_s=t_s, offering=offering_id, delta_gpus=delta,
                         note=text(ctx, data, "note", ""))


def gpus_by(fleet: Iterable[FleetEntry], attribute: str, catalog: Catalog) -> dict[str, int]:
    """GPUs at t=0 grouped by an offering attribute: accelerator, cloud, region, market."""
    out: dict[str, int] = {}
    for entry in fleet:
        value = getattr(catalog.offering(entry.offering), attribute)
        key = value.value if isinstance(value, Market) else str(value)
        out[key] = out.get(key, 0) + entry.gpus
    return dict(sorted(out.items()))
