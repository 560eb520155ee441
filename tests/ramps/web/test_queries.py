"""The ramp pages stay O(1) in queries: the list does not query per ramp, a ramp's page
not per event, and the pool page's live block not per route it carries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.traffic.models import Route
from tests.ramps.web.conftest import add_window, make_ramp
from tests.traffic.web.conftest import SYSTEM, make_route, ramp

pytestmark = pytest.mark.django_db


def count(client: Client, url: str, headers: dict[str, str] | None = None) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, headers=headers or {})
    assert response.status_code == 200
    return len(captured.captured_queries)


def events(on: Ramp, n: int) -> None:
    for i in range(n):
        RampEvent.objects.create(ramp=on, kind="wait", step_index=1, message=f"wait {i}",
                                 actor="ramp", numbers={"candidate": {"pool": "mi300x-us"}})


def test_the_list_and_a_ramps_page_do_not_query_per_row(oncall: Client, route: Route):
    first = make_ramp(route, state="complete", step_index=2)
    add_window(pool="mi300x-us")
    small = {"list": count(oncall, reverse("ramps:list")),
             "page": count(oncall, reverse("ramps:detail", args=[first.pk])),
             "live": count(oncall, reverse("ramps:detail", args=[first.pk]),
                           {"HX-Request": "true", "HX-Target": "ramp-decisions"})}
    for _ in range(12):
        make_ramp(route, state="aborted")
    events(first, 30)
    large = {"list": count(oncall, reverse("ramps:list")),
             "page": count(oncall, reverse("ramps:detail", args=[first.pk])),
             "live": count(oncall, reverse("ramps:detail", args=[first.pk]),
                           {"HX-Request": "true", "HX-Target": "ramp-decisions"})}
    assert large == small
    assert small["page"] <= 16, small


def test_the_pool_page_does_not_query_per_route_it_carries(oncall: Client, route: Route):
    url = reverse("fleet:pool-detail", args=["mi300x-us"])
    small = count(oncall, url)
    for i in range(6):
        for pool in ("h200-us", "mi300x-us"):
            pool_model_create(actor=SYSTEM, pool=Pool.objects.get(name=pool),
                              model_id=f"m-{i}", max_context_tokens=8192)
        ramp(make_route(f"r-{i}", model_id=f"m-{i}"), {"h200-us": 50, "mi300x-us": 50})
    html = oncall.get(url).content.decode()
    assert html.count('data-route="r-') == 6
    assert count(oncall, url) == small
