"""The demo's capacity drill (fleetctl/demo/capacity_drill.py) on the demo's own names, after
the Gaudi ramp: with the H200 primary sampled at its capacity, draining the TPU off the
unpinned llama-8b spreads its share to the Gaudi in India (it has room), and the drill
restores it, once. Real parts: PostgreSQL, benchmark evidence, gateway traffic samples, the
file gateway kind (the burst itself goes through the demo's Envoy: checked in a running
demo, docs/demo.md)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleetctl.demo import capacity_drill
from fleetctl.fleet import services as fleet_services
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import selectors, services
from fleetctl.traffic.models import PoolTrafficSample, Route
from tests.conftest import SYSTEM
from tests.traffic.test_drain_capacity import MODEL, _bench

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]
H200, TPU, GAUDI = "h200-us-east", "tpu-v5e-eu-west", "gaudi3-in-west"


@pytest.fixture
def demo(make_pool, tmp_path):
    """The demo's llama-8b after the ramp (H200 45 %, TPU 5 %, Gaudi 50 %), the TPU's EU
    route and the batch route (all on the H200 here), each pool measured at 16 streams."""
    eu = fleet_services.region_create(actor=SYSTEM, code="eu-west", name="EU West",
                                      jurisdiction="EU")
    india = fleet_services.region_create(actor=SYSTEM, code="in-west", name="India West",
                                         jurisdiction="IN")
    pools = {H200: make_pool(name=H200), TPU: make_pool(name=TPU, region=eu),
             GAUDI: make_pool(name=GAUDI, region=india)}
    for run, pool in enumerate(pools.values(), start=1):
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=8192)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
        _bench(pool, run=run, streams=16)
    routes = [
        services.route_create(actor=SYSTEM, name="llama-8b", model_id=MODEL,
                              primary_pool=pools[H200],
                              weights={H200: 45, TPU: 5, GAUDI: 50}),
        services.route_create(actor=SYSTEM, name="llama-8b-eu", model_id=MODEL,
                              residency="EU", primary_pool=pools[TPU]),
        services.route_create(actor=SYSTEM, name="llama-8b-batch", model_id=MODEL,
                              latency_class="batch", primary_pool=pools[H200]),
    ]
    gateway = services.gateway_create(actor=SYSTEM, name="envoy-demo", kind="file",
                                      admin_address=str(tmp_path),
                                      options={"file_name": "weights.json"}, routes=routes)
    return gateway


def _live(gateway, **active: int) -> None:
    for pool, streams in active.items():
        PoolTrafficSample.objects.create(gateway=gateway, pool=pool.replace("_", "-"),
                                         active=streams, requests_total=0, errors_total=0,
                                         at=timezone.now())


def _split() -> dict[str, int]:
    current = selectors.revision_current(route=Route.objects.get(name="llama-8b"))
    return dict(current.weights) if current else {}


def test_the_drill_fills_the_primary_through_the_route_it_carries_most(demo):
    _live(demo, **{H200: 10, TPU: 0, GAUDI: 3})
    assert capacity_drill.not_ready() == ""
    plan = capacity_drill.burst_plan()
    # The batch route is all on the H200: 16 + 3 - 10 streams there; the TPU's own route.
    assert (plan["via"], plan["streams"], plan["headers"]) == (
        "llama-8b-batch", 9, {"x-fleetctl-latency-class": "batch"})
    assert (plan["tpu_via"], plan["tpu_headers"]) == (
        "llama-8b-eu", {"x-fleetctl-residency": "EU"})
    assert capacity_drill.primary_full(H200)[0] is False


def test_with_the_primary_full_the_tpus_share_spreads_to_the_gaudi_and_comes_back(demo):
    _live(demo, **{H200: 19, TPU: 2, GAUDI: 4})
    full, live, cap = capacity_drill.primary_full(H200)
    assert full and live == {H200: 19, TPU: 2} and cap == 16

    drain = capacity_drill.drill_drain()

    assert drain.requested_by == "system:demo-drill"
    assert drain.capacity["decision"] == "spread"
    note = drain.capacity["routes"][0]
    assert note["route"] == "llama-8b"
    assert note["pools"][H200]["room_streams"] == -3.0
    # The Gaudi is in another jurisdiction, but llama-8b is unpinned and sends to it already.
    assert note["pools"][GAUDI]["role"] == "spread" and note["pools"][GAUDI]["given_bp"] == 500
    assert _split() == {H200: 4500, GAUDI: 5500}
    assert capacity_drill.drill_drains() == (drain, None)

    restore = capacity_drill.drill_restore(drain)
    assert _split() == {H200: 4500, TPU: 500, GAUDI: 5000}
    assert capacity_drill.drill_drains()[1] == restore
    said: list[str] = []
    assert capacity_drill.run("http://127.0.0.1:1", note=said.append) == 0  # once per database
    assert said and said[0].startswith(f"already drilled (drain {drain.pk}: spread")


def test_an_interrupted_drill_is_restored_at_the_next_start(demo):
    _live(demo, **{H200: 19, TPU: 2, GAUDI: 4})
    drain = capacity_drill.drill_drain()
    said: list[str] = []
    assert capacity_drill.run("http://127.0.0.1:1", note=said.append, restore_after_s=0) == 0
    assert said[-1].startswith(f"restored drain {drain.pk}")
    assert _split() == {H200: 4500, TPU: 500, GAUDI: 5000}
