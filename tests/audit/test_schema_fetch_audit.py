"""Reading the API's description is not a request for any of its data: fetching the schema
or opening the docs page writes no audit event, whoever asks. A real refusal still does."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleetctl.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

SCHEMA_FORMATS = ["application/vnd.oai.openapi+json", "application/vnd.oai.openapi"]


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
    before = AuditEvent.objects.count()
    for accept in SCHEMA_FORMATS:
        response = client.get("/api/schema/", HTTP_ACCEPT=accept)
        assert response.status_code == 200, response.content[:300]
    assert client.get("/api/docs/").status_code == 200
    new = list(AuditEvent.objects.order_by("pk")[before:].values_list("action", "outcome"))
    assert new == [], new


def test_a_real_list_by_a_viewer_is_still_refused_and_audited(client_for):
    viewer = client_for("viewer")
    before = AuditEvent.objects.count()
    response = viewer.get("/api/v1/service-tokens/")
    assert response.status_code == 403
    denied = AuditEvent.objects.filter(pk__gt=0).order_by("pk")[before:]
    assert [(e.action, e.outcome) for e in denied] == [("token.list_service", "denied")]
