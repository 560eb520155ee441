"""The check every rendering adapter (HAProxy, nginx, Gateway API) makes of a route's pools
before writing its config."""

from __future__ import annotations

from fleetctl.traffic.gateways.base import AdapterError, DesiredState, PoolTarget, RouteSpec


def route_target(route: RouteSpec, pool: str, weight: int, desired: DesiredState) -> PoolTarget:
    """The declared pool `pool` of `route`. A permanent AdapterError when it is not declared,
    or when it carries weight outside the jurisdiction the route is pinned to."""
    target = desired.pools.get(pool)
    if target is None:
        raise AdapterError(f"route {route.key}: pool {pool} is not declared", permanent=True)
    if weight and route.residency and target.jurisdiction != route.residency:
        raise AdapterError(f"route {route.key} is pinned to {route.residency}; pool {pool} "
                           f"is in {target.jurisdiction}", permanent=True)
    return target
