"""What every dashboard page needs from the person signed in: the guard that lets in only
someone who may read, and the navigation with what they may do.

Templates hide or disable buttons with `can.fleet_manage` etc.; the services check again, so a
hidden button is a courtesy, never the protection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from fleetctl.accounts import roles
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.errors import PermissionDeniedError

View = TypeVar("View", bound=Callable[..., HttpResponseBase])

NO_ROLE_MESSAGE = (
    "You are signed in, but your account has no fleetctl role yet, so there is nothing you may "
    "see. Ask an admin to give you a role (viewer, on-call, platform-lead or admin)."
)


def dashboard_view(view: View) -> View:
    """Require a signed-in person who holds the `read` permission.

    A refused read is audited like the API's (through `Actor.require`) and answered with the
    403 page. An htmx poll from an expired sign-in gets a client redirect to the login page,
    so the login form is never swapped into a tile.
    """

    @wraps(view)
    def needs_read(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            actor_from_request(request).require(roles.READ, action=f"web.read:{request.path}")
        except PermissionDeniedError as exc:
            raise PermissionDenied(NO_ROLE_MESSAGE) from exc
        return view(request, *args, **kwargs)

    signed_in = login_required(needs_read)

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if getattr(request, "htmx", False) and not request.user.is_authenticated:
            login = redirect_to_login(request.htmx.current_url_abs_path or "/")  # type: ignore[attr-defined]
            return HttpResponseClientRedirect(login["Location"])
        return signed_in(request, *args, **kwargs)

    return cast(View, guarded)


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str = ""  # empty: this version has no such section; it renders disabled
    section: str = ""  # the URL namespace that marks this item as the current one
    note: str = ""


def _nav_items() -> list[NavItem]:
    return [
        NavItem("Fleet", reverse("fleet:overview"), section="fleet"),
        NavItem("Plans", reverse("plans:board"), section="plans"),
        NavItem("Traffic", reverse("traffic:routes"), section="traffic"),
        NavItem("Ramps", reverse("ramps:list"), section="ramps"),
        NavItem("Batch", reverse("batch:list"), section="batch"),
        NavItem("Benchmarks", reverse("bench:home"), section="bench"),
        NavItem("Conformance", reverse("conformance:home"), section="conformance"),
        NavItem("Shadow", reverse("shadow:home"), section="shadow"),
        NavItem("Evals", reverse("evals:home"), section="evals"),
        NavItem("Schedules", reverse("schedules:list"), section="schedules"),
        NavItem("Audit", reverse("audit:list"), section="audit"),
        NavItem("Webhooks", reverse("webhooks:list"), section="webhooks"),
        NavItem("Metric sources", reverse("metric_sources:list"), section="metric_sources"),
        NavItem("API docs", reverse("api-docs")),
    ]


def navigation(request: HttpRequest) -> dict[str, Any]:
    """Context processor (settings.TEMPLATES): the navigation and the `can` flags."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_items": []}
    actor = actor_from_request(request)
    match = getattr(request, "resolver_match", None)
    items = _nav_items()
    if actor.can(roles.ADMIN_MANAGE):
        items.insert(-1, NavItem("People", reverse("people:list"), section="people"))
    return {
        "nav_items": items,
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
            "admin_manage": actor.can(roles.ADMIN_MANAGE),
        },
    }
