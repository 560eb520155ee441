"""The Tokens page: a new token's secret is shown once, and revoking works."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.services import token_create_personal
from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


def test_a_new_tokens_secret_is_shown_once_with_the_cli_usage(login_as: LoginAs, viewer: User):
    client = login_as(viewer)
    response = client.post(
        reverse("accounts:tokens"), {"name": "laptop CLI", "scopes": ["read"]}
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    secret = response.context["issued"].secret
    html = response.content.decode()
    assert html.count(secret) == 2  # the copy field and the CLI example
    assert "only time the secret is shown" in html
    assert "export FLEETCTL_URL=http://testserver" in html
    assert f"export FLEETCTL_TOKEN={secret}" in html and "fleetctl pools list" in html

    token = ApiToken.objects.get(user=viewer)
    assert token.name == "laptop CLI" and token.scopes == ["read"]
    later = client.get(reverse("accounts:tokens")).content.decode()
    assert secret not in later
    assert f"{token.prefix}…" in later and "laptop CLI" in later

    me = Client().get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 200


def test_an_expiry_date_means_through_the_end_of_that_day(login_as: LoginAs, viewer: User):
    day = date.today() + timedelta(days=30)
    login_as(viewer).post(
        reverse("accounts:tokens"),
        {"name": "ci", "scopes": ["read"], "expires_at": day.isoformat()},
    )
    token = ApiToken.objects.get(user=viewer)
    assert token.expires_at is not None
    assert token.expires_at.date() == day + timedelta(days=1)
    assert token.expires_at.hour == 0


def test_token_input_errors_are_shown_on_their_fields(login_as: LoginAs, viewer: User):
    response = login_as(viewer).post(
        reverse("accounts:tokens"),
        {"name": "old", "scopes": ["read"], "expires_at": "2001-01-01"},
    )
    assert response.status_code == 200
    assert "must be in the future" in " ".join(response.context["form"].errors["expires_at"])
    response = login_as(viewer).post(reverse("accounts:tokens"), {"name": "none"})
    assert "scopes" in response.context["form"].errors
    assert not ApiToken.objects.exists()


def test_revoking_a_token_stops_it_working(login_as: LoginAs, viewer: User):
    issued = token_create_personal(actor=Actor(user=viewer), name="ci", scopes=["read"])
    client = login_as(viewer)
    response = client.post(reverse("accounts:token-revoke", args=[issued.token.pk]))
    assert response.status_code == 302
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoke", outcome="ok").exists()
    page = client.get(reverse("accounts:tokens")).content.decode()
    assert "Revoked token ci" in page and "revoked" in page
    me = Client().get("/api/v1/me/", headers={"Authorization": f"Bearer {issued.secret}"})
    assert me.status_code == 401


def test_nobody_revokes_someone_elses_token_from_their_page(
    login_as: LoginAs, viewer: User, lead: User
):
    issued = token_create_personal(actor=Actor(user=lead), name="lead-cli", scopes=["read"])
    client = login_as(viewer)
    response = client.post(reverse("accounts:token-revoke", args=[issued.token.pk]))
    assert response.status_code == 302
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is None
    assert "needs a role that grants it" in client.get(response["Location"]).content.decode()
    assert "lead-cli" not in client.get(reverse("accounts:tokens")).content.decode()
