"""Reading the API's description is not a request for any of its data: fetching the schema
or opening the docs page writes no audit event, whoever asks — including for a view that
checks a permission when asked for its queryset (tests/audit/schema_probe_urls.py adds one
to the project's URLs, as a view added later might). A real refusal is still audited."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

SCHEMA_FORMATS = ["application/vnd.oai.openapi+json", "application/vnd.oai.openapi"]


@pytest.fixture(autouse=True)
def probe_urls(settings):
    settings.ROOT_URLCONF = "tests.audit.schema_probe_urls"


def _new_events(since: int) -> list[tuple[str, str]]:
    return list(AuditEvent.objects.filter(pk__gt=since).order_by("pk")
                .values_list("action", "outcome"))


def _last_pk() -> int:
    return AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


@pytest.fixture
def callers(client_for, token_client):
    return {
        "anonymous": APIClient(),
        "no role": client_for(username="nobody"),
        "viewer": client_for("viewer"),
        "admin": client_for("admin"),
        "viewer token": token_client(["read"], "viewer"),
        "service token (jobs only)": token_client(["jobs"], service=True),
    }


@pytest.mark.parametrize("who", ["anonymous", "no role", "viewer", "admin", "viewer token",
                                 "service token (jobs only)"])
def test_fetching_the_schema_and_the_docs_writes_no_audit_event(callers, who):
    client = callers[who]
    since = _last_pk()
    for accept in SCHEMA_FORMATS:
        response = client.get("/api/schema/", HTTP_ACCEPT=accept)
        assert response.status_code == 200, response.content[:300]
    schema = client.get("/api/schema/", HTTP_ACCEPT=SCHEMA_FORMATS[0]).json()
    assert "/api/v1/guarded/{id}/" in schema["paths"]
    assert "/api/v1/service-tokens/" in schema["paths"]
    assert client.get("/api/docs/").status_code == 200
    assert _new_events(since) == []


def test_a_real_list_is_still_refused_and_audited(client_for):
    viewer = client_for("viewer")
    since = _last_pk()
    assert viewer.get("/api/v1/service-tokens/").status_code == 403
    assert viewer.get("/api/v1/guarded/").status_code == 403
    assert _new_events(since) == [("token.list_service", "denied"),
                                  ("guarded.list", "denied")]
