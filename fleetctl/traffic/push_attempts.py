"""One push attempt and what it writes: the gateway I/O (run in a push thread, no database
work), then the attempt rows, the pushes a verified attempt settles and the gateway's state,
recorded together in a few queries. push.py decides when attempts are made."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Case, DateTimeField, F, PositiveIntegerField, Value, When
from django.utils import timezone

from fleetctl.traffic import mirror_auth, selectors
from fleetctl.traffic.gateways.base import AdapterError, ApplyResult, DesiredState, adapter_for
from fleetctl.traffic.models import Gateway, GatewayPush, GatewayPushAttempt

log = logging.getLogger("fleetctl.traffic")

# Every push sends the gateway its whole desired state, so a gateway that is down needs only
# one push retried (its newest open one) and the retry is the probe: cheap (a refused
# connection) and capped low, so a gateway that answers again is sent the current state
# within seconds, which settles every older open push to it (_gateways_in_sync).
RETRY_DELAYS_S = (0.2, 0.5, 1, 2, 5)
OPEN = (GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING)


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
        adapter = adapter_for(selectors.gateway_spec(push.live_gateway))
        io.result = adapter.apply(desired)
        io.answered = timezone.now()
        held = adapter.read_back()
        io.verified = adapter.matches(desired, held)
        if io.verified:
            # The mirror fraction (shadow runs) is held too, or this kind says it cannot tell.
            io.verified, mirror_note = adapter.mirror_matches(desired)
            if not io.verified:
                io.error = mirror_note
            elif mirror_note and io.result is not None:
                io.result.detail = "; ".join(t for t in (io.result.detail, mirror_note) if t)
        io.verified_at = timezone.now()
        if not io.verified and not io.error:
            io.error = f"read back {held} differs from what was applied"
    except AdapterError as exc:
        io.error, io.permanent = str(exc), exc.permanent
        io.answered = io.answered or timezone.now()
    io.duration_ms = (time.monotonic() - io.started) * 1000
    # What a gateway says may quote its config, which holds the mirror tokens.
    io.error = mirror_auth.redact(io.error)
    if io.result is not None:
        io.result.detail = mirror_auth.redact(io.result.detail)
    return io


def _push_record(outcomes: list[_PushIO], *, settled: dict[int, tuple[str, Any]] | None = None
                 ) -> list[tuple[str, float | None]]:
    """Attempt rows in one insert, then the pushes a verified attempt settles and its gateway
    in one update each; failures one by one (they are rare and each has its own retry).
    `settled` collects push id → (status, verified at) of every push settled here."""
    if not outcomes:
        return []
    GatewayPushAttempt.objects.bulk_create([
        GatewayPushAttempt(
            push=io.push, number=io.push.attempts + 1, sent_at=io.sent,
            answered_at=io.answered, applied=bool(io.result and io.result.applied),
            verified=io.verified, method=io.result.method if io.result else "",
            detail=io.result.detail if io.result else "", error=io.error,
            duration_ms=io.duration_ms)
        for io in outcomes
    ])
    _gateways_in_sync([io for io in outcomes if io.verified],
                      settled if settled is not None else {})
    return [(GatewayPush.Status.VERIFIED, None) if io.verified
            else _push_failed(io.push, io.push.attempts + 1, io.error, io.permanent)
            for io in outcomes]


def _push_failed(push: GatewayPush, attempts: int, error: str,
                 permanent: bool) -> tuple[str, float | None]:
    retry = None if permanent else RETRY_DELAYS_S[min(attempts - 1, len(RETRY_DELAYS_S) - 1)]
    status = GatewayPush.Status.FAILED if permanent else GatewayPush.Status.RETRYING
    # A push abandoned meanwhile (its gateway deleted) stays abandoned: it counts the attempt.
    GatewayPush.objects.filter(pk=push.pk).exclude(status=GatewayPush.Status.ABANDONED).update(
        status=status, last_error=error, attempts=F("attempts") + 1)
    gateway = push.live_gateway
    if gateway.state != Gateway.State.FAILING:
        log.error("gateway %s cannot be updated: %s", gateway.name, error)
    # Conditional, so of two attempts failing at once only one reports the flip.
    flipped = Gateway.objects.filter(pk=gateway.pk).exclude(
        state=Gateway.State.FAILING).update(state=Gateway.State.FAILING, last_error=error,
                                            state_changed_at=timezone.now())
    if flipped:
        _gateway_notify(gateway.name, failing=True, error=error)
    else:
        Gateway.objects.filter(pk=gateway.pk).update(last_error=error)
    return status, retry


def _gateway_notify(name: str, *, failing: bool, error: str = "") -> None:
    from fleetctl.webhooks.services import notify

    state = Gateway.State.FAILING if failing else Gateway.State.IN_SYNC
    notify("gateway.failing", {"gateway": name, "state": str(state), "error": error,
                               "url": f"/api/v1/gateways/{name}/"},
           text=(f"fleetctl gateway {name} is failing: {error}" if failing
                 else f"fleetctl gateway {name} is in sync again"))


def _gateways_in_sync(outcomes: list[_PushIO], settled: dict[int, tuple[str, Any]]) -> None:
    """Each gateway holds exactly the revisions it was sent: its open pushes of those
    revisions are verified, open pushes of older ones (or of routes it no longer carries)
    superseded. Only pushes that were committed before the attempt read its desired state
    are settled: one made meanwhile (a newer revision, a registry edit the attempt never saw)
    stays open for its own attempt. The attempted pushes count their attempt. Fills
    `settled` with push id → (status, verified at)."""
    if not outcomes:
        return
    now = timezone.now()
    by_gateway = {io.push.live_gateway_id: io for io in outcomes}
    attempted = [io.push.pk for io in outcomes]
    open_pushes = GatewayPush.objects.filter(
        gateway_id__in=by_gateway,
        status__in=[GatewayPush.Status.PENDING, GatewayPush.Status.RETRYING],
    ).select_related("revision__route")
    verified: dict[int, _PushIO] = {}
    superseded = []
    for push in open_pushes:
        io = by_gateway[push.live_gateway_id]
        if push.pk not in io.known and push.pk != io.push.pk:
            continue  # committed after this attempt read its state: it may hold more
        held = {spec.key: spec.revision for spec in io.desired.routes}
        number = held.get(push.revision.route.name)
        if number == push.revision.number:
            verified[push.pk] = io
        elif number is None or push.revision.number < number:
            superseded.append(push.pk)
    counted = Case(When(pk__in=attempted, then=F("attempts") + 1), default=F("attempts"),
                   output_field=PositiveIntegerField())
    if verified:
        _settle_verified(verified, attempted)
        settled.update({pk: (GatewayPush.Status.VERIFIED, io.verified_at)
                        for pk, io in verified.items()})
    if superseded:
        GatewayPush.objects.filter(pk__in=superseded, status__in=OPEN).update(
            status=GatewayPush.Status.SUPERSEDED, attempts=counted)
        settled.update({pk: (GatewayPush.Status.SUPERSEDED, None) for pk in superseded})
    uncounted = [pk for pk in attempted if pk not in verified and pk not in superseded]
    if uncounted:  # settled by another attempt meanwhile: it still had this one
        GatewayPush.objects.filter(pk__in=uncounted).update(attempts=F("attempts") + 1)
    recovered = list(Gateway.objects.filter(pk__in=by_gateway, state=Gateway.State.FAILING)
                     .values_list("name", flat=True))
    Gateway.objects.filter(pk__in=by_gateway).update(
        state=Gateway.State.IN_SYNC, last_error="", last_verified_at=now,
        state_changed_at=Case(When(state=Gateway.State.IN_SYNC, then=F("state_changed_at")),
                              default=Value(now), output_field=DateTimeField()))
    for name in recovered:
        _gateway_notify(name, failing=False)
    # In sync with all it can hold; what it had to leave out (a pool it cannot route to)
    # stays in view until a push holds everything again.
    for gateway_id, io in by_gateway.items():
        if io.result is not None and io.result.warning:
            log.warning("gateway %s: %s", io.push.live_gateway.name, io.result.warning)
            Gateway.objects.filter(pk=gateway_id).update(
                last_error=f"warning: {io.result.warning}")


def _settle_verified(verified: dict[int, _PushIO], attempted: list[int]) -> None:
    """One statement for every push settled verified, each applied and verified when its
    gateway's attempt was; `status IN (open)` keeps a push another attempt settled meanwhile.
    Written as SQL: the ORM builds this CASE from one expression per push, and resolving
    those took ~20 ms of every drain's answer (benchmarks/drain_latency.py)."""
    ops, quote = connection.ops, connection.ops.quote_name
    column = quote  # these fields' columns carry their names

    pks = list(verified)
    marks = ", ".join(["%s"] * len(pks))
    cases = {"applied_at": [], "verified_at": []}  # type: dict[str, list[Any]]
    for pk, io in verified.items():
        cases["applied_at"] += [pk, ops.adapt_datetimefield_value(io.answered)]
        cases["verified_at"] += [pk, ops.adapt_datetimefield_value(io.verified_at)]
    when = " ".join(["WHEN %s THEN %s"] * len(pks))
    counted = [pk for pk in attempted if pk in verified]
    attempts = column("attempts")
    bump = (f"CASE WHEN {quote('id')} IN ({', '.join(['%s'] * len(counted))}) "
            f"THEN 1 ELSE 0 END" if counted else "0")
    sql = (f"UPDATE {quote(GatewayPush._meta.db_table)} SET {column('status')} = %s, "
           f"{column('last_error')} = %s, "
           f"{column('applied_at')} = CASE {quote('id')} {when} END, "
           f"{column('verified_at')} = CASE {quote('id')} {when} END, "
           f"{attempts} = {attempts} + {bump} "
           f"WHERE {quote('id')} IN ({marks}) AND {column('status')} IN (%s, %s)")
    params = [GatewayPush.Status.VERIFIED.value, "", *cases["applied_at"],
              *cases["verified_at"], *counted, *pks, *(status.value for status in OPEN)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
