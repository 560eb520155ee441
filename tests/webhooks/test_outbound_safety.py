"""Webhooks reach only where a webhook may go (fleetctl/core/destinations.py), say nothing
of what an untrusted receiver answers, and show their URL whole only to those who manage
them. The attack of issue 25: a `fleet` token pointing a webhook at the gateway's admin API
(`/runtime_modify`, `/quitquitquit`), the metadata service or the web's own API."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetctl.audit.models import AuditEvent
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.traffic.services import gateway_create
from fleetctl.webhooks.models import Attempt, Delivery, Webhook
from fleetctl.webhooks.services import delivery_attempt, webhook_create, webhook_test
from tests.conftest import SYSTEM
from tests.webhooks.conftest import Receiver

pytestmark = pytest.mark.django_db
BASE = "/api/v1/webhooks/"
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


@pytest.fixture
def strict(settings: Any) -> None:
    """Production's default: no network allow-listed for webhooks."""
    settings.OUTBOUND_ALLOWED_NETWORKS = {"pools": LOOPBACK, "gateways": LOOPBACK,
                                          "webhooks": []}


@pytest.fixture
def fleet_token(token_client):
    return token_client(["fleet", "read"], "platform-lead")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9901/quitquitquit", "http://localhost:6379/", "http://0.0.0.0:8000/",
    "http://169.254.169.254/latest/meta-data/iam/", "http://[fd00:ec2::254]/latest/",
    "http://[::ffff:127.0.0.1]:9901/", "http://2130706433:9901/", "http://127.1:9901/",
])
def test_a_fleet_token_cannot_point_a_webhook_at_this_host_or_metadata(
        strict: None, fleet_token, url: str) -> None:
    answer = fleet_token.post(BASE, {"name": "evil", "url": url}, format="json")
    assert answer.status_code == 400, answer.json()
    assert "url" in answer.json()["errors"] if "errors" in answer.json() else "url" in str(
        answer.json())
    assert not Webhook.objects.exists()
    refused = AuditEvent.objects.filter(action="webhook.create", outcome="denied")
    assert refused.count() == 1
    # The audit log, read by every role, keeps no receiver path.
    assert "quitquitquit" not in refused.get().message and "iam" not in refused.get().message


def test_the_gateways_admin_api_is_refused_even_where_loopback_is_allowed(
        tmp_path: Path, fleet_token, receiver: Receiver) -> None:
    """`make test` allows loopback for webhooks (its receivers run here), as an operator
    might: a registered gateway's admin API stays out of reach. Envoy keeps running and its
    runtime unchanged."""
    envoy = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    try:
        gateway_create(actor=SYSTEM, name="edge", kind="envoy", admin_address=envoy.admin_url,
                       options={"config_dir": str(envoy.workdir)})
        admin = envoy.admin_url.replace("127.0.0.1", "localhost")
        for url in (f"{envoy.admin_url}/runtime_modify?fleetctl.x=10000",
                    f"{admin}/quitquitquit"):
            answer = fleet_token.post(BASE, {"name": "evil", "url": url}, format="json")
            assert answer.status_code == 400
            assert "registered gateway's admin API" in str(answer.json())
        # A row that got in before this check (or by hand) is refused at sending time.
        hook = Webhook.objects.create(name="old", url=f"{envoy.admin_url}/quitquitquit",
                                      created_by="test")
        delivery = Delivery.objects.create(webhook=hook, event="webhook.test",
                                           payload={"text": "x", "data": {}})
        assert delivery_attempt(delivery_id=delivery.pk) == "failed"
        attempt = Attempt.objects.get(delivery=delivery)
        assert attempt.status_code is None and attempt.error.startswith("not sent:")
        assert httpx.get(f"{envoy.admin_url}/ready", timeout=5).status_code == 200
        runtime = httpx.get(f"{envoy.admin_url}/runtime", timeout=5).json()
        assert "fleetctl.x" not in runtime.get("entries", {})
        # A receiver elsewhere still gets its deliveries.
        assert fleet_token.post(BASE, {"name": "fine", "url": receiver.url},
                                format="json").status_code == 201
    finally:
        envoy.stop()


