"""Deleting a gateway never rewrites history: its pushes and their attempts stay, naming it
(the link nulled), a drain that was waiting on it finishes for the remaining gateways and
says the deleted one never verified, and a drain already finished reads as it did."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.traffic import push, services
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, GatewayPushAttempt, Route
from migrations_plan.evidence import RuleContext
from migrations_plan.rules import drain_rehearsed
from tests.conftest import SYSTEM

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def working(gateway: Gateway) -> Gateway:
    return gateway


def _down(route: Route, tmp_path: Path) -> Gateway:
    """An Envoy nobody answers for: every push to it is refused and retried."""
    (tmp_path / "envoy").mkdir(exist_ok=True)
    return services.gateway_create(actor=SYSTEM, name="gw-3", kind="envoy",
                                   admin_address="http://127.0.0.1:1",
                                   options={"config_dir": str(tmp_path / "envoy")},
                                   routes=[route])


def test_a_drain_waiting_on_a_deleted_gateway_finishes_for_the_others_and_says_so(
    route: Route, working: Gateway, tmp_path: Path, client_for
):
    down = _down(route, tmp_path)
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    drain.refresh_from_db()
    assert drain.status == Drain.Status.PARTIAL  # gw-1 verified, gw-3 retrying
    attempts_before = GatewayPushAttempt.objects.filter(push__gateway=down).count()
    assert attempts_before >= 1
    verified_on_gw1 = GatewayPush.objects.get(gateway=working, revision__drains=drain).verified_at

    lead = client_for("platform-lead")
    assert lead.delete("/api/v1/gateways/gw-3/").status_code == 204
    assert not Gateway.objects.filter(name="gw-3").exists()

    # The pushes and attempts stay, under the gateway's name, the open ones abandoned.
    kept = list(GatewayPush.objects.filter(gateway_name="gw-3"))
    assert kept and all(p.gateway_id is None and p.gateway_kind == "envoy" for p in kept)
    drain_push = next(p for p in kept if p.revision.drains.filter(pk=drain.pk).exists())
    assert drain_push.status == GatewayPush.Status.ABANDONED
    assert GatewayPushAttempt.objects.filter(push__in=kept).count() == attempts_before
    # Nothing retries it: a retry queued before the deletion stands down.
    assert push.push_execute(push_id=drain_push.pk) == GatewayPush.Status.ABANDONED
    assert GatewayPushAttempt.objects.filter(push__in=kept).count() == attempts_before

    event = AuditEvent.objects.filter(action="gateway.delete").latest("pk")
    assert "gw-3 (envoy) deleted" in event.message
    assert "open push(es) abandoned" in event.message
    assert f"drain(s) {drain.pk} no longer wait for it" in event.message

    # The drain finishes for the remaining gateway, timed to the deletion, not to gw-1.
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.COMPLETE
    assert drain.verified_at >= drain_push.gateway_deleted_at > verified_on_gw1

    answer = client_for("viewer").get(f"/api/v1/drains/{drain.pk}/").json()
    by_name = {g["gateway"]: g for g in answer["gateways"]}
    assert by_name["gw-3"]["gateway_deleted"] is True
    assert by_name["gw-3"]["status"] == "abandoned"
    assert by_name["gw-3"]["verified_at"] is None
    assert by_name["gw-1"]["gateway_deleted"] is False
    assert by_name["gw-1"]["status"] == "verified"
    pushes = client_for("viewer", username="vic").get("/api/v1/pushes/?status=abandoned").json()
    assert {(p["gateway"], p["gateway_deleted"]) for p in pushes["results"]} == {
        ("gw-3", True)}
    assert drain_push.pk in {p["id"] for p in pushes["results"]}

    html = client_for("viewer", username="val").get(
        f"/traffic/drains/{drain.pk}/").content.decode()
    assert "gw-3 (deleted)" in html
    assert "deleted before verifying" in html
    assert "Remaining gateways verified" in html
    assert "All gateways verified" not in html
    assert "every remaining gateway verified" in html

    # Verified on the remaining gateways only: no rehearsal of every gateway for a gate.
    drain.refresh_from_db()
    candidate = Pool.objects.get(name=drain.drained_pools[0])  # a pool the drain took off
    ctx = RuleContext(plan=None, candidate=candidate, primary=None,  # type: ignore[arg-type]
                      routes=[route], now=timezone.now())
    result = drain_rehearsed(ctx, {"within_days": 7, "max_ms": 600_000})
    assert result.status == "insufficient", result.summary
    assert "gw-3 deleted before verifying" in result.summary


def test_a_finished_drain_reads_the_same_after_its_gateway_is_deleted(
    route: Route, working: Gateway, tmp_path: Path, client_for
):
    other = services.gateway_create(actor=SYSTEM, name="gw-2", kind="file",
                                    admin_address=str(tmp_path / "two"),
                                    options={"file_name": "weights.json"}, routes=[route])
    (tmp_path / "two").mkdir(exist_ok=True)
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="rehearsal"))
    assert push.drain_progress(drain_id=drain.pk)
    viewer = client_for("viewer")
    before = viewer.get(f"/api/v1/drains/{drain.pk}/").json()
    assert before["status"] == "complete"

    services.gateway_delete(actor=SYSTEM, gateway=other)
    push.drains_advance()

    after = viewer.get(f"/api/v1/drains/{drain.pk}/").json()
    for field in ("status", "verified_at", "completed_at", "verified_ms", "duration_ms"):
        assert after[field] == before[field], field
    gw2 = next(g for g in after["gateways"] if g["gateway"] == "gw-2")
    assert gw2["gateway_deleted"] is True and gw2["status"] == "verified"
    assert gw2["verified_at"] is not None
    assert len(after["gateways"]) == len(before["gateways"]) == 2
    html = client_for("viewer", username="vera").get(
        f"/traffic/drains/{drain.pk}/").content.decode()
    assert "gw-2 (deleted)" in html and "All gateways verified" in html
    assert "deleted before verifying" not in html


def test_a_failed_drain_stays_failed_after_its_gateway_is_deleted(
    route: Route, working: Gateway, tmp_path: Path, settings, client_for
):
    from datetime import timedelta

    from django.utils import timezone

    down = _down(route, tmp_path)
    drain = push.drain_push_now(
        services.drain_request(actor=SYSTEM, route=route, reason="incident"))
    Drain.objects.filter(pk=drain.pk).update(
        requested_at=timezone.now() - timedelta(seconds=settings.DRAIN_WATCH_TIMEOUT_S + 1))
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.FAILED
    reason = drain.failure_reason

    services.gateway_delete(actor=SYSTEM, gateway=down)
    push.drains_advance()
    drain.refresh_from_db()
    assert (drain.status, drain.failure_reason, drain.completed_at) == (
        Drain.Status.FAILED, reason, None)
    answer = client_for("viewer").get(f"/api/v1/drains/{drain.pk}/").json()
    assert answer["status"] == "failed" and "gw-3" in answer["failure_reason"]
    gw3 = next(g for g in answer["gateways"] if g["gateway"] == "gw-3")
    assert gw3["gateway_deleted"] is True and gw3["attempts"] >= 1
