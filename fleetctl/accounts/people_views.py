"""The People page (admins only): everyone who can sign in, their roles, whether they are
enabled, and the invite form. Every change goes through the people services, which check
`admin.manage` again and audit it. A set-password link is rendered into the response to the
POST that made it and nowhere else, and the pages are never cached."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.tokens import default_token_generator
from django.contrib.auth.views import PasswordResetConfirmView
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from fleetctl.accounts import roles, selectors, services
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.forms import PersonInviteForm, PersonRolesForm
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.audit.selectors import object_history
from fleetctl.core.errors import PermissionDeniedError
from fleetctl.core.views import Outcome, call_service, form_page, get_or_404

NOT_ADMIN = "Only admins manage people and roles. Ask an admin to change your roles."
HISTORY_SHOWN = 20  # a person's latest changes; the audit page has the rest


def _admin(request: HttpRequest, action: str) -> Actor:
    actor = actor_from_request(request)
    try:
        actor.require(roles.ADMIN_MANAGE, action=action)
    except PermissionDeniedError as exc:
        raise PermissionDenied(NOT_ADMIN) from exc
    return actor


def _link_days() -> int:
    return max(1, round(settings.PASSWORD_RESET_TIMEOUT / 86400))


def _link(request: HttpRequest, invited: services.InvitedPerson | None) -> str:
    return request.build_absolute_uri(invited.set_password_path) if invited else ""


@dashboard_view
@never_cache
@require_http_methods(["GET", "POST"])
def people(request: HttpRequest) -> HttpResponse:
    actor = _admin(request, "web.people")
    form = PersonInviteForm(request.POST if request.method == "POST" else None)
    done: Outcome[services.InvitedPerson] = Outcome()
    if request.method == "POST" and form.is_valid():
        done = call_service(request, lambda: services.person_invite(
            actor=actor, username=form.cleaned_data["username"],
            email=form.cleaned_data["email"], role_names=form.cleaned_data["roles"],
        ), form=form)
        if done.result is not None:
            form = PersonInviteForm()
    people_rows = [(person, selectors.person_roles(person)) for person in selectors.person_list()]
    return render(request, "accounts/people.html", {
        "form": form, "invited": done.result, "invite_link": _link(request, done.result),
        "people": people_rows, "me": request.user, "link_days": _link_days(),
    }, status=done.status)


@dashboard_view
@never_cache
@require_http_methods(["GET", "POST"])
def person(request: HttpRequest, username: str) -> HttpResponseBase:
    """One person: their roles (the form), enable/disable, a new set-password link."""
    actor = _admin(request, "web.people")
    found = get_or_404(selectors.person_get, username=username,
                       what=f"person named {username!r}")
    held = selectors.person_roles(found)
    form = PersonRolesForm(request.POST if request.method == "POST" else None,
                           initial={"roles": held})

    return form_page(
        request, form, lambda data: services.user_set_roles(
            actor=actor, username=username, role_names=data["roles"]),
        template="accounts/person.html", context=lambda: _person_context(request, found),
        success=lambda _user: f"Roles of {username}: "
                              f"{', '.join(form.cleaned_data['roles']) or 'none'}.",
        then=lambda _user: reverse("people:detail", args=[username]), flash_refusals=True)


def _person_context(request: HttpRequest, found: Any, *, link: str = "") -> dict[str, Any]:
    """The person page but its roles form: roles, tokens, history, a set-password link."""
    events = object_history(object_type=found._meta.label_lower, object_id=found.pk,
                            limit=HISTORY_SHOWN)
    history = [(event, _changes(event.before, event.after)) for event in events]
    return {
        "person": found, "roles": selectors.person_roles(found),
        "tokens": selectors.token_list_for_user(user=found), "history": history,
        "is_me": found.pk == request.user.pk, "link": link, "link_days": _link_days(),
    }


@dashboard_view
@require_POST
def person_active(request: HttpRequest, username: str) -> HttpResponse:
    actor = _admin(request, "web.people")
    active = request.POST.get("active")
    if active not in ("0", "1"):
        messages.error(request, "Say whether to enable (active=1) or disable (active=0).")
        return redirect("people:detail", username=username)
    done = call_service(request, lambda: services.person_set_active(
        actor=actor, username=username, active=active == "1"))
    if done.result is not None:
        messages.success(request, f"{username} is {'enabled' if active == '1' else 'disabled'}"
                         + ("." if active == "1" else
                            ": they cannot sign in and their tokens answer 401."))
    return redirect("people:detail", username=username)


@dashboard_view
@never_cache
@require_POST
def person_link(request: HttpRequest, username: str) -> HttpResponse:
    actor = _admin(request, "web.people")
    found = get_or_404(selectors.person_get, username=username,
                       what=f"person named {username!r}")
    done = call_service(request, lambda: services.person_set_password_link(
        actor=actor, username=username))
    if done.result is None:
        return redirect("people:detail", username=username)
    form = PersonRolesForm(initial={"roles": selectors.person_roles(found)})
    return render(request, "accounts/person.html", {
        "form": form, **_person_context(request, found, link=_link(request, done.result))})


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "—" if value in (None, "") else str(value)


def _changes(before: Any, after: Any) -> list[tuple[str, str, str]]:
    """What an audit event changed, field by field: (field, before, after)."""
    before, after = before or {}, after or {}
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    fields = [name for name in dict.fromkeys([*before, *after]) if name != "id"]
    return [(name, _shown(before.get(name)) if before else "", _shown(after.get(name)))
            for name in fields if not before or before.get(name) != after.get(name)]


class SetPasswordView(PasswordResetConfirmView):
    """Where an invited person (or one given a new link) chooses their password. A disabled
    person's link does not work."""

    template_name = "accounts/set_password.html"
    success_url = reverse_lazy("login")
    token_generator = default_token_generator

    def get_user(self, uidb64: str) -> Any:
        user = super().get_user(uidb64)
        return user if user is not None and user.is_active else None

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        messages.success(self.request, "Your password is set. Sign in with it.")
        return response
