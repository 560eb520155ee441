"""What every write of a split shares: checking a split against the registry, storing a
revision with its pushes, and pushing gateways again after a registry change (fleet
services call `gateways_refresh`)."""

from __future__ import annotations

import logging

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import mirror_auth, policy, selectors
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route, SplitRevision
from fleetctl.traffic.split import as_percentages

log = logging.getLogger("fleetctl.traffic")

GATEWAY_FIELDS = ["name", "kind", "admin_address", "options"]
PUSH_OPEN = (GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING)
DRAIN_OPEN = (Drain.Status.PUSHING, Drain.Status.VERIFIED, Drain.Status.PARTIAL)


# --- validation ------------------------------------------------------------------------------

def _check_split(*, route: Route, weights: dict[str, int], previous: dict[str, int],
                 force: bool, identity: dict[str, int] | None = None) -> dict[str, int]:
    """Everything a split must satisfy; returns the pool ids behind its names. Residency is
    checked even when forced: no flag sends pinned traffic across a border.

    Call it inside the transaction that stores the revision: it locks the pools and their
    regions, so a registry write that would move one of them out of the pin (fleet
    services, which take the same locks) waits for this revision and then sees it.
    `identity`: the pool ids the weights were meant for (a restore); a name that now
    belongs to another pool is refused."""
    pools = {p.name: p for p in Pool.objects.select_related("region")
             .select_for_update(of=("self", "region")).filter(name__in=weights)}
    unknown = sorted(set(weights) - set(pools))
    if unknown:
        raise ValidationError({"weights": [f"Unknown pool(s): {', '.join(unknown)}."]})
    if identity is not None:
        taken = sorted(name for name, bp in weights.items()
                       if bp and identity.get(name) != pools[name].pk)
        if taken:
            raise ConflictError(
                f"Pool(s) {', '.join(taken)} were deleted and registered again since that "
                f"split was made: the name now belongs to another pool, which is not given "
                f"the old pool's traffic. Set the split by hand instead.")
    serving = set(PoolModel.objects.filter(pool__in=pools.values(), model_id=route.model_id)
                  .values_list("pool__name", flat=True))
    problems: list[str] = []
    for name, pool in sorted(pools.items()):
        if route.residency and pool.region.jurisdiction != route.residency:
            raise ValidationError({"weights": [
                f"Residency: pool {name} is in jurisdiction {pool.region.jurisdiction}, but "
                f"route {route.name} is pinned to {route.residency}. Refused."
            ]})
        if name not in serving:
            problems.append(f"pool {name} does not serve model {route.model_id}")
        if weights[name] > previous.get(name, 0):
            if pool.health_state != Pool.Health.HEALTHY and not force:
                problems.append(f"pool {name} is {pool.health_state} (force to override)")
            refusal = policy.live_weight_refusal(pool, route)
            if refusal:
                problems.append(f"pool {name}: {refusal}")
    if problems:
        raise ValidationError({"weights": [p[0].upper() + p[1:] + "." for p in problems]})
    return {name: pool.pk for name, pool in pools.items()}


def _stale(route: Route, base: int) -> ConflictError:
    fresh = Route.objects.get(pk=route.pk)
    current = selectors.revision_current(route=fresh)
    return ConflictError(
        f"Route {route.name} is at revision {fresh.revision_number}, not {base}: someone "
        f"changed it since you looked. Re-read it and try again.",
        fields={"current_revision": [str(fresh.revision_number)]},
        extra={"current_revision": fresh.revision_number,
               "current_weights": as_percentages(current.weights) if current else {},
               "current_author": current.created_by if current else ""},
    )