def test_a_paused_webhook_is_never_sent_to_tests_included(receiver: Receiver) -> None:
    hook = webhook_create(actor=SYSTEM, name="paused", url=receiver.url, active=False)
    from fleetctl.core.errors import ConflictError

    with pytest.raises(ConflictError, match="paused"):
        webhook_test(actor=SYSTEM, webhook=hook)
    assert AuditEvent.objects.filter(action="webhook.test", outcome="denied").count() == 1
    # A delivery made while it was active, attempted after it was paused: not sent.
    delivery = Delivery.objects.create(webhook=hook, event="webhook.test",
                                       payload={"text": "x", "data": {}})
    assert delivery_attempt(delivery_id=delivery.pk) == "failed"
    assert receiver.requests == []
    assert "paused" in Delivery.objects.get(pk=delivery.pk).last_error


def test_the_test_button_answers_409_over_rest_for_a_paused_webhook(fleet_token,
                                                                     receiver: Receiver):
    fleet_token.post(BASE, {"name": "quiet", "url": receiver.url, "active": False},
                     format="json")
    answer = fleet_token.post(f"{BASE}quiet/test/")
    assert answer.status_code == 409 and "paused" in str(answer.json())
    assert not Delivery.objects.exists()


def test_an_untrusted_receivers_answer_is_kept_as_its_status_line_only(
        receiver: Receiver) -> None:
    hook = webhook_create(actor=SYSTEM, name="plain", url=receiver.url)
    receiver.answer(418)
    delivery = Delivery.objects.create(webhook=hook, event="webhook.test",
                                       payload={"text": "x", "data": {}})
    delivery_attempt(delivery_id=delivery.pk)
    attempt = Attempt.objects.get(delivery=delivery)
    assert attempt.response_excerpt.startswith("HTTP 418")
    assert '"ok"' not in attempt.response_excerpt
    # Errors name the receiver by scheme, host and port: its path may be a secret.
    assert "/hook" not in attempt.error and "127.0.0.1" in attempt.error


def test_a_trusted_receivers_answer_is_kept(receiver: Receiver) -> None:
    hook = webhook_create(actor=SYSTEM, name="trusted", url=receiver.url, trusted=True)
    delivery = Delivery.objects.create(webhook=hook, event="webhook.test",
                                       payload={"text": "x", "data": {}})
    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"
    assert Attempt.objects.get(delivery=delivery).response_excerpt == '{"ok": true}'


def test_only_an_administrator_trusts_a_receiver_and_a_new_url_loses_it(
        token_client, client_for, receiver: Receiver) -> None:
    lead = token_client(["fleet", "read"], "platform-lead")
    assert lead.post(BASE, {"name": "t", "url": receiver.url, "trusted": True},
                     format="json").status_code == 403
    assert not Webhook.objects.exists()
    admin = client_for("admin")
    assert admin.post(BASE, {"name": "t", "url": receiver.url, "trusted": True},
                      format="json").status_code == 201
    assert lead.patch(f"{BASE}t/", {"trusted": False}, format="json").status_code == 403
    moved = lead.patch(f"{BASE}t/", {"url": receiver.url + "/other"}, format="json")
    assert moved.status_code == 200 and moved.json()["trusted"] is False


def test_readers_see_scheme_host_and_port_only(token_client, client_for,
                                               receiver: Receiver) -> None:
    secret_url = receiver.url.replace("http://", "http://user:pass@") + "/T0/B1/xyzSECRET"
    webhook_create(actor=SYSTEM, name="slack", url=secret_url)
    reader = token_client(["read"], "viewer")
    shown = reader.get(f"{BASE}slack/").json()["url"]
    assert shown == receiver.url.rsplit("/", 1)[0] + "/…"
    assert "SECRET" not in str(reader.get(BASE).json()) and "pass" not in shown
    manager = token_client(["fleet", "read"], "platform-lead")
    assert manager.get(f"{BASE}slack/").json()["url"] == secret_url
    viewer = client_for("viewer")
    for page in ("/webhooks/", "/webhooks/slack/", "/webhooks/slack/edit/", "/audit/"):
        body = viewer.get(page).content.decode()
        assert "SECRET" not in body and "user:pass" not in body, page
