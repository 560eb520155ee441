"""Guessing a password is throttled and every failed sign-in is audited (django-axes behind
Django's LoginView and the admin's login, both real requests through the middleware)."""

from __future__ import annotations

import json

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.forms.models import model_to_dict
from django.test import Client

from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

RIGHT = "the-right-password-42"
WRONG = "hunter2-guess-{}"


def sign_in(client: Client, username: str, password: str, *, path: str = "/login/"):
    return client.post(path, {"username": username, "password": password})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def auth_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action__startswith="auth.").order_by("id"))


def test_the_right_password_after_five_wrong_ones_is_refused_and_the_lockout_is_audited(
        make_user):
    make_user("lead", "platform-lead", password=RIGHT)
    client = Client(REMOTE_ADDR="198.51.100.20", HTTP_USER_AGENT="guesser/1.0")
    answers = [sign_in(client, "lead", WRONG.format(i)).status_code for i in range(5)]
    assert answers == [200, 200, 200, 200, 429]  # the fifth failure already locks

    refused = sign_in(client, "lead", RIGHT)
    assert refused.status_code == 429 and not signed_in(client)
    page = refused.content.decode()
    assert "Too many failed sign-ins as lead from this address." in page
    assert "Try again after" in page and "axes_reset_username lead" in page
    assert 14 * 60 < int(refused["Retry-After"]) <= 15 * 60

    events = auth_events()
    assert [e.action for e in events] == ["auth.login_failed"] * 5 + [
        "auth.lockout", "auth.login_failed"]
    assert {e.outcome for e in events} == {"denied"}
    lockout = events[5]
    assert lockout.object_type == "auth.user" and lockout.object_repr == "lead"
    assert lockout.after == {"username": "lead", "ip_address": "198.51.100.20",
                             "user_agent": "guesser/1.0"}
    assert "after 5 failed sign-ins until" in lockout.message
    assert "refused: locked out until" in events[6].message


def test_failed_sign_ins_are_audited_with_username_address_and_agent_but_never_the_password(
        make_user):
    make_user("oncall", "on-call", password=RIGHT)
    client = Client(REMOTE_ADDR="198.51.100.21", HTTP_USER_AGENT="Mozilla/5.0 (test)")
    sign_in(client, "oncall", "hunter2-never-stored")
    sign_in(client, "nobody-by-that-name", "hunter2-never-stored")
    sign_in(client, "oncall", "hunter2-never-stored", path="/admin/login/")

    events = auth_events()
    assert [(e.action, e.actor, e.object_repr) for e in events] == [
        ("auth.login_failed", "anonymous", "oncall"),
        ("auth.login_failed", "anonymous", "nobody-by-that-name"),
        ("auth.login_failed", "anonymous", "oncall"),
    ]
    assert events[0].message == "Wrong username or password for 'oncall' from 198.51.100.21."
    assert events[0].after == {"username": "oncall", "ip_address": "198.51.100.21",
                               "user_agent": "Mozilla/5.0 (test)"}
    assert events[1].object_type == ""  # no such person: only the name that was tried
    stored = json.dumps([model_to_dict(e) for e in events], default=str)
    stored += json.dumps([model_to_dict(a) for a in AccessAttempt.objects.all()], default=str)
    assert "hunter2" not in stored


def test_the_lockout_is_per_username_and_address_and_an_admin_can_lift_it(make_user):
    make_user("lead", "platform-lead", password=RIGHT)
    make_user("lead2", "platform-lead", password=RIGHT)
    guesser = Client(REMOTE_ADDR="198.51.100.22")
    for i in range(5):
        sign_in(guesser, "lead", WRONG.format(i))
    assert sign_in(guesser, "lead", RIGHT).status_code == 429

    colleague = Client(REMOTE_ADDR="198.51.100.22")  # same address, another person
    sign_in(colleague, "lead2", RIGHT)
    assert signed_in(colleague)
    elsewhere = Client(REMOTE_ADDR="203.0.113.9")  # the same person from another address
    sign_in(elsewhere, "lead", RIGHT)
    assert signed_in(elsewhere)

    call_command("axes_reset_ip_username", "198.51.100.22", "lead")
    sign_in(guesser, "lead", RIGHT)
    assert signed_in(guesser)


def test_a_successful_sign_in_forgets_earlier_typos(make_user):
    make_user("viewer", "viewer", password=RIGHT)
    client = Client(REMOTE_ADDR="198.51.100.23")
    for i in range(4):
        sign_in(client, "viewer", WRONG.format(i))
    sign_in(client, "viewer", RIGHT)
    assert signed_in(client)
    client.post("/logout/")
    for i in range(4):
        assert sign_in(client, "viewer", WRONG.format(i)).status_code == 200
    sign_in(client, "viewer", RIGHT)
    assert signed_in(client)
