"""End to end with a real worker and the simulator: one run measures a candidate costed in EUR
and a primary costed in USD. The gate compares them within that run, converts through a dated
rate (or refuses without one), checks the latency margin at a level both passed, and a later
hourly-rate change makes the cost stale in the rule, the pool API and the pages."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from fleetctl.bench import services
from fleetctl.bench.models import Run
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import world  # noqa: F401 - the fixture
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"
SLO = {"slo_ttft_p95_ms": 2000, "slo_tpot_p95_ms": 200, "slo_error_rate": 0.05}
FAST = {"warmup_s": 0.5, "window_s": 2.0, "min_samples": 8, "lag_limit_ms": 500}


def _result(plan: Plan, key: str, stage: int = 2) -> ev.CheckResult:
    fresh = Plan.objects.get(pk=plan.pk)
    return next(o for o in ev.evaluate_gate(fresh, stage=stage).outcomes
                if o.check.key == key).result


def test_one_run_of_both_pools_is_compared_converted_and_goes_stale(
        celery_worker, bench_sim, make_pool, system, world, client_for):  # noqa: F811
    pools = {}
    for name, rate, currency in (("paced", "39.80", "USD"), ("faulty", "31.20", "EUR")):
        pool = make_pool(name=name, base_urls=[bench_sim.url(name)], node_hourly_rate=rate,
                         currency=currency)
        fleet.pool_model_create(actor=system, pool=pool, model_id=MODEL,
                                max_context_tokens=8192)
        pools[name] = pool
    trace = services.trace_generate(
        actor=system, name="cost-chat", n=200, seed=7,
        prompt_tokens={"kind": "uniform", "lo": 50, "hi": 150},
        completion_tokens={"kind": "uniform", "lo": 16, "hi": 32},
        arrival={"kind": "poisson", "rate": 50.0})
    run = services.run_create(actor=system, trace=trace, pools=list(pools.values()),
                              model_id=MODEL, mode="levels", levels=[1, 4], **SLO, **FAST)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=120,
               what="the two-pool run to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error)

    # The evidence says what the cost was computed with and what makes runs comparable.
    data = Evidence.objects.get(kind="benchmark", pool=pools["faulty"]).data
    assert data["run"] == run.pk and data["trace_sha256"] == trace.sha256
    assert data["hourly_rate"] == "31.2000" and data["currency"] == "EUR"
    assert data["pools"] == ["faulty", "paced"] and data["window_s"] == 2.0
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 4]
    faulty = Pool.objects.get(pk=pools["faulty"].pk)
    assert (faulty.cost_hourly_rate, faulty.cost_currency, faulty.cost_source) == (
        Decimal("31.2000"), "EUR", f"run #{run.pk}")

    plan = plans.plan_create(actor=world.actor("author"), name="faulty-llama",
                             candidate_pool=pools["faulty"], primary_pool=pools["paced"],
                             routes=[world.route], slo_ttft_p95_ms=2000, slo_tpot_p95_ms=200,
                             slo_error_rate=0.05, cost_margin_pct=10, latency_margin_pct=50)
    cost = _result(plan, "cost-vs-primary")
    assert cost.status == ev.INSUFFICIENT and "no EUR→USD rate dated on or before" in \
        cost.summary, cost.summary
    assert cost.numbers["runs"] == [run.pk, run.pk]

    as_of = timezone.now().date() - timedelta(days=1)
    fleet.currency_rate_create(actor=world.actor("lead"), from_currency="EUR",
                               to_currency="USD", rate=Decimal("1.08"), as_of=as_of)
    cost = _result(plan, "cost-vs-primary")
    assert cost.status in (ev.PASS, ev.FAIL), cost.summary
    assert f"EUR converted at 1.08 USD/EUR as of {as_of:%Y-%m-%d}" in cost.summary
    assert f"both measured in run #{run.pk}" in cost.summary

    latency = _result(plan, "latency-vs-primary")
    assert latency.status in (ev.PASS, ev.FAIL), latency.summary
    assert latency.numbers["runs"] == [run.pk, run.pk]
    assert latency.numbers["level"] == "concurrency 4", latency.summary
    assert set(latency.numbers["ttft_p95_ms"]) == {"candidate", "primary", "limit", "text"}

    # The run page: one cost chart per currency.
    viewer = Client()
    viewer.force_login(world.viewer)
    html = viewer.get(f"/bench/runs/{run.pk}/").content.decode()
    assert 'id="cost-chart-eur-data"' in html and 'id="cost-chart-usd-data"' in html
    eur = json.loads(re.search(r'<script id="cost-chart-eur-data" type="application/json">'
                               r'(.*?)</script>', html, re.S)[1])
    assert {t["name"] for t in eur["data"]} <= {"faulty", "faulty: not counted"}

    # The candidate's hourly rate changes: its cost is stale everywhere.
    fleet.pool_update(actor=system, pool=pools["faulty"], node_hourly_rate=Decimal("29.00"))
    reason = (f"hourly rate changed from 31.20 to 29.00 EUR after run #{run.pk}; re-run the "
              f"benchmark")
    for key, stage in (("cost-vs-primary", 2), ("cost-reported", 1)):
        result = _result(plan, key, stage)
        assert result.status == ev.INSUFFICIENT and reason in result.summary, result.summary
    body = client_for("viewer").get("/api/v1/pools/faulty/").json()
    assert body["cost_stale"] is True and body["cost_stale_reason"] == reason
    assert reason in viewer.get("/pools/faulty/").content.decode()
    assert f"This cost no longer holds for faulty: {reason}" in \
        viewer.get(f"/bench/runs/{run.pk}/").content.decode()
