"""The Tokens page: a person's own API tokens. A new token's secret is rendered into the
response to the POST that created it and nowhere else: it is not stored (only its hash is),
not put in the session, and the page is never cached."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from fleetctl.accounts import roles, selectors, services
from fleetctl.accounts.forms import TokenCreateForm
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.errors import DomainError
from fleetctl.core.views import dashboard_view, form_add_service_errors


@dashboard_view
@never_cache
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    actor = actor_from_request(request)
    form = TokenCreateForm(request.POST if request.method == "POST" else None)
    issued: services.IssuedToken | None = None
    status = 200
    if request.method == "POST" and form.is_valid():
        try:
            issued = services.token_create_personal(
                actor=actor, name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"], expires_at=form.expiry(),
            )
        except ValidationError as exc:
            form_add_service_errors(form, exc)
        except DomainError as exc:
            messages.error(request, exc.message)
            status = exc.status_code
        else:
            form = TokenCreateForm()
    role_permissions = roles.permissions_for_roles(actor.roles)
    context = {
        "form": form,
        "issued": issued,
        "tokens": selectors.token_list_for_user(user=request.user),
        "granted_scopes": [
            scope for scope in roles.SCOPES
            if roles.permissions_for_scopes([scope]) <= role_permissions
        ],
        "fleetctl_url": request.build_absolute_uri("/").rstrip("/"),
    }
    return render(request, "accounts/tokens.html", context, status=status)


@dashboard_view
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = services.token_revoke(actor=actor_from_request(request), token_id=token_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Revoked token {token.name} ({token.prefix}…).")
    return redirect("accounts:tokens")
