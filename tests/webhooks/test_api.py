"""/api/v1/webhooks/: scopes, the write-only secret, 400s a person can act on, deliveries."""

from __future__ import annotations

import pytest

from fleetctl.webhooks.models import Delivery, Webhook
from fleetctl.webhooks.services import delivery_attempt, notify
from tests.webhooks.conftest import Receiver

pytestmark = pytest.mark.django_db
BASE = "/api/v1/webhooks/"


@pytest.fixture
def lead(token_client):
    return token_client(["fleet", "read"], "platform-lead")


def test_create_read_update_delete_with_a_write_only_secret(lead, receiver: Receiver):
    made = lead.post(BASE, {"name": "oncall", "url": receiver.url, "events": ["gate.changed"],
                            "format": "slack", "secret": "s3cret"}, format="json")
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["has_secret"] is True and "secret" not in body
    assert body["created_by"].startswith("tok-")

    listed = lead.get(BASE).json()["results"]
    assert [(h["name"], h["has_secret"]) for h in listed] == [("oncall", True)]
    assert "s3cret" not in str(listed)

    changed = lead.patch(f"{BASE}oncall/", {"secret": "", "active": False}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["has_secret"] is False and changed.json()["active"] is False

    assert lead.delete(f"{BASE}oncall/").status_code == 204
    assert not Webhook.objects.exists()


def test_bad_input_is_a_400_naming_the_field_and_nothing_is_stored(lead):
    bad = lead.post(BASE, {"name": "x", "url": "file:///etc/passwd",
                           "events": ["ramp.decided"]}, format="json")
    assert bad.status_code == 400
    text = str(bad.json())
    assert "http:// or https://" in text and "Unknown event(s): ramp.decided" in text
    assert not Webhook.objects.exists()


def test_read_scope_reads_fleet_scope_writes(token_client, lead, receiver: Receiver):
    lead.post(BASE, {"name": "oncall", "url": receiver.url}, format="json")
    reader = token_client(["read"], "platform-lead")
    assert reader.get(f"{BASE}oncall/").status_code == 200
    refused = reader.post(BASE, {"name": "other", "url": receiver.url}, format="json")
    assert refused.status_code == 403
    assert reader.post(f"{BASE}oncall/test/").status_code == 403
    assert Webhook.objects.count() == 1


def test_deliveries_with_attempts_and_a_test_delivery(lead, receiver: Receiver):
    lead.post(BASE, {"name": "oncall", "url": receiver.url}, format="json")
    receiver.answer(500)
    [first] = notify("drain.automatic", {"pool": "p"}, text="pool p drained")
    delivery_attempt(delivery_id=first)
    delivery_attempt(delivery_id=first)

    sent = lead.post(f"{BASE}oncall/test/")
    assert sent.status_code == 202
    test_id = sent.json()["id"]
    assert Delivery.objects.get(pk=test_id).event == "webhook.test"
    delivery_attempt(delivery_id=test_id)

    rows = lead.get(f"{BASE}oncall/deliveries/").json()["results"]
    assert [(r["event"], r["status"]) for r in rows] == [
        ("webhook.test", "delivered"), ("drain.automatic", "delivered")]
    assert [a["status_code"] for a in rows[1]["attempt_rows"]] == [500, 200]
    assert receiver.requests[-1].json()["event"] == "webhook.test"
