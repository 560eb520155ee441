"""Writes for traffic: routes, revisions, gateways, and drain and restore records. Every
function here is a transaction; none talks to a gateway (that is `push`).

A revision is validated, stored (winning a conditional UPDATE of the route's revision
counter, so of two concurrent changes exactly one wins) with one push row per gateway of the
route. After the commit a Celery task on the `push` queue makes their first attempts (the
only thing a commit hook here does is queue that task). Drains and restores are revisions
with a timed record, and their pushes are not queued: the caller makes the first attempt
itself once its transaction has committed, by name — `push.drain_push_now(drain)` — because
that attempt is what the drain's figures time.

The writes are split by who makes them: `writes` (what a person or an API client does to
routes, revisions and gateways), `capacity` (applying a route's capacity split), `drains`
(drains and restores), `mirroring` (what shadow runs' jobs ask for), `affinity` (a route's
prefix affinity), `tiers` (a route's context tiers, and the guard fleet asks before a pool's
context is lowered) and `_shared` (checking and storing a split and its pushes). Import them
from here: `from fleetctl.traffic import services; services.revision_create(...)`."""

from __future__ import annotations

from fleetctl.traffic.services._shared import (
    DRAIN_OPEN,
    GATEWAY_FIELDS,
    PUSH_OPEN,
    gateways_refresh,
)
from fleetctl.traffic.services.affinity import route_affinity_set
from fleetctl.traffic.services.capacity import route_capacity_split_apply
from fleetctl.traffic.services.drain_steps import drain_step_take, drain_steps_due
from fleetctl.traffic.services.drains import drain_request, drain_restore
from fleetctl.traffic.services.mirroring import MIRROR_FIELDS, route_mirror_clear, route_mirror_set
from fleetctl.traffic.services.tiers import route_tiers_set
from fleetctl.traffic.services.writes import (
    gateway_create,
    gateway_delete,
    gateway_mirror_secret_rotate,
    gateway_set_routes,
    gateway_update,
    revision_create,
    route_create,
    route_health_policy_set,
    route_reverify_policy_set,
)

__all__ = [
    "DRAIN_OPEN",
    "GATEWAY_FIELDS",
    "MIRROR_FIELDS",
    "PUSH_OPEN",
    "drain_request",
    "drain_restore",
    "drain_step_take",
    "drain_steps_due",
    "gateway_create",
    "gateway_delete",
    "gateway_mirror_secret_rotate",
    "gateway_set_routes",
    "gateway_update",
    "gateways_refresh",
    "revision_create",
    "route_affinity_set",
    "route_capacity_split_apply",
    "route_create",
    "route_health_policy_set",
    "route_mirror_clear",
    "route_mirror_set",
    "route_reverify_policy_set",
    "route_tiers_set",
]
