"""The routes' re-verification policy, when a changed pool's conformance re-run failed
(called by fleetctl/conformance/reverify.py): on each route where the pool carries weight,
`drain` takes it off through the drain service (pushed once committed, audited, a
`drain.automatic` webhook with `policy: "reverify"`); `hold` keeps it (its ramps stay
paused) and the record says so."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool
from fleetctl.traffic import push, selectors
from fleetctl.traffic.models import Drain, Route
from fleetctl.traffic.services import drain_request
from fleetctl.webhooks.services import notify

log = logging.getLogger(__name__)


@dataclass
class PolicyOutcome:
    drain: Drain | None = None
    drained: list[str] = field(default_factory=list)  # route names
    held: list[str] = field(default_factory=list)
    refused: str = ""  # why the drain was refused, if it was


def weighted_routes(pool: Pool) -> list[Route]:
    """Routes whose split in force gives the pool weight."""
    routes = list(Route.objects.select_related("primary_pool").order_by("pk"))
    current = selectors.revisions_current(routes=routes)
    return [route for route in routes
            if route.pk in current and current[route.pk].weights.get(pool.name, 0) > 0]


def policy_apply(*, actor: Actor, pool: Pool, reason: str, details: dict[str, object]
                 ) -> PolicyOutcome:
    """Drain the pool off its `drain`-policy routes (one drain), list its `hold` ones."""
    routes = weighted_routes(pool)
    outcome = PolicyOutcome(
        held=[r.name for r in routes if r.reverify_policy == Route.ReverifyPolicy.HOLD])
    drain_routes = [r for r in routes if r.reverify_policy == Route.ReverifyPolicy.DRAIN]
    if not drain_routes:
        return outcome
    try:
        with transaction.atomic():
            outcome.drain = drain_request(actor=actor, pool=pool, routes=drain_routes,
                                          reason=reason)
    except (ValidationError, DomainError) as exc:
        log.warning("re-verification policy could not drain %s: %s", pool.name, exc)
        outcome.refused = str(exc)
        return outcome
    outcome.drained = [r.name for r in drain_routes]
    # Tell people first: a slow or unreachable gateway must not delay the page on-call reads.
    notify("drain.automatic", {
        "action": "drain", "pool": pool.name, "routes": outcome.drained, "policy": "reverify",
        "drain": outcome.drain.pk, "url": f"/traffic/drains/{outcome.drain.pk}/",
        "reason": reason, **details},
        text=f"fleetctl drained pool {pool.name} off {', '.join(outcome.drained)}: {reason}")
    push.drain_push_now(outcome.drain)
    return outcome
