"""The interruption tax of an interruptible pool (fleetctl/fleet/interruption.py): priced by
the pool's own drill, in every cost figure of the pool (the benchmark cost checks, the
business case, live cost, the soak's arbitrage, the pool API and pages), "not measured"
without a drill (never a zero tax), bad input refused with nothing changed, an edit recorded
and re-judging what depends on it.

The drill evidence here is written the way a passed drill writes it (batch/drill.py
`drill_record`: a `checkpoint-resume` row about the pool); tests/batch/test_interruption_drill.py
prices the tax from a real drill run. Numbers are chosen so the arithmetic is exact:
73 reclaims a month = 0.1 an hour; re-warm 36 s, nothing resent = 0.01 h per reclaim, so the
reclaims add 0.1 × 0.01 = 0.1 %; standby 10 % adds 10 %: the effective rate is 1.101 × rate.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.batch.cost import plan_arbitrage
from fleetctl.batch.evidence import DRILL_KIND
from fleetctl.bench.evidence import cost_vs_primary
from fleetctl.economics import case as cases
from fleetctl.economics.models import BusinessCase
from fleetctl.economics.services import business_case_update
from fleetctl.fleet import services as fleet
from fleetctl.fleet.interruption import effective_rate
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_set_cost
from fleetctl.telemetry.cost import live_cost
from fleetctl.telemetry.services import window_add
from migrations_plan import services as plans
from migrations_plan.evidence import RuleContext
from migrations_plan.rules import cost_reported
from tests.batch.test_cost import soaked  # noqa: F401  (a plan with a finished soak)
from tests.bench.test_cost_rules import bench
from tests.conftest import SYSTEM
from tests.migrations_plan.conftest import world  # noqa: F401

pytestmark = pytest.mark.django_db

TEXT = ("incl. interruption tax +10.1 % (reclaims 73/month, re-warm 36.0 s, lost work 0.0 s, "
        "standby 10 %; measured by the drill of batch job 901)")


def drill(pool: Pool, *, resume_s: float = 36.0, resends: int = 0, job: int = 901,
          verdict: str = "pass", days_ago: float = 1.0) -> Any:
    """A checkpoint-resume row as drill_record writes one."""
    data = {"job": job, "drill": "kill-worker", "state": "completed", "total": 60,
            "results": 60, "missing": 0, "resends": resends, "duplicates_refused": 0,
            "resume_s": resume_s, "reasons": [] if verdict == "pass" else ["failed"]}
    row = plans.evidence_record(actor=SYSTEM, pool=pool, kind=DRILL_KIND, verdict=verdict,
                                summary="drill", data=data, url=f"/batch/jobs/{job}/",
                                source=f"batch job {job}")
    type(row).objects.filter(pk=row.pk).update(
        observed_at=timezone.now() - timedelta(days=days_ago))
    return row


def interruptible(pool: Pool, reclaims: str = "73", standby: str = "10") -> Pool:
    return fleet.pool_update(actor=SYSTEM, pool=pool, interruptible=True,
                             reclaims_per_month=Decimal(reclaims), standby_pct=Decimal(standby))


def ctx(plan: Any) -> RuleContext:
    plan.refresh_from_db()
    return RuleContext(plan=plan, candidate=Pool.objects.get(pk=plan.candidate_pool_id),
                       primary=Pool.objects.get(pk=plan.primary_pool_id),
                       routes=list(plan.routes.order_by("name")),
                       now=timezone.now())


def test_the_tax_is_itemised_from_the_pools_newest_passed_drill(world):  # noqa: F811
    pool = interruptible(world.candidate)
    drill(pool, resume_s=99, job=900, days_ago=5)  # older: not the one
    drill(pool, resume_s=500, job=902, verdict="fail", days_ago=0.5)  # failed: never
    drill(pool, resume_s=1, job=903, days_ago=91)  # beyond the horizon
    drill(pool)
    tax = effective_rate(Pool.objects.get(pk=pool.pk))
    assert tax.not_measured == "" and tax.drill is not None
    assert (tax.drill.rewarm_s, tax.drill.redone, tax.drill.lost_s) == (36.0, 0, 0.0)
    assert tax.factor == Decimal("1.101")
    # 10.50 × 0.001 = 0.0105 reclaims, 10.50 × 0.10 = 1.05 standby: 11.5605 USD/h.
    assert tax.reclaim_per_h == Decimal("0.0105") and tax.standby_per_h == Decimal("1.05")
    assert tax.effective_rate == Decimal("11.5605")
    assert tax.text == TEXT
    assert effective_rate(world.primary).text == ""  # not interruptible: no tax, no query
    assert effective_rate(world.primary).apply("4.00") == Decimal("4.00")


def test_without_a_drill_the_tax_and_every_cost_are_not_measured_never_zero(
        world, client_for):  # noqa: F811
    pool = interruptible(world.candidate)
    drill(pool, verdict="fail")
    tax = effective_rate(pool)
    assert tax.factor is None and tax.apply("4.00") is None
    assert "run a drill on mi300x-us" in tax.not_measured
    plan = world.plan()
    pool_set_cost(actor=SYSTEM, pool=pool, cost_per_1m=Decimal("4.00"),
                  measured_at=timezone.now(), source="run #5")
    reported = cost_reported(ctx(plan), {"max_age_days": 30.0})
    assert reported.status == "insufficient" and "run a drill on mi300x-us" in reported.summary
    bench(pool, run=5, cost="4.00")
    bench(world.primary, run=5, cost="5.00")
    compared = cost_vs_primary(ctx(plan), {"within_days": 30, "max_rate_age_days": 31})
    assert compared.status == "insufficient", compared.summary
    assert "run a drill on mi300x-us" in compared.summary
    answer = client_for("viewer").get("/api/v1/pools/mi300x-us/").json()
    assert answer["cost_per_1m_incl_tax"] is None
    assert answer["interruption_tax"]["not_measured"].startswith("not measured: mi300x-us")
    page = client_for("viewer", username="v2").get("/pools/mi300x-us/").content.decode()
    assert "Interruption tax" in page and "run a drill on mi300x-us" in page


def test_every_cost_figure_of_the_pool_includes_the_tax(
        world, client_for, make_user):  # noqa: F811
    pool = interruptible(world.candidate)
    drill(pool)
    plan = world.plan()
    # The pool's benchmark cost: the API, the pool page, the gate's cost checks.
    pool_set_cost(actor=SYSTEM, pool=pool, cost_per_1m=Decimal("4.00"),
                  measured_at=timezone.now(), source="run #5")
    api = client_for("viewer").get("/api/v1/pools/mi300x-us/").json()
    assert api["cost_per_1m_output_tokens"] == "4.0000"
    assert api["cost_per_1m_incl_tax"] == "4.4040"  # 4.00 × 1.101
    assert api["interruption_tax"]["uplift_pct"] == "10.10"
    assert api["interruption_tax"]["drill"]["source"] == "batch job 901"
    page = client_for("viewer", username="v2").get("/pools/mi300x-us/").content.decode()
    assert "4.4040 USD" in page and TEXT in page and "11.5605 USD/h" in page
    overview = client_for("viewer", username="v3").get("/").content.decode()
    assert "4.40 USD" in overview and "+10.1 % tax" in overview
    reported = cost_reported(ctx(plan), {"max_age_days": 30.0})
    assert reported.status == "pass" and "4.4040 USD" in reported.summary
    assert TEXT in reported.summary
    assert reported.numbers["candidate_cost_per_1m"] == "4.4040"
    # The benchmark comparison with the primary, and the business case through it.
    bench(pool, run=5, cost="4.00")
    bench(world.primary, run=5, cost="5.00")
    compared = cost_vs_primary(ctx(plan), {"within_days": 30, "max_rate_age_days": 31})
    assert compared.status == "pass", compared.summary
    assert compared.numbers["candidate_cost_per_1m"] == "4.4040"
    assert compared.numbers["bare_cost_per_1m"] == {"candidate": "4.00", "primary": "5.00"}
    assert TEXT in compared.summary
    case = business_case_update(actor=world.actor("lead"), plan=plan,
                                expected_mtokens_per_month="1000")
    assert case.numbers["arbitrage_per_1m"] == "0.5960"  # 5.00 − 4.404
    lead = client_for("platform-lead", username="lead-2")
    assert TEXT in lead.get(f"/plans/{plan.name}/business-case/").content.decode()
    # Live cost: 360 000 tokens in 600 s at 11.5605 USD/h.
    start = timezone.now() - timedelta(minutes=20)
    window_add(source="pool", source_name="mi300x-us", route="", pool="mi300x-us",
               resolution_s=600, start=start,
               counts={"output_tokens": 360_000, "metered_ms": 600_000})
    live = live_cost(pool="mi300x-us", since=start - timedelta(minutes=1),
                     until=timezone.now())
    assert live.cost == "1.9268"  # 11.5605 × 600 / 3600
    assert live.cost_per_1m == "5.3521"  # 11.5605 / (600 tok/s × 3600) × 1e6
    assert live.benchmark_cost_per_1m == "4.4040" and live.interruption == TEXT
    assert live.hourly_rate == "10.50" and live.effective_hourly_rate == "11.5605"


def test_the_soaks_cost_arbitrage_includes_the_tax(soaked):  # noqa: F811
    people, plan, soak = soaked
    pool = interruptible(soak.pool)
    soak.refresh_from_db()
    soak.pool = pool
    plans.plan_update(actor=people.actor("lead"), plan=plan, predicted_cost_per_1m="9.50",
                      predicted_cost_currency="USD", predicted_cost_source="capacity plan")
    plan.refresh_from_db()
    answer = plan_arbitrage(plan, soak)
    assert answer.status == "insufficient" and "run a drill on mi300x-us" in answer.message
    assert answer.measured is None
    drill(pool)
    answer = plan_arbitrage(plan, soak)
    # 35 000 tokens in 100 s = 350 tok/s at 11.5605 USD/h: 9.1750 USD per 1M (8.3333 bare).
    assert answer.status == "pass" and answer.measured == Decimal("9.1750")
    assert answer.hourly_rate == Decimal("11.5605") and TEXT in answer.message
    assert answer.as_json()["interruption"]["effective_rate"] == "11.5605"


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"interruptible": True}, "reclaims_per_month", "expected reclaims a month"),
    ({"interruptible": True, "reclaims_per_month": "0", "standby_pct": "5"},
     "reclaims_per_month", "above 0 and at most 720"),
    ({"interruptible": True, "reclaims_per_month": "721", "standby_pct": "5"},
     "reclaims_per_month", "above 0 and at most 720"),
    ({"interruptible": True, "reclaims_per_month": "4"}, "standby_pct", "0-100"),
    ({"interruptible": True, "reclaims_per_month": "4", "standby_pct": "101"},
     "standby_pct", "between 0 and 100"),
    ({"interruptible": True, "reclaims_per_month": "4", "standby_pct": "-1"},
     "standby_pct", "between 0 and 100"),
    ({"interruptible": True, "reclaims_per_month": "lots", "standby_pct": "5"},
     "reclaims_per_month", "valid number"),
])
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
        world, client_for, body, field, says):  # noqa: F811
    pool = world.candidate  # not interruptible
    before = Pool.objects.values().get(pk=pool.pk)
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    answer = client_for("platform-lead").patch("/api/v1/pools/mi300x-us/", body,
                                                format="json")
    assert answer.status_code == 400, answer.content
    assert says in str(answer.json()["error"]["fields"][field]), answer.json()
    assert Pool.objects.values().get(pk=pool.pk) == before
    changed = AuditEvent.objects.filter(id__gt=last, action="pool.update").exclude(after=None)
    assert not changed.exists()


def test_the_form_refuses_bad_input_and_saves_nothing(world, client_for):  # noqa: F811
    pool = world.candidate
    before = Pool.objects.values().get(pk=pool.pk)
    lead = client_for("platform-lead")
    form = {"name": pool.name, "runtime": pool.runtime, "accelerator": pool.accelerator,
            "region": pool.region.code, "base_urls": "\n".join(pool.base_urls),
            "latency_class": pool.latency_class, "max_context_tokens": pool.max_context_tokens,
            "node_hourly_rate": "10.50", "currency": "USD", "labels": "driver=6.4.1",
            "runtime_version": pool.runtime_version, "interruptible": "on",
            "reclaims_per_month": "900", "standby_pct": "10"}
    page = lead.post("/pools/mi300x-us/edit/", form)
    assert page.status_code == 200 and "at most 720" in page.content.decode()
    assert Pool.objects.values().get(pk=pool.pk) == before
    page = lead.post("/pools/mi300x-us/edit/", {**form, "reclaims_per_month": "4"})
    assert page.status_code == 302, page.content.decode()[:2000]
    saved = Pool.objects.get(pk=pool.pk)
    assert saved.interruptible and saved.reclaims_per_month == Decimal("4")


def test_not_interruptible_clears_the_reclaim_model(world):  # noqa: F811
    pool = interruptible(world.candidate)
    pool = fleet.pool_update(actor=SYSTEM, pool=pool, interruptible=False)
    assert (pool.reclaims_per_month, pool.standby_pct) == (None, None)
    with pytest.raises(ValidationError):
        fleet.pool_update(actor=SYSTEM, pool=pool, interruptible=True)


def test_an_edit_of_the_reclaim_model_is_recorded_and_rejudges_the_business_case(
        world, django_capture_on_commit_callbacks):  # noqa: F811
    pool = interruptible(world.candidate)
    drill(pool)
    plan = world.plan()
    bench(pool, run=5, cost="4.00")
    bench(world.primary, run=5, cost="5.00")
    business_case_update(actor=world.actor("lead"), plan=plan,
                         expected_mtokens_per_month="1000", engineer_cost_per_year="1000")
    assert BusinessCase.objects.get(plan=plan).verdict == cases.PAYS
    with django_capture_on_commit_callbacks(execute=True):
        fleet.pool_update(actor=world.actor("lead"), pool=pool,
                          standby_pct=Decimal("30"))  # 4.00 × 1.301 = 5.204 > 5.00
    event = AuditEvent.objects.filter(action="pool.update").latest("id")
    assert set(event.before) == {"standby_pct"} and set(event.after) == {"standby_pct"}
    judged = AuditEvent.objects.filter(action="plan.business_case.judged").latest("id")
    assert "interruption model changed" in judged.message
    assert "standby 10.00 % → 73.00 reclaims a month, standby 30.00 %" in judged.message
    assert BusinessCase.objects.get(plan=plan).verdict != cases.PAYS
