"""`gate.changed`: a plan moving stage, and a gate check changing status, reach webhooks."""

from __future__ import annotations

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from migrations_plan import services
from tests.conftest import SYSTEM
from tests.migrations_plan.helpers import pass_gate

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(db):
    return webhook_create(actor=SYSTEM, name="plans", url="http://127.0.0.1:9/hook",
                          events=["gate.changed"])


def _sent() -> list[dict]:
    return [d.payload for d in Delivery.objects.filter(event="gate.changed").order_by("pk")]


def test_a_stage_move_is_a_gate_changed_delivery(world, hook):
    plan = world.plan()
    pass_gate(world, plan)
    [move] = [p for p in _sent() if p["data"]["kind"] == "advance"]
    assert move["data"]["from_state"] == "stage-1" and move["data"]["to_state"] == "stage-2"
    assert move["data"]["by"] == "bob" and move["data"]["url"] == f"/plans/{plan.name}/"
    assert "stage-1 → stage-2" in move["text"]


def test_a_check_changing_status_is_a_gate_changed_delivery(world, hook):
    plan = world.plan()
    assert services.plan_refresh(plan=plan) == []  # the first look records, reports nothing
    assert _sent() == []
    services.evidence_record(actor=Actor.for_system("conformance-probe"), pool=world.candidate,
                             kind="conformance", verdict="pass", summary="40/40 cases")
    changes = services.plan_refresh(plan=plan)
    assert changes
    [sent] = _sent()
    assert sent["data"]["kind"] == "check-status" and sent["data"]["changes"] == changes
    assert "40/40 cases" in sent["text"]
