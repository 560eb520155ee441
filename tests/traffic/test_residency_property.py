"""A stateful property test (hypothesis) over registry and traffic operations through
REST, guarded ramps driven by their controller, health flips under the health policy and a
migration plan moved through its stages: after every step the real Envoy must send pinned
requests only to pools, and endpoints, registered in the pin's jurisdiction, and give the
plan's candidate only the weight its stage allows. The machine is in residency_machine.py;
benchmarks/residency_fuzz.py runs it for 1,000+ sequences."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, settings

from fleetctl.traffic.services import gateway_create
from tests.conftest import SYSTEM
from tests.traffic.residency_machine import make_machine

pytestmark = pytest.mark.slow


def test_no_sequence_of_registry_and_traffic_changes_sends_pinned_traffic_abroad(
    celery_worker, envoy, client_for
):
    from hypothesis.stateful import run_state_machine_as_test

    gateway = gateway_create(actor=SYSTEM, name="fuzz-edge", kind="envoy",
                             admin_address=envoy.admin_url,
                             options={"config_dir": str(envoy.workdir), "load_timeout_s": 30})
    machine = make_machine(client_for("admin"), gateway, itertools.count(1))

    run_state_machine_as_test(machine, settings=settings(
        # Ten sequences of up to 18 steps: the rules for ramps and health flips need a few
        # steps to build on each other (start, tick, move, resume...) in one sequence.
        max_examples=10, stateful_step_count=18, deadline=None, database=None,
        # No shrinking: each step waits on a real Envoy, and the failing sequence is printed
        # step by step anyway.
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))


def test_the_property_sees_pinned_traffic_reach_a_foreign_server_through_a_spelling(
    celery_worker, envoy
):
    """The property's own check is not blind to spellings: an EU pool whose endpoint is
    written `localhost` at the US pool's port (stored past the registry's refusal, as before
    issue 25) is a crossing once Envoy holds it."""
    from fleetctl.fleet.models import Pool
    from fleetctl.fleet.services import (
        pool_create,
        pool_health_record,
        pool_model_create,
        region_create,
    )
    from fleetctl.traffic.services import gateway_set_routes, route_create
    from tests.traffic.residency_machine import crossings, settle

    gateway = gateway_create(actor=SYSTEM, name="spell-edge", kind="envoy",
                             admin_address=envoy.admin_url,
                             options={"config_dir": str(envoy.workdir), "load_timeout_s": 30})
    regions = {j: region_create(actor=SYSTEM, code=f"r-{j.lower()}", name=j, jurisdiction=j)
               for j in ("EU", "US")}
    pools = {j: pool_create(actor=SYSTEM, name=f"p-{j.lower()}", runtime="cuda",
                            accelerator="H100", region=regions[j], max_context_tokens=4096,
                            node_hourly_rate="1", base_urls=[f"http://127.0.0.1:{port}"])
             for j, port in (("EU", 29101), ("US", 29102))}
    Pool.objects.filter(pk=pools["EU"].pk).update(base_urls=["http://localhost:29102/v1"])
    for pool in pools.values():
        pool_model_create(actor=SYSTEM, pool=pool, model_id="m", max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=SYSTEM, name="eu-only", model_id="m", residency="EU",
                         primary_pool=pools["EU"], weights={"p-eu": 100})
    gateway_set_routes(actor=SYSTEM, gateway=gateway, routes=[route])
    settle(gateway)

    found = crossings(gateway, settled=True)

    assert any("eu-only (EU)" in line and "'US'" in line for line in found), found
