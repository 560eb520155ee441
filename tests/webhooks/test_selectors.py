"""The webhook list's "last delivery" column: each webhook's newest delivery, read in one
query that SQLite (the demo's database) runs as well as PostgreSQL -- no DISTINCT ON."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleetctl.webhooks import selectors
from fleetctl.webhooks.models import Delivery, Webhook

pytestmark = pytest.mark.django_db


def hook(name: str) -> Webhook:
    return Webhook.objects.create(name=name, url=f"https://hooks.example.com/{name}",
                                  created_by="test")


def delivery(webhook: Webhook, event: str, minutes_ago: float) -> Delivery:
    return Delivery.objects.create(webhook=webhook, event=event, payload={},
                                   created_at=timezone.now() - timedelta(minutes=minutes_ago))


def test_each_webhook_gets_its_newest_delivery_in_one_query_and_none_without_deliveries():
    ops, slack, quiet = hook("ops"), hook("slack"), hook("quiet")
    delivery(ops, "gate.changed", 30)
    newest_ops = delivery(ops, "ramp.decision", 1)
    delivery(ops, "batch.soak", 10)
    same_time = timezone.now() - timedelta(minutes=5)
    first = Delivery.objects.create(webhook=slack, event="gate.changed", payload={},
                                    created_at=same_time)
    second = Delivery.objects.create(webhook=slack, event="ramp.decision", payload={},
                                     created_at=same_time)

    with CaptureQueriesContext(connection) as queries:
        latest = selectors.deliveries_latest(webhooks=[ops, slack, quiet])

    assert len(queries.captured_queries) == 1
    assert latest[ops.pk] == newest_ops
    assert latest[slack.pk] == second and first.pk < second.pk  # a tie: the later row
    assert quiet.pk not in latest


def test_no_webhooks_no_deliveries():
    assert selectors.deliveries_latest(webhooks=[]) == {}
