"""The audit log is append-only, however one tries."""

from __future__ import annotations

import csv
import io

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from fleetctl.audit.models import AuditEvent, AuditImmutableError

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(make_pool) -> AuditEvent:
    make_pool(name="h200-a")
    return AuditEvent.objects.get(action="pool.create")


def test_the_model_refuses_to_update_or_delete(event):
    event.actor = "someone-else"
    with pytest.raises(AuditImmutableError):
        event.save()
    with pytest.raises(AuditImmutableError):
        event.delete()
    with pytest.raises(AuditImmutableError):
        AuditEvent.objects.filter(pk=event.pk).update(actor="x")
    with pytest.raises(AuditImmutableError):
        AuditEvent.objects.filter(pk=event.pk).delete()


@pytest.mark.parametrize("sql", [
    "UPDATE audit_auditevent SET actor = 'rewritten'",
    "DELETE FROM audit_auditevent",
])
def test_the_database_refuses_raw_sql_too(event, sql):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute(sql)
    assert AuditEvent.objects.get(pk=event.pk).actor == "system:test"


def test_the_api_offers_no_way_to_change_an_event(client_for, event):
    admin = client_for("admin")
    url = f"/api/v1/audit-events/{event.pk}/"
    assert admin.get(url).status_code == 200
    assert admin.put(url, {"actor": "x"}, format="json").status_code == 405
    assert admin.patch(url, {"actor": "x"}, format="json").status_code == 405
    assert admin.delete(url).status_code == 405


def test_the_admin_site_cannot_change_or_delete_events(client_for, event):
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", password="pw-for-tests-only")
    from django.test import Client

    site = Client()
    site.login(username="root", password="pw-for-tests-only")
    assert site.get(f"/admin/audit/auditevent/{event.pk}/delete/").status_code == 403
    site.post(f"/admin/audit/auditevent/{event.pk}/change/", {"actor": "x"})
    assert AuditEvent.objects.get(pk=event.pk).actor == "system:test"


def test_events_filter_and_export_as_csv(client_for, make_pool):
    make_pool(name="a-pool")
    make_pool(name="b-pool")
    auditor = client_for("viewer")
    listed = auditor.get("/api/v1/audit-events/?action=pool.create").json()
    assert listed["count"] == 2
    response = auditor.get("/api/v1/audit-events/export/?action=pool.create")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert sorted(r["object_repr"] for r in rows) == ["a-pool", "b-pool"]
    assert all(r["actor"] == "system:test" for r in rows)
