"""The traffic pages stay fast as the record grows: their query count does not depend on the
number of routes, revisions, gateways or drains (no per-row query)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.traffic import push, services
from fleetctl.traffic.models import Route
from tests.traffic.web.conftest import SYSTEM, make_route, ramp

# These gateways are never reached (no worker runs here); Envoy rows need a config dir.
NO_ENVOY = {"config_dir": "/nonexistent/fleetctl-test"}

pytestmark = pytest.mark.django_db


def queries_for(client: Client, url: str, headers: dict[str, str] | None = None) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, headers=headers or {})
    assert response.status_code == 200
    return [query["sql"] for query in captured.captured_queries]


def seed_routes(first: int, last: int) -> None:
    """Routes `m-<i>`, each split 90/10, carried by a gateway, with one completed drain."""
    primary, cand = Pool.objects.get(name="h200-us"), Pool.objects.get(name="mi300x-us")
    for i in range(first, last):
        for pool in (primary, cand):
            pool_model_create(actor=SYSTEM, pool=pool, model_id=f"m-{i}",
                              max_context_tokens=8192)
        route = make_route(f"m-{i}", model_id=f"m-{i}")
        ramp(route, {"h200-us": 90, "mi300x-us": 10})
        services.gateway_create(actor=SYSTEM, name=f"gw-{i}", kind="envoy",
                                admin_address=f"http://127.0.0.1:{19000 + i}",
        options=NO_ENVOY, routes=[route])
        route.refresh_from_db()
        drain = services.drain_request(actor=SYSTEM, route=route, reason="test")
        push.drain_progress(drain_id=drain.pk)


def test_the_routes_page_query_count_does_not_grow_with_the_number_of_routes(
    oncall: Client, pools: object
):
    blocks = {"page": {}, "gateways": {"HX-Request": "true", "HX-Target": "gateways"},
              "drains": {"HX-Request": "true", "HX-Target": "recent-drains"}}
    url = reverse("traffic:routes")
    seed_routes(0, 3)
    small = {name: queries_for(oncall, url, headers) for name, headers in blocks.items()}
    seed_routes(3, 20)
    assert Route.objects.count() == 20
    large = {name: queries_for(oncall, url, headers) for name, headers in blocks.items()}
    for name in blocks:
        assert len(large[name]) == len(small[name]), (name, large[name])
    assert len(small["page"]) <= 14, small["page"]


def test_a_route_page_query_count_does_not_grow_with_its_revisions_and_gateways(
    oncall: Client, route: Route
):
    url = reverse("traffic:route-detail", args=[route.name])
    services.gateway_create(actor=SYSTEM, name="gw-a", kind="envoy",
                            admin_address="http://127.0.0.1:19901",
        options=NO_ENVOY, routes=[route])
    small = queries_for(oncall, url)
    for step in range(18):
        ramp(route, {"h200-us": 90 - step, "mi300x-us": 10 + step})
    for name in ("gw-b", "gw-c", "gw-d"):
        services.gateway_create(actor=SYSTEM, name=name, kind="nginx",
                                admin_address=f"/etc/nginx/{name}", routes=[route],
                                options={"listen": "127.0.0.1:1"})
    route.refresh_from_db()
    assert route.revision_number == 20
    large = queries_for(oncall, url)
    assert len(large) == len(small), large
    # 22: the Ramps panel's standing watches are one query (their verdicts one more, when any),
    # and the live figures read which Prometheus telemetry sources read the pools (one).
    assert len(small) <= 22, small


def test_the_drain_list_and_a_drain_page_do_not_query_per_row(oncall: Client, pools: object):
    seed_routes(0, 3)
    small = queries_for(oncall, reverse("traffic:drains"))
    seed_routes(3, 12)
    large = queries_for(oncall, reverse("traffic:drains"))
    assert len(large) == len(small), large
