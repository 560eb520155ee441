"""Comparisons with the primary compare like with like: one run (or runs on the same trace
with the same SLO and timing, said so), currencies converted through a dated rate or not at
all, a cost whose pool's hourly rate changed since is stale, and the latency margin is a rule.
Evidence rows are written as benchmark runs write them (bench services), without measuring."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import world  # noqa: F401

BOT = Actor.for_system("benchmark")
SHA_A, SHA_B = "a" * 64, "b" * 64
SLO = {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}
TODAY = date.today()


def _levels(*rows: tuple[int, str, float, float]) -> list[dict[str, Any]]:
    return [{"concurrency": c, "speed": None, "verdict": verdict, "ttft_p95_ms": ttft,
             "tpot_p95_ms": tpot, "output_tokens_per_s": 100.0 * c}
            for c, verdict, ttft, tpot in rows]


def bench(pool: Pool, *, run: int, cost: str | None = "5.00", trace: str = "demo-chat",
          sha: str = SHA_A, slo: dict[str, float] | None = None, currency: str | None = None,
          rate: str | None = None, levels: list[dict[str, Any]] | None = None,
          measured_on: date = TODAY, timing: str = "concurrency", window_s: float = 10.0):
    data = {"run": run, "timing": timing, "best_concurrency": 16, "best_speed": None,
            "output_tokens_per_s": 1000.0, "cost_per_1m": cost, "binding": "tpot_p95",
            "hourly_rate": rate or str(pool.node_hourly_rate),
            "currency": currency or pool.currency, "measured_on": measured_on.isoformat(),
            "slo": slo or SLO, "window_s": window_s, "warmup_s": 2.0, "client_bound": False,
            "trace": trace, "trace_sha256": sha, "pools": [pool.name],
            "levels": levels if levels is not None else _levels((16, "pass", 500, 40))}
    return plans.evidence_record(actor=BOT, pool=pool, kind="benchmark",
                                 verdict="pass" if cost else "fail",
                                 summary=f"run {run}", data=data)


def outcome(plan: Plan, key: str, stage: int = 2) -> ev.CheckResult:
    plan = Plan.objects.get(pk=plan.pk)
    return next(o for o in ev.evaluate_gate(plan, stage=stage).outcomes
                if o.check.key == key).result


# --- like with like ----------------------------------------------------------------------------

def test_runs_on_different_traces_are_not_compared(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10, latency_margin_pct=10)
    bench(world.candidate, run=2, trace="chat-a", sha=SHA_A, cost="4.00")
    bench(world.primary, run=3, trace="chat-b", sha=SHA_B, cost="5.00")
    for key in ("cost-vs-primary", "latency-vs-primary"):
        result = outcome(plan, key)
        assert result.status == ev.INSUFFICIENT, (key, result.summary)
        assert ("mi300x-us measured on trace chat-a, h200-us on trace chat-b"
                in result.summary), result.summary
        assert "run both in one run" in result.summary
        assert result.numbers["runs"] == [2, 3]


def test_same_trace_name_with_other_content_or_another_slo_is_not_compared(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    bench(world.candidate, run=2, sha=SHA_A)
    bench(world.primary, run=3, sha=SHA_B)
    assert "same name, different content" in outcome(plan, "cost-vs-primary").summary
    bench(world.primary, run=4, sha=SHA_A, slo={**SLO, "ttft_p95_ms": 700})
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.INSUFFICIENT
    assert "mi300x-us's run used the SLO TTFT p95 800 ms" in result.summary
    assert "h200-us's TTFT p95 700 ms" in result.summary


def test_one_run_that_measured_both_pools_is_preferred_and_named(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    bench(world.candidate, run=5, cost="5.40")
    bench(world.primary, run=5, cost="5.00")
    bench(world.candidate, run=7, cost="9.99", trace="other", sha=SHA_B)  # later, alone
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.PASS, result.summary
    assert "both measured in run #5" in result.summary
    assert result.numbers["runs"] == [5, 5] and result.numbers["same_run"] is True
    assert result.numbers["trace"] == "demo-chat" and result.numbers["slo"] == SLO


def test_two_runs_on_the_same_trace_and_slo_are_compared_and_said_so(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    bench(world.candidate, run=12, cost="5.60")
    bench(world.primary, run=15, cost="5.00")
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.FAIL
    assert "from runs #12 and #15, same trace demo-chat and SLO" in result.summary
    assert result.numbers["runs"] == [12, 15] and result.numbers["same_run"] is False


# --- currencies ----------------------------------------------------------------------------------

@pytest.fixture
def eur_candidate(world):  # noqa: F811
    fleet.pool_update(actor=BOT, pool=world.candidate, currency="EUR")
    world.candidate = Pool.objects.get(pk=world.candidate.pk)
    return world


def test_costs_in_two_currencies_are_refused_without_a_rate(eur_candidate):
    w = eur_candidate
    plan = w.plan(cost_margin_pct=10)
    bench(w.candidate, run=5, cost="4.80")
    bench(w.primary, run=5, cost="5.00")
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.INSUFFICIENT
    assert (f"no EUR→USD rate dated on or before {TODAY:%Y-%m-%d}" in result.summary), \
        result.summary
    # A rate dated after the measurement is not one that applied to it.
    fleet.currency_rate_create(actor=w.actor("lead"), from_currency="EUR",
                               to_currency="USD", rate=Decimal("1.08"),
                               as_of=TODAY + timedelta(days=1))
    assert outcome(plan, "cost-vs-primary").status == ev.INSUFFICIENT


def test_costs_in_two_currencies_are_converted_at_the_latest_dated_rate(eur_candidate):
    w = eur_candidate
    plan = w.plan(cost_margin_pct=10)
    bench(w.candidate, run=5, cost="4.80")
    bench(w.primary, run=5, cost="5.00")
    lead = w.actor("lead")
    fleet.currency_rate_create(actor=lead, from_currency="EUR", to_currency="USD",
                               rate=Decimal("1.30"), as_of=TODAY - timedelta(days=10))
    as_of = TODAY - timedelta(days=2)
    fleet.currency_rate_create(actor=lead, from_currency="EUR", to_currency="USD",
                               rate=Decimal("1.08"), as_of=as_of, source="reference rate")
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.PASS, result.summary  # 4.80 × 1.08 = 5.184 ≤ 5.50
    assert f"EUR converted at 1.08 USD/EUR as of {as_of:%Y-%m-%d}" in result.summary
    assert "4.80 EUR = 5.1840 USD" in result.summary
    assert result.numbers["conversion"]["rate"] == "1.08000000"
    assert result.numbers["candidate_currency"] == "EUR"
    assert result.numbers["primary_currency"] == "USD"


def test_an_inverse_rate_converts_and_a_rate_older_than_the_limit_is_refused(eur_candidate):
    w = eur_candidate
    plan = w.plan(cost_margin_pct=10)
    bench(w.candidate, run=5, cost="5.40")
    bench(w.primary, run=5, cost="5.00")
    old = TODAY - timedelta(days=40)
    fleet.currency_rate_create(actor=w.actor("lead"), from_currency="USD",
                               to_currency="EUR", rate=Decimal("0.80"), as_of=old)
    result = outcome(plan, "cost-vs-primary")
    assert result.status == ev.INSUFFICIENT
    assert f"is as of {old:%Y-%m-%d}, 40 days before the measurement (limit 31)" in \
        result.summary
    check = plan.checks.get(stage=2, key="cost-vs-primary")
    plans.check_update(actor=w.actor("lead"), check=check,
                       params={"max_rate_age_days": 60})
    result = outcome(plan, "cost-vs-primary")
    # 5.40 EUR ÷ 0.80 = 6.75 USD > 5.50
    assert result.status == ev.FAIL, result.summary
    assert "= 6.7500 USD (EUR converted at 1.25 USD/EUR (the inverse of 0.80 EUR/USD)" in \
        result.summary


def test_rates_are_written_by_platform_leads_only_and_validated(world):  # noqa: F811
    from fleetctl.core.errors import PermissionDeniedError

    with pytest.raises(PermissionDeniedError):
        fleet.currency_rate_create(actor=world.actor("oncall"), from_currency="EUR",
                                   to_currency="USD", rate=Decimal("1.08"), as_of=TODAY)
    lead = world.actor("lead")
    with pytest.raises(ValidationError, match="two different currencies"):
        fleet.currency_rate_create(actor=lead, from_currency="USD", to_currency="USD",
                                   rate=Decimal("1"), as_of=TODAY)
    with pytest.raises(ValidationError):
        fleet.currency_rate_create(actor=lead, from_currency="EUR", to_currency="USD",
                                   rate=Decimal("0"), as_of=TODAY)
    fleet.currency_rate_create(actor=lead, from_currency="EUR", to_currency="USD",
                               rate=Decimal("1.08"), as_of=TODAY)
    with pytest.raises(ValidationError, match="its inverse"):
        fleet.currency_rate_create(actor=lead, from_currency="USD", to_currency="EUR",
                                   rate=Decimal("0.9"), as_of=TODAY)
    with pytest.raises(ValidationError, match="change it instead"):
        fleet.currency_rate_create(actor=lead, from_currency="EUR", to_currency="USD",
                                   rate=Decimal("1.09"), as_of=TODAY)
    from fleetctl.fleet.models import CurrencyRate

    assert CurrencyRate.objects.count() == 1


# --- a rate change makes the cost stale --------------------------------------------------------

def test_an_hourly_rate_change_makes_the_cost_stale_for_both_rules(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    fleet.pool_update(actor=BOT, pool=world.candidate, node_hourly_rate=Decimal("39.80"))
    candidate = Pool.objects.get(pk=world.candidate.pk)
    bench(candidate, run=12, cost="5.00")
    bench(world.primary, run=12, cost="5.00")
    fleet.pool_set_cost(actor=BOT, pool=candidate, cost_per_1m=Decimal("5.00"),
                        measured_at=timezone.now(), hourly_rate=Decimal("39.80"),
                        currency="USD", source="run #12")
    assert outcome(plan, "cost-vs-primary").status == ev.PASS
    assert outcome(plan, "cost-reported", stage=1).status == ev.PASS
    fleet.pool_update(actor=BOT, pool=candidate, node_hourly_rate=Decimal("35.00"))
    reason = "hourly rate changed from 39.80 to 35.00 USD after run #12; re-run the benchmark"
    for key, stage in (("cost-vs-primary", 2), ("cost-reported", 1)):
        result = outcome(plan, key, stage=stage)
        assert result.status == ev.INSUFFICIENT, (key, result.summary)
        assert reason in result.summary, result.summary
    assert Pool.objects.get(pk=candidate.pk).cost_stale_reason == reason
    fleet.pool_update(actor=BOT, pool=candidate, node_hourly_rate=Decimal("39.8"))
    assert outcome(plan, "cost-vs-primary").status == ev.PASS  # the rate it was measured at
    fleet.pool_update(actor=BOT, pool=candidate, currency="EUR")
    result = outcome(plan, "cost-reported", stage=1)
    assert result.status == ev.INSUFFICIENT
    assert "currency changed from USD to EUR after run #12" in result.summary


def test_the_pool_api_and_page_say_the_cost_is_stale(world, client_for):  # noqa: F811
    candidate = world.candidate
    fleet.pool_set_cost(actor=BOT, pool=candidate, cost_per_1m=Decimal("5.0000"),
                        measured_at=timezone.now(), hourly_rate=candidate.node_hourly_rate,
                        currency="USD", source="run #12")
    viewer = client_for("viewer")
    body = viewer.get(f"/api/v1/pools/{candidate.name}/").json()
    assert body["cost_stale"] is False and body["cost_stale_reason"] is None
    assert body["cost_source"] == "run #12" and body["cost_currency"] == "USD"
    fleet.pool_update(actor=BOT, pool=candidate, node_hourly_rate=Decimal("12.25"))
    body = viewer.get(f"/api/v1/pools/{candidate.name}/").json()
    assert body["cost_stale"] is True
    assert body["cost_stale_reason"] == ("hourly rate changed from 10.50 to 12.25 USD after "
                                         "run #12; re-run the benchmark")
    page = viewer.get(f"/pools/{candidate.name}/").content.decode()
    assert "Stale:" in page and "hourly rate changed from 10.50 to 12.25 USD" in page
    overview = viewer.get("/").content.decode()
    assert 'class="badge health-unknown cost-stale"' in overview


# --- latency margin ----------------------------------------------------------------------------

def test_latency_within_the_margin_at_the_highest_level_both_passed(world):  # noqa: F811
    plan = world.plan(latency_margin_pct=10)
    bench(world.candidate, run=5, levels=_levels((8, "pass", 400, 30), (16, "pass", 640, 44),
                                                 (32, "fail", 900, 70)))
    bench(world.primary, run=5, levels=_levels((8, "pass", 380, 28), (16, "pass", 600, 40),
                                               (32, "pass", 700, 50)))
    result = outcome(plan, "latency-vs-primary")
    assert result.status == ev.PASS, result.summary
    assert "at concurrency 16, the highest level both passed (both measured in run #5)" in \
        result.summary
    assert result.numbers["level"] == "concurrency 16"
    assert result.numbers["ttft_p95_ms"] == {"candidate": 640.0, "primary": 600.0,
                                             "limit": 660.0,
                                             "text": "TTFT p95 640.0 vs 600.0 ms (limit 660.0)"}


def test_latency_over_the_margin_fails_and_names_the_figures(world):  # noqa: F811
    plan = world.plan(latency_margin_pct=10)
    bench(world.candidate, run=5, levels=_levels((16, "pass", 600, 44.01)))
    bench(world.primary, run=5, levels=_levels((16, "pass", 600, 40)))
    result = outcome(plan, "latency-vs-primary")
    assert result.status == ev.FAIL
    assert "TPOT p95 44.01 vs 40.0 ms (limit 44.0)" in result.summary, result.summary


def test_latency_when_the_candidate_fails_where_the_primary_passed(world):  # noqa: F811
    plan = world.plan(latency_margin_pct=10)
    bench(world.candidate, run=5, levels=_levels((16, "fail", 1600, 44)))
    bench(world.primary, run=5, levels=_levels((16, "pass", 600, 40)))
    result = outcome(plan, "latency-vs-primary")
    assert result.status == ev.FAIL
    assert "mi300x-us failed the SLO at concurrency 16, where h200-us met it" in result.summary


def test_benchmark_data_is_checked_against_the_kind_schema(world):  # noqa: F811
    with pytest.raises(ValidationError, match="currency"):
        bench(world.candidate, run=5, currency="usd")
    with pytest.raises(ValidationError, match="trace_sha256"):
        bench(world.candidate, run=5, sha="not-a-sha")
