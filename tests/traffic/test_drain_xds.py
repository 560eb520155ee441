"""A drain on an `envoy-xds` gateway of two real Envoys, fed by fleetctl's ADS server in this
process: the drain watcher's in-flight look sums over both Envoys, so a stream held open
through the Envoy that admin_address does not name keeps the drain from completing, and an
Envoy that does not answer keeps it open too (unknown is not zero)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import push
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdmin, in_flight
from fleetctl.traffic.models import Drain, GatewayPush
from fleetctl.traffic.services import drain_request, gateway_create, route_create
from fleetctl.xds.server import XdsServer
from fleetctl.xds.store import MemoryStore, set_default_store
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.traffic.scenarios import slowed

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("xds-drain-sims"), TEST_PROFILES,
                            dict.fromkeys(("us-primary", "us-cand"), "quick"), models=[MODEL])
    yield sim
    sim.stop()


@pytest.fixture
def xds(tmp_path: Path) -> Iterator[tuple[MemoryStore, list[EnvoyProcess]]]:
    store = MemoryStore()
    set_default_store(store)  # the push engine's adapters in this process use it
    server = XdsServer(store=store).start()
    token = store.issue_token("edge")
    envoys: list[EnvoyProcess] = []
    try:
        for node in ("e1", "e2"):
            envoys.append(EnvoyProcess(
                tmp_path / node, free_port(), free_port(),
                xds=XdsSource("127.0.0.1", server.port, "edge", node, token=token)).start(60))
        yield store, envoys
    finally:
        for envoy in envoys:
            envoy.stop()
        server.stop()
        set_default_store(None)


def test_a_drain_waits_for_a_stream_on_any_envoy_of_the_gateway_and_for_a_silent_one(
        sims: SimProcess, xds: tuple[MemoryStore, list[EnvoyProcess]], make_pool,
        system) -> None:
    store, (e1, e2) = xds
    pools = {name: make_pool(name=name, base_urls=[sims.url(name)])
             for name in ("us-primary", "us-cand")}
    for pool in pools.values():
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=system, name="llama", model_id=MODEL,
                         primary_pool=pools["us-primary"],
                         weights={"us-primary": 0, "us-cand": 100}, reason="test")
    gateway_create(actor=system, name="edge", kind="envoy-xds", admin_address=e1.admin_url,
                   options={"ack_timeout_s": 30, "admin_timeout_s": 0.5}, routes=[route])
    push.push_inline(push_ids=list(GatewayPush.objects.values_list("pk", flat=True)))
    assert set(GatewayPush.objects.values_list("status", flat=True)) == {"verified"}

    with slowed(sims, "us-cand", 50), httpx.stream(
            "POST", f"{e2.listen_url}/v1/chat/completions", timeout=30,
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 100, "stream": True, "ignore_eos": True}) as held:
        lines = held.iter_lines()
        wait_until(lambda: next(lines).startswith("data: {"), what="the stream's first chunk")
        drain = push.drain_push_now(drain_request(actor=system, reason="test", route=route,
                                                  force=True))
        assert drain.verified_at is not None, drain.last_error
        # e1 (admin_address) has nothing in flight; the stream on e2 keeps the drain open.
        assert not push.drain_progress(drain_id=drain.pk)
        drain.refresh_from_db()
        assert (drain.status, drain.in_flight_zero_at) == (Drain.Status.VERIFIED, None)
    # The client left: e2's stream ends. With e1 silent (connected, its admin API stopped),
    # the figure is unknown, and unknown is not zero.
    wait_until(lambda: in_flight(EnvoyAdmin(e2.admin_url, timeout_s=5, gateway="e2"),
                                 "us-cand") == 0, what="the stream to end on e2")
    assert [e.node_id for e in store.envoys("edge") if e.connected] == ["e1", "e2"]
    assert e1.proc is not None
    os.kill(e1.proc.pid, signal.SIGSTOP)
    try:
        assert not push.drain_progress(drain_id=drain.pk)
        drain.refresh_from_db()
        assert drain.in_flight_zero_at is None
    finally:
        os.kill(e1.proc.pid, signal.SIGCONT)
    wait_until(lambda: push.drain_progress(drain_id=drain.pk), timeout_s=30,
               what="the drain to complete once every Envoy answers zero")
    drain.refresh_from_db()
    assert drain.status == Drain.Status.COMPLETE and drain.in_flight_zero_at is not None
