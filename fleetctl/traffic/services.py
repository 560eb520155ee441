"""Writes for traffic: routes, revisions, gateways, and drain and restore records. Every
function here is a transaction; none talks to a gateway (that is `push`).

A revision is validated, stored (winning a conditional UPDATE of the route's revision
counter, so of two concurrent changes exactly one wins) with one push row per gateway of the
route. After the commit a Celery task on the `push` queue makes their first attempts (the
only thing a commit hook here does is queue that task). Drains and restores are revisions
with a timed record, and their pushes are not queued: the caller makes the first attempt
itself once its transaction has committed, by name — `push.drain_push_now(drain)` — because
that attempt is what the drain's figures time.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.crud import audited_create, audited_delete, audited_update
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import mirror_auth, policy, selectors
from fleetctl.traffic.holds import Hold, holders_drained, holders_lock, holds_on
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route, SplitRevision
from fleetctl.traffic.split import as_percentages, parse_percentages

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


def _check_route_primary(route: Route) -> None:
    primary = route.primary_pool
    if route.residency and primary.region.jurisdiction != route.residency:
        raise ValidationError({"primary_pool": [
            f"Residency: primary {primary.name} is in {primary.region.jurisdiction}, "
            f"the route is pinned to {route.residency}."
        ]})
    if not PoolModel.objects.filter(pool=primary, model_id=route.model_id).exists():
        raise ValidationError({"primary_pool": [
            f"Primary {primary.name} does not serve model {route.model_id}."
        ]})


# --- routes and revisions --------------------------------------------------------------------

def route_create(*, actor: Actor, name: str, model_id: str, primary_pool: Pool,
                 weights: Any = None, latency_class: str = "", residency: str = "",
                 reason: str = "", force: bool = False,
                 health_policy: str = Route.HealthPolicy.DRAIN) -> Route:
    """A route and its first revision (default: everything to the primary)."""
    actor.require(roles.FLEET_MANAGE, action="route.create", target="traffic.route")
    route = Route(name=name, model_id=model_id, primary_pool=primary_pool,
                  latency_class=latency_class, residency=residency, health_policy=health_policy)
    route.full_clean()
    _check_route_primary(route)
    split = parse_percentages(weights) if weights else {primary_pool.name: 10_000}
    with transaction.atomic():
        pool_ids = _check_split(route=route, weights=split, previous={}, force=force)
        route.save()
        audit_record(actor=actor, action="route.create", target=route,
                     after=snapshot(route, ["name", "model_id", "latency_class", "residency",
                                            "primary_pool", "health_policy"]))
        _store_revision(actor=actor, route=route, base=0, weights=split,
                        kind=SplitRevision.Kind.CREATE, reason=reason or "route created",
                        forced=force, pool_ids=pool_ids)
    return route


def route_health_policy_set(*, actor: Actor, route: Route, health_policy: str) -> Route:
    """What the health policy does on this route when a pool with weight turns unhealthy
    (traffic/health.py). Applies from the next flip; drains already made stay."""
    return audited_update(actor=actor, permission=roles.FLEET_MANAGE,
                          action="route.health_policy", instance=route,
                          changes={"health_policy": health_policy}, allowed=["health_policy"])


def revision_create(*, actor: Actor, route: Route, weights: Any, base_revision: int,
                    reason: str, force: bool = False) -> SplitRevision:
    """Change a route's split. `base_revision` is the revision the caller saw: if another
    change landed since, this one is refused with 409 (and nothing stored or pushed)."""
    actor.require(roles.RAMP, action="revision.create", target=route)
    if not reason.strip():
        raise ValidationError({"reason": ["Say why the split changes (it goes in the record)."]})
    split = parse_percentages(weights)
    if base_revision > route.revision_number:
        _refuse_future_base(route, base_revision)
    current = selectors.revision_current(route=route)
    if base_revision != route.revision_number:
        raise _stale(route, base_revision)
    if current is not None and _same_split(current, split):
        # Nothing to change: no revision, no push, no audit event (a retry of a change
        # that landed, or a ramp re-applying its step). The caller is told so.
        current.unchanged = True  # type: ignore[attr-defined]
        return current
    with transaction.atomic():
        pool_ids = _check_split(route=route, weights=split,
                                previous=current.weights if current else {}, force=force)
        revision = _store_revision(actor=actor, route=route, base=base_revision, weights=split,
                                   kind=SplitRevision.Kind.CHANGE, reason=reason, forced=force,
                                   parent=current, pool_ids=pool_ids)
    return revision


def _refuse_future_base(route: Route, base: int) -> None:
    """A base revision the route never had is a mistake in the request (400), not someone
    else's change (409). Read again first: the route may have moved on since it was loaded,
    and then `base` may exist and merely be stale."""
    current = Route.objects.get(pk=route.pk).revision_number
    if base > current:
        raise ValidationError({"base_revision": [
            f"Route {route.name}'s current revision is {current}; revision {base} does not "
            f"exist. Send the revision you read (the route's revision_number)."]})


def _same_split(current: SplitRevision, split: dict[str, int]) -> bool:
    """The split in force already, pool for pool: the same weights on the same names, and
    each name still the pool the revision was made for (a name deleted and registered again
    is another pool, so the split would change where traffic goes)."""
    if current.weights != split:
        return False
    now = dict(Pool.objects.filter(name__in=split).values_list("name", "pk"))
    return all(current.pool_ids.get(name) == now.get(name) for name in split)


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
    if ids and queue:
        from fleetctl.traffic.tasks import push_fanout

        transaction.on_commit(lambda: push_fanout.delay(ids))
    return ids


# --- gateways --------------------------------------------------------------------------------

def _publish_mirror_auth_after_commit() -> None:
    """Which gateway may mirror which route, for the shadow collectors (mirror_auth), once
    the change is committed: before the pushes it queues, so a gateway's first copies
    under a new config are already accepted."""
    transaction.on_commit(mirror_auth.publish_quietly)


def gateway_create(*, actor: Actor, routes: list[Route] | None = None,
                   **fields: Any) -> Gateway:
    gateway = audited_create(actor=actor, permission=roles.FLEET_MANAGE,
                             action="gateway.create", instance=Gateway(**fields))
    if routes:
        gateway_set_routes(actor=actor, gateway=gateway, routes=routes)
    return gateway


def gateway_update(*, actor: Actor, gateway: Gateway, routes: list[Route] | None = None,
                   **changes: Any) -> Gateway:
    gateway = audited_update(actor=actor, permission=roles.FLEET_MANAGE,
                             action="gateway.update", instance=gateway, changes=changes,
                             allowed=GATEWAY_FIELDS)
    _publish_mirror_auth_after_commit()  # its kind may now mirror, or no longer
    if routes is not None:
        gateway_set_routes(actor=actor, gateway=gateway, routes=routes)
    return gateway


def gateway_mirror_secret_rotate(*, actor: Actor, gateway: Gateway) -> Gateway:
    """Give the gateway a new mirror secret and push it its whole state (the new tokens).
    The collectors accept the old secret's tokens for MIRROR_SECRET_GRACE_S more, while the
    push is applied; rotating again within that time drops the one before. The audit event
    says when and until when, never a secret."""
    actor.require(roles.FLEET_MANAGE, action="gateway.mirror_secret_rotate", target=gateway)
    with transaction.atomic():
        locked = Gateway.objects.select_for_update().get(pk=gateway.pk)
        now = timezone.now()
        locked.mirror_secret_previous = locked.mirror_secret
        locked.mirror_secret = mirror_auth.new_secret()
        locked.mirror_secret_rotated_at = now
        locked.save(update_fields=["mirror_secret", "mirror_secret_previous",
                                   "mirror_secret_rotated_at"])
        until = now + timedelta(seconds=mirror_auth.MIRROR_SECRET_GRACE_S)
        audit_record(actor=actor, action="gateway.mirror_secret_rotate", target=locked,
                     message=f"Mirror secret of gateway {locked.name} rotated; copies signed "
                             f"with the previous one are accepted until "
                             f"{until:%Y-%m-%d %H:%M:%S} UTC while the gateway is pushed its "
                             f"new tokens.",
                     after={"mirror_secret_rotated_at": now.isoformat(),
                            "previous_accepted_until": until.isoformat()})
        _publish_mirror_auth_after_commit()
        revisions = [r for r in (selectors.revision_current(route=route)
                                 for route in locked.routes.order_by("name")) if r is not None]
        if revisions:
            push = GatewayPush.objects.create(revision=revisions[0], gateway=locked,
                                              reason="mirror-secret")
            _enqueue_after_commit(push.pk)
    return locked


def gateway_delete(*, actor: Actor, gateway: Gateway) -> None:
    """Delete a gateway, keeping history: its pushes and their attempts stay, naming it
    (name and kind copied onto them, the link nulled), so drains and ramps that reached it
    read as they did. A push still open is `abandoned` — deleted before verifying — and
    nothing retries it; a drain that was waiting on it then finishes for the remaining
    gateways, saying so. Its traffic samples go with it. The audit event says all this."""
    actor.require(roles.FLEET_MANAGE, action="gateway.delete", target=gateway)
    with transaction.atomic():
        locked = Gateway.objects.select_for_update().get(pk=gateway.pk)
        now = timezone.now()
        pushes = GatewayPush.objects.filter(gateway=locked)
        open_ids = list(pushes.filter(status__in=PUSH_OPEN).values_list("pk", flat=True))
        waiting = sorted(set(Drain.objects.filter(
            status__in=DRAIN_OPEN, revisions__pushes__in=open_ids).values_list("pk", flat=True)))
        GatewayPush.objects.filter(pk__in=open_ids).update(
            status=GatewayPush.Status.ABANDONED,
            last_error=f"gateway {locked.name} was deleted before it verified")
        kept = pushes.update(gateway_name=locked.name, gateway_kind=locked.kind,
                             gateway_deleted_at=now)
        samples = locked.samples.count()
        message = (f"Gateway {locked.name} ({locked.kind}) deleted; {kept} push(es) and their "
                   f"attempts kept as history")
        if open_ids:
            message += (f"; {len(open_ids)} open push(es) abandoned (deleted before "
                        f"verifying)")
        if waiting:
            message += (f"; drain(s) {', '.join(map(str, waiting))} no longer wait for it and "
                        f"finish for the remaining gateways")
        message += f"; {samples} traffic sample(s) deleted with it."
        audited_delete(actor=actor, permission=roles.FLEET_MANAGE, action="gateway.delete",
                       instance=locked, message=message,
                       after={"pushes_kept": kept, "pushes_abandoned": open_ids,
                              "drains_waiting": waiting, "samples_deleted": samples})
        _publish_mirror_auth_after_commit()  # its copies are refused from now on
        if waiting:
            from fleetctl.traffic.tasks import drain_watch

            transaction.on_commit(lambda: [drain_watch.delay(pk) for pk in waiting])


def gateway_set_routes(*, actor: Actor, gateway: Gateway, routes: list[Route]) -> None:
    """Which routes a gateway carries; it is pushed its new whole state right away."""
    actor.require(roles.FLEET_MANAGE, action="gateway.set_routes", target=gateway)
    with transaction.atomic():
        before = sorted(gateway.routes.values_list("name", flat=True))
        gateway.routes.set(routes)
        audit_record(actor=actor, action="gateway.set_routes", target=gateway,
                     before={"routes": before}, after={"routes": sorted(r.name for r in routes)})
        _publish_mirror_auth_after_commit()
        for route in routes:
            current = selectors.revision_current(route=route)
            if current is not None:
                push = GatewayPush.objects.create(revision=current, gateway=gateway,
                                                  reason="routes")
                _enqueue_after_commit(push.pk)


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
    if ids:
        from fleetctl.traffic.tasks import push_fanout

        transaction.on_commit(lambda: push_fanout.delay(ids))
    return ids


def _enqueue_after_commit(push_id: int) -> None:
    from fleetctl.traffic.tasks import push_run

    transaction.on_commit(lambda: push_run.delay(push_id))


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
    if not reason.strip():
        raise ValidationError({"reason": ["Say why mirroring stops (it goes in the record)."]})
    with transaction.atomic():
        locked = Route.objects.select_for_update().get(pk=route.pk)
        if not locked.mirror_percent and not locked.mirror_pools:
            return locked
        return _mirror_store(actor=actor, route=locked, action="route.mirror_clear",
                             percent=0.0, pools={}, owner="", message=reason.strip())


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


# --- drains ----------------------------------------------------------------------------------

def drain_request(*, actor: Actor, reason: str, route: Route | None = None,
                  pool: Pool | None = None, routes: list[Route] | None = None) -> Drain:
    """Move a route (all of it to its primary), or every route using a pool (that pool's
    share), back — never across a border. `routes` limits a pool drain to some routes (a
    migration plan leaving stage 4). One transaction; no gateway is contacted. Returns the
    record with `push_ids` set: once the caller's transaction has committed, it makes the
    first attempt with `push.drain_push_now(drain)` (should it never, the converge task
    attempts them within seconds and follows the drain)."""
    target: object = route or pool
    actor.require(roles.DRAIN, action="drain.request", target=target)
    if not reason.strip():
        raise ValidationError({"reason": ["Say why you drain (it goes in the record)."]})
    if (route is None) == (pool is None):
        raise ValidationError({"non_field_errors": ["Drain either a route or a pool."]})
    requested_at = timezone.now()
    push_ids: list[int] = []
    with transaction.atomic():
        # What this drain could end (a ramp of the pool) is locked before the routes, in
        # the order a ramp's own step takes them (its row, then its route's): no deadlock.
        holders_lock(pool=pool, route=route, routes=routes)
        plan = _drain_plan(route=route, pool=pool, only=routes)
        if not plan:
            raise ConflictError(
                f"Nothing to drain: route {route.name} already sends everything to its "
                f"primary {route.primary_pool.name}." if route is not None else
                f"Nothing to drain: pool {pool.name} has no weight on any route."  # type: ignore[union-attr]
            )
        record = Drain.objects.create(
            action=Drain.Action.DRAIN, route=route, pool=pool, requested_by=actor.label,
            reason=reason, requested_at=requested_at,
            drained_pools=sorted({p for _, _, removed, _ in plan for p in removed}),
        )
        revisions = [
            _store_revision(
                actor=actor, route=locked, base=locked.revision_number, weights=new_weights,
                kind=SplitRevision.Kind.DRAIN,
                reason=f"drain {', '.join(sorted(removed))}: {reason}", parent=current,
                queue=False, push_ids=push_ids,
            )
            for locked, new_weights, removed, current in plan
        ]
        record.revisions.add(*revisions)
        audit_record(actor=actor, action="drain.request", target=record, message=reason,
                     after={"drained_pools": record.drained_pools,
                            "routes": [r.name for r, _, _, _ in plan]})
        # A ramp of a pool this drain took off its route ends here ("aborted by drain N").
        holders_drained(actor=actor, drain=record,
                        removed={locked.pk: removed for locked, _, removed, _ in plan})
    record.push_ids, record.new_revisions = push_ids, revisions
    return record


def _drain_plan(*, route: Route | None, pool: Pool | None, only: list[Route] | None = None
                ) -> list[tuple[Route, dict[str, int], set[str], SplitRevision | None]]:
    routes = Route.objects.select_for_update().select_related("primary_pool__region")
    if route is not None:
        routes = routes.filter(pk=route.pk)
    if only is not None:
        routes = routes.filter(pk__in=[r.pk for r in only])
    plan = []
    for locked in routes.order_by("pk"):
        current = selectors.revision_current(route=locked)
        step = selectors.drain_step(route=locked, weights=current.weights if current else {},
                                    pool=pool)
        if step is not None:
            plan.append((locked, *step, current))
    return plan


def drain_restore(*, actor: Actor, drain: Drain, reason: str) -> Drain:
    """Put each drained route back to the split it had before the drain, if nobody changed
    it since (otherwise 409: restoring would overwrite a newer decision). Like drain_request,
    one transaction: the caller pushes with `push.drain_push_now(record)` after its commit.

    A share a ramp held is not handed back (traffic/holds.py): the ramp was ended by this
    drain (or is still active and owns it), and nothing would guard that weight. Such a
    route gets the rest of its split back; one with nothing else to restore is left as it
    is, and a restore with nothing at all to put back is refused (409) saying why.
    `record.withheld` lists the holds that kept a share back."""
    actor.require(roles.DRAIN, action="drain.restore", target=drain)
    if drain.action != Drain.Action.DRAIN:
        raise ValidationError({"drain": ["Only a drain can be restored."]})
    push_ids: list[int] = []
    restored_revisions = []
    with transaction.atomic():
        revisions = list(drain.revisions.select_related("route", "parent"))
        routes = {r.pk: r for r in Route.objects.select_for_update().filter(
            pk__in=[rev.route_id for rev in revisions])}
        # Under the routes' locks, so of two restores of one drain the second sees the first.
        already = selectors.drain_restored_by(drain=drain)
        if already is not None:
            raise ConflictError(
                f"Drain {drain.pk} was already restored: restore {already.pk} by "
                f"{already.requested_by} at {already.requested_at:%Y-%m-%d %H:%M:%S} UTC "
                f"({already.status}). See /traffic/drains/{already.pk}/.",
                fields={"restored_by": [str(already.pk)]})
        for rev in revisions:
            if routes[rev.route_id].revision_number != rev.number:
                raise ConflictError(
                    f"Route {rev.route.name} changed after this drain (now at revision "
                    f"{routes[rev.route_id].revision_number}); restore by hand instead."
                )
        record = Drain.objects.create(
            action=Drain.Action.RESTORE, route=drain.route, pool=drain.pool, restores=drain,
            requested_by=actor.label, reason=reason or f"restore after drain {drain.pk}",
        )
        holds = holds_on(route_ids=list(routes), drain=drain)
        withheld: list[Hold] = []
        for rev in revisions:
            route = routes[rev.route_id]
            weights, kept_back = selectors.restore_target(revision=rev, route=route,
                                                          holds=holds)
            withheld += kept_back
            if weights == rev.weights:
                continue  # only a held share to give back: the route stays as drained
            identity = rev.parent.pool_ids if rev.parent else {}
            if kept_back:  # the held share went to pools the drain gave it to
                identity = {**rev.pool_ids, **identity}
            # Restoring sends traffic back: the pools must be healthy again (and in bounds),
            # and be the very pools the split was made for.
            pool_ids = _check_split(route=route, weights=weights, previous=rev.weights,
                                    force=False, identity=identity)
            restored = _store_revision(
                actor=actor, route=route, base=rev.number, weights=weights,
                kind=SplitRevision.Kind.RESTORE, reason=record.reason, parent=rev,
                queue=False, pool_ids=pool_ids, push_ids=push_ids,
            )
            record.revisions.add(restored)
            restored_revisions.append(restored)
        kept_text = _withheld_text(withheld, routes)
        if not restored_revisions:
            raise ConflictError(
                f"Nothing to restore: {kept_text}. A restore does not hand a ramp's share "
                f"back (nothing would guard it); start a new ramp to give the pool weight "
                f"again, from its first step. Nothing was changed.",
                fields={"drain": [kept_text]})
        audit_record(actor=actor, action="drain.restore", target=record, message=record.reason,
                     after={"restores": drain.pk,
                            **({"withheld": kept_text} if withheld else {})})
    record.push_ids, record.new_revisions = push_ids, restored_revisions
    record.withheld = withheld  # type: ignore[attr-defined]
    return record


def _withheld_text(withheld: list[Hold], routes: dict[int, Route]) -> str:
    return "; ".join(f"{hold.pool}'s share of route {routes[hold.route_id].name} was held by "
                     f"{hold}" for hold in withheld)
