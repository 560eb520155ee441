"""Guessing API tokens is throttled per client address (counted in Redis) and audited, without
ever storing what was presented beyond the short prefix every token shows."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.forms.models import model_to_dict
from rest_framework.test import APIClient

from fleetctl.accounts import throttle
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_revoke
from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

GUESSER = "198.51.100.30"
ELSEWHERE = "203.0.113.30"


@pytest.fixture(autouse=True)
def _fresh_counters():
    for ip in (GUESSER, ELSEWHERE):
        throttle.reset(ip)
    yield
    for ip in (GUESSER, ELSEWHERE):
        throttle.reset(ip)


def guess(api: APIClient, n: int):
    return api.get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer fct_guess{n:04d}-secret-part",
                   REMOTE_ADDR=GUESSER, HTTP_USER_AGENT="guesser/2.0")


def test_twenty_invalid_tokens_from_one_client_get_429_with_retry_after(api, settings):
    answers = [guess(api, n) for n in range(20)]
    assert [a.status_code for a in answers] == [401] * 10 + [429] * 10
    last = answers[-1]
    assert 0 < int(last["Retry-After"]) <= settings.API_AUTH_BLOCK_S
    error = last.json()["error"]
    assert error["code"] == "throttled"
    assert error["message"].startswith(f"Too many invalid API tokens from {GUESSER}; invalid "
                                       f"bearer tokens from this address are refused for ")


def test_a_blocked_address_still_gets_200_for_a_valid_token_and_429_for_an_invalid_one(
        api, token_client):
    for n in range(10):
        guess(api, n)
    valid = token_client(["read"], "viewer")

    assert valid.get("/api/v1/me/", REMOTE_ADDR=GUESSER).status_code == 200
    assert guess(api, 10).status_code == 429
    assert api.get("/api/v1/me/", HTTP_AUTHORIZATION="Bearer", REMOTE_ADDR=GUESSER
                   ).status_code == 429
    # Still blocked after the valid token went through: a success does not lift the block.
    assert guess(api, 11).status_code == 429
    assert valid.get("/api/v1/me/", REMOTE_ADDR=ELSEWHERE).status_code == 200

    call_command("api_auth_unblock", GUESSER)
    assert guess(api, 12).status_code == 401


def test_a_revoked_token_from_a_blocked_address_is_refused_like_an_unknown_one(
        api, token_client):
    revoked = token_client(["read"], "viewer")
    token_revoke(actor=Actor(user=revoked.token.user), token_id=revoked.token.pk)
    for n in range(10):
        guess(api, n)

    answer = revoked.get("/api/v1/me/", REMOTE_ADDR=GUESSER)

    assert answer.status_code == 429 and answer.json()["error"]["code"] == "throttled"


def test_a_valid_token_and_an_unknown_one_cost_the_same_queries_while_blocked(
        api, token_client):
    """Timing must not tell which tokens exist: both look the presented secret up before
    anything is decided (the valid one then also records its use, after the decision)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for n in range(10):
        guess(api, n)
    valid = token_client(["read"], "viewer")
    with CaptureQueriesContext(connection) as unknown_queries:
        assert guess(api, 10).status_code == 429
    with CaptureQueriesContext(connection) as valid_queries:
        assert valid.get("/api/v1/me/", REMOTE_ADDR=GUESSER).status_code == 200

    def lookups(captured):
        return [q["sql"] for q in captured.captured_queries
                if 'FROM "accounts_apitoken"' in q["sql"] and "secret_sha256" in q["sql"]]

    assert len(lookups(unknown_queries)) == len(lookups(valid_queries)) == 1
    # The unknown token's whole answer is that one lookup: nothing counted or audited.
    assert len(unknown_queries.captured_queries) == 1


def test_invalid_tokens_are_audited_with_a_short_prefix_and_never_the_secret(api):
    for n in range(12):
        guess(api, n)
    events = list(AuditEvent.objects.filter(action__startswith="auth.").order_by("id"))
    assert [e.action for e in events] == ["auth.token_failed"] * 10 + ["auth.token_throttled"]
    first = events[0]
    assert (first.actor, first.outcome, first.token_prefix) == ("anonymous", "denied",
                                                                 "fct_guess0")
    assert first.message == f"Unknown API token. (from {GUESSER})"
    assert first.after == {"ip_address": GUESSER, "user_agent": "guesser/2.0",
                           "failures_in_window": 1}
    assert f"10 invalid API tokens from {GUESSER} within 300 s" in events[-1].message
    stored = json.dumps([model_to_dict(e) for e in events], default=str)
    assert "secret-part" not in stored and "guess0001-" not in stored


def test_a_revoked_token_is_audited_against_the_token(token_client):
    revoked = token_client(["read"], "viewer")
    token_revoke(actor=Actor(user=revoked.token.user), token_id=revoked.token.pk)
    assert revoked.get("/api/v1/me/", REMOTE_ADDR=GUESSER).status_code == 401
    event = AuditEvent.objects.get(action="auth.token_failed")
    assert (event.object_type, event.object_id, event.token_prefix) == (
        "accounts.apitoken", str(revoked.token.pk), revoked.token.prefix)
    assert event.message == f"This API token was revoked. (from {GUESSER})"
