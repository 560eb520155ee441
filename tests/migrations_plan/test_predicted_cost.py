"""Stage 3's predicted cost per 1M output tokens: recorded from the candidate's benchmark cost
when the plan enters stage 3 (not when that cost is stale or absent), and set or replaced by a
platform lead through plan_update / PATCH, the amount and its currency together, audited."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.services import pool_set_cost, pool_update
from migrations_plan import services
from migrations_plan.models import Plan
from tests.migrations_plan.helpers import walk_to

pytestmark = pytest.mark.django_db


def _audit_messages(plan: Plan) -> list[str]:
    return list(AuditEvent.objects.filter(object_type="migrations_plan.plan",
                                          object_id=str(plan.pk), action="plan.update")
                .order_by("id").values_list("message", flat=True))


def test_entering_stage_3_records_the_candidates_benchmark_cost(world, system):
    pool_set_cost(actor=system, pool=world.candidate, cost_per_1m="7.2500",
                  measured_at=timezone.now(), source="run #12")
    plan = walk_to(world, world.plan(), 2)
    assert plan.predicted_cost_per_1m is None  # stage 2: nothing yet
    plan = walk_to(world, plan, 3)
    plan.refresh_from_db()
    assert plan.predicted_cost_per_1m == Decimal("7.2500")
    assert plan.predicted_cost_currency == "USD"
    assert plan.predicted_cost_source == ("the candidate's benchmark cost when the plan "
                                          "entered stage 3 (run #12)")
    assert plan.predicted_cost_at is not None
    assert any("predicted cost recorded on entering stage 3: 7.2500 USD" in m
               for m in _audit_messages(plan))


def test_a_stale_cost_is_not_a_prediction(world, system):
    pool_set_cost(actor=system, pool=world.candidate, cost_per_1m="7.2500",
                  measured_at=timezone.now(), source="run #12")
    pool_update(actor=system, pool=world.candidate, node_hourly_rate="99.00")
    plan = walk_to(world, world.plan(), 3)
    plan.refresh_from_db()
    assert plan.predicted_cost_per_1m is None and plan.predicted_cost_currency == ""
    said = _audit_messages(plan)[-1]
    assert "no predicted cost recorded on entering stage 3" in said
    assert "hourly rate changed" in said


def test_no_benchmark_cost_no_prediction(world):
    plan = walk_to(world, world.plan(), 3)
    assert Plan.objects.get(pk=plan.pk).predicted_cost_per_1m is None
    assert "no benchmark has measured" in _audit_messages(plan)[-1]


def test_a_prediction_already_set_is_kept_on_entering_stage_3(world, system):
    pool_set_cost(actor=system, pool=world.candidate, cost_per_1m="7.2500",
                  measured_at=timezone.now(), source="run #12")
    plan = walk_to(world, world.plan(), 2)
    services.plan_update(actor=world.actor("lead"), plan=plan, predicted_cost_per_1m="6.10",
                         predicted_cost_currency="EUR",
                         predicted_cost_source="Q3 capacity plan")
    plan = walk_to(world, plan, 3)
    plan.refresh_from_db()
    assert (plan.predicted_cost_per_1m, plan.predicted_cost_currency) == (Decimal("6.10"),
                                                                          "EUR")
    assert plan.predicted_cost_source == "Q3 capacity plan"


def test_a_lead_sets_replaces_and_clears_the_prediction_audited(world):
    plan = world.plan()
    lead = world.actor("lead")
    services.plan_update(actor=lead, plan=plan, predicted_cost_per_1m="8.40",
                         predicted_cost_currency="usd")
    plan.refresh_from_db()
    assert (plan.predicted_cost_per_1m, plan.predicted_cost_currency) == (Decimal("8.40"),
                                                                          "USD")
    assert plan.predicted_cost_source == "set by bob"
    first_at = plan.predicted_cost_at
    services.plan_update(actor=lead, plan=plan, predicted_cost_per_1m="7.90",
                         predicted_cost_currency="EUR", predicted_cost_source="finance")
    plan.refresh_from_db()
    assert plan.predicted_cost_currency == "EUR" and plan.predicted_cost_at >= first_at
    event = AuditEvent.objects.filter(object_id=str(plan.pk), action="plan.update").latest("id")
    assert event.before["predicted_cost_per_1m"] == "8.4000"
    assert event.after["predicted_cost_currency"] == "EUR"
    services.plan_update(actor=lead, plan=plan, predicted_cost_per_1m=None,
                         predicted_cost_currency="")
    plan.refresh_from_db()
    assert plan.predicted_cost_per_1m is None and plan.predicted_cost_at is None


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"predicted_cost_per_1m": "8.40"}, "predicted_cost_currency", "together"),
    ({"predicted_cost_currency": "USD"}, "predicted_cost_per_1m", "together"),
    ({"predicted_cost_per_1m": "8.40", "predicted_cost_currency": "XYZ"},
     "predicted_cost_currency", "Unknown currency 'XYZ'"),
    ({"predicted_cost_per_1m": "-1", "predicted_cost_currency": "USD"},
     "predicted_cost_per_1m", "0 or more"),
    ({"predicted_cost_per_1m": "lots", "predicted_cost_currency": "USD"},
     "predicted_cost_per_1m", "not a number"),
    ({"predicted_cost_per_1m": None, "predicted_cost_currency": "",
      "predicted_cost_source": "x"}, "predicted_cost_source", "amount and currency"),
])
def test_a_bad_prediction_is_refused_and_nothing_changes(world, changes, field, words):
    plan = world.plan()
    with pytest.raises(ValidationError) as refused:
        services.plan_update(actor=world.actor("lead"), plan=plan, **changes)
    assert words in " ".join(refused.value.message_dict[field])
    plan.refresh_from_db()
    assert plan.predicted_cost_per_1m is None and plan.predicted_cost_currency == ""


def test_the_api_sets_and_shows_the_prediction(world, client_for):
    plan = world.plan()
    lead = client_for("platform-lead", username="dora")
    answer = lead.patch(f"/api/v1/plans/{plan.name}/", {
        "predicted_cost_per_1m": "8.4", "predicted_cost_currency": "GBP",
        "predicted_cost_source": "capacity plan"}, format="json")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["predicted_cost_per_1m"] == "8.4000"
    assert body["predicted_cost_currency"] == "GBP"
    assert body["predicted_cost_source"] == "capacity plan"
    half = lead.patch(f"/api/v1/plans/{plan.name}/", {"predicted_cost_per_1m": "9"},
                      format="json")
    assert half.status_code == 400
    assert "together" in str(half.json())
    assert Plan.objects.get(pk=plan.pk).predicted_cost_per_1m == Decimal("8.4")
    viewer = client_for("viewer", username="vera")
    assert viewer.patch(f"/api/v1/plans/{plan.name}/", {
        "predicted_cost_per_1m": "1", "predicted_cost_currency": "USD"},
        format="json").status_code == 403
