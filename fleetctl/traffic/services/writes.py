"""What a person (or an API client) does to routes, revisions and gateways: create, change
the split, set the health policy, edit, rotate and delete gateways. Permission-checked and
audited, one transaction each."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.crud import audited_create, audited_delete, audited_update
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import required_reason
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import mirror_auth, selectors
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, Route, SplitRevision
from fleetctl.traffic.services._shared import (
    DRAIN_OPEN,
    GATEWAY_FIELDS,
    PUSH_OPEN,
    _check_split,
    _enqueue_after_commit,
    _publish_mirror_auth_after_commit,
    _stale,
    _store_revision,
)
from fleetctl.traffic.split import parse_percentages


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
                 health_policy: str = Route.HealthPolicy.DRAIN,
                 reverify_policy: str = Route.ReverifyPolicy.HOLD,
                 reverify_benchmark: bool = False) -> Route:
    """A route and its first revision (default: everything to the primary)."""
    actor.require(roles.FLEET_MANAGE, action="route.create", target="traffic.route")
    route = Route(name=name, model_id=model_id, primary_pool=primary_pool,
                  latency_class=latency_class, residency=residency, health_policy=health_policy,
                  reverify_policy=reverify_policy, reverify_benchmark=reverify_benchmark)
    route.full_clean()
    _check_route_primary(route)
    split = parse_percentages(weights) if weights else {primary_pool.name: 10_000}
    with transaction.atomic():
        pool_ids = _check_split(route=route, weights=split, previous={}, force=force)
        route.save()
        audit_record(actor=actor, action="route.create", target=route,
                     after=snapshot(route, ["name", "model_id", "latency_class", "residency",
                                            "primary_pool", "health_policy",
                                            "reverify_policy", "reverify_benchmark"]))
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


def route_reverify_policy_set(*, actor: Actor, route: Route, reverify_policy: str,
                              reverify_benchmark: bool | None = None) -> Route:
    """What happens on this route while a changed pool is re-verified
    (conformance/reverify.py): hold, or drain the pool when its conformance re-run fails;
    and whether a passing re-run also re-runs the benchmark. Applies from the next
    re-verification; drains already made stay."""
    changes: dict[str, Any] = {"reverify_policy": reverify_policy}
    if reverify_benchmark is not None:
        changes["reverify_benchmark"] = reverify_benchmark
    return audited_update(actor=actor, permission=roles.FLEET_MANAGE,
                          action="route.reverify_policy", instance=route, changes=changes,
                          allowed=["reverify_policy", "reverify_benchmark"])


def revision_create(*, actor: Actor, route: Route, weights: Any, base_revision: int,
                    reason: str, force: bool = False) -> SplitRevision:
    """Change a route's split. `base_revision` is the revision the caller saw: if another
    change landed since, this one is refused with 409 (and nothing stored or pushed)."""
    actor.require(roles.RAMP, action="revision.create", target=route)
    required_reason(reason, "Say why the split changes (it goes in the record).")
    return revision_store(actor=actor, route=route, split=parse_percentages(weights),
                          base_revision=base_revision, reason=reason, force=force,
                          kind=SplitRevision.Kind.CHANGE)


def revision_store(*, actor: Actor, route: Route, split: dict[str, int], base_revision: int,
                   reason: str, kind: str, force: bool = False) -> SplitRevision:
    """What every person's split change shares once the caller checked its permission and
    reason: the base revision (400 when it never existed, 409 when stale), nothing stored for
    the split in force already (`unchanged`), else the split checked under the route's lock
    and stored as a revision of `kind`."""
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
        # One lock order everywhere: the route row, then its pools (a drain locks all its
        # routes before any pool); pools first here deadlocked against a drain.
        Route.objects.select_for_update(of=("self",)).filter(pk=route.pk).first()
        pool_ids = _check_split(route=route, weights=split,
                                previous=current.weights if current else {}, force=force)
        revision = _store_revision(actor=actor, route=route, base=base_revision, weights=split,
                                   kind=kind, reason=reason, forced=force,
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


def gateway_create(*, actor: Actor, routes: list[Route] | None = None,
                   **fields: Any) -> Gateway:
    gateway = audited_create(actor=actor, permission=roles.FLEET_MANAGE,
                             action="gateway.create", instance=Gateway(**fields))
    if routes:
        gateway_set_routes(actor=actor, gateway=gateway, routes=routes)
    return gateway


def _refuse_tiers_on_kind(kind_name: str, routes: list[Route], *, field: str) -> None:
    """400 naming `field` when a gateway of this kind cannot route by prompt size and one of
    `routes` has context tiers: it would send them by the split alone (a silent partial)."""
    from fleetctl.traffic.gateways import registry

    kind = registry.find(kind_name)
    if kind is None or kind.supports_context_tiers or not routes:
        return
    tiered = sorted(Route.objects.filter(pk__in=[r.pk for r in routes],
                                         context_tiers__isnull=False)
                    .distinct().values_list("name", flat=True))
    if tiered:
        raise ValidationError({field: [
            f"{kind.label} gateways cannot route by prompt size, and route(s) "
            f"{', '.join(tiered)} have context tiers: only Envoy gateways enforce them. "
            f"Remove the tiers first, or carry these routes on an Envoy gateway."]})


def _refuse_affinity_on_kind(kind_name: str, routes: list[Route], *, field: str) -> None:
    """400 naming `field` when a gateway of this kind cannot keep prefix affinity and one of
    `routes` has it on: it would balance them by load alone (a silent partial)."""
    from fleetctl.traffic.gateways import registry

    kind = registry.find(kind_name)
    if kind is None or kind.supports_prefix_affinity or not routes:
        return
    hashed = sorted(Route.objects.filter(pk__in=[r.pk for r in routes])
                    .exclude(prefix_affinity=Route.PrefixAffinity.OFF)
                    .values_list("name", flat=True))
    if hashed:
        raise ValidationError({field: [
            f"{kind.label} gateways cannot keep prefix affinity, and route(s) "
            f"{', '.join(hashed)} have it on: only Envoy gateways enforce it. Turn it off "
            f"first, or carry these routes on an Envoy gateway."]})


def gateway_update(*, actor: Actor, gateway: Gateway, routes: list[Route] | None = None,
                   **changes: Any) -> Gateway:
    if "kind" in changes and changes["kind"] != gateway.kind:
        carried = list(gateway.routes.all() if routes is None else routes)
        _refuse_tiers_on_kind(str(changes["kind"]), carried, field="kind")
        _refuse_affinity_on_kind(str(changes["kind"]), carried, field="kind")
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
    _refuse_tiers_on_kind(gateway.kind, routes, field="routes")
    _refuse_affinity_on_kind(gateway.kind, routes, field="routes")
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
