"""Mirroring for shadow runs: the shadow app's jobs set and clear a route's mirror share; the
gateways carrying the route are pushed after the commit."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import required_reason
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import selectors
from fleetctl.traffic.models import Route
from fleetctl.traffic.services._shared import gateways_refresh

# --- mirroring (shadow runs) --------------------------------------------------------------------

MIRROR_FIELDS = ["mirror_percent", "mirror_pools", "mirror_owner"]


def route_mirror_set(*, actor: Actor, route: Route, percent: float, pools: list[Pool],
                     owner: str) -> Route:
    """Have the route's gateways copy `percent` % of its requests to the shadow collector,
    for a shadow run (`owner`, e.g. "shadow run 12") comparing `pools` (candidate and
    primary). Refused (400, naming the pool) when a pool sits outside the route's residency
    pin or does not serve its model: a mirror copies requests, and pinned requests never
    leave their jurisdiction, not even as copies. Not a revision: nothing any caller gets
    back changes. The gateways are pushed after the commit, and verify only once they hold
    the mirror fraction."""
    actor.require(roles.JOBS, action="route.mirror_set", target=route)
    problems = _mirror_problems(percent=percent, pools=pools, owner=owner)
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        locked = Route.objects.select_for_update().get(pk=route.pk)
        # The locks a registry edit takes (fleet services): a pool cannot leave the pin, or
        # stop serving the model, between this check and the commit.
        found = {p.name: p for p in Pool.objects.select_related("region")
                 .select_for_update(of=("self", "region")).filter(pk__in=[p.pk for p in pools])}
        serving = set(PoolModel.objects.filter(pool__in=found.values(),
                                               model_id=locked.model_id)
                      .values_list("pool__name", flat=True))
        refused = []
        for pool in sorted(pools, key=lambda p: p.name):
            current = found.get(pool.name)
            if current is None or current.pk != pool.pk:
                refused.append(f"Pool {pool.name} no longer exists under that name.")
            elif locked.residency and current.region.jurisdiction != locked.residency:
                refused.append(
                    f"Residency: pool {pool.name} is in jurisdiction "
                    f"{current.region.jurisdiction}, but route {locked.name} is pinned to "
                    f"{locked.residency}; its requests may not be mirrored to it. Refused.")
            elif pool.name not in serving:
                refused.append(f"Pool {pool.name} does not serve model {locked.model_id} of "
                               f"route {locked.name}.")
        if refused:
            raise ValidationError({"pools": refused})
        return _mirror_store(actor=actor, route=locked, action="route.mirror_set",
                             percent=float(percent),
                             pools={p.name: p.pk for p in pools}, owner=owner.strip(),
                             message=f"{owner.strip()}: mirror {float(percent):g} % of "
                                     f"{locked.name}'s requests")


def route_mirror_clear(*, actor: Actor, route: Route, reason: str) -> Route:
    """Stop mirroring the route (0 %) and push its gateways after the commit. Clearing a
    route that does not mirror changes nothing and pushes nothing."""
    actor.require(roles.JOBS, action="route.mirror_clear", target=route)
    reason = required_reason(reason, "Say why mirroring stops (it goes in the record).")
    with transaction.atomic():
        locked = Route.objects.select_for_update().get(pk=route.pk)
        if not locked.mirror_percent and not locked.mirror_pools:
            return locked
        return _mirror_store(actor=actor, route=locked, action="route.mirror_clear",
                             percent=0.0, pools={}, owner="", message=reason)


def _mirror_problems(*, percent: Any, pools: list[Pool], owner: str) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    if (isinstance(percent, bool) or not isinstance(percent, int | float)
            or not 0 < percent <= 100):
        problems["percent"] = [f"Mirror a share of requests above 0 and at most 100 %, not "
                               f"{percent!r}."]
    elif selectors.mirror_bp(percent) == 0:
        problems["percent"] = [f"{percent:g} % rounds to 0: gateways mirror in steps of "
                               f"0.01 %."]
    if not pools:
        problems["pools"] = ["Name the pools the mirrored requests are compared on."]
    if not owner.strip():
        problems["owner"] = ['Say who mirrors (e.g. "shadow run 12").']
    elif len(owner.strip()) > Route._meta.get_field("mirror_owner").max_length:  # type: ignore[operator]
        problems["owner"] = ["At most 100 characters."]
    return problems


def _mirror_store(*, actor: Actor, route: Route, action: str, percent: float,
                  pools: dict[str, int], owner: str, message: str) -> Route:
    before = snapshot(route, MIRROR_FIELDS)
    route.mirror_percent, route.mirror_pools, route.mirror_owner = percent, pools, owner
    route.save(update_fields=MIRROR_FIELDS)
    audit_record(actor=actor, action=action, target=route, message=message, before=before,
                 after=snapshot(route, MIRROR_FIELDS))
    gateways_refresh(reason="mirror", route=route)
    return route
