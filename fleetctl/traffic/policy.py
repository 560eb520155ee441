"""Rules a split must satisfy before it is stored, beyond its own arithmetic.

`LIVE_WEIGHT_GUARDS` is the hook the migration-plans app fills: a guard returns a reason to
refuse live weight for a pool on a route (e.g. "candidate is in stage 2; live weight needs
stage 4"), or None. Guards apply to increases of weight only, so a drain is never blocked.
A guard may register a batch form too (the same reasons for many pools of one route, read at
once): `live_weight_refusals` uses it where a page or a render asks for every pool of a route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route

LiveWeightGuard = Callable[["Pool", "Route"], "str | None"]
LIVE_WEIGHT_GUARDS: list[LiveWeightGuard] = []
# {pool id: reason} for the pools of `pools` the guard refuses on the route.
LiveWeightBatchGuard = Callable[[Sequence["Pool"], "Route"], dict[int, str]]
LIVE_WEIGHT_BATCH_GUARDS: dict[LiveWeightGuard, LiveWeightBatchGuard] = {}


def register_live_weight_guard(guard: LiveWeightGuard, *,
                               batch: LiveWeightBatchGuard | None = None) -> LiveWeightGuard:
    if guard not in LIVE_WEIGHT_GUARDS:
        LIVE_WEIGHT_GUARDS.append(guard)
    if batch is not None:
        LIVE_WEIGHT_BATCH_GUARDS[guard] = batch
    return guard


def live_weight_refusal(pool: Pool, route: Route) -> str | None:
    for guard in LIVE_WEIGHT_GUARDS:
        reason = guard(pool, route)
        if reason:
            return reason
    return None


def live_weight_refusals(pools: Sequence[Pool], route: Route) -> dict[int, str]:
    """{pool id: reason} for the pools refused live weight on the route: per pool what
    `live_weight_refusal` says (the first guard that refuses), each guard asked once for all
    the pools by its batch form, or pool by pool where it registered none."""
    refused: dict[int, str] = {}
    for guard in LIVE_WEIGHT_GUARDS:
        left = [pool for pool in pools if pool.pk not in refused]
        if not left:
            break
        batch = LIVE_WEIGHT_BATCH_GUARDS.get(guard)
        if batch is not None:
            reasons = batch(left, route)
        else:
            reasons = {pool.pk: reason for pool in left if (reason := guard(pool, route))}
        refused.update({pk: reason for pk, reason in reasons.items() if reason})
    return refused
