"""People and roles: the services (audit rows, the last-admin guard), the API (each bad input
answers 400 and changes nothing), a disabled person (no sign-in, no session, tokens 401), the
one-time set-password link, and a token that revokes itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from fleetctl.accounts import services
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.models import ApiToken
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-only"


def roles_of(username: str) -> list[str]:
    return sorted(User.objects.get(username=username).groups.values_list("name", flat=True))


@pytest.fixture
def admin(make_user: Callable[..., User]) -> User:
    return make_user("ada", "admin")


@pytest.fixture
def admin_api(admin: User) -> APIClient:
    client = APIClient()
    client.force_login(admin)
    return client


# --- services ---------------------------------------------------------------------------------

def test_invite_makes_a_person_without_a_password_and_audits_it(admin: User):
    invited = services.person_invite(actor=Actor(user=admin), username="bo",
                                     email="bo@example.org", role_names=["on-call", "viewer"])
    user = User.objects.get(username="bo")
    assert not user.has_usable_password() and user.is_active
    assert roles_of("bo") == ["on-call", "viewer"]
    assert invited.set_password_path.startswith("/account/set-password/")
    event = AuditEvent.objects.get(action="person.invite")
    assert event.actor == "ada" and event.outcome == "ok" and event.object_id == str(user.pk)
    assert event.after["roles"] == ["on-call", "viewer"]
    assert event.after["email"] == "bo@example.org" and event.after["is_active"] is True


@pytest.mark.parametrize(("username", "email", "role_names", "field"), [
    ("", "x@example.org", ["viewer"], "username"),
    ("has space", "x@example.org", ["viewer"], "username"),
    ("ADA", "x@example.org", ["viewer"], "username"),  # taken, whatever the case
    ("new", "not-an-email", ["viewer"], "email"),
    ("new", "", ["viewer"], "email"),
    ("new", "x@example.org", [], "roles"),
    ("new", "x@example.org", ["root"], "roles"),
])
def test_invite_refuses_bad_input_and_makes_no_one(admin: User, username: str, email: str,
                                                    role_names: list[str], field: str):
    before = User.objects.count()
    with pytest.raises(ValidationError) as raised:
        services.person_invite(actor=Actor(user=admin), username=username, email=email,
                               role_names=role_names)
    assert field in raised.value.message_dict
    assert User.objects.count() == before
    assert not AuditEvent.objects.filter(action="person.invite").exists()


def test_a_non_admin_cannot_invite_and_the_refusal_is_audited(make_user: Callable[..., User]):
    lead = make_user("lee", "platform-lead")
    with pytest.raises(PermissionDeniedError):
        services.person_invite(actor=Actor(user=lead), username="x", email="x@example.org",
                               role_names=["admin"])
    assert not User.objects.filter(username="x").exists()
    assert AuditEvent.objects.get(action="person.invite").outcome == "denied"


def test_set_roles_audits_before_and_after(admin: User, make_user: Callable[..., User]):
    make_user("cy", "viewer")
    services.user_set_roles(actor=Actor(user=admin), username="cy",
                            role_names=["on-call", "platform-lead"])
    assert roles_of("cy") == ["on-call", "platform-lead"]
    event = AuditEvent.objects.get(action="user.set_roles")
    assert event.before == {"roles": ["viewer"]}
    assert event.after == {"roles": ["on-call", "platform-lead"]}


def test_the_last_admin_keeps_the_admin_role(admin: User, make_user: Callable[..., User]):
    with pytest.raises(ConflictError, match="last active admin"):
        services.user_set_roles(actor=Actor(user=admin), username="ada", role_names=["viewer"])
    assert roles_of("ada") == ["admin"]
    assert not AuditEvent.objects.filter(action="user.set_roles").exists()
    # A disabled admin does not count: with only one *active* admin the guard still holds.
    other = make_user("eve", "admin")
    services.person_set_active(actor=Actor(user=admin), username="eve", active=False)
    with pytest.raises(ConflictError):
        services.user_set_roles(actor=Actor(user=admin), username="ada", role_names=[])
    # With a second active admin, the first may step down.
    services.person_set_active(actor=Actor(user=admin), username="eve", active=True)
    services.user_set_roles(actor=Actor(user=admin), username="ada", role_names=["viewer"])
    assert roles_of("ada") == ["viewer"] and roles_of(other.username) == ["admin"]


def test_an_admin_cannot_disable_themselves_nor_the_last_admin(admin: User):
    with pytest.raises(ConflictError, match="cannot disable yourself"):
        services.person_set_active(actor=Actor(user=admin), username="ada", active=False)
    with pytest.raises(ConflictError, match="last active admin"):
        services.person_set_active(actor=Actor.for_system("test"), username="ada", active=False)
    assert User.objects.get(username="ada").is_active


def test_disable_and_enable_are_audited_and_keep_the_history(admin: User,
                                                            make_user: Callable[..., User]):
    bo = make_user("bo", "on-call")
    issued = token_create_personal(actor=Actor(user=bo), name="cli", scopes=["read"])
    services.person_set_active(actor=Actor(user=admin), username="bo", active=False)
    services.person_set_active(actor=Actor(user=admin), username="bo", active=True)
    events = list(AuditEvent.objects.filter(object_id=str(bo.pk), object_type="auth.user")
                  .order_by("at").values_list("action", "before", "after"))
    assert [e[0] for e in events] == ["person.disable", "person.enable"]
    assert events[0][1]["is_active"] is True and events[0][2]["is_active"] is False
    assert ApiToken.objects.get(pk=issued.token.pk).revoked_at is None  # the token row stays


def test_person_update_changes_both_or_neither(admin: User, make_user: Callable[..., User]):
    make_user("bo", "viewer")
    with pytest.raises(ConflictError):
        services.person_update(actor=Actor(user=admin), username="ada",
                               role_names=["admin", "viewer"], active=False)
    assert roles_of("ada") == ["admin"]  # the role change rolled back with the refusal


# --- API --------------------------------------------------------------------------------------

def test_api_lists_people_for_admins_only(admin_api: APIClient, client_for: Any,
                                          token_client: Any, admin: User):
    token_create_personal(actor=Actor(user=admin), name="cli", scopes=["read"])
    body = admin_api.get("/api/v1/people/").json()
    ada = next(p for p in body["results"] if p["username"] == "ada")
    assert ada["roles"] == ["admin"] and ada["active"] is True
    assert ada["tokens_active"] == 1 and ada["has_password"] is True
    assert admin_api.get("/api/v1/people/ada/").json()["username"] == "ada"
    assert client_for("platform-lead").get("/api/v1/people/").status_code == 403
    with_token = token_client(["read", "fleet"], "admin")
    refused = with_token.get("/api/v1/people/")
    assert refused.status_code == 403
    assert "cannot be done with an API token" in refused.json()["error"]["message"]


def test_api_invite_answers_a_one_time_link(admin_api: APIClient):
    response = admin_api.post("/api/v1/people/", {
        "username": "bo", "email": "bo@example.org", "roles": ["on-call"]}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["roles"] == ["on-call"] and body["has_password"] is False
    assert body["set_password_url"].startswith("http://testserver/account/set-password/")


@pytest.mark.parametrize(("payload", "field"), [
    ({"email": "x@example.org", "roles": ["viewer"]}, "username"),
    ({"username": "x", "email": "nope", "roles": ["viewer"]}, "email"),
    ({"username": "x", "email": "x@example.org", "roles": ["root"]}, "roles"),
    ({"username": "x", "email": "x@example.org", "roles": []}, "roles"),
    ({"username": "x", "email": "x@example.org", "roles": "admin"}, "roles"),
    ({"username": "ada", "email": "x@example.org", "roles": ["viewer"]}, "username"),
    ({"username": "a b", "email": "x@example.org", "roles": ["viewer"]}, "username"),
    ({"username": "x", "email": "x@example.org", "roles": ["viewer"], "is_superuser": True},
     "is_superuser"),
])
def test_api_invite_bad_input_is_400_and_changes_nothing(admin_api: APIClient,
                                                         payload: dict[str, Any], field: str):
    before = User.objects.count()
    response = admin_api.post("/api/v1/people/", payload, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"] and error["message"]
    assert User.objects.count() == before


@pytest.mark.parametrize(("payload", "field"), [
    ({}, None),
    ({"roles": ["root"]}, "roles"),
    ({"roles": "viewer"}, "roles"),
    ({"active": "maybe"}, "active"),
    ({"is_staff": True}, "is_staff"),
])
def test_api_patch_bad_input_is_400_and_changes_nothing(
        admin_api: APIClient, make_user: Callable[..., User], payload: dict[str, Any],
        field: str | None):
    make_user("bo", "viewer")
    response = admin_api.patch("/api/v1/people/bo/", payload, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"]
    if field:
        assert field in error["fields"]
    bo = User.objects.get(username="bo")
    assert roles_of("bo") == ["viewer"] and bo.is_active and not bo.is_staff


def test_api_patch_sets_roles_and_active(admin_api: APIClient, make_user: Callable[..., User]):
    make_user("bo", "viewer")
    response = admin_api.patch("/api/v1/people/bo/", {"roles": ["on-call"], "active": False},
                               format="json")
    assert response.status_code == 200, response.content
    assert response.json()["roles"] == ["on-call"] and response.json()["active"] is False
    assert {e.action for e in AuditEvent.objects.filter(outcome="ok")} >= {
        "user.set_roles", "person.disable"}
    assert admin_api.patch("/api/v1/people/nobody/", {"active": True},
                           format="json").status_code == 404


def test_api_refuses_self_disable_and_removing_the_last_admin_with_409(admin_api: APIClient):
    response = admin_api.patch("/api/v1/people/ada/", {"active": False}, format="json")
    assert response.status_code == 409
    assert "cannot disable yourself" in response.json()["error"]["message"]
    response = admin_api.patch("/api/v1/people/ada/", {"roles": ["viewer"]}, format="json")
    assert response.status_code == 409
    assert "last active admin" in response.json()["error"]["message"]
    assert roles_of("ada") == ["admin"] and User.objects.get(username="ada").is_active


# --- a disabled person ------------------------------------------------------------------------

def test_a_disabled_person_cannot_sign_in_loses_their_session_and_tokens(
        admin: User, make_user: Callable[..., User]):
    bo = make_user("bo", "on-call", password=PASSWORD)
    secret = token_create_personal(actor=Actor(user=bo), name="cli", scopes=["read"]).secret
    session = Client()
    assert session.post("/login/", {"username": "bo", "password": PASSWORD}).status_code == 302
    assert session.get("/").status_code == 200
    bearer = {"Authorization": f"Bearer {secret}"}
    assert Client().get("/api/v1/me/", headers=bearer).status_code == 200

    services.person_set_active(actor=Actor(user=admin), username="bo", active=False)

    assert session.get("/").status_code == 302  # the open session ends
    refused = Client().post("/login/", {"username": "bo", "password": PASSWORD})
    assert refused.status_code == 200 and refused.context["form"].errors
    failed = AuditEvent.objects.filter(action="auth.login_failed").get()
    assert failed.message == "Sign-in as 'bo' from 127.0.0.1 refused: the account is disabled."
    denied = Client().get("/api/v1/me/", headers=bearer)
    assert denied.status_code == 401
    assert "inactive" in denied.json()["error"]["message"]

    services.person_set_active(actor=Actor(user=admin), username="bo", active=True)
    assert Client().get("/api/v1/me/", headers=bearer).status_code == 200
    assert Client().post("/login/", {"username": "bo", "password": PASSWORD}).status_code == 302


# --- the one-time set-password link -------------------------------------------------------------

def test_the_set_password_link_works_once(admin: User):
    invited = services.person_invite(actor=Actor(user=admin), username="bo",
                                     email="bo@example.org", role_names=["viewer"])
    browser = Client()
    form_page = browser.get(invited.set_password_path, follow=True)
    assert form_page.status_code == 200 and form_page.context["validlink"]
    new_password = "a-long-and-unusual-passphrase-42"
    done = browser.post(form_page.redirect_chain[-1][0], {
        "new_password1": new_password, "new_password2": new_password})
    assert done.status_code == 302 and done["Location"] == "/login/"
    assert Client().post("/login/", {"username": "bo", "password": new_password}
                         ).status_code == 302
    again = Client().get(invited.set_password_path, follow=True)
    assert again.context["validlink"] is False
    assert "does not work" in again.content.decode()


def test_a_disabled_persons_link_does_not_work(admin: User):
    invited = services.person_invite(actor=Actor(user=admin), username="bo",
                                     email="bo@example.org", role_names=["viewer"])
    services.person_set_active(actor=Actor(user=admin), username="bo", active=False)
    page = Client().get(invited.set_password_path, follow=True)
    assert page.context["validlink"] is False
    with pytest.raises(ConflictError):
        services.person_set_password_link(actor=Actor(user=admin), username="bo")


# --- a token revokes itself ---------------------------------------------------------------------

@pytest.mark.parametrize("service", [False, True])
def test_a_token_revokes_itself_and_then_answers_401(make_user: Callable[..., User],
                                                     service: bool):
    if service:
        # Only `drain`: revoking itself needs no scope at all.
        issued = token_create_service(actor=Actor.for_system("test"), name="ci-bot",
                                      scopes=["drain"])
    else:
        user = make_user("bo", "viewer")
        issued = token_create_personal(actor=Actor(user=user), name="laptop", scopes=["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    if not service:
        assert client.get("/api/v1/tokens/current/").json()["prefix"] == issued.token.prefix
    response = client.delete("/api/v1/tokens/current/")
    assert response.status_code == 204, response.content
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.outcome == "ok" and event.token_prefix == issued.token.prefix
    assert event.actor == ("service:ci-bot" if service else "bo")
    assert event.before["revoked_at"] is None and event.after["revoked_at"]
    after = client.get("/api/v1/me/")
    assert after.status_code == 401 and "revoked" in after.json()["error"]["message"]
    assert client.delete("/api/v1/tokens/current/").status_code == 401


def test_revoking_the_current_token_without_a_token_is_400(client_for: Any):
    client = client_for("viewer")
    response = client.delete("/api/v1/tokens/current/")
    assert response.status_code == 400
    assert "not made with an API token" in response.json()["error"]["message"]
    assert not AuditEvent.objects.filter(action="token.revoke").exists()


@pytest.mark.slow
def test_two_admins_demoting_each_other_at_once_leave_one_admin(transactional_db: None,
                                                                make_user: Callable[..., User]):
    import threading

    from django.db import connection

    ada, eve = make_user("ada", "admin"), make_user("eve", "admin")
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def demote(actor: User, username: str) -> None:
        try:
            barrier.wait(timeout=30)
            services.user_set_roles(actor=Actor(user=actor), username=username,
                                    role_names=["viewer"])
            outcomes[username] = "demoted"
        except ConflictError:
            outcomes[username] = "refused"
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(ada, "eve")),
               threading.Thread(target=demote, args=(eve, "ada"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes.values()) == ["demoted", "refused"]
    admins = User.objects.filter(groups__name="admin", is_active=True)
    assert admins.count() == 1
