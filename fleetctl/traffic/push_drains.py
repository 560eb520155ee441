"""Following a drain from the rows: its pushes verified on every gateway, then the
in-flight streams to the drained pools closed, or given up on with a reason (push.py makes
the pushes; the watcher and converge tasks call drain_progress and drains_advance)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from fleetctl.traffic import selectors
from fleetctl.traffic.gateways.base import AdapterError, adapter_for
from fleetctl.traffic.models import Drain, Gateway, GatewayPush

log = logging.getLogger("fleetctl.traffic")

DRAINS_OPEN = (Drain.Status.PUSHING, Drain.Status.VERIFIED, Drain.Status.PARTIAL)


def drain_progress(*, drain_id: int, look_in_flight: bool = True) -> bool:
    """One look at a drain: all pushes verified? in-flight to drained pools zero? Updates
    the record and returns True when there is nothing more to wait for. Without
    `look_in_flight` it stops after noting the verified time (no gateway is asked).

    A drain gives up — status `failed`, the reason stored, never left `partial` or
    `verified` — when a gateway refused one of its pushes for good (a permanent adapter
    error: nothing retries it), when it is still not verified on every gateway
    DRAIN_WATCH_TIMEOUT_S after it was requested, or when the drained pools' in-flight
    requests have not reached zero by then (or could not be read). Retrying pushes carry on
    after that (a gateway that answers again still gets the current state); the record says
    the drain did not do what it was asked in time."""
    drain = Drain.objects.filter(pk=drain_id).first()
    if drain is None or drain.status in (Drain.Status.COMPLETE, Drain.Status.FAILED):
        return True
    pushes = list(GatewayPush.objects.select_related("gateway", "revision__route")
                  .filter(revision__in=drain.revisions.all()))
    now = timezone.now()
    failing = [p for p in pushes if p.status in (GatewayPush.Status.RETRYING,
                                                 GatewayPush.Status.FAILED)]
    # A push whose gateway was deleted before it verified waits no more: the drain finishes
    # for the remaining gateways, and its record keeps saying which one never verified.
    done = [p for p in pushes if p.status in (GatewayPush.Status.VERIFIED,
                                              GatewayPush.Status.SUPERSEDED,
                                              GatewayPush.Status.ABANDONED)]
    # A stepped drain is not done before its last step is stored (services/drain_steps.py).
    if len(done) < len(pushes) or drain.next_step_at is not None:
        return _not_verified_yet(drain, pushes, failing, now)
    if drain.verified_at is None:
        # The last gateway's read-back — or the moment a gateway it waited on was deleted:
        # the drain was not done with its gateways before that.
        verified_times = [p.verified_at for p in pushes if p.verified_at] + [
            p.gateway_deleted_at for p in pushes
            if p.status == GatewayPush.Status.ABANDONED and p.gateway_deleted_at] or [now]
        drain.verified_at = max(verified_times)
        Drain.objects.filter(pk=drain.pk).update(verified_at=drain.verified_at,
                                                 status=Drain.Status.VERIFIED, last_error="")
    if not look_in_flight:
        return False
    if drain.in_flight_zero_at is None and not _in_flight_zero(drain):
        reason = _in_flight_given_up(drain, now)
        if reason:
            log.error("%s %s failed: %s", drain.action, drain.pk, reason)
            Drain.objects.filter(pk=drain.pk).update(status=Drain.Status.FAILED,
                                                     failure_reason=reason)
            return True
        return False
    zero_at = drain.in_flight_zero_at or now
    Drain.objects.filter(pk=drain.pk).update(
        in_flight_zero_at=zero_at, completed_at=max(zero_at, drain.verified_at),
        status=Drain.Status.COMPLETE,
    )
    return True


def _not_verified_yet(drain: Drain, pushes: list[GatewayPush], failing: list[GatewayPush],
                      now: Any) -> bool:
    """A drain some of whose pushes are still open: note which gateways fail (`partial`), or
    fail the drain when it will not be verified (_given_up). True when it is settled."""
    error = "; ".join(f"{p.gateway_label}: {p.last_error}" for p in failing)
    reason = _given_up(drain, pushes, now)
    if reason:
        log.error("%s %s failed: %s", drain.action, drain.pk, reason)
        Drain.objects.filter(pk=drain.pk).update(
            status=Drain.Status.FAILED, failure_reason=reason, last_error=error)
        return True
    status = Drain.Status.PARTIAL if failing else Drain.Status.PUSHING
    if (drain.status, drain.last_error) != (status, error):  # the watcher polls: no idle writes
        Drain.objects.filter(pk=drain.pk).update(status=status, last_error=error)
    return False


def _given_up(drain: Drain, pushes: list[GatewayPush], now: Any) -> str:
    """Why a drain not yet verified everywhere will not be: a push refused for good, or the
    watch timeout passed. Empty while there is still reason to wait."""
    refused = [p for p in pushes if p.status == GatewayPush.Status.FAILED]
    if refused:
        return "; ".join(f"gateway {p.gateway_label} refused {p.revision.route.name} "
                         f"r{p.revision.number} for good: {p.last_error}" for p in refused)
    timeout_s = settings.DRAIN_WATCH_TIMEOUT_S
    if not _past_deadline(drain, now):
        return ""
    waiting = sorted({p.gateway_label for p in pushes
                      if p.status not in (GatewayPush.Status.VERIFIED,
                                          GatewayPush.Status.SUPERSEDED,
                                          GatewayPush.Status.ABANDONED)})
    return (f"not verified on {', '.join(waiting)} within {timeout_s:g} s "
            f"(DRAIN_WATCH_TIMEOUT_S); their pushes keep retrying")


def _past_deadline(drain: Drain, now: Any) -> bool:
    return now - drain.requested_at > timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S)


def _in_flight_given_up(drain: Drain, now: Any) -> str:
    """Why a drain verified everywhere stops waiting for in-flight requests: the watch
    timeout passed. Empty while there is still reason to wait."""
    if not _past_deadline(drain, now):
        return ""
    return (f"verified on every gateway, but in-flight requests to "
            f"{', '.join(drain.drained_pools)} did not reach zero (or could not be read) "
            f"within {settings.DRAIN_WATCH_TIMEOUT_S:g} s (DRAIN_WATCH_TIMEOUT_S)")


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


def _give_up_unfollowable(drain_id: int, exc: Exception) -> bool:
    """A drain whose progress cannot even be looked at (every look raises) is not left open
    for ever: past the watch timeout it is failed, with what went wrong."""
    now = timezone.now()
    reason = (f"its progress could not be followed within {settings.DRAIN_WATCH_TIMEOUT_S:g} "
              f"s (DRAIN_WATCH_TIMEOUT_S): {type(exc).__name__}: {exc}")
    return bool(Drain.objects.filter(
        pk=drain_id, status__in=DRAINS_OPEN,
        requested_at__lt=now - timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S)).update(
            status=Drain.Status.FAILED, failure_reason=reason))


def drains_advance() -> int:
    """One look at every open drain and restore (drain_progress), whoever made it and
    whatever process died since: the converge task runs this every few seconds, and a push
    that verifies runs it at once. Returns how many are settled now (complete or failed)."""
    complete = 0
    for pk in Drain.objects.filter(status__in=DRAINS_OPEN).values_list("pk", flat=True):
        try:
            complete += drain_progress(drain_id=pk)
        except Exception as exc:  # one drain's trouble must not keep the others waiting
            log.exception("drain %s: could not look at its progress", pk)
            complete += _give_up_unfollowable(pk, exc)
    return complete
