"""Weight on a route that something above traffic steps by itself (a guarded ramp), as drains
and restores need to know it. Traffic knows splits, not what moves them: the app that does
registers a holder here in its ready(), as fleet's health hooks are registered.

The rules (Argo Rollouts' and Flagger's: an operator who pulls a canary's traffic has
aborted the canary, and getting it back means starting the canary again from its first
step, under its analysis):
* a drain that takes a held pool off its route ends what held it (a ramp is aborted by the
  drain and its guard stops): nothing steps that pool back up behind the on-call's back;
* a restore never hands such a pool its share back: nothing would guard it any more. The
  rest of the route is restored; the held pool's share stays where the drain put it, and
  its owner (a new ramp) gives it weight again, step by step;
* the drain and restore pages say which ramp holds what before anyone confirms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Drain, Route


@dataclass(frozen=True)
class Hold:
    """`pool`'s weight on route `route_id` belongs to `owner` ("ramp 12", at `url`), which
    is `state` ("paused at 50 %", or "aborted by drain 7" when a drain ended it)."""

    route_id: int
    pool: str
    owner: str
    url: str
    state: str
    active: bool  # still stepping the weight (a drain would end it)

    def __str__(self) -> str:
        return f"{self.owner} ({self.state})"


@dataclass(frozen=True)
class Holder:
    # Lock what a drain of `pool` (or of `route`), limited to `routes` when given, could end,
    # before the drain locks the routes: ramps lock their row before their route's.
    lock: Callable[..., None]
    # The holds on these routes now, and those `drain` ended.
    holds: Callable[..., list[Hold]]
    # End what held the pools this drain took off each route: {route id: {pool names}}.
    drained: Callable[..., None]


HOLDERS: dict[str, Holder] = {}


def holder_register(name: str, *, lock: Callable[..., None],
                    holds: Callable[..., list[Hold]], drained: Callable[..., None]) -> None:
    HOLDERS[name] = Holder(lock=lock, holds=holds, drained=drained)


def holders_lock(*, pool: Pool | None, route: Route | None,
                   routes: list[Route] | None) -> None:
    for holder in HOLDERS.values():
        holder.lock(pool=pool, route=route, routes=routes)


def holds_on(*, route_ids: list[int], drain: Drain | None = None) -> list[Hold]:
    return [hold for holder in HOLDERS.values()
            for hold in holder.holds(route_ids=route_ids, drain=drain)]


def holders_drained(*, actor: Actor, drain: Drain, removed: dict[int, set[str]]) -> None:
    for holder in HOLDERS.values():
        holder.drained(actor=actor, drain=drain, removed=removed)
