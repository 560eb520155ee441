"""Applying a route's capacity split (traffic/capacity_split.py): one click or one POST
stores it as a revision of kind `capacity` whose reason names each pool's benchmark run and
what was left at 0 % and why. Based on the revision the person saw, like every split
change: 409 when someone changed the route since, 400 when no split can be offered."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.traffic.capacity_split import route_capacity_split
from fleetctl.traffic.models import Route, SplitRevision
from fleetctl.traffic.services.writes import revision_store


def route_capacity_split_apply(*, actor: Actor, route: Route, base_revision: int,
                               note: str = "") -> SplitRevision:
    """Store the route's capacity split as it reads now. `base_revision`: the revision the
    person saw (the split was suggested against it). `note`: the person's own words, added
    to the generated reason. The answer has `unchanged` when the split is in force already
    (nothing stored, pushed or audited)."""
    actor.require(roles.RAMP, action="revision.capacity", target=route)
    if isinstance(base_revision, bool) or not isinstance(base_revision, int) \
            or base_revision < 1:
        raise ValidationError({"base_revision": [
            f"Send the route's revision you read (a whole number, 1 or more; "
            f"{route.name} is at {route.revision_number}), not {base_revision!r}."]})
    split = route_capacity_split(route=route)
    if split.refusal:
        raise ValidationError({"capacity": [split.refusal]})
    reason = split.reason + (f" Note: {note.strip()}" if note and note.strip() else "")
    return revision_store(actor=actor, route=route, split=split.weights,
                          base_revision=base_revision, reason=reason,
                          kind=SplitRevision.Kind.CAPACITY)
