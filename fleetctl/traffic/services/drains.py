"""Drains and restores: asked for by a person, the health policy or a ramp. One transaction
each; the caller makes the first push attempt after its commit (`push.drain_push_now`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.fleet.models import Pool
from fleetctl.traffic import drain_capacity, selectors
from fleetctl.traffic.holds import Hold, holders_drained, holders_lock, holds_on
from fleetctl.traffic.models import Drain, Route, SplitRevision
from fleetctl.traffic.services._shared import _check_split, _store_revision

# One route of a drain: the route (locked), its split after, the pools taken out, the revision
# it had.
Plan = list[tuple[Route, dict[str, int], set[str], SplitRevision | None]]

# --- drains ----------------------------------------------------------------------------------

def drain_request(*, actor: Actor, reason: str, route: Route | None = None,
                  pool: Pool | None = None, routes: list[Route] | None = None,
                  force: bool = False, stepping: bool = False) -> Drain:
    """Move a route (all of it to its primary), or every route using a pool (that pool's
    share), back — never across a border. `routes` limits a pool drain to some routes (a
    migration plan leaving stage 4). One transaction; no gateway is contacted. Returns the
    record with `push_ids` set: once the caller's transaction has committed, it makes the
    first attempt with `push.drain_push_now(drain)` (should it never, the converge task
    attempts them within seconds and follows the drain).

    Capacity-checked (traffic/drain_capacity.py): a share the primary cannot carry is spread
    over the route's pools that carry weight (in its pin, if pinned); `stepping` (a person's drain:
    the API, dashboard and CLI) lets a drain nothing can carry move in steps
    (services/drain_steps.py); `force` (on-call) moves everything to the primary at once
    whatever the capacity. `record.capacity` holds the figures and the decision."""
    target: object = route or pool
    actor.require(roles.DRAIN, action="drain.request", target=target)
    required_reason(reason, "Say why you drain (it goes in the record).")
    if (route is None) == (pool is None):
        raise ValidationError({"non_field_errors": ["Drain either a route or a pool."]})
    if not isinstance(force, bool) or not isinstance(stepping, bool):
        raise ValidationError({"force": ["Give force as true or false."]})
    requested_at = timezone.now()
    push_ids: list[int] = []
    with transaction.atomic():
        # What this drain could end (a ramp of the pool) is locked before the routes, in
        # the order a ramp's own step takes them (its row, then its route's): no deadlock.
        holders_lock(pool=pool, route=route, routes=routes)
        eligible: dict[int, set[str]] = {}
        plan = _drain_plan(route=route, pool=pool, only=routes, eligible=eligible)
        if not plan:
            raise ConflictError(
                f"Nothing to drain: route {route.name} already sends everything to its "
                f"primary {route.primary_pool.name}." if route is not None else
                f"Nothing to drain: pool {pool.name} has no weight on any route."  # type: ignore[union-attr]
            )
        plan, capacity = _capacity_checked(plan, force=force, stepping=stepping,
                                           eligible=eligible)
        record = Drain.objects.create(
            action=Drain.Action.DRAIN, route=route, pool=pool, requested_by=actor.label,
            reason=reason, requested_at=requested_at,
            drained_pools=sorted({p for _, _, removed, _ in plan for p in removed}),
            capacity=capacity, next_step_at=_next_step_at(capacity, requested_at),
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
                            "routes": [r.name for r, _, _, _ in plan],
                            "capacity": {"decision": capacity["decision"],
                                         "why": capacity["why"]}})
        # A ramp of a pool this drain took off its route ends here ("aborted by drain N").
        holders_drained(actor=actor, drain=record,
                        removed={locked.pk: removed for locked, _, removed, _ in plan})
    record.push_ids, record.new_revisions = push_ids, revisions
    return record


def _drain_plan(*, route: Route | None, pool: Pool | None, only: list[Route] | None = None,
                eligible: dict[int, set[str]] | None = None) -> Plan:
    """`eligible`, when given, is filled with each planned route's `pools_eligible` (read
    once here, for the capacity check too)."""
    # One lock order everywhere: every route row first (by id), then their primary pools and
    # regions (by id). Locking each route with its pool in one join interleaved them and
    # deadlocked against a split change (route, then its pools) on a later route.
    routes = Route.objects.select_for_update(of=("self",))
    if route is not None:
        routes = routes.filter(pk=route.pk)
    if only is not None:
        routes = routes.filter(pk__in=[r.pk for r in only])
    locked_routes = list(routes.order_by("pk"))
    primaries = {p.pk: p for p in Pool.objects.select_related("region").select_for_update(
        of=("self", "region")).filter(pk__in={r.primary_pool_id for r in locked_routes})
        .order_by("pk")}
    # Every locked route's current split in one read (a pool drain locks every route), and
    # the pools that may carry the routes that have something to move in one more.
    revisions = selectors.revisions_current(routes=locked_routes)
    weights = {r.pk: revisions[r.pk].weights if r.pk in revisions else {}
               for r in locked_routes}
    moving = [r for r in locked_routes
              if (set(weights[r.pk]) & ({pool.name} if pool is not None else set(weights[r.pk])
                                        - {primaries[r.primary_pool_id].name}))]
    found = selectors.pools_eligible_many(routes=moving)
    if eligible is not None:
        eligible.update(found)
    plan = []
    for locked in locked_routes:
        locked.primary_pool = primaries[locked.primary_pool_id]
        current = revisions.get(locked.pk)
        if locked.pk not in found:
            continue  # nothing of it to move (drain_step would say None)
        step = selectors.drain_step(route=locked, weights=weights[locked.pk], pool=pool,
                                    eligible=found[locked.pk])
        if step is not None:
            plan.append((locked, *step, current))
    return plan


def _capacity_checked(plan: Plan, *, force: bool, stepping: bool, step: int = 1,
                      first: dict[str, int] | None = None,
                      eligible: dict[int, set[str]] | None = None
                      ) -> tuple[Plan, dict[str, Any]]:
    """The plan with each route's split capacity-checked, and the record of the check.
    `step`, `first` (route name -> the share its first step freed): a stepped drain's
    later step. `eligible`: the routes' `pools_eligible` as _drain_plan read them."""
    weights = {locked.pk: (current.weights if current else {})
               for locked, _, _, current in plan}
    if eligible is None or any(locked.pk not in eligible for locked, _, _, _ in plan):
        eligible = selectors.pools_eligible_many(routes=[locked for locked, _, _, _ in plan])
    found = drain_capacity.readings([locked for locked, _, _, _ in plan], weights)
    checked, notes = [], []
    for locked, _, removed, current in plan:
        after, note = drain_capacity.check(
            route=locked, weights=weights[locked.pk], remove=removed,
            eligible=eligible[locked.pk], found=found, force=force,
            stepping=stepping, step=step, first_freed=(first or {}).get(locked.name))
        checked.append((locked, after, removed, current))
        notes.append(note)
    capacity = drain_capacity.summary(notes, force=force, stepping=stepping)
    left = {n["route"]: n.get("left_bp", 0) for n in notes}
    if capacity["decision"] == drain_capacity.STEPPED:
        capacity["steps"] = {"done": step, "max": settings.DRAIN_STEPS_MAX,
                             "interval_s": settings.DRAIN_STEP_INTERVAL_S,
                             "left_bp": left, "log": []}
    return checked, capacity


