"""Rules a split must satisfy before it is stored, beyond its own arithmetic.

`LIVE_WEIGHT_GUARDS` is the hook the migration-plans app fills: a guard returns a reason to
refuse live weight for a pool on a route (e.g. "candidate is in stage 2; live weight needs
stage 4"), or None. Guards apply to increases of weight only, so a drain is never blocked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route

LiveWeightGuard = Callable[["Pool", "Route"], "str | None"]
LIVE_WEIGHT_GUARDS: list[LiveWeightGuard] = []


def register_live_weight_guard(guard: LiveWeightGuard) -> LiveWeightGuard:
    if guard not in LIVE_WEIGHT_GUARDS:
        LIVE_WEIGHT_GUARDS.append(guard)
    return guard


def live_weight_refusal(pool: Pool, route: Route) -> str | None:
    for guard in LIVE_WEIGHT_GUARDS:
        reason = guard(pool, route)
        if reason:
            return reason
    return None
