"""The Tokens page: a person's own API tokens. A new token's secret is rendered into the
response to the POST that created it and nowhere else: it is not stored (only its hash is),
not put in the session, and the page is never cached. Also the page a locked-out sign-in
gets."""

from __future__ import annotations

import math
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from fleetctl.accounts import roles, selectors, services
from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.forms import TokenCreateForm
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.accounts.throttle import client_ip
from fleetctl.core.views import Outcome, call_service


@dashboard_view
@never_cache
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    actor = actor_from_request(request)
    form = TokenCreateForm(request.POST if request.method == "POST" else None)
    done: Outcome[services.IssuedToken] = Outcome()
    if request.method == "POST" and form.is_valid():
        done = call_service(request, lambda: services.token_create_personal(
            actor=actor, name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"], expires_at=form.expiry(),
        ), form=form)
        if done.result is not None:
            form = TokenCreateForm()
    role_permissions = roles.permissions_for_roles(actor.roles)
    context = {
        "form": form,
        "issued": done.result,
        "tokens": selectors.token_list_for_user(user=request.user),
        "granted_scopes": [
            scope for scope in roles.SCOPES
            if roles.permissions_for_scopes([scope]) <= role_permissions
        ],
        "fleetctl_url": request.build_absolute_uri("/").rstrip("/"),
    }
    return render(request, "accounts/tokens.html", context, status=done.status)


@dashboard_view
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    actor = actor_from_request(request)
    token = call_service(request, lambda: services.token_revoke(actor=actor, token_id=token_id))
    if token.result is not None:
        messages.success(request, f"Revoked token {token.result.name} ({token.result.prefix}…).")
    return redirect("accounts:tokens")


def login_locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """The answer to a sign-in refused by the lockout (settings.AXES_LOCKOUT_CALLABLE): 429,
    when to retry (also as Retry-After) and how an admin unlocks it."""
    username = str((credentials or {}).get("username") or "")
    until = selectors.login_locked_until(username=username, ip_address=client_ip(request))
    seconds = max(0, math.ceil((until - timezone.now()).total_seconds())) if until else 0
    response = render(request, "registration/locked_out.html", {
        "username": username, "until": until, "minutes": max(1, math.ceil(seconds / 60)),
    }, status=429)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response
