"""`gateway.failing`: a gateway that cannot take a push, and its recovery, reach webhooks once
per flip. A real Envoy; the failing one is the same gateway pointed at a port nobody serves."""

from __future__ import annotations

import pytest

from fleetctl.core.ports import free_port
from fleetctl.traffic import push, services
from fleetctl.traffic.models import Gateway, GatewayPush
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db


def _attempt(gateway: Gateway) -> str:
    newest = GatewayPush.objects.filter(gateway=gateway).order_by("-pk").first()
    return push.push_execute(push_id=newest.pk)


def test_failing_and_back_in_sync_are_one_delivery_each(route, envoy):
    webhook_create(actor=SYSTEM, name="gw", url="http://127.0.0.1:9/hook",
                   events=["gateway.failing"])
    gateway = services.gateway_create(
        actor=SYSTEM, name="edge", kind="envoy", admin_address=f"http://127.0.0.1:{free_port()}",
        options={"config_dir": str(envoy.workdir)}, routes=[route])

    assert _attempt(gateway) == "retrying"
    assert _attempt(gateway) == "retrying"  # still failing: no second delivery
    Gateway.objects.filter(pk=gateway.pk).update(admin_address=envoy.admin_url)
    assert _attempt(gateway) == "verified"

    sent = [(d.payload["data"]["state"], d.payload["data"]["gateway"])
            for d in Delivery.objects.filter(event="gateway.failing").order_by("pk")]
    assert sent == [("failing", "edge"), ("in-sync", "edge")]
    first = Delivery.objects.filter(event="gateway.failing").order_by("pk").first()
    assert "edge" in first.payload["text"] and first.payload["data"]["error"]
