"""Who may do what, through every door: session, personal token, service token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetctl.accounts.models import ApiToken
from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

NEW_POOL = {
    "runtime": "cuda", "accelerator": "A100", "region": "us-east",
    "base_urls": ["http://127.0.0.1:9999"], "max_context_tokens": 8192,
    "node_hourly_rate": "4.00",
}


def _create_pool(client, name: str) -> int:
    return client.post("/api/v1/pools/", {**NEW_POOL, "name": name}, format="json").status_code


@pytest.mark.parametrize(
    ("roles", "read", "write", "admin"),
    [
        ((), 403, 403, 403),
        (("viewer",), 200, 403, 403),
        (("on-call",), 200, 403, 403),
        (("platform-lead",), 200, 201, 403),
        (("admin",), 200, 201, 200),
    ],
)
def test_role_matrix_through_the_session(client_for, region, roles, read, write, admin):
    client = client_for(*roles)
    assert client.get("/api/v1/pools/").status_code == read
    assert _create_pool(client, "p-" + "-".join(roles or ("none",))) == write
    assert client.get("/api/v1/service-tokens/").status_code == admin


@pytest.mark.parametrize(
    ("scopes", "roles", "service", "read", "write"),
    [
        (["read"], ("platform-lead",), False, 200, 403),
        (["read", "fleet"], ("platform-lead",), False, 200, 201),
        (["read", "fleet"], ("viewer",), False, 200, 403),  # scope cannot exceed the role
        (["drain"], ("platform-lead",), False, 403, 403),
        (["read"], (), True, 200, 403),
        (["read", "fleet"], (), True, 200, 201),
        (["jobs", "ramp", "drain"], (), True, 403, 403),
    ],
)
def test_scope_matrix_through_tokens(token_client, region, scopes, roles, service, read, write):
    client = token_client(scopes, *roles, service=service)
    assert client.get("/api/v1/pools/").status_code == read
    assert _create_pool(client, f"p-{len(scopes)}-{int(service)}") == write


def test_a_refused_write_is_audited_with_who_and_what(client_for, region):
    viewer = client_for("viewer", username="vera")
    response = viewer.post("/api/v1/pools/", {**NEW_POOL, "name": "nope"}, format="json")
    assert response.status_code == 403
    assert "fleet.manage" in response.json()["error"]["message"]
    event = AuditEvent.objects.get(outcome="denied")
    assert (event.actor, event.action) == ("vera", "pool.create")


def test_a_refused_read_by_scope_is_audited(token_client):
    client = token_client(["drain"], service=True)
    assert client.get("/api/v1/pools/").status_code == 403
    event = AuditEvent.objects.get(outcome="denied")
    assert event.actor == "service:bot"
    assert event.token_prefix == client.token.prefix


def test_tokens_cannot_mint_tokens(token_client):
    client = token_client(["read", "jobs", "ramp", "drain", "fleet"], "admin")
    response = client.post("/api/v1/tokens/", {"name": "more", "scopes": ["read"]},
                           format="json")
    assert response.status_code == 403
    assert "sign in" in response.json()["error"]["message"]


def test_a_person_creates_a_token_sees_the_secret_once_and_only_a_hash_is_stored(client_for):
    client = client_for("on-call")
    response = client.post("/api/v1/tokens/", {"name": "laptop", "scopes": ["read", "drain"]},
                           format="json")
    assert response.status_code == 201
    secret = response.json()["secret"]
    token = ApiToken.objects.get()
    assert secret.startswith("fct_") and secret not in token.secret_sha256
    assert "secret" not in client.get(f"/api/v1/tokens/{token.pk}/").json()
    me = client.get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert me["permissions"] == ["drain", "read"]


@pytest.mark.parametrize(
    ("scopes", "message"),
    [([], "at least one"), (["read", "root"], "root"), ("read", "list")],
)
def test_bad_token_requests_say_what_is_wrong(client_for, scopes, message):
    client = client_for("viewer")
    response = client.post("/api/v1/tokens/", {"name": "x", "scopes": scopes}, format="json")
    assert response.status_code == 400
    assert message in response.json()["error"]["message"].lower() or message in str(
        response.json()["error"]["fields"]).lower()
    assert not ApiToken.objects.exists()


def test_expired_revoked_and_unknown_tokens_are_401(token_client, client_for):
    client = token_client(["read"], "viewer")
    ApiToken.objects.filter(pk=client.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert client.get("/api/v1/pools/").json()["error"]["message"] == "This API token has expired."
    other = token_client(["read"], "platform-lead")
    owner = client_for("admin")
    assert owner.delete(f"/api/v1/service-tokens/{other.token.pk}/").status_code in (204, 404)
    ApiToken.objects.filter(pk=other.token.pk).update(revoked_at=timezone.now())
    assert other.get("/api/v1/pools/").status_code == 401
    stranger = token_client(["read"], "viewer")
    stranger.credentials(HTTP_AUTHORIZATION="Bearer fct_nope")
    assert stranger.get("/api/v1/pools/").status_code == 401


def test_people_revoke_their_own_tokens_but_not_others(client_for, token_client):
    alice = client_for("viewer", username="alice")
    created = alice.post("/api/v1/tokens/", {"name": "a", "scopes": ["read"]}, format="json")
    token_id = created.json()["id"]
    bob = client_for("viewer", username="bob")
    assert bob.delete(f"/api/v1/tokens/{token_id}/").status_code == 404
    assert alice.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    assert ApiToken.objects.get(pk=token_id).revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoke", actor="alice").exists()
