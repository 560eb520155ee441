"""Queries that must not grow with the fleet (benchmarks/scale_rehearsal.py found each):
the routes and drains lists per row, a gateway's desired state per route it carries, a pool
drain per route of the fleet. The answers stay what they were."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.traffic import push, services
from fleetctl.traffic.models import Gateway, Route
from tests.conftest import SYSTEM

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]


def listed(client, url: str) -> tuple[int, list[dict]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries), response.json()["results"]


def drain_and_restore(route: Route) -> None:
    drain = push.drain_push_now(services.drain_request(actor=SYSTEM, route=route,
                                                       reason="incident"))
    push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    push.drain_push_now(services.drain_restore(actor=SYSTEM, drain=drain, reason="over"))


def test_the_drains_list_does_not_query_per_drain(route: Route, gateway: Gateway, client_for):
    viewer = client_for("viewer")
    drain_and_restore(route)
    few, _ = listed(viewer, "/api/v1/drains/")
    for _ in range(4):
        drain_and_restore(route)
    many, rows = listed(viewer, "/api/v1/drains/")
    assert len(rows) == 10
    assert many == few
    for row in rows:  # each drain's own pushes, as its page answers them
        assert row["gateways"] == viewer.get(f"/api/v1/drains/{row['id']}/").json()["gateways"]
        assert [g["gateway"] for g in row["gateways"]] == ["gw-1"]


def test_the_routes_list_does_not_query_per_route(route: Route, gateway: Gateway, client_for):
    viewer = client_for("viewer")
    services.revision_create(actor=SYSTEM, route=route, weights={"primary": 90, "cand": 10},
                             base_revision=route.revision_number, reason="test")
    few, _ = listed(viewer, "/api/v1/routes/")
    primary = Pool.objects.get(name="primary")
    for i in range(5):
        pool_model_create(actor=SYSTEM, pool=primary, model_id=f"m-{i}",
                          max_context_tokens=4096)
        services.route_create(actor=SYSTEM, name=f"r-{i}", model_id=f"m-{i}",
                              primary_pool=primary)
    many, rows = listed(viewer, "/api/v1/routes/")
    assert len(rows) == 6
    assert many == few
    current = {row["name"]: row["current"] for row in rows}
    assert current["llama"]["route"] == "llama"
    assert (current["llama"]["number"], current["llama"]["parent"]) == (2, 1)
    assert current["r-0"]["route"] == "r-0" and current["r-0"]["parent"] is None


def test_a_gateways_desired_state_reads_eligibility_once(route: Route, gateway: Gateway,
                                                         make_pool):
    """Reconcile and every push read the gateway's desired state: which pools may carry
    each route is one query for all its routes, the same sets `pools_eligible` answers
    (its model served, in the route's jurisdiction when pinned)."""
    from fleetctl.fleet.services import region_create
    from fleetctl.traffic import selectors

    def reads() -> int:
        with CaptureQueriesContext(connection) as captured:
            selectors.gateway_desired_state(gateway=gateway)
        return len(captured.captured_queries)

    few = reads()
    eu = region_create(actor=SYSTEM, code="eu-west", name="EU West", jurisdiction="EU")
    abroad = make_pool(name="abroad", region=eu)
    primary = Pool.objects.get(name="primary")
    routes = []
    for i in range(4):
        for pool in (primary, abroad):
            pool_model_create(actor=SYSTEM, pool=pool, model_id=f"m-{i}",
                              max_context_tokens=4096)
        routes.append(services.route_create(actor=SYSTEM, name=f"r-{i}", model_id=f"m-{i}",
                                            primary_pool=primary,
                                            residency="US" if i % 2 else ""))
    services.gateway_set_routes(actor=SYSTEM, gateway=gateway, routes=[route, *routes])
    assert reads() == few
    every = selectors.pools_eligible_many(routes=[route, *routes])
    assert every == {r.pk: selectors.pools_eligible(route=r) for r in [route, *routes]}
    assert every[routes[0].pk] == {"primary", "abroad"} and every[routes[1].pk] == {"primary"}


def test_a_pool_drain_does_not_query_per_route_of_the_fleet(route: Route, gateway: Gateway):
    """A pool drain locks every route and reads each one's split: in one query."""
    cand = Pool.objects.get(name="cand")

    def drained() -> int:
        with CaptureQueriesContext(connection) as captured:
            drain = services.drain_request(actor=SYSTEM, pool=cand, reason="incident",
                                           force=True)
        stored = drain.new_revisions or []
        assert [(r.route.name, r.weights) for r in stored] == [("llama", {"primary": 10_000})]
        push.drain_push_now(drain)
        push.drain_progress(drain_id=drain.pk)
        drain.refresh_from_db()
        push.drain_push_now(services.drain_restore(actor=SYSTEM, drain=drain, reason="over"))
        return len(captured.captured_queries)

    few = drained()
    primary = Pool.objects.get(name="primary")
    for i in range(5):  # routes the pool is not on
        pool_model_create(actor=SYSTEM, pool=primary, model_id=f"m-{i}",
                          max_context_tokens=4096)
        services.route_create(actor=SYSTEM, name=f"r-{i}", model_id=f"m-{i}",
                              primary_pool=primary)
    assert drained() == few
