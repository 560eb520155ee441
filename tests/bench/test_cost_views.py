"""The run page never puts costs in two currencies on one axis, and shows each level's cost
at the rate it was computed with, saying so when the pool's rate has changed since."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.bench.models import Level
from fleetctl.fleet.services import pool_update
from tests.bench.helpers import SYSTEM, finished_run, serving, small_trace

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def trace_files(settings, tmp_path):
    settings.DATA_DIR = tmp_path


@pytest.fixture
def viewer(make_user) -> Client:
    client = Client()
    client.force_login(make_user("vera", "viewer"))
    return client


def _figure(html: str, chart: str) -> dict | None:
    found = re.search(rf'<script id="{chart}-data" type="application/json">(.*?)</script>',
                      html, re.S)
    return json.loads(found[1]) if found else None


def test_costs_in_two_currencies_get_one_chart_each(viewer, make_pool):
    paced = serving(make_pool, "paced")
    faulty = serving(make_pool, "faulty", "31.20", currency="EUR")
    run = finished_run(small_trace(), paced, faulty)
    Level.objects.filter(pool=faulty).update(hourly_rate=Decimal("31.20"), currency="EUR")
    html = viewer.get(reverse("bench:run-detail", args=[run.pk])).content.decode()
    assert _figure(html, "cost-chart") is None
    eur, usd = _figure(html, "cost-chart-eur"), _figure(html, "cost-chart-usd")
    assert eur is not None and usd is not None
    assert [t["name"] for t in eur["data"]] == ["faulty", "faulty: not counted"]
    assert [t["name"] for t in usd["data"]] == ["paced"]
    assert eur["layout"]["yaxis"]["title"]["text"] == "EUR per 1M output tokens"
    assert usd["layout"]["yaxis"]["title"]["text"] == "USD per 1M output tokens"
    # Each pool keeps its colour across the charts.
    throughput = _figure(html, "throughput-chart")
    assert throughput is not None
    colour = {t["name"]: t["line"]["color"] for t in throughput["data"] if "line" in t}
    assert eur["data"][0]["line"]["color"] == colour["faulty"]
    assert usd["data"][0]["line"]["color"] == colour["paced"]


def test_a_rate_change_after_the_run_leaves_its_figures_and_says_they_are_stale(viewer,
                                                                                 make_pool):
    paced = serving(make_pool, "paced")
    faulty = serving(make_pool, "faulty", "31.20")
    run = finished_run(small_trace(), paced, faulty)
    Level.objects.filter(pool=paced).update(hourly_rate=Decimal("39.80"), currency="USD")
    pool_update(actor=SYSTEM, pool=paced, node_hourly_rate=Decimal("45.00"))
    html = viewer.get(reverse("bench:run-detail", args=[run.pk])).content.decode()
    card = html[html.index('data-pool="paced"'):]
    assert "= 39.8000 USD/h ÷ 400.0 tok/s × 1e6 ÷ 3600" in card
    assert (f"This cost no longer holds for paced: hourly rate changed from 39.80 to 45.00 "
            f"USD after run #{run.pk}; re-run the benchmark") in card
    assert "no longer holds for faulty" not in html


def test_editing_the_rate_on_the_pool_page_says_the_cost_is_now_stale(make_user, make_pool):
    from django.utils import timezone

    from fleetctl.fleet.services import pool_set_cost

    pool = serving(make_pool, "paced")
    pool_set_cost(actor=SYSTEM, pool=pool, cost_per_1m=Decimal("27.6389"),
                  measured_at=timezone.now(), source="run #3")
    lead = Client()
    lead.force_login(make_user("lena", "platform-lead"))
    form = {"name": "paced", "runtime": "cuda", "accelerator": "H200", "region": "us-east",
            "base_urls": pool.base_urls[0], "latency_class": "standard",
            "max_context_tokens": "32768", "node_hourly_rate": "42.00", "currency": "USD",
            "labels": ""}
    answer = lead.post(f"/pools/{pool.name}/edit/", form, follow=True)
    html = answer.content.decode()
    assert answer.status_code == 200 and "Saved pool paced." in html
    reason = "hourly rate changed from 39.80 to 42.00 USD after run #3; re-run the benchmark"
    assert f"Its cost per 1M output tokens is now stale: {reason}." in html
    assert "Stale:" in html
