"""Traffic charts are pure functions of selector data; the route page embeds them with the
numbers one click away."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleetctl.core.charts import pool_colours
from fleetctl.traffic import charts, services
from fleetctl.traffic.models import PoolTrafficSample, Route
from tests.traffic.web.conftest import SYSTEM

# These gateways are never reached (no worker runs here); Envoy rows need a config dir.
NO_ENVOY = {"config_dir": "/nonexistent/fleetctl-test"}


def test_pool_colours_are_stable_whatever_order_the_pools_come_in():
    assert pool_colours(["b", "a", "b"]) == pool_colours(["a", "b"])
    assert len(set(pool_colours(["a", "b", "c"]).values())) == 3


def test_the_split_chart_has_one_bar_per_pool_with_its_percentage_written_on_it():
    figure = charts.split_figure({"h200": 99.9, "mi300x": 0.1},
                                 colours=pool_colours(["h200", "mi300x"]), revision=7)
    (bar,) = figure.data
    assert list(bar.y) == ["h200", "mi300x"] and list(bar.x) == [99.9, 0.1]
    assert list(bar.text) == ["99.9 %", "0.1 %"]
    assert figure.layout.title.text == "Current split (revision 7)"


def test_the_rates_chart_draws_every_pool_in_every_panel_never_only_the_sum():
    now = timezone.now().isoformat()
    rates = {pool: [{"at": now, "rps": 10.0, "eps": 0.5, "active": 3.0}]
             for pool in ("h200", "mi300x")}
    figure = charts.pool_rates_figure(rates, colours=pool_colours(rates))
    assert [(t.name, t.yaxis) for t in figure.data] == [
        ("h200", "y"), ("h200", "y2"), ("h200", "y3"),
        ("mi300x", "y"), ("mi300x", "y2"), ("mi300x", "y3"),
    ]
    assert [t.showlegend for t in figure.data].count(True) == 2


@pytest.mark.django_db
def test_the_route_page_draws_per_pool_rates_from_the_gateways_samples(
    viewer: Client, route: Route
):
    gateway = services.gateway_create(actor=SYSTEM, name="edge-1", kind="envoy",
                                      admin_address="http://127.0.0.1:9901",
        options=NO_ENVOY, routes=[route])
    start = timezone.now() - timedelta(minutes=2)
    PoolTrafficSample.objects.bulk_create([
        PoolTrafficSample(gateway=gateway, pool=pool, at=start + timedelta(seconds=10 * step),
                          requests_total=base + 100 * step, errors_total=step, active=2)
        for step in range(4) for pool, base in (("h200-us", 1000), ("mi300x-us", 50),
                                                ("somebody-elses-pool", 0))
    ])
    html = viewer.get(reverse("traffic:route-detail", args=[route.name])).content.decode()
    assert 'id="rates-chart-data"' in html and html.count("plotly.min.js") == 1
    assert "The numbers: 6 readings" in html  # 3 rates for each of the route's 2 pools
    assert "somebody-elses-pool" not in html
    assert "10.00</td>" in html  # 100 requests in 10 s
    assert "No traffic samples" not in html
