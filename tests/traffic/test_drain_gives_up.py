"""A drain's first push is made by name after the transaction that stored it, never inside
one; and a drain that gives up is `failed`, with the reason on its record, its page and its
API answer."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from fleetctl.traffic import push, services
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, GatewayPushAttempt, Route
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def refusing(route: Route, settings, tmp_path: Path) -> Gateway:
    """An nginx gateway that refuses every push for good: the residency header configured
    has a space in it, which nginx's map cannot hold (refused before a byte is written)."""
    settings.TRAFFIC_RESIDENCY_HEADER = "x residency"
    return services.gateway_create(
        actor=SYSTEM, name="edge-nginx", kind="nginx", admin_address=str(tmp_path),
        options={"listen": "127.0.0.1:1"}, routes=[route])


def test_the_push_engine_refuses_to_run_inside_a_transaction(route: Route, tmp_path: Path):
    services.gateway_create(actor=SYSTEM, name="edge", kind="envoy",
                            admin_address="http://127.0.0.1:1",
                            options={"config_dir": str(tmp_path)}, routes=[route])
    with transaction.atomic():
        drain = services.drain_request(actor=SYSTEM, route=route, reason="incident")
        assert drain.push_ids
        with pytest.raises(push.InTransactionError, match="after the transaction"):
            push.drain_push_now(drain)
        with pytest.raises(push.InTransactionError, match="after the transaction"):
            push.push_inline(push_ids=drain.push_ids)
    assert not GatewayPushAttempt.objects.exists()  # no gateway was contacted
    assert GatewayPush.objects.get(pk=drain.push_ids[0]).attempts == 0


def test_a_drain_a_gateway_refuses_for_good_fails_with_the_reason(
    route: Route, refusing: Gateway, client_for
):
    drain = services.drain_request(actor=SYSTEM, route=route, reason="incident")
    push.drain_push_now(drain)

    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    assert "edge-nginx refused llama r2 for good" in drain.failure_reason
    assert "header name 'x residency'" in drain.failure_reason
    assert push.drain_progress(drain_id=drain.pk)  # nothing more to wait for
    assert drain.pk not in Drain.objects.filter(status__in=push.DRAINS_OPEN).values_list(
        "pk", flat=True)

    answer = client_for("viewer").get(f"/api/v1/drains/{drain.pk}/").json()
    assert answer["status"] == "failed"
    assert answer["failure_reason"] == drain.failure_reason
    page = client_for("viewer", username="vera").get(f"/traffic/drains/{drain.pk}/")
    html = page.content.decode()
    assert "Gave up" in html and "refused llama r2 for good" in html
    assert 'hx-trigger="every 500ms"' not in html  # a failed drain is not polled


def test_a_drain_not_verified_within_the_watch_timeout_fails(route: Route, settings,
                                                             tmp_path: Path):
    services.gateway_create(actor=SYSTEM, name="down", kind="envoy",
                            admin_address="http://127.0.0.1:1",
                            options={"config_dir": str(tmp_path)}, routes=[route])
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    drain.refresh_from_db()
    assert drain.status == Drain.Status.PARTIAL  # retrying: still worth waiting for
    assert not push.drain_progress(drain_id=drain.pk)

    settings.DRAIN_WATCH_TIMEOUT_S = 60
    Drain.objects.filter(pk=drain.pk).update(
        requested_at=timezone.now() - timedelta(seconds=61))
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    assert drain.failure_reason.startswith("not verified on down within 60 s")
    assert "down:" in drain.last_error  # what the gateway answered, kept
