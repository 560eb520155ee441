"""The overview must stay fast with a thousand pools: its query count may not grow with the
number of pools (no per-row query), for the full page and for both htmx partials."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleetctl.fleet.models import Pool
from tests.web.factories import seed_fleet

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]
PAGES: dict[str, dict[str, str]] = {
    "full page": {},
    "tile partial": {"HX-Request": "true", "HX-Target": "summary-tiles"},
    "pool partial": {"HX-Request": "true", "HX-Target": "pool-groups"},
}


def queries_for(client: Client, headers: dict[str, str], params: dict[str, str]) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(reverse("fleet:overview"), params, headers=headers)
    assert response.status_code == 200
    return [query["sql"] for query in captured.captured_queries]


@pytest.mark.parametrize("params", [{}, {"model": "llama-3.1-70b-instruct", "runtime": "rocm"}])
def test_the_overview_query_count_does_not_grow_with_the_number_of_pools(
    login_as: LoginAs, viewer: User, params: dict[str, str]
):
    client = login_as(viewer)
    seed_fleet(3)
    small = {name: queries_for(client, headers, params) for name, headers in PAGES.items()}

    seed_fleet(27, prefix="more")
    assert Pool.objects.count() == 30
    large = {name: queries_for(client, headers, params) for name, headers in PAGES.items()}

    for name in PAGES:
        assert len(large[name]) == len(small[name]), (name, large[name])
    # 12, plus the live figures' one live_summary for the page's pools: their names, the
    # gateways' windows, the pools' own windows.
    assert len(small["full page"]) <= 15, small["full page"]
    assert len(small["tile partial"]) <= 6, small["tile partial"]


def test_the_overview_pages_a_large_fleet_and_keeps_filters_across_pages(
    login_as: LoginAs, viewer: User
):
    client = login_as(viewer)
    seed_fleet(130)
    first = client.get(reverse("fleet:overview")).content.decode()
    assert first.count('class="pool-link"') == 100
    assert "showing 1–100" in first and "page 1 of 2" in first
    second = client.get(reverse("fleet:overview"), {"page": "2"}).content.decode()
    assert second.count('class="pool-link"') == 30
    filtered = client.get(reverse("fleet:overview"), {"runtime": "rocm"}).content.decode()
    rocm = Pool.objects.filter(runtime="rocm").count()
    assert filtered.count('class="pool-link"') == min(rocm, 100)
    assert "page=2" not in filtered or "runtime=rocm" in filtered
