"""The navigation every dashboard page shows, and what the signed-in person may do.

Templates hide or disable buttons with `can.fleet_manage` etc.; the services check again, so a
hidden button is a courtesy, never the protection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.urls import reverse

from fleetctl.accounts import roles
from fleetctl.accounts.permissions import actor_from_request


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str = ""  # empty: the section is not built yet and renders disabled
    section: str = ""  # the URL namespace that marks this item as the current one
    note: str = ""


def _nav_items() -> list[NavItem]:
    return [
        NavItem("Fleet", reverse("fleet:overview"), section="fleet"),
        NavItem("Plans", reverse("plans:board"), section="plans"),
        NavItem("Traffic", reverse("traffic:routes"), section="traffic"),
        NavItem("Benchmarks", reverse("bench:home"), section="bench"),
        # Planned sections show disabled: people see what is coming, with no dead link.
        NavItem("Shadow", note="not built yet"),
        NavItem("Audit", reverse("audit:list"), section="audit"),
        NavItem("API docs", reverse("api-docs")),
    ]


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_items": []}
    actor = actor_from_request(request)
    match = getattr(request, "resolver_match", None)
    return {
        "nav_items": _nav_items(),
        "nav_current": match.namespace if match else "",
        "nav_roles": sorted(actor.roles),
        "can": {
            "read": actor.can(roles.READ),
            "fleet_manage": actor.can(roles.FLEET_MANAGE),
            "tokens_own": actor.can(roles.TOKENS_OWN),
            "ramp": actor.can(roles.RAMP),
            "drain": actor.can(roles.DRAIN),
            "jobs": actor.can(roles.JOBS),
            "approve": actor.can(roles.APPROVE),
        },
    }
