"""A plan's business case (fleetctl/economics/): the arithmetic against hand-computed rows in
two currencies through dated rates, validation that leaves the state as it was, a rate change
that re-judges and is recorded on the plan's timeline, "not measured" with its reason (never
0), the page for a platform lead and the API round trip. Benchmark evidence is written as a
benchmark run writes it (tests/bench/test_cost_rules.py's `bench`), without measuring."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from fleetctl.audit.models import AuditEvent
from fleetctl.economics import case as cases
from fleetctl.economics.models import BusinessCase
from fleetctl.economics.selectors import case_of
from fleetctl.economics.services import business_case_update
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import CurrencyRate, Pool
from tests.bench.test_cost_rules import BOT, bench
from tests.migrations_plan.conftest import world  # noqa: F401

TODAY = date.today()


@pytest.fixture
def eur_world(world):  # noqa: F811
    """The candidate priced in EUR, the primary in USD; EUR→USD 1.10 and GBP→USD 1.25 dated
    today, and an older GBP→USD rate that must not be the one used."""
    fleet.pool_update(actor=BOT, pool=world.candidate, currency="EUR")
    world.candidate = Pool.objects.get(pk=world.candidate.pk)
    for pair, rate, on in ((("EUR", "USD"), "1.10", TODAY), (("GBP", "USD"), "1.25", TODAY),
                           (("GBP", "USD"), "1.40", TODAY - timedelta(days=10))):
        fleet.currency_rate_create(actor=BOT, from_currency=pair[0], to_currency=pair[1],
                                   rate=Decimal(rate), as_of=on, source="test")
    bench(world.candidate, run=5, cost="4.00")  # EUR
    bench(world.primary, run=5, cost="5.00")  # USD
    return world


def _edit(world, plan, **changes):  # noqa: F811
    return business_case_update(actor=world.actor("lead"), plan=plan, **changes)


def test_the_arithmetic_matches_hand_computed_rows_in_two_currencies(eur_world):
    w = eur_world
    plan = w.plan()
    case = _edit(w, plan, engineer_cost_per_year="100000", engineer_cost_currency="GBP",
                 expected_mtokens_per_month="10000")
    n = case.numbers
    # 4.00 EUR × 1.10 = 4.40 USD; 5.00 − 4.40 = 0.60 USD per 1M.
    assert n["comparison"]["candidate_cost_converted"] == "4.4000"
    assert n["arbitrage_per_1m"] == "0.6000"
    # 0.60 × 10 000 M/month × 12 = 72 000 USD a year.
    assert n["arbitrage_per_year"] == "72000.00"
    # 6+4+4+4+3+4+2 = 27 weeks × (100 000 GBP × 1.25 = 125 000 USD) ÷ 46 = 73 369.57.
    assert n["burden_weeks"] == "27.0" and n["engineer_cost_per_year"] == "125000.00"
    assert n["engineer_cost_conversion"]["rate"] == "1.25000000"
    assert n["burden_per_year"] == "73369.57"
    # 73 369.565… ÷ (0.60 × 12) = 10 190.217 M tokens a month.
    assert n["break_even_mtokens_per_month"] == "10190.217"
    assert case.verdict == cases.DOES_NOT and case.currency == "USD"
    assert "1369.57 USD a year short" in case.headline, case.headline
    assert any("above 10190.2 M output tokens a month" in c for c in case.changes)
    # One engineer-week costs 125 000 ÷ 46 = 2 717.39; 72 000 ÷ 2 717.39 = 26.5 weeks.
    assert any("covers up to 26.5 engineer-weeks a year" in c for c in case.changes)
    # The candidate may cost at most 5.00 − 73 369.57 ÷ 120 000 = 4.3886 USD per 1M.
    assert any("at most 4.3886 USD per 1M" in c for c in case.changes)
    # At 12 000 M: 0.60 × 12 000 × 12 = 86 400 ≥ 73 369.57: pays, 13 030.43 to spare.
    case = _edit(w, plan, expected_mtokens_per_month="12000")
    assert case.verdict == cases.PAYS and case.numbers["net_per_year"] == "13030.43"
    # Fewer weeks on a row: 20 weeks × 125 000 ÷ 46 = 54 347.83.
    case = _edit(w, plan, expected_mtokens_per_month="10000", oncall_weeks="0",
                 driver_runtime_weeks="3")
    assert case.numbers["burden_weeks"] == "20.0"
    assert case.numbers["burden_per_year"] == "54347.83" and case.verdict == cases.PAYS


def test_a_recorded_reason_or_a_short_primary_justifies_what_does_not_pay(eur_world):
    w = eur_world
    plan = w.plan()
    _edit(w, plan, expected_mtokens_per_month="100")
    case = _edit(w, plan, override="residency",
                 override_reason="the Mumbai contract pins the data to India")
    assert case.verdict == cases.JUSTIFIED
    assert "the Mumbai contract pins the data to India" in case.headline
    assert case.numbers["arbitrage_per_year"] == "720.00"  # the numbers are still shown


@pytest.mark.parametrize(("field", "value", "says"), [
    ("oncall_weeks", "-1", "0 to 52 engineer-weeks"),
    ("images_weeks", "53", "0 to 52 engineer-weeks"),
    ("numerics_weeks", "abc", "must be a number"),
    ("engineer_cost_per_year", "0", "above 0"),
    ("engineer_cost_per_year", "99999999", "at most 10,000,000"),
    ("engineer_cost_currency", "XYZ", "Unknown currency"),
    ("expected_mtokens_per_month", "0", "in millions"),
    ("expected_mtokens_per_month", "1e12", "in millions"),
    ("peak_days", "90", "1 to 30 days"),
    ("override", "cheaper", "capacity, residency or none"),
])
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(eur_world, field, value,
                                                                   says):
    w = eur_world
    plan = w.plan()
    _edit(w, plan, expected_mtokens_per_month="10000")
    before = BusinessCase.objects.values().get(plan=plan)
    events = AuditEvent.objects.count()
    with pytest.raises(ValidationError) as refused:
        _edit(w, plan, **{"oncall_weeks": "5", field: value})
    assert says in " ".join(refused.value.message_dict[field])
    assert BusinessCase.objects.values().get(plan=plan) == before
    assert AuditEvent.objects.count() == events


def test_an_override_needs_its_reason(eur_world):
    w = eur_world
    plan = w.plan()
    with pytest.raises(ValidationError) as refused:
        _edit(w, plan, override="capacity")
    assert "override_reason" in refused.value.message_dict
    assert not BusinessCase.objects.filter(plan=plan).exists()


def test_a_rate_change_judges_again_and_is_recorded(eur_world,
                                                     django_capture_on_commit_callbacks):
    w = eur_world
    plan = w.plan()
    assert _edit(w, plan, engineer_cost_per_year="100000", engineer_cost_currency="GBP",
                 expected_mtokens_per_month="10000").verdict == cases.DOES_NOT
    rate = CurrencyRate.objects.get(from_currency="GBP", as_of=TODAY)
    with django_capture_on_commit_callbacks(execute=True):
        fleet.currency_rate_update(actor=BOT, currency_rate=rate, rate=Decimal("1.00"))
    row = BusinessCase.objects.get(plan=plan)
    # 27 × 100 000 USD ÷ 46 = 58 695.65 < 72 000: now it pays.
    assert row.verdict == cases.PAYS and "58695.65" in row.verdict_text
    judged = AuditEvent.objects.filter(action="plan.business_case.judged",
                                       object_id=str(plan.pk)).order_by("-id").first()
    assert judged is not None and "currency rate 1.00 USD/GBP" in judged.message
    assert judged.before["verdict"] == cases.DOES_NOT and judged.after["verdict"] == cases.PAYS
    edits = AuditEvent.objects.filter(action="plan.business_case.update",
                                      object_id=str(plan.pk))
    assert edits.count() == 1
    assert edits.get().after["engineer_cost_currency"] == "GBP"


def test_new_benchmark_evidence_judges_again_and_is_recorded(
        world, django_capture_on_commit_callbacks):  # noqa: F811
    w = world
    plan = w.plan()
    assert _edit(w, plan, expected_mtokens_per_month="100000").verdict == cases.NOT_MEASURED
    with django_capture_on_commit_callbacks(execute=True):
        bench(w.candidate, run=9, cost="4.00")
        bench(w.primary, run=9, cost="5.00")
    row = BusinessCase.objects.get(plan=plan)
    # 1.00 × 100 000 × 12 = 1 200 000 USD against 27 × 150 000 ÷ 46 = 88 043.48: pays.
    assert row.verdict == cases.PAYS and "88043.48" in row.verdict_text, row.verdict_text
    judged = AuditEvent.objects.filter(action="plan.business_case.judged",
                                       object_id=str(plan.pk)).order_by("-id").first()
    assert judged is not None and "benchmark evidence of " in judged.message


def test_what_is_missing_is_not_measured_with_its_reason_never_zero(world):  # noqa: F811
    w = world
    plan = w.plan()
    _, case = case_of(plan)  # defaults, nothing measured
    assert case.verdict == cases.NOT_MEASURED
    assert "no benchmark of mi300x-us yet" in case.headline
    assert "set the output tokens per month" in case.headline
    assert "arbitrage_per_year" not in case.numbers
    bench(w.candidate, run=5, cost="4.00")
    bench(w.primary, run=5, cost="5.00")
    case = _edit(w, plan, expected_mtokens_per_month="10", engineer_cost_currency="GBP")
    assert case.verdict == cases.NOT_MEASURED
    assert "no GBP→USD rate dated on or before" in case.headline, case.headline
    assert case.numbers["arbitrage_per_1m"] == "1.0000"
    assert "burden_per_year" not in case.numbers and "arbitrage_per_year" not in case.numbers


def test_the_page_shows_the_verdict_and_saves_the_table_for_a_platform_lead(eur_world, client):
    w = eur_world
    plan = w.plan()
    client.force_login(w.lead)
    assert "Open the business case" in client.get(f"/plans/{plan.name}/").content.decode()
    page = client.get(f"/plans/{plan.name}/business-case/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Not measured" in body and "Driver and runtime matrix" in body
    form = {name: value for name, value in page.context["form"].initial.items()}
    form.update(expected_mtokens_per_month="12000", engineer_cost_currency="GBP",
                engineer_cost_per_year="100000", override="")
    saved = client.post(f"/plans/{plan.name}/business-case/", form, follow=True)
    assert saved.status_code == 200
    assert "Pays for itself: the measured arbitrage is 0.60 USD" in saved.content.decode()
    refused = client.post(f"/plans/{plan.name}/business-case/",
                          {**form, "images_weeks": "60"})
    assert refused.status_code == 400
    assert "0 to 52 engineer-weeks" in refused.content.decode()
    assert BusinessCase.objects.get(plan=plan).images_weeks == Decimal("4.0")
    timeline = client.get(f"/plans/{plan.name}/").content.decode()
    assert "changed the business case" in timeline and "business case judged again" in timeline


def test_a_viewer_reads_but_cannot_edit(eur_world, client):
    w = eur_world
    plan = w.plan()
    client.force_login(w.viewer)
    page = client.get(f"/plans/{plan.name}/business-case/")
    assert page.status_code == 200 and "needs the <code>fleet.manage</code>" in \
        page.content.decode()
    refused = client.post(f"/plans/{plan.name}/business-case/",
                          {**page.context["form"].initial, "oncall_weeks": "1"})
    assert refused.status_code == 403
    assert not BusinessCase.objects.filter(plan=plan).exists()


def test_the_api_round_trip(eur_world, token_client):
    w = eur_world
    plan = w.plan()
    api = token_client(["read", "fleet"], "platform-lead")
    url = f"/api/v1/plans/{plan.name}/business-case/"
    got = api.get(url)
    assert got.status_code == 200, got.content
    assert got.json()["verdict"] == "not-measured" and got.json()["inputs"]["oncall_weeks"] == \
        "4.0"
    put = api.put(url, {"expected_mtokens_per_month": "12000", "engineer_cost_per_year":
                        "100000", "engineer_cost_currency": "GBP"}, format="json")
    assert put.status_code == 200, put.content
    assert put.json()["verdict"] == "pays" and put.json()["recorded_verdict"] == "pays"
    again = api.get(url).json()
    assert again["numbers"]["arbitrage_per_year"] == "86400.00"
    assert again["inputs"]["engineer_cost_currency"] == "GBP"
    bad = api.put(url, {"oncall_weeks": "-2", "engineer_cost_currency": "XYZ"}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) >= {"oncall_weeks", "engineer_cost_currency"}, \
        bad.json()
    assert api.get(url).json()["inputs"]["oncall_weeks"] == "4.0"
    assert api.get("/api/v1/plans/nope/business-case/").status_code == 404
