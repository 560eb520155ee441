"""The health policy: what traffic does when the probe flips a pool's health.

Unhealthy: the pool is drained, as the system, off every route whose `health_policy` is not
`off` and that gives it weight — one drain per flip (two when the routes differ in policy, so
that the `drain-restore` ones can be restored on their own), linked to the health transition
that caused it, so the drain's page shows the probe's evidence. Healthy again: each automatic
drain of that pool whose routes all say `drain-restore` is restored, unless someone changed a
route since (the restore service's 409): then the drain stays and the audit log and the
webhook say why. Routes with `drain` stay drained until a person restores them.

Runs as the `traffic.health_policy` task, queued by fleet's HEALTH_HOOKS after the flip
commits. Running it twice for one transition does nothing the second time: the transition
row is locked and what was done for it is looked up first.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import HealthTransition, Pool
from fleetctl.traffic import selectors, services
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.services import notify

log = logging.getLogger(__name__)

SYSTEM = "health-policy"
RESTORE_REFUSED = "drain.auto_restore_refused"


def policy_apply(*, transition_id: int) -> list[Drain]:
    """Apply the policy for one health flip. Returns the drains (or restores) it made, for
    the caller to push once committed (the task does: `push.drain_push_now`)."""
    with transaction.atomic():
        transition = (HealthTransition.objects.select_for_update(of=("self",))
                      .select_related("pool", "health_check")
                      .filter(pk=transition_id).first())
        if transition is None:
            return []
        pool = transition.pool
        # A newer flip has its own task; acting on this one now would undo it.
        latest = HealthTransition.objects.filter(pool=pool).order_by("-at", "-id").first()
        if latest is None or latest.pk != transition.pk:
            return []
        if transition.to_state == Pool.Health.UNHEALTHY:
            return _drain(transition)
        if transition.to_state == Pool.Health.HEALTHY:
            return _restore(transition)
    return []


def _evidence(transition: HealthTransition) -> dict[str, Any]:
    check = transition.health_check
    return {"transition": transition.pk, "health_check": check.pk if check else None,
            "probe_error": check.error if check else "", "reason": transition.reason,
            "at": transition.at.isoformat()}


def _drain(transition: HealthTransition) -> list[Drain]:
    if Drain.objects.filter(health_transition=transition).exists():
        return []  # done by an earlier run of this task
    pool = transition.pool
    actor = Actor.for_system(SYSTEM)
    routes = list(Route.objects.exclude(health_policy=Route.HealthPolicy.OFF)
                  .select_related("primary_pool").order_by("pk"))
    current = selectors.revisions_current(routes=routes)
    groups: dict[str, list[Route]] = {}
    for route in routes:
        weights = current[route.pk].weights if route.pk in current else {}
        if weights.get(pool.name, 0) <= 0:
            continue
        step = selectors.drain_step(route=route, weights=weights, pool=pool)
        # Nowhere to send its share (no other pool may serve the route): a drain would only
        # turn the pool's errors into the gateway's; a person decides.
        if step is None or not step[0]:
            continue
        groups.setdefault(route.health_policy, []).append(route)
    check = transition.health_check
    error = (check.error if check else transition.reason) or transition.reason
    reason = (f"pool {pool.name} unhealthy: {error} "
              f"(health check {check.pk if check else '-'})")[:2000]
    made = []
    for policy, group in sorted(groups.items()):
        try:
            drain = services.drain_request(actor=actor, pool=pool, routes=group, reason=reason)
        except (ConflictError, ValidationError) as exc:
            log.warning("health policy could not drain %s: %s", pool.name, exc)
            continue
        drain.health_transition = transition
        drain.save(update_fields=["health_transition"])
        names = [r.name for r in group]
        notify("drain.automatic", {
            "action": "drain", "pool": pool.name, "routes": names, "policy": policy,
            "drain": drain.pk, "url": f"/traffic/drains/{drain.pk}/", **_evidence(transition),
        }, text=f"fleetctl drained pool {pool.name} off {', '.join(names)}: {reason}")
        made.append(drain)
    return made


def _restore(transition: HealthTransition) -> list[Drain]:
    pool = transition.pool
    actor = Actor.for_system(SYSTEM)
    made = []
    drains = (Drain.objects.filter(pool=pool, action=Drain.Action.DRAIN,
                                   requested_by=actor.label, health_transition__isnull=False,
                                   restored_by__isnull=True)
              .order_by("requested_at", "pk"))
    for drain in drains:
        routes = list(Route.objects.filter(revisions__drains=drain).distinct())
        if not routes or any(r.health_policy != Route.HealthPolicy.DRAIN_RESTORE
                             for r in routes):
            continue  # `drain` (or since turned `off`): a person restores it
        if AuditEvent.objects.filter(action=RESTORE_REFUSED, object_id=str(drain.pk),
                                     after__transition=transition.pk).exists():
            continue  # refused already, for this very flip
        names = sorted(r.name for r in routes)
        reason = (f"pool {pool.name} healthy again: {transition.reason} (health check "
                  f"{transition.health_check_id or '-'}); restoring drain {drain.pk}")
        try:
            with transaction.atomic():
                record = services.drain_restore(actor=actor, drain=drain, reason=reason)
                record.health_transition = transition
                record.save(update_fields=["health_transition"])
        except (ConflictError, ValidationError) as exc:
            why = exc.message if isinstance(exc, ConflictError) else "; ".join(exc.messages)
            audit_record(actor=actor, action=RESTORE_REFUSED, target=drain,
                         message=f"Not restored: {why}",
                         after={"transition": transition.pk, "routes": names})
            notify("drain.automatic", {
                "action": "restore-refused", "pool": pool.name, "routes": names,
                "drain": drain.pk, "url": f"/traffic/drains/{drain.pk}/", "why": why,
                **_evidence(transition),
            }, text=f"fleetctl did not restore pool {pool.name} on {', '.join(names)} "
                    f"(drain {drain.pk}): {why}")
            continue
        notify("drain.automatic", {
            "action": "restore", "pool": pool.name, "routes": names, "drain": drain.pk,
            "restore": record.pk, "url": f"/traffic/drains/{record.pk}/",
            **_evidence(transition),
        }, text=f"fleetctl restored pool {pool.name} on {', '.join(names)}: {reason}")
        made.append(record)
    return made
