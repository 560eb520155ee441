"""The audit page lists, filters and pages the log; its CSV export holds the same rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.audit.services import audit_record
from fleetctl.fleet import services
from fleetctl.fleet.models import Pool

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


def export_rows(client: Client, params: dict[str, str]) -> list[dict[str, str]]:
    response = client.get(reverse("audit:export"), params)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="fleetctl-audit-')
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    return list(csv.DictReader(io.StringIO(body)))


def test_the_audit_page_shows_who_changed_what_with_a_compact_diff(
    login_as: LoginAs, viewer: User, lead: User, pool: Pool
):
    services.pool_update(actor=Actor(user=lead), pool=pool, accelerator="H200 NVL")
    html = login_as(viewer).get(reverse("audit:list")).content.decode()
    assert "pool.update" in html and lead.username in html
    assert '<span class="before">H200</span> → <span class="after">H200 NVL</span>' in html
    assert "pool.create" in html  # the fixture's, as a folded list of fields
    assert f"?object_type=fleet.pool&amp;object_id={pool.pk}" in html


def test_the_audit_page_filters_by_object_the_way_the_pool_page_links_to_it(
    login_as: LoginAs, viewer: User, pool: Pool, region
):
    other = services.pool_create(
        actor=Actor.for_system("test"), name="other-pool", runtime="tpu", accelerator="v5e",
        region=region, base_urls=["http://other:8000/v1"], max_context_tokens=8192,
        node_hourly_rate="1.00",
    )
    response = login_as(viewer).get(
        reverse("audit:list"), {"object_type": "fleet.pool", "object_id": str(pool.pk)}
    )
    events = [event for event, _, _ in response.context["rows"]]
    assert events and all(event.object_id == str(pool.pk) for event in events)
    assert other.name not in {event.object_repr for event in events}


def test_the_audit_page_pages_fifty_events_at_a_time(login_as: LoginAs, viewer: User):
    actor = Actor.for_system("test")
    for number in range(120):
        audit_record(actor=actor, action="test.bulk", message=f"event {number}")
    client = login_as(viewer)
    first = client.get(reverse("audit:list"), {"action": "test."})
    assert len(first.context["rows"]) == 50
    assert "page 1 of 3" in first.content.decode()
    last = client.get(reverse("audit:list"), {"action": "test.", "page": "3"})
    assert len(last.context["rows"]) == 20
    assert "action=test." in last.content.decode()  # page links keep the filters


def test_the_csv_export_holds_the_rows_and_honours_the_filters(
    login_as: LoginAs, viewer: User, lead: User, pool: Pool
):
    services.pool_update(actor=Actor(user=lead), pool=pool, accelerator="H200 NVL")
    client = login_as(viewer)
    everything = export_rows(client, {})
    assert len(everything) == AuditEvent.objects.count()
    assert {"pool.create", "pool.update", "pool_model.create"} <= {r["action"] for r in everything}

    updates = export_rows(client, {"action": "pool.update", "actor": lead.username})
    assert [row["action"] for row in updates] == ["pool.update"]
    assert '"accelerator": "H200 NVL"' in updates[0]["after"]
    assert updates[0]["object_id"] == str(pool.pk)


def test_the_export_link_carries_the_page_filters_but_not_the_page_number(
    login_as: LoginAs, viewer: User, pool: Pool
):
    html = login_as(viewer).get(
        reverse("audit:list"), {"action": "pool.", "outcome": "ok", "page": "1"}
    ).content.decode()
    assert f'href="{reverse("audit:export")}?action=pool.&amp;outcome=ok"' in html
