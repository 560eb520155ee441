"""Capacity-checked drains (docs/traffic.md, "Capacity-checked drains"): before a drain
moves a share of a route, the load that share carries now is compared with what the pools
it would go to can still carry within their SLO (traffic/capacity.py).

Per route: the freed share's load is the drained pools' live streams (the gateways'
in-flight count). A pool that carries weight on several routes has its streams attributed
to each in proportion to the weight each route gives it (the gateways count streams per
pool, not per route; routes are taken as equally busy per unit of weight). A pool's room is
its SLO capacity in streams less its live streams, less what earlier routes of the same
drain already sent it.

- The primary has room for it all: `instant`, as a drain always was.
- Otherwise `spread`: the primary takes what fits, the rest goes to the route's other pools
  that already carry weight on it, may serve it, are not unhealthy and have figures, in
  proportion to their room. Jurisdiction only restricts a pinned route (its pools are all in
  its pin, and one found outside it is skipped); an unpinned route sends to its pools
  wherever they are already, so the share may go to any of them.
- Still too much: a person's drain is `stepped`: what fits moves now, at least 1/N of the
  share, and the rest stays on the drained pools for the next step, DRAIN_STEP_INTERVAL_S
  later, which reads the capacity again (services/drain_steps.py); by step N
  (DRAIN_STEPS_MAX) everything has moved, whatever the capacity. An automatic drain (health
  policy, ramp rollback, re-verification, a plan's stage) never steps: a failing pool must
  not keep traffic because of a figure; all of it moves now, the excess in proportion to
  the targets' capacity.
- `forced` (on-call): at once to the primary, as before; the figures are still recorded.
- A figure missing (no benchmark, no recent gateway sample, the source failing): the drain
  goes at once to the primary, as without a check, and says "capacity unknown: …". A
  drain is never held up by a missing figure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from fleetctl.fleet.models import Pool
from fleetctl.traffic import selectors
from fleetctl.traffic.capacity import (
    LIVE_SAMPLE_MAX_AGE_S,
    PoolCapacity,
    live_streams,
    pool_capacities,
)
from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.models import Route
from fleetctl.traffic.split import drained, drained_within

log = logging.getLogger("fleetctl.traffic")

INSTANT, SPREAD, STEPPED, FORCED = "instant", "spread", "stepped", "forced"
# The drain's decision is its routes' most cautious one.
ORDER = (INSTANT, SPREAD, STEPPED, FORCED)


@dataclass
class Readings:
    """What the routes of one drain share: streams in flight per pool, each pool's weight
    over every route (to attribute its streams), the pools, capacities per (model, pool),
    and the streams this drain already sent each pool."""

    live: dict[str, int] = field(default_factory=dict)
    carried: dict[str, int] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    capacities: dict[tuple[str, str], PoolCapacity] = field(default_factory=dict)
    taken: dict[str, float] = field(default_factory=dict)
    failed: str = ""  # the figures could not be read at all: why


def readings(routes: list[Route], weights: dict[int, dict[str, int]]) -> Readings:
    """The figures every route of a drain needs (their current split in `weights`, by route
    id): live streams, weights over every route, the pools. Capacities are read later, and
    only those a route's check needs (`capacity`). A read that fails leaves `failed` set
    instead of failing the drain."""
    found = Readings()
    try:
        with transaction.atomic():  # a failing read must not spoil the drain's transaction
            names = {p for split in weights.values() for p in split}
            names |= {route.primary_pool.name for route in routes}
            found.live = live_streams(names)
            for split in selectors.splits_current():
                for pool, bp in split.items():
                    found.carried[pool] = found.carried.get(pool, 0) + bp
            found.pools = {p.name: p for p in Pool.objects.select_related("region")
                           .filter(name__in=names)}
    except Exception as exc:  # never block a drain on a figure
        log.exception("drain capacity check: could not read the figures")
        found.failed = f"the figures could not be read ({type(exc).__name__}: {exc})"
    return found


def capacity(found: Readings, model: str, name: str) -> PoolCapacity | None:
    """A pool's capacity for a model, read once per drain; None for a pool not found. A
    source that fails gives a capacity that says why (never an exception)."""
    key = (model, name)
    pool = found.pools.get(name)
    if key not in found.capacities and pool is not None:
        try:
            with transaction.atomic():
                found.capacities[key] = pool_capacities(model, [pool])[name]
        except Exception as exc:  # never block a drain on a figure
            log.exception("drain capacity check: could not read %s's capacity", name)
            found.capacities[key] = PoolCapacity(pool=name, why_none=(
                f"its capacity could not be read ({type(exc).__name__}: {exc})"))
    return found.capacities.get(key)


def check(*, route: Route, weights: dict[str, int], remove: set[str], eligible: set[str],
          found: Readings, force: bool, stepping: bool, step: int = 1,
          first_freed: int | None = None) -> tuple[dict[str, int], dict[str, Any]]:
    """One route's split after this drain step, and the note that records why (the
    numbers, per pool). `step`/`first_freed`: a stepped drain's later steps (the share freed
    at its first step bounds how much may still be left)."""
    primary = route.primary_pool.name
    instant = drained(weights, remove=remove, primary=primary, eligible=eligible)
    kept = sum(w for p, w in weights.items() if p not in remove and p in eligible and w > 0)
    freed = TOTAL_WEIGHT - kept
    note: dict[str, Any] = {"route": route.name, "step": step, "freed_bp": freed, "pools": {}}
    load, unknown = _load(route, weights, remove, found, note)
    if force:  # on-call's instant drain: no capacity is read, the load is recorded
        return instant, {**note, "decision": FORCED, "weights": instant,
                         "why": "forced: moved at once to the primary whatever the capacity "
                                "(not checked)" + (f"; load unknown: {unknown}" if unknown
                                                   else "")}
    if not unknown and load <= 0:
        return instant, {**note, "decision": INSTANT, "weights": instant,
                         "why": "the drained pools carry no streams now"}
    room: dict[str, float] = {}
    if not unknown:
        room, unknown = _targets(route, weights, remove, eligible, found, note, load)
    if unknown:
        return instant, {**note, "decision": INSTANT, "weights": instant,
                         "why": f"capacity unknown: {unknown}; moved at once to the primary, "
                                f"as without a check"}
    total_room = sum(max(r, 0.0) for r in room.values())
    streams = {p: float(getattr(capacity(found, route.model_id, p), "streams", 0) or 0)
               for p in room}
    if primary in room and load <= room[primary]:
        after, given, decision = instant, {primary: freed}, INSTANT
        why = (f"the primary {primary} has room: {load:g} stream(s) moved, "
               f"{room[primary]:g} free of its capacity")
    else:
        # All of it moves (it fits by spreading, or an automatic drain), except a stepped
        # drain's: what fits and at least its step's part of the first freed share.
        at_least = freed
        if load > total_room and stepping:
            steps = settings.DRAIN_STEPS_MAX
            base = first_freed if first_freed is not None else freed
            may_stay = 0 if step >= steps else base * (steps - step) // steps
            at_least = max(0, freed - may_stay)
        after, given = drained_within(weights, remove=remove, primary=primary,
                                      eligible=eligible, load=load, room=room,
                                      capacity=streams, at_least=at_least)
        decision, why = _decided(load, total_room, room, primary, stepping, step, after,
                                 remove, given)
    for pool, bp in given.items():
        found.taken[pool] = found.taken.get(pool, 0.0) + (load * bp / freed if freed else 0)
        note["pools"].setdefault(pool, {}).update({"given_bp": bp, "given_percent": bp / 100})
    note["left_bp"] = sum(bp for p, bp in after.items() if p in remove)
    return after, {**note, "decision": decision, "why": why, "weights": after}


def _decided(load: float, total_room: float, room: dict[str, float], primary: str,
             stepping: bool, step: int, after: dict[str, int], remove: set[str],
             given: dict[str, int]) -> tuple[str, str]:
    # Two decimals: an attributed load is a fraction (2 streams x 5 % of the weight = 0.1).
    where = f"{round(load, 2):g} stream(s) to move, {round(total_room, 2):g} free on " + (
        ", ".join(f"{p} {round(max(r, 0.0), 2):g}" for p, r in room.items()))
    if load <= total_room:
        who = (f"the primary {primary} alone cannot carry it" if primary in room
               else f"the primary {primary} is itself drained")
        return SPREAD, f"spread: {who}; {where}"
    left = sum(bp for p, bp in after.items() if p in remove)
    if stepping:
        steps = settings.DRAIN_STEPS_MAX
        rest = (f"{left / 100:g} % left on the drained pool(s) for step {step + 1} in "
                f"{settings.DRAIN_STEP_INTERVAL_S} s" if left else "nothing left")
        return STEPPED, (f"stepped: more than the route's pools can carry; {where}; step "
                         f"{step} of at most {steps}: {rest}")
    spread = any(p != primary for p in given)
    return (SPREAD if spread else INSTANT), (
        f"over capacity: {where}; an automatic drain does not step: all of it moved now, "
        f"beyond the room in proportion to capacity")


def _load(route: Route, weights: dict[str, int], remove: set[str], found: Readings,
          note: dict[str, Any]) -> tuple[float, str]:
    """The streams the freed share carries now (attributed to this route), or why unknown."""
    if found.failed:
        return 0.0, found.failed
    load = 0.0
    for pool in sorted(p for p, w in weights.items() if p in remove and w > 0):
        if pool not in found.live:
            return 0.0, (f"no gateway sampled {pool}'s streams in the last "
                         f"{LIVE_SAMPLE_MAX_AGE_S} s")
        share = weights[pool] / max(found.carried.get(pool, 0), weights[pool])
        streams = found.live[pool] * share
        load += streams
        note["pools"][pool] = {"role": "drained", "weight_bp": weights[pool],
                               "live_streams": found.live[pool],
                               "route_streams": round(streams, 2)}
        if share < 1:
            note["pools"][pool]["attributed"] = (
                f"{pool} serves other routes too: {share:.0%} of its streams (its weight here "
                f"over its weight on every route)")
    note["load_streams"] = round(load, 2)
    return load, ""


def _targets(route: Route, weights: dict[str, int], remove: set[str], eligible: set[str],
             found: Readings, note: dict[str, Any], load: float
             ) -> tuple[dict[str, float], str]:
    """Pool -> streams of room: the primary's, and when it cannot take `load`, the pools
    the share may spread to (their figures are read only then); or why the check cannot be
    made (the primary's figures missing)."""
    primary = route.primary_pool.name
    room: dict[str, float] = {}
    candidates = [primary] if primary in eligible and primary not in remove else []
    candidates += sorted(p for p, w in weights.items() if w > 0 and p not in remove
                         and p != primary)
    for pool in candidates:
        if pool != primary and primary in room and load <= room[primary]:
            break  # the primary carries it: the others are not needed
        row = found.pools.get(pool)
        entry = note["pools"].setdefault(pool, {})
        entry["role"] = "primary" if pool == primary else "spread"
        skip = _not_a_target(pool, row, eligible, route.residency)
        cap = None if skip else capacity(found, route.model_id, pool)
        if cap is not None:
            entry.update({"capacity_streams": cap.streams, "source": cap.source})
            skip = _unmeasured(pool, cap, found)
        if pool in found.live:
            entry["live_streams"] = found.live[pool]
        if skip:
            if pool == primary:
                return {}, f"primary {pool}: {skip}"
            entry.update({"role": "skipped", "why": skip})
            continue
        assert cap is not None and cap.streams is not None
        room[pool] = cap.streams - found.live[pool] - found.taken.get(pool, 0.0)
        entry["room_streams"] = round(room[pool], 2)
    if not room:
        return {}, "no pool the share could go to has a capacity figure and a live count"
    return room, ""


def _not_a_target(pool: str, row: Pool | None, eligible: set[str], pin: str) -> str:
    """Why `pool` takes no share, or "". `pin`: the route's residency ("" unpinned: the route
    already sends to its pools wherever they are, so their jurisdiction is no reason)."""
    if row is None or pool not in eligible:
        return "may not serve this route"
    if pin and row.region.jurisdiction != pin:
        return f"in jurisdiction {row.region.jurisdiction}, outside the route's pin {pin}"
    if row.health_state == Pool.Health.UNHEALTHY:
        return "unhealthy"
    return ""


def _unmeasured(pool: str, cap: PoolCapacity, found: Readings) -> str:
    if not cap.known or cap.streams is None:
        return cap.source
    if pool not in found.live:
        return f"no gateway sampled its streams in the last {LIVE_SAMPLE_MAX_AGE_S} s"
    return ""


def summary(notes: list[dict[str, Any]], *, force: bool, stepping: bool) -> dict[str, Any]:
    """The drain's record of its check: the most cautious decision of its routes, why, and
    each route's note."""
    decision = max((n["decision"] for n in notes), key=ORDER.index, default=INSTANT)
    why = "; ".join(f"{n['route']}: {n['why']}" for n in notes)
    return {"decision": decision, "why": why, "force": force, "stepping": stepping,
            "routes": notes}
