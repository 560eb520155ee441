"""Deliveries to a real HTTP receiver on localhost: what is sent, how it is signed, and what
each kind of answer does to the delivery."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from fleetctl.audit.models import AuditEvent
from fleetctl.webhooks import services
from fleetctl.webhooks.models import Attempt, Delivery, Webhook
from tests.conftest import SYSTEM
from tests.webhooks.conftest import Receiver

pytestmark = pytest.mark.django_db


def _hook(url: str, **fields: object) -> Webhook:
    return services.webhook_create(actor=SYSTEM, name=str(fields.pop("name", "ops")), url=url,
                                   **fields)  # type: ignore[arg-type]


def test_notify_makes_a_delivery_per_subscribed_active_webhook(receiver: Receiver) -> None:
    every = _hook(receiver.url, name="every")
    drains = _hook(receiver.url, name="drains", events=["drain.automatic"])
    _hook(receiver.url, name="gates", events=["gate.changed"])
    _hook(receiver.url, name="off", active=False)

    ids = services.notify("drain.automatic", {"pool": "p1"}, text="pool p1 drained")

    assert sorted(Delivery.objects.filter(pk__in=ids).values_list("webhook_id", flat=True)) \
        == sorted([every.pk, drains.pk])
    assert receiver.requests == []  # sent by the task, after the commit


def test_an_unknown_event_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"unknown webhook event 'drain\.manual'"):
        services.notify("drain.manual", {}, text="x")


def test_delivered_json_body_headers_and_signature_verify(receiver: Receiver) -> None:
    _hook(receiver.url, secret="s3cret")
    [delivery_id] = services.notify("gate.changed", {"plan": "p"}, text="plan p moved")

    assert services.delivery_attempt(delivery_id=delivery_id) == "delivered"

    [got] = receiver.requests
    assert got.headers["X-Fleetctl-Event"] == "gate.changed"
    assert got.headers["X-Fleetctl-Delivery"] == str(delivery_id)
    expected = hmac.new(b"s3cret", got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(got.headers["X-Fleetctl-Signature"], f"sha256={expected}")
    body = got.json()
    assert body["event"] == "gate.changed" and body["delivery"] == delivery_id
    assert body["data"] == {"plan": "p"} and body["at"]
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == "delivered" and delivery.delivered_at is not None
    assert [(a.number, a.status_code) for a in delivery.attempt_rows.all()] == [(1, 200)]


def test_no_secret_no_signature_header(receiver: Receiver) -> None:
    _hook(receiver.url)
    [delivery_id] = services.notify("gate.changed", {}, text="t")
    services.delivery_attempt(delivery_id=delivery_id)
    assert "X-Fleetctl-Signature" not in receiver.requests[0].headers


def test_slack_format_posts_text_and_a_context_line(receiver: Receiver) -> None:
    _hook(receiver.url, format="slack")
    [delivery_id] = services.notify("drain.automatic", {"pool": "p1"},
                                    text="fleetctl drained pool p1")
    services.delivery_attempt(delivery_id=delivery_id)
    body = receiver.requests[0].json()
    assert body["text"] == "fleetctl drained pool p1"
    assert body["blocks"][1]["type"] == "context"
    assert "drain.automatic" in body["blocks"][1]["elements"][0]["text"]
    assert "data" not in body


def test_a_4xx_fails_at_once_without_retry(receiver: Receiver) -> None:
    _hook(receiver.url)
    receiver.answer(410)
    [delivery_id] = services.notify("gate.changed", {}, text="t")

    assert services.delivery_attempt(delivery_id=delivery_id) == "failed"
    # A second run of the task (a duplicate) sends nothing more.
    assert services.delivery_attempt(delivery_id=delivery_id) == "failed"

    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.next_attempt_at is None and delivery.attempts == 1
    assert "HTTP 410" in delivery.last_error and "not retried" in delivery.last_error
    assert len(receiver.requests) == 1


def test_a_5xx_is_retried_with_backoff_then_delivered(receiver: Receiver) -> None:
    _hook(receiver.url)
    receiver.answer(503, 500)
    [delivery_id] = services.notify("gate.changed", {}, text="t")

    assert services.delivery_attempt(delivery_id=delivery_id) == "retrying"
    first = Delivery.objects.get(pk=delivery_id)
    attempt = Attempt.objects.get(delivery_id=delivery_id, number=1)
    assert first.next_attempt_at == attempt.at + timedelta(seconds=5)
    assert services.delivery_attempt(delivery_id=delivery_id) == "retrying"
    attempt = Attempt.objects.get(delivery_id=delivery_id, number=2)
    assert Delivery.objects.get(pk=delivery_id).next_attempt_at \
        == attempt.at + timedelta(seconds=30)
    assert services.delivery_attempt(delivery_id=delivery_id) == "delivered"

    codes = list(Attempt.objects.filter(delivery_id=delivery_id)
                 .values_list("status_code", flat=True))
    assert codes == [503, 500, 200]


def test_429_and_no_answer_are_retried_and_attempts_run_out(receiver: Receiver) -> None:
    hook = _hook(receiver.url)
    receiver.answer(429)
    [delivery_id] = services.notify("gate.changed", {}, text="t")
    assert services.delivery_attempt(delivery_id=delivery_id) == "retrying"

    # Nothing listens on the receiver's port once it is closed: no answer at all.
    Webhook.objects.filter(pk=hook.pk).update(url="http://127.0.0.1:9/hook")
    statuses = [services.delivery_attempt(delivery_id=delivery_id)
                for _ in range(len(services.RETRY_DELAYS_S))]
    assert statuses == ["retrying"] * (len(services.RETRY_DELAYS_S) - 1) + ["failed"]
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == len(services.RETRY_DELAYS_S) + 1
    assert "gave up after 6 attempts" in delivery.last_error
    assert "could not connect" in delivery.last_error


def test_create_refuses_bad_urls_and_unknown_events() -> None:
    with pytest.raises(ValidationError) as bad:
        services.webhook_create(actor=SYSTEM, name="x", url="ftp://example.com/",
                                events=["gate.changd"])
    assert "http:// or https://" in bad.value.message_dict["url"][0]
    assert "Unknown event(s): gate.changd" in bad.value.message_dict["events"][0]
    assert not Webhook.objects.exists()


def test_the_secret_never_reaches_the_audit_log(receiver: Receiver) -> None:
    hook = _hook(receiver.url, secret="do-not-log-me")
    services.webhook_update(actor=SYSTEM, webhook=hook, secret="new-one-also-secret")
    services.webhook_delete(actor=SYSTEM, webhook=Webhook.objects.get(pk=hook.pk))
    events = AuditEvent.objects.filter(action__startswith="webhook.")
    assert [e.action for e in events.order_by("at", "pk")] == [
        "webhook.create", "webhook.update", "webhook.delete"]
    dump = " ".join(f"{e.before} {e.after} {e.message}" for e in events)
    assert "do-not-log-me" not in dump and "new-one-also-secret" not in dump
    assert "has_secret" in dump


def test_prune_removes_deliveries_older_than_30_days(receiver: Receiver) -> None:
    _hook(receiver.url)
    [old] = services.notify("gate.changed", {}, text="t")
    [new] = services.notify("gate.changed", {}, text="t")
    Delivery.objects.filter(pk=old).update(created_at=Delivery.objects.get(pk=old).created_at
                                           - timedelta(days=31))
    assert services.deliveries_prune() == 1
    assert list(Delivery.objects.values_list("pk", flat=True)) == [new]
