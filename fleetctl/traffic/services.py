"""Writes for traffic: routes, revisions, gateways, pushes, drains and restores.

A revision is validated, stored (winning a conditional UPDATE of the route's revision
counter, so of two concurrent changes exactly one wins), then pushed to every gateway of the
route in parallel by tasks on the `push` queue. Drains are revisions with a timed record, and
their first push attempt is made by the caller itself right after the commit (no queue hop:
a drain is timed in milliseconds); failed attempts retry on the `push` queue like any other.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.crud import audited_create, audited_delete, audited_update
from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import policy, selectors
from fleetctl.traffic.gateways.base import AdapterError, ApplyResult, DesiredState, adapter_for
from fleetctl.traffic.models import (
    Drain,
    Gateway,
    GatewayPush,
    GatewayPushAttempt,
    PoolTrafficSample,
    Route,
    SplitRevision,
)
from fleetctl.traffic.split import as_percentages, parse_percentages

log = logging.getLogger("fleetctl.traffic")

GATEWAY_FIELDS = ["name", "kind", "admin_address", "options"]


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
                 reason: str = "", force: bool = False) -> Route:
    """A route and its first revision (default: everything to the primary)."""
    actor.require(roles.FLEET_MANAGE, action="route.create", target="traffic.route")
    route = Route(name=name, model_id=model_id, primary_pool=primary_pool,
                  latency_class=latency_class, residency=residency)
    route.full_clean()
    _check_route_primary(route)
    split = parse_percentages(weights) if weights else {primary_pool.name: 10_000}
    with transaction.atomic():
        pool_ids = _check_split(route=route, weights=split, previous={}, force=force)
        route.save()
        audit_record(actor=actor, action="route.create", target=route,
                     after=snapshot(route, ["name", "model_id", "latency_class", "residency",
                                            "primary_pool"]))
        _store_revision(actor=actor, route=route, base=0, weights=split,
                        kind=SplitRevision.Kind.CREATE, reason=reason or "route created",
                        forced=force, pool_ids=pool_ids)
    return route


def revision_create(*, actor: Actor, route: Route, weights: Any, base_revision: int,
                    reason: str, force: bool = False) -> SplitRevision:
    """Change a route's split. `base_revision` is the revision the caller saw: if another
    change landed since, this one is refused with 409 (and nothing stored or pushed)."""
    actor.require(roles.RAMP, action="revision.create", target=route)
    if not reason.strip():
        raise ValidationError({"reason": ["Say why the split changes (it goes in the record)."]})
    split = parse_percentages(weights)
    current = selectors.revision_current(route=route)
    if base_revision != route.revision_number:
        raise _stale(route, base_revision)
    with transaction.atomic():
        pool_ids = _check_split(route=route, weights=split,
                                previous=current.weights if current else {}, force=force)
        revision = _store_revision(actor=actor, route=route, base=base_revision, weights=split,
                                   kind=SplitRevision.Kind.CHANGE, reason=reason, forced=force,
                                   parent=current, pool_ids=pool_ids)
    return revision


def _stale(route: Route, base: int) -> ConflictError:
    current = Route.objects.get(pk=route.pk).revision_number
    return ConflictError(
        f"Route {route.name} is at revision {current}, not {base}: someone changed it since "
        f"you looked. Re-read it and try again.", fields={"current_revision": [str(current)]}
    )


def _store_revision(*, actor: Actor, route: Route, base: int, weights: dict[str, int],
                    kind: str, reason: str, forced: bool = False,
                    parent: SplitRevision | None = None, inline: bool = False,
                    pool_ids: dict[str, int] | None = None) -> SplitRevision:
    """Claim revision base+1 with a conditional UPDATE (the loser of a race gets 409), store
    it, audit it, and queue its pushes once the transaction commits. `parent`: revision
    `base` when the caller already read it (saves a query). `pool_ids`: the identities
    _check_split validated (otherwise the parent's, see _pool_ids). `inline`: make the first push
    attempt in this process after the commit instead of queueing it (drains)."""
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
    _queue_pushes(revision, inline=inline)
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


def _queue_pushes(revision: SplitRevision, *, inline: bool = False) -> None:
    pushes = GatewayPush.objects.bulk_create(
        [GatewayPush(revision=revision, gateway=gateway)
         for gateway in revision.route.gateways.all()]
    )
    if not pushes:
        return
    ids = [p.pk for p in pushes]
    if inline:
        # Hooks run in order after the commit: a pool drain's first hook pushes every
        # gateway its whole new state (all routes), so the later hooks find their pushes
        # verified already and have nothing left to do.
        transaction.on_commit(lambda: push_inline(push_ids=ids), robust=True)
        return
    from fleetctl.traffic.tasks import push_fanout

    # One message for all gateways: the task pushes to them in parallel threads, so it
    # does not wait for the worker to pick up ten messages one by one.
    transaction.on_commit(lambda: push_fanout.delay(ids))


# --- gateways --------------------------------------------------------------------------------

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
    if routes is not None:
        gateway_set_routes(actor=actor, gateway=gateway, routes=routes)
    return gateway


def gateway_delete(*, actor: Actor, gateway: Gateway) -> None:
    audited_delete(actor=actor, permission=roles.FLEET_MANAGE, action="gateway.delete",
                   instance=gateway)


def gateway_set_routes(*, actor: Actor, gateway: Gateway, routes: list[Route]) -> None:
    """Which routes a gateway carries; it is pushed its new whole state right away."""
    actor.require(roles.FLEET_MANAGE, action="gateway.set_routes", target=gateway)
    with transaction.atomic():
        before = sorted(gateway.routes.values_list("name", flat=True))
        gateway.routes.set(routes)
        audit_record(actor=actor, action="gateway.set_routes", target=gateway,
                     before={"routes": before}, after={"routes": sorted(r.name for r in routes)})
        for route in routes:
            current = selectors.revision_current(route=route)
            if current is not None:
                push = GatewayPush.objects.create(revision=current, gateway=gateway,
                                                  reason="routes")
                _enqueue_after_commit(push.pk)


def gateways_refresh(*, reason: str = "registry") -> list[int]:
    """A registry edit changes what gateways should hold without a new revision (a pool's
    endpoints, which pools may carry a route): push every gateway that carries a route its
    whole state again, after the commit. One message for all; a gateway that already holds
    its state is only read. Returns the push ids."""
    gateways = list(Gateway.objects.prefetch_related("routes"))
    current = selectors.revisions_current(routes=list({route.pk: route for gateway in gateways
                                                       for route in gateway.routes.all()}
                                                      .values()))
    pushes = []
    for gateway in gateways:
        revisions = [current[r.pk] for r in gateway.routes.all() if r.pk in current]
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


# --- pushing ---------------------------------------------------------------------------------

# Every push sends the gateway its whole desired state, so a gateway that is down needs only
# one push retried (its newest open one) and the retry is the probe: cheap (a refused
# connection) and capped low, so a gateway that answers again is sent the current state
# within seconds, which settles every older open push to it (_gateways_in_sync).
RETRY_DELAYS_S = (0.2, 0.5, 1, 2, 5)
# A push stored but not attempted this long after its commit lost the process that was to
# make its first attempt (a web process killed right after a drain committed): the converge
# task attempts it. An inline first attempt still in flight this late (a hung gateway) may be
# doubled by that — harmless: a push is idempotent, it sets the gateway's whole state.
ORPHAN_PUSH_AFTER_S = 3.0
# A retrying push whose retry is this late was lost (countdown messages can die with their
# worker): the converge task drives it again.
RETRY_LOST_AFTER_S = 3.0
_OPEN = (GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING)


def push_fanout(*, push_ids: list[int], budget_s: float | None = None) -> None:
    """First attempt of several pushes at once: one thread per gateway does the talking (the
    work is waiting on gateways), then every outcome is recorded together in a few queries
    and each failure is queued to retry on its own with backoff (push_run). Gateways
    carrying the same routes share one desired state.

    With `budget_s`, only the attempts that finish within it are recorded here; a slower
    gateway's attempt records itself from its thread when it ends and queues its own retry,
    so a caller waiting on this is never held by one slow gateway for longer than the
    budget."""
    # Every open push of these gateways in one read, made before the desired states (see
    # _open_pushes_now): the ones to attempt, and what a verified attempt may settle.
    open_now = list(GatewayPush.objects.select_related("gateway")
                    .prefetch_related("gateway__routes").filter(
                        status__in=_OPEN, gateway_id__in=GatewayPush.objects.filter(
                            pk__in=push_ids).values("gateway_id")))
    known: dict[int, frozenset[int]] = {}
    for each in open_now:
        known[each.gateway_id] = known.get(each.gateway_id, frozenset()) | {each.pk}
    wanted = set(push_ids)
    pushes = [push for push in open_now if push.pk in wanted]
    states: dict[tuple[int, ...], DesiredState] = {}
    work = []
    for push in pushes:
        routes = tuple(sorted(route.pk for route in push.gateway.routes.all()))
        if routes not in states:
            states[routes] = selectors.gateway_desired_state(gateway=push.gateway)
        work.append((push, states[routes], known.get(push.gateway_id, frozenset())))
    futures = [_push_threads().submit(_push_io, *item) for item in work]
    finished, late = wait_futures(futures, timeout=budget_s)
    caller = threading.get_ident()
    for future in late:
        # Runs in the push thread when the attempt ends — or here at once if it ended in
        # the meantime, and then this thread's connection must be left alone.
        future.add_done_callback(
            lambda done: _record_late(done, own_thread=threading.get_ident() != caller))
    outcomes = [future.result() for future in futures if future in finished]
    for io, (_status, retry_in) in zip(outcomes, _push_record(outcomes), strict=True):
        if retry_in is not None:
            _retry_later(io.push.pk, retry_in, attempts=io.push.attempts + 1)


def _open_pushes_now(gateway_ids: Any) -> dict[int, frozenset[int]]:
    """Per gateway, its open pushes as committed right now. Read *before* the desired state:
    whatever these pushes stand for (a revision, a registry edit) committed with them, so
    the desired state read next includes it, and a verified attempt may settle exactly these.
    A push committed later may stand for a change the attempt never saw: it keeps its own."""
    known: dict[int, set[int]] = {}
    for pk, gateway_id in GatewayPush.objects.filter(
            gateway_id__in=gateway_ids, status__in=_OPEN).values_list("pk", "gateway_id"):
        known.setdefault(gateway_id, set()).add(pk)
    return {gateway_id: frozenset(pks) for gateway_id, pks in known.items()}


def push_inline(*, push_ids: list[int]) -> None:
    """A drain's first attempt, made by the process that stored it (right after the commit),
    waiting at most TRAFFIC_INLINE_PUSH_BUDGET_S; failures retry on the `push` queue."""
    try:
        push_fanout(push_ids=push_ids, budget_s=settings.TRAFFIC_INLINE_PUSH_BUDGET_S)
    except Exception:  # the revision is stored: converge attempts pushes nobody attempted
        log.exception("inline push of %s failed; the converge task will retry", push_ids)


def _retry_later(push_id: int, retry_in: float, *, attempts: int) -> None:
    """Queue the next attempt. `attempts`: how many the push has had by then; if another
    attempt is made meanwhile (converge drove it again), this retry stands down."""
    from fleetctl.traffic.tasks import push_run

    push_run.apply_async((push_id, attempts), countdown=retry_in)


def _record_late(future: Future[_PushIO], *, own_thread: bool) -> None:
    """Done-callback of an attempt that outlived its caller's budget. In a push thread
    (`own_thread`) it records with that thread's own connection and closes it after."""
    from django.db import connections

    try:
        io = future.result()
        _status, retry_in = _push_record([io])[0]
        if retry_in is not None:
            _retry_later(io.push.pk, retry_in, attempts=io.push.attempts + 1)
    except Exception:
        log.exception("recording a late push attempt failed; the converge task will retry")
    finally:
        if own_thread:
            connections.close_all()


_DONE = (GatewayPush.Status.VERIFIED, GatewayPush.Status.SUPERSEDED, GatewayPush.Status.FAILED)
_pool: Any = None


def _push_threads() -> Any:
    """Threads kept for the process's life: a drain is timed in milliseconds."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="push")
    return _pool


@dataclass
class _PushIO:
    """What one attempt found out from the gateway; recorded afterwards."""

    push: GatewayPush
    desired: DesiredState
    known: frozenset[int]
    sent: Any
    started: float
    answered: Any = None
    verified_at: Any = None
    result: ApplyResult | None = None
    verified: bool = False
    error: str = ""
    permanent: bool = False
    duration_ms: float = 0.0


def _push_io(push: GatewayPush, desired: DesiredState, known: frozenset[int]) -> _PushIO:
    """Apply and read back; no database work here (it runs in a thread per gateway).
    `known`: the gateway's open pushes read before `desired` (_open_pushes_now)."""
    io = _PushIO(push=push, desired=desired, known=known, sent=timezone.now(),
                 started=time.monotonic())
    try:
        adapter = adapter_for(selectors.gateway_spec(push.gateway))
        io.result = adapter.apply(desired)
        io.answered = timezone.now()
        held = adapter.read_back()
        io.verified = adapter.matches(desired, held)
        io.verified_at = timezone.now()
        if not io.verified:
            io.error = f"read back {held} differs from what was applied"
    except AdapterError as exc:
        io.error, io.permanent = str(exc), exc.permanent
        io.answered = io.answered or timezone.now()
    io.duration_ms = (time.monotonic() - io.started) * 1000
    return io


def push_execute(*, push_id: int, attempts: int | None = None) -> str:
    """One attempt at making a gateway hold its whole desired state (the push_run task);
    queues its own retry. Returns the push's status.

    It stands down — no attempt, no retry — when the push is done, when `attempts` (what the
    push had when this attempt was queued) no longer matches (someone attempted it since and
    their retry carries on), or when a newer push to the same gateway is open: that one
    sends the same whole state, and its verification settles this one. So however many
    pushes pile up while a gateway is down, one is retried."""
    push = (GatewayPush.objects.select_related("gateway", "revision__route")
            .filter(pk=push_id).first())
    if push is None:  # its gateway or route was deleted meanwhile
        return "gone"
    if push.status in _DONE or (attempts is not None and push.attempts != attempts):
        return push.status
    known = _open_pushes_now([push.gateway_id]).get(push.gateway_id, frozenset())
    if any(pk > push.pk for pk in known):
        return push.status
    desired = selectors.gateway_desired_state(gateway=push.gateway)
    status, retry_in = _push_record([_push_io(push, desired, known)])[0]
    if retry_in is not None:
        _retry_later(push.pk, retry_in, attempts=push.attempts + 1)
    elif status == GatewayPush.Status.VERIFIED:
        drains_advance()  # the gateway may be back: drains waiting on it complete now
    return status


def _push_record(outcomes: list[_PushIO]) -> list[tuple[str, float | None]]:
    """Attempt rows, then verified/superseded pushes and in-sync gateways in bulk; failures
    one by one (they are rare and each has its own retry)."""
    if not outcomes:
        return []
    GatewayPush.objects.filter(pk__in=[io.push.pk for io in outcomes]).update(
        attempts=F("attempts") + 1)
    GatewayPushAttempt.objects.bulk_create([
        GatewayPushAttempt(
            push=io.push, number=io.push.attempts + 1, sent_at=io.sent,
            answered_at=io.answered, applied=bool(io.result and io.result.applied),
            verified=io.verified, method=io.result.method if io.result else "",
            detail=io.result.detail if io.result else "", error=io.error,
            duration_ms=io.duration_ms)
        for io in outcomes
    ])
    _gateways_in_sync([io for io in outcomes if io.verified])
    return [(GatewayPush.Status.VERIFIED, None) if io.verified
            else _push_failed(io.push, io.push.attempts + 1, io.error, io.permanent)
            for io in outcomes]


def _push_failed(push: GatewayPush, attempts: int, error: str,
                 permanent: bool) -> tuple[str, float | None]:
    retry = None if permanent else RETRY_DELAYS_S[min(attempts - 1, len(RETRY_DELAYS_S) - 1)]
    status = GatewayPush.Status.FAILED if permanent else GatewayPush.Status.RETRYING
    GatewayPush.objects.filter(pk=push.pk).update(status=status, last_error=error)
    gateway = push.gateway
    if gateway.state != Gateway.State.FAILING:
        log.error("gateway %s cannot be updated: %s", gateway.name, error)
    Gateway.objects.filter(pk=gateway.pk).update(
        state=Gateway.State.FAILING, last_error=error,
        state_changed_at=timezone.now() if gateway.state != Gateway.State.FAILING
        else gateway.state_changed_at,
    )
    return status, retry


def _gateways_in_sync(outcomes: list[_PushIO]) -> None:
    """Each gateway holds exactly the revisions it was sent: its open pushes of those
    revisions are verified, open pushes of older ones (or of routes it no longer carries)
    superseded. Only pushes that were committed before the attempt read its desired state
    are settled: one made meanwhile (a newer revision, a registry edit the attempt never saw)
    stays open for its own attempt."""
    if not outcomes:
        return
    now = timezone.now()
    by_gateway = {io.push.gateway_id: io for io in outcomes}
    open_pushes = GatewayPush.objects.filter(
        gateway_id__in=by_gateway,
        status__in=[GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING],
    ).select_related("revision__route")
    verified, superseded = [], []
    for push in open_pushes:
        io = by_gateway[push.gateway_id]
        if push.pk not in io.known and push.pk != io.push.pk:
            continue  # committed after this attempt read its state: it may hold more
        held = {spec.key: spec.revision for spec in io.desired.routes}
        number = held.get(push.revision.route.name)
        if number == push.revision.number:
            push.status, push.last_error = GatewayPush.Status.VERIFIED, ""
            push.applied_at, push.verified_at = io.answered, io.verified_at
            verified.append(push)
        elif number is None or push.revision.number < number:
            superseded.append(push.pk)
    GatewayPush.objects.bulk_update(verified, ["status", "last_error", "applied_at",
                                               "verified_at"])
    GatewayPush.objects.filter(pk__in=superseded).update(status=GatewayPush.Status.SUPERSEDED)
    Gateway.objects.filter(pk__in=by_gateway).exclude(state=Gateway.State.IN_SYNC).update(
        state_changed_at=now)
    Gateway.objects.filter(pk__in=by_gateway).update(
        state=Gateway.State.IN_SYNC, last_error="", last_verified_at=now)
    # In sync with all it can hold; what it had to leave out (a pool it cannot route to)
    # stays in view until a push holds everything again.
    for gateway_id, io in by_gateway.items():
        if io.result is not None and io.result.warning:
            log.warning("gateway %s: %s", io.push.gateway.name, io.result.warning)
            Gateway.objects.filter(pk=gateway_id).update(
                last_error=f"warning: {io.result.warning}")


def gateway_reconcile(*, gateway: Gateway) -> bool:
    """Compare what the gateway holds with what it should; re-push on drift (e.g. an Envoy
    restarted empty). Returns True when a push was queued. A gateway with an open push is
    left to it: that push sends the whole state and brings the gateway in line, and
    pushes_converge keeps it going even if its own retry was lost."""
    if GatewayPush.objects.filter(gateway=gateway, status__in=_OPEN).exists():
        return False
    desired = selectors.gateway_desired_state(gateway=gateway)
    try:
        adapter = adapter_for(selectors.gateway_spec(gateway))
        if adapter.matches(desired, adapter.read_back()):
            return False
    except AdapterError as exc:
        Gateway.objects.filter(pk=gateway.pk).update(state=Gateway.State.FAILING,
                                                      last_error=str(exc))
    revisions = [r for r in (selectors.revision_current(route=route)
                             for route in gateway.routes.all()) if r is not None]
    if not revisions:
        return False
    with transaction.atomic():
        push = GatewayPush.objects.create(revision=revisions[0], gateway=gateway,
                                          reason="reconcile")
        _enqueue_after_commit(push.pk)
    log.warning("gateway %s drifted from its desired state; re-pushing", gateway.name)
    return True


def pushes_converge() -> int:
    """From the rows alone: drive again the newest open push of every gateway whose
    attempt is overdue — never attempted ORPHAN_PUSH_AFTER_S after it was stored, or its
    retry later than its backoff plus RETRY_LOST_AFTER_S (the message died with a worker).
    Older open pushes need nothing: the newest sends the same whole state and settles them.
    Returns how many were driven; the converge task calls this every few seconds."""
    newest: dict[int, GatewayPush] = {}
    for push in (GatewayPush.objects.filter(status__in=_OPEN).select_related("gateway")
                 .annotate(last_attempt_at=Max("attempt_rows__answered_at")).order_by("-pk")):
        newest.setdefault(push.gateway_id, push)
    now = timezone.now()
    overdue = [push for push in newest.values() if _overdue(push, now)]
    for late in overdue:
        log.warning("push %s to %s is overdue (%s attempt(s), none queued); driving it again",
                    late.pk, late.gateway.name, late.attempts)
        _retry_later(late.pk, 0, attempts=late.attempts)
    return len(overdue)


def _overdue(push: GatewayPush, now: Any) -> bool:
    if push.attempts == 0:
        return now - push.created_at > timedelta(seconds=ORPHAN_PUSH_AFTER_S)
    backoff = RETRY_DELAYS_S[min(push.attempts - 1, len(RETRY_DELAYS_S) - 1)]
    last = push.last_attempt_at or push.created_at  # type: ignore[attr-defined]
    return now - last > timedelta(seconds=backoff + RETRY_LOST_AFTER_S)


def traffic_sample(*, gateway: Gateway) -> int:
    """Store one reading of the gateway's per-pool counters; returns rows written."""
    try:
        counters = adapter_for(selectors.gateway_spec(gateway)).pool_counters()
    except AdapterError as exc:
        log.info("no traffic sample from %s: %s", gateway.name, exc)
        return 0
    now = timezone.now()
    PoolTrafficSample.objects.bulk_create([
        PoolTrafficSample(gateway=gateway, pool=pool, at=now, requests_total=c.requests_total,
                          errors_total=c.errors_total, active=c.active)
        for pool, c in counters.items()
    ])
    return len(counters)


def traffic_samples_prune(*, older_than_hours: int = 24) -> int:
    cutoff = timezone.now() - timedelta(hours=older_than_hours)
    return PoolTrafficSample.objects.filter(at__lt=cutoff).delete()[0]


# --- drains ----------------------------------------------------------------------------------

def drain_request(*, actor: Actor, reason: str, route: Route | None = None,
                  pool: Pool | None = None, routes: list[Route] | None = None) -> Drain:
    """Move a route (all of it to its primary), or every route using a pool (that pool's
    share), back — never across a border. `routes` limits a pool drain to some routes (a
    migration plan leaving stage 4). Returns the record; progress is filled in by the push
    tasks and the drain watcher."""
    target: object = route or pool
    actor.require(roles.DRAIN, action="drain.request", target=target)
    if not reason.strip():
        raise ValidationError({"reason": ["Say why you drain (it goes in the record)."]})
    if (route is None) == (pool is None):
        raise ValidationError({"non_field_errors": ["Drain either a route or a pool."]})
    requested_at = timezone.now()
    with transaction.atomic():
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
        record.revisions.add(*[
            _store_revision(
                actor=actor, route=locked, base=locked.revision_number, weights=new_weights,
                kind=SplitRevision.Kind.DRAIN,
                reason=f"drain {', '.join(sorted(removed))}: {reason}", parent=current,
                inline=True,
            )
            for locked, new_weights, removed, current in plan
        ])
        audit_record(actor=actor, action="drain.request", target=record, message=reason,
                     after={"drained_pools": record.drained_pools,
                            "routes": [r.name for r, _, _, _ in plan]})
        _watch_after_commit(record.pk)
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


def _watch_after_commit(drain_id: int) -> None:
    """After the inline pushes (hooks run in order): note on the record whether every
    gateway verified, so the caller's answer says so, then hand it to the watcher, which
    waits for the drained pools' in-flight streams to close. Should this process die before
    either, nothing is lost: the converge task advances every open drain from the rows."""
    from fleetctl.traffic.tasks import drain_watch

    def watch() -> None:
        try:
            drain_progress(drain_id=drain_id, look_in_flight=False)
        finally:
            drain_watch.delay(drain_id)

    transaction.on_commit(watch, robust=True)


def drain_restore(*, actor: Actor, drain: Drain, reason: str) -> Drain:
    """Put each drained route back to the split it had before the drain, if nobody changed
    it since (otherwise 409: restoring would overwrite a newer decision)."""
    actor.require(roles.DRAIN, action="drain.restore", target=drain)
    if drain.action != Drain.Action.DRAIN:
        raise ValidationError({"drain": ["Only a drain can be restored."]})
    with transaction.atomic():
        revisions = list(drain.revisions.select_related("route", "parent"))
        routes = {r.pk: r for r in Route.objects.select_for_update().filter(
            pk__in=[rev.route_id for rev in revisions])}
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
        for rev in revisions:
            parent_weights = rev.parent.weights if rev.parent else {}
            route = routes[rev.route_id]
            # Restoring sends traffic back: the pools must be healthy again (and in bounds),
            # and be the very pools the split was made for.
            pool_ids = _check_split(route=route, weights=parent_weights, previous=rev.weights,
                                    force=False,
                                    identity=rev.parent.pool_ids if rev.parent else {})
            restored = _store_revision(
                actor=actor, route=route, base=rev.number, weights=parent_weights,
                kind=SplitRevision.Kind.RESTORE, reason=record.reason, parent=rev,
                inline=True, pool_ids=pool_ids,
            )
            record.revisions.add(restored)
        audit_record(actor=actor, action="drain.restore", target=record, message=record.reason,
                     after={"restores": drain.pk})
        _watch_after_commit(record.pk)
    return record


def drain_progress(*, drain_id: int, look_in_flight: bool = True) -> bool:
    """One look at a drain: all pushes verified? in-flight to drained pools zero? Updates
    the record and returns True when there is nothing more to wait for. Without
    `look_in_flight` it stops after noting the verified time (no gateway is asked)."""
    drain = Drain.objects.filter(pk=drain_id).first()
    if drain is None or drain.status in (Drain.Status.COMPLETE, Drain.Status.FAILED):
        return True
    pushes = list(GatewayPush.objects.select_related("gateway")
                  .filter(revision__in=drain.revisions.all()))
    now = timezone.now()
    failing = [p for p in pushes if p.status in (GatewayPush.Status.RETRYING,
                                                 GatewayPush.Status.FAILED)]
    done = [p for p in pushes if p.status in (GatewayPush.Status.VERIFIED,
                                              GatewayPush.Status.SUPERSEDED)]
    if len(done) < len(pushes):
        status = Drain.Status.PARTIAL if failing else Drain.Status.PUSHING
        error = "; ".join(f"{p.gateway.name}: {p.last_error}" for p in failing)
        if (drain.status, drain.last_error) != (status, error):  # the watcher polls: no idle writes
            Drain.objects.filter(pk=drain.pk).update(status=status, last_error=error)
        return False
    if drain.verified_at is None:
        verified_times = [p.verified_at for p in pushes if p.verified_at] or [now]
        drain.verified_at = max(verified_times)
        Drain.objects.filter(pk=drain.pk).update(verified_at=drain.verified_at,
                                                 status=Drain.Status.VERIFIED, last_error="")
    if not look_in_flight:
        return False
    if drain.in_flight_zero_at is None and not _in_flight_zero(drain):
        return False
    zero_at = drain.in_flight_zero_at or now
    Drain.objects.filter(pk=drain.pk).update(
        in_flight_zero_at=zero_at, completed_at=max(zero_at, drain.verified_at),
        status=Drain.Status.COMPLETE,
    )
    return True


def _in_flight_zero(drain: Drain) -> bool:
    """In-flight requests to each drained pool, summed over the gateways that carried it.
    A pool that still has weight on some other route of a gateway cannot be told apart per
    route, so that gateway is not waited for (its cluster counts both routes)."""
    if drain.action == Drain.Action.RESTORE or not drain.drained_pools:
        return True
    for gateway in Gateway.objects.filter(routes__in=[r.route_id for r in
                                                      drain.revisions.all()]).distinct():
        desired = selectors.gateway_desired_state(gateway=gateway)
        adapter = adapter_for(selectors.gateway_spec(gateway))
        for pool in drain.drained_pools:
            if any(r.weights.get(pool) for r in desired.routes):
                continue
            try:
                count = adapter.in_flight(pool)
            except AdapterError:
                return False
            if count > 0:
                return False
    return True


DRAINS_OPEN = (Drain.Status.PUSHING, Drain.Status.VERIFIED, Drain.Status.PARTIAL)


def drains_advance() -> int:
    """One look at every open drain and restore (drain_progress), whoever made it and
    whatever process died since: the converge task runs this every few seconds, and a push
    that verifies runs it at once. Returns how many are complete now."""
    complete = 0
    for pk in Drain.objects.filter(status__in=DRAINS_OPEN).values_list("pk", flat=True):
        try:
            complete += drain_progress(drain_id=pk)
        except Exception:  # one drain's trouble must not keep the others waiting
            log.exception("drain %s: could not look at its progress", pk)
    return complete
