"""The demo's context tiers, visible (called by `demo_seed` before the guarded ramp): the TPU
v5e (standard class, in no plan, 8,192 tokens) gets PERCENT % of llama-8b, so a short prompt
may land on it (the ≤ 8k tier lists it) while a long one never does (the ≤ 32k tier does
not): the answer's `x-fleetctl-pool` header and the route page's tier card show where each
went. Set by `lead` before the seeded Gaudi ramp starts, so the ramp steps up from this
split (the H200 and the TPU give up the ramp's share in proportion: 5 % on the TPU at 50 %).

Created once: a route that ever gave the TPU weight, or that has had a ramp (the ramp's
base split was taken without it), is kept as it is."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import transaction

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool

ROUTE = "llama-8b"
POOL = "tpu-v5e-eu-west"
PERCENT = 10


def seed_tier_share(note: Callable[[str], None] = print) -> list[str]:
    """Give the TPU its share of llama-8b unless the route ever had one or a ramp: what was
    made (a refusal is passed to `note`)."""
    from fleetctl.ramps.models import Ramp
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Route

    route = Route.objects.select_related("primary_pool").filter(name=ROUTE).first()
    if route is None or not Pool.objects.filter(name=POOL).exists():
        return []
    if Ramp.objects.filter(route=route).exists() or any(
            POOL in revision.weights for revision in route.revisions.all()):
        return []
    try:
        with transaction.atomic():
            traffic.revision_create(
                actor=Actor(user=User.objects.get(username="lead")), route=route,
                base_revision=route.revision_number,
                weights={route.primary_pool.name: 100 - PERCENT, POOL: PERCENT}, force=True,
                reason=f"demo: the TPU v5e (8,192 tokens) takes {PERCENT} % of short prompts; "
                       f"long ones stay on the 32k pools (pools not probed yet)")
    except (ValidationError, DomainError, ObjectDoesNotExist) as exc:
        note(f"{PERCENT} % of {ROUTE} on {POOL} not set: {exc}")
        return []
    return [f"{PERCENT} % of {ROUTE} on {POOL}"]