def _store_revision(*, actor: Actor, route: Route, base: int, weights: dict[str, int],
                    kind: str, reason: str, forced: bool = False,
                    parent: SplitRevision | None = None, queue: bool = True,
                    pool_ids: dict[str, int] | None = None,
                    push_ids: list[int] | None = None) -> SplitRevision:
    """Claim revision base+1 with a conditional UPDATE (the loser of a race gets 409), store
    it, audit it, and store its pushes. `parent`: revision `base` when the caller already
    read it (saves a query). `pool_ids`: the identities _check_split validated (otherwise the
    parent's, see _pool_ids). `queue`: queue the pushes' first attempts once the transaction
    commits; drains pass False and attempt them themselves after their commit, adding the
    push ids to `push_ids`."""
    claimed = Route.objects.filter(pk=route.pk, revision_number=base).update(
        revision_number=F("revision_number") + 1
    )
    if not claimed:
        raise _stale(route, base)
    route.revision_number = base + 1
    if parent is None or parent.route_id != route.pk or parent.number != base:
        parent = SplitRevision.objects.filter(route=route, number=base).first()
    revision = SplitRevision.objects.create(
        route=route, number=base + 1, parent=parent, kind=kind, weights=weights,
        pool_ids=pool_ids if pool_ids is not None else _pool_ids(weights, parent),
        reason=reason, forced=forced, created_by=actor.label,
    )
    audit_record(
        actor=actor, action=f"revision.{kind}", target=route, message=reason,
        before={"revision": base, "weights": as_percentages(parent.weights) if parent else {}},
        after={"revision": revision.number, "weights": as_percentages(weights),
               "forced": forced},
    )
    ids = _store_pushes(revision, queue=queue)
    if push_ids is not None:
        push_ids.extend(ids)
    return revision


def _pool_ids(weights: dict[str, int], parent: SplitRevision | None) -> dict[str, int]:
    """The identity behind each pool name of a new revision. A name the parent already had
    keeps the parent's pool: a drain or restore moves weight between the pools the operator
    saw, and if one of them was deleted and its name taken since, the new holder of the name
    gets nothing (fails closed). Other names are the pools that hold them now, which
    _check_split has just validated under a row lock."""
    known = {name: pk for name, pk in (parent.pool_ids if parent else {}).items()
             if name in weights}
    missing = [name for name in weights if name not in known]
    if missing:
        known |= dict(Pool.objects.filter(name__in=missing).values_list("name", "pk"))
    return known


def _store_pushes(revision: SplitRevision, *, queue: bool) -> list[int]:
    """One push row per gateway carrying the revision's route; with `queue`, one task after
    the commit makes their first attempts (one message for all gateways: the task pushes to
    them in parallel threads, so it does not wait for a worker to pick up ten messages)."""
    pushes = GatewayPush.objects.bulk_create(
        [GatewayPush(revision=revision, gateway=gateway)
         for gateway in revision.route.gateways.all()]
    )
    ids = [p.pk for p in pushes]
    if queue:
        _fanout_after_commit(ids)
    return ids


# --- gateways --------------------------------------------------------------------------------

def _publish_mirror_auth_after_commit() -> None:
    """Which gateway may mirror which route, for the shadow collectors (mirror_auth), once
    the change is committed: before the pushes it queues, so a gateway's first copies
    under a new config are already accepted."""
    transaction.on_commit(mirror_auth.publish_quietly)


def gateways_refresh(*, reason: str = "registry", route: Route | None = None) -> list[int]:
    """A registry edit changes what gateways should hold without a new revision (a pool's
    endpoints, which pools may carry a route): push every gateway that carries a route its
    whole state again, after the commit. One message for all; a gateway that already holds
    its state is only read. Returns the push ids.

    With `route`, only the gateways carrying it, each push of the route's current revision
    (a mirror change: the revision is unchanged, the push verifies once the gateway holds
    the mirror fraction too)."""
    gateways = list(Gateway.objects.prefetch_related("routes") if route is None
                    else Gateway.objects.filter(routes=route).prefetch_related("routes"))
    current = selectors.revisions_current(routes=list({r.pk: r for gateway in gateways
                                                       for r in gateway.routes.all()}
                                                      .values()))
    pushes = []
    for gateway in gateways:
        revisions = [current[r.pk] for r in gateway.routes.all() if r.pk in current]
        if route is not None:
            revisions = [current[route.pk]] if route.pk in current else []
        if revisions:
            pushes.append(GatewayPush(revision=revisions[0], gateway=gateway, reason=reason))
    ids = [push.pk for push in GatewayPush.objects.bulk_create(pushes)]
    _fanout_after_commit(ids)
    return ids


def _fanout_after_commit(ids: list[int]) -> None:
    """Once the transaction commits, one task makes the first attempts of these pushes
    (nothing is queued for none)."""
    if ids:
        from fleetctl.traffic.tasks import push_fanout

        transaction.on_commit(lambda: push_fanout.delay(ids))


def _enqueue_after_commit(push_id: int) -> None:
    from fleetctl.traffic.tasks import push_run

    transaction.on_commit(lambda: push_run.delay(push_id))