def _next_step_at(capacity: dict[str, Any], now: datetime) -> datetime | None:
    steps = capacity.get("steps") or {}
    if not any(steps.get("left_bp", {}).values()) or steps.get("done", 0) >= steps["max"]:
        return None
    return now + timedelta(seconds=steps["interval_s"])


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
        revisions = selectors.drain_revisions(drain=drain)
        routes = {r.pk: r for r in Route.objects.select_for_update().filter(
            pk__in=[rev.route_id for rev in revisions])}
        _refuse_restore(drain=drain, revisions=revisions, routes=routes)
        record = Drain.objects.create(
            action=Drain.Action.RESTORE, route=drain.route, pool=drain.pool, restores=drain,
            requested_by=actor.label, reason=reason or f"restore after drain {drain.pk}",
        )
        holds = holds_on(route_ids=list(routes), drain=drain)
        withheld: list[Hold] = []
        for rev in revisions:
            restored, kept_back = _restore_route(actor=actor, record=record, revision=rev,
                                                 route=routes[rev.route_id], holds=holds,
                                                 push_ids=push_ids)
            withheld += kept_back
            if restored is not None:
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


def _refuse_restore(*, drain: Drain, revisions: list[SplitRevision],
                    routes: dict[int, Route]) -> None:
    """A drain is restored once, and only while its routes are still as it left them.
    Called under the routes' locks, so of two restores of one drain the second sees the
    first."""
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


def _restore_route(*, actor: Actor, record: Drain, revision: SplitRevision, route: Route,
                   holds: list[Hold], push_ids: list[int]
                   ) -> tuple[SplitRevision | None, list[Hold]]:
    """Put one drained route back (a RESTORE revision added to `record`), and the holds
    that kept a share of it back. None when only a held share was left to give back: the
    route stays as drained."""
    rev = revision
    weights, kept_back = selectors.restore_target(revision=rev, route=route, holds=holds)
    if weights == rev.weights:
        return None, kept_back
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
    return restored, kept_back


def _withheld_text(withheld: list[Hold], routes: dict[int, Route]) -> str:
    return "; ".join(f"{hold.pool}'s share of route {routes[hold.route_id].name} was held by "
                     f"{hold}" for hold in withheld)
