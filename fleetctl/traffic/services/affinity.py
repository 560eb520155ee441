"""A route's prefix affinity (issue 28): set it in one audited call, refused while a gateway
whose kind cannot keep it carries the route; its gateways are pushed their state again."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import NotFoundError
from fleetctl.traffic.models import Route
from fleetctl.traffic.services._shared import gateways_refresh
from fleetctl.traffic.services.tiers import _whole

# The leading bytes of a prompt's text that make its key: a few lines at least (so two
# different prompts rarely share a key), at most what the Lua script copies per request.
MIN_PREFIX_BYTES = 64
MAX_PREFIX_BYTES = 65_536
DEFAULT_PREFIX_BYTES = 4096
AFFINITY_KEYS = ("source", "prefix_bytes")
SOURCES = [value for value, _ in Route.PrefixAffinity.choices]


def affinity_dict(route: Route) -> dict[str, Any]:
    """The setting as the API answers it: prefix_bytes only for a `prompt` key."""
    prompt = route.prefix_affinity == Route.PrefixAffinity.PROMPT
    return {"source": route.prefix_affinity,
            "prefix_bytes": route.prefix_affinity_bytes if prompt else None}


def parse_affinity(data: Any) -> tuple[str, int | None]:
    """(source, prefix_bytes) from the body, or 400 naming the field."""
    if not isinstance(data, dict):
        raise ValidationError({"source": [
            f"Give an object, e.g. {{\"source\": \"prompt\", \"prefix_bytes\": "
            f"{DEFAULT_PREFIX_BYTES}}}; {{\"source\": \"off\"}} turns it off."]})
    errors: dict[str, list[str]] = {}
    for key in data:
        if key not in AFFINITY_KEYS:
            errors[str(key)[:40]] = [f"Unknown field; prefix affinity has "
                                     f"{', '.join(AFFINITY_KEYS)}."]
    source = data.get("source")
    if source is None:
        errors["source"] = [f"Required: one of {', '.join(SOURCES)}."]
    elif not isinstance(source, str) or source not in SOURCES:
        errors["source"] = [f"Unknown source {str(source)[:40]!r}: one of "
                            f"{', '.join(SOURCES)} (prompt: the caller's "
                            f"x-fleetctl-prefix-key, else the prompt's leading bytes)."]
    size = data.get("prefix_bytes")
    if size is not None:
        if source != Route.PrefixAffinity.PROMPT:
            errors["prefix_bytes"] = [f"Only a prompt key reads prompt bytes (source is "
                                      f"{str(source)[:40]}); leave prefix_bytes out."]
        elif problem := _whole(size, lo=MIN_PREFIX_BYTES, hi=MAX_PREFIX_BYTES):
            errors["prefix_bytes"] = [problem + " Take about the length of the shared part "
                                      "(system prompt, document) of your prompts, in bytes."]
    if errors:
        raise ValidationError(errors)
    return str(source), size


def _gateways_refusal(route: Route) -> str | None:
    """Why the route's gateways cannot keep prefix affinity (a kind that cannot would
    balance the route by load alone: a silent partial), or None."""
    from fleetctl.traffic.gateways import registry

    cannot = []
    for gateway in route.gateways.order_by("name"):
        kind = registry.find(gateway.kind)
        if kind is not None and not kind.supports_prefix_affinity:
            cannot.append(f"{gateway.name} ({kind.label})")
    if not cannot:
        return None
    return (f"Route {route.name} is carried by gateway(s) that cannot keep prefix affinity: "
            f"{', '.join(cannot)}. Only Envoy gateways enforce it; take the route off those "
            f"gateways first, or keep it off.")


def route_affinity_set(*, actor: Actor, route: Route, data: Any) -> Route:
    """Set the route's prefix affinity (fleet-manage), audited with before and after, and
    push its gateways. 400 naming the field on a bad value, or on `source` while a gateway
    whose kind cannot keep it carries the route. `prefix_bytes` left out keeps the route's
    (DEFAULT_PREFIX_BYTES at first)."""
    actor.require(roles.FLEET_MANAGE, action="route.affinity", target=route)
    source, size = parse_affinity(data)
    with transaction.atomic():
        locked = Route.objects.select_for_update().filter(pk=route.pk).first()
        if locked is None:
            raise NotFoundError(f"Route {route.name} was deleted meanwhile; nothing was "
                                f"changed.")
        if source != Route.PrefixAffinity.OFF and (refusal := _gateways_refusal(locked)):
            raise ValidationError({"source": [refusal]})
        before = affinity_dict(locked)
        locked.prefix_affinity = source
        if size is not None:
            locked.prefix_affinity_bytes = size
        after = affinity_dict(locked)
        if after != before:
            locked.save(update_fields=["prefix_affinity", "prefix_affinity_bytes"])
            said = (f"{source}, the leading {locked.prefix_affinity_bytes:,} bytes"
                    if source == Route.PrefixAffinity.PROMPT else source)
            audit_record(actor=actor, action="route.affinity", target=locked,
                         before=before, after=after,
                         message=f"prefix affinity of {locked.name}: {said}")
            gateways_refresh(reason="affinity", route=locked)
    return locked
