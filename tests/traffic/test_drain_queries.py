"""A drain's transaction is on the path every drain is timed by (drain call → every gateway
verified): its query count must not grow with the gateways carrying the route, nor with the
other routes in the registry (a pool drain locks every route, and reads each one's split)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from fleetctl.traffic import selectors, services
from fleetctl.traffic.models import Drain, GatewayPush, Route

pytestmark = pytest.mark.django_db

SYSTEM = Actor.for_system("test")  # as tests.conftest's, whose own typing mypy flags

# What a pool drain of one route costs today (the transaction's own SAVEPOINT and RELEASE
# included): the ramps' lock, routes, primaries, splits, eligible pools, the capacity
# figures (in a savepoint of their own), the record, the revision and its pushes, two audit
# rows, the ramps a drain ends.
DRAIN_QUERIES_MAX = 21


def add_gateways(route: Route, tmp_path: Path, first: int, last: int) -> None:
    for i in range(first, last):
        services.gateway_create(actor=SYSTEM, name=f"gw-{i}", kind="file",
                                admin_address=str(tmp_path / f"gw-{i}"),
                                options={"file_name": "weights.json"}, routes=[route])


def add_routes(first: int, last: int) -> None:
    """Routes on the primary alone: the pool drain locks them and leaves them as they are."""
    primary = Pool.objects.get(name="primary")
    for i in range(first, last):
        pool_model_create(actor=SYSTEM, pool=primary, model_id=f"other-{i}",
                          max_context_tokens=4096)
        services.route_create(actor=SYSTEM, name=f"other-{i}", model_id=f"other-{i}",
                              primary_pool=primary, weights={"primary": 100})


def drain_queries(pool: Pool) -> tuple[Drain, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        drain = services.drain_request(actor=SYSTEM, pool=pool, reason="queries")
    return drain, [query["sql"] for query in captured.captured_queries]


def test_a_pool_drain_reads_the_same_whatever_the_gateways_and_other_routes(
        route: Route, tmp_path: Path, file_kind: None):
    cand = Pool.objects.get(name="cand")
    add_gateways(route, tmp_path, 0, 2)
    drain, small = drain_queries(cand)
    assert len(drain.push_ids or []) == 2
    services.drain_restore(actor=SYSTEM, drain=drain, reason="again")

    add_gateways(route, tmp_path, 2, 10)
    add_routes(0, 6)
    drain, large = drain_queries(cand)

    assert len(large) == len(small), large
    assert len(large) <= DRAIN_QUERIES_MAX, large
    # ... and it still did all of it: the split, a push per gateway, the audit rows.
    route.refresh_from_db()
    current = selectors.revision_current(route=route)
    assert current is not None and current.weights == {"primary": 10000}
    assert GatewayPush.objects.filter(pk__in=drain.push_ids or []).count() == 10
    assert [r.route_id for r in drain.new_revisions or []] == [route.pk]
    assert AuditEvent.objects.filter(action="drain.request", object_id=str(drain.pk)).exists()
    assert all(r.revision_number == 1 for r in Route.objects.exclude(pk=route.pk))
