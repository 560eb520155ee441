"""Only copies a gateway of the run's route mirrored count: a real Envoy and a real nginx in
front of real simulated pools mirror a route to the real shadow collector
(`python -m fleetctl.shadow.collector`), each copy carrying the gateway's token for the route
(fleetctl/traffic/mirror_auth.py), while forged copies are POSTed straight to the collector's
port. The forged ones are refused (403), counted `refused_unauthenticated`, and change
nothing else: not received, no rate budget spent, nothing queued for a pair; the genuine ones
are all counted and queued. A client of the gateway cannot choose the copy's headers (the
gateway overwrites them), and the live pool never sees the token.

Redis is a database of these tests' own (tests/shadow/conftest.py), so the `shadow.pair`
tasks the collector queues stay in its `shadow` list to be read: what a worker would pair."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import redis

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.demo.nginx_process import NginxProcess
from fleetctl.shadow import live
from fleetctl.traffic import mirror_auth
from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    DesiredState,
    PoolTarget,
)
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from tests.shadow.collector_proc import (
    Running,
    counted,
    publish_gateways,
    queued_kwargs,
)
from tests.sim.simproc import MODEL, SimProcess
from tests.traffic.scenarios import Harness, route, start_fleet
from tests.traffic.test_mirror_gateways import Sink

pytestmark = pytest.mark.slow

RUN = 8_800_101
ROUTE = "chat"
OTHER = "other"
GATEWAY, SECRET = 9_001, mirror_auth.new_secret()  # the gateway under test: carries ROUTE
NEIGHBOUR, NEIGHBOUR_SECRET = 9_002, mirror_auth.new_secret()  # carries OTHER only
GENUINE = 20
FORGED_EACH = 8


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = start_fleet(tmp_path_factory.mktemp("fleet"))
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def envoy_gateway(sims: SimProcess, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Harness]:
    process = EnvoyProcess(tmp_path_factory.mktemp("envoy-auth"), free_port(),
                           free_port()).start(timeout_s=60)
    yield Harness(url=process.listen_url, sim=sims,
                  adapter=EnvoyAdapter(process.gateway("auth-envoy", load_timeout_s=30)))
    process.stop()


@pytest.fixture(scope="module")
def nginx_gateway(sims: SimProcess, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Harness]:
    process = NginxProcess(tmp_path_factory.mktemp("nginx-auth")).start(timeout_s=60)
    yield Harness(url=process.url, adapter=NginxAdapter(process.gateway), sim=sims)
    process.stop()


@pytest.fixture(params=["envoy_gateway", "nginx_gateway"])
def gateway(request: pytest.FixtureRequest) -> Harness:
    """Each gateway kind that mirrors and runs here."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def collector(start_collector: Callable[..., Running], shadow_redis: redis.Redis) -> Running:
    """A collector with run RUN on ROUTE, which GATEWAY carries; NEIGHBOUR carries OTHER.
    The run's rate cap is a burst of GENUINE copies: had a forged copy spent any of it, a
    genuine one would be dropped."""
    publish_gateways({
        ROUTE: {GATEWAY: [(mirror_auth.route_token(SECRET, ROUTE), None)]},
        OTHER: {NEIGHBOUR: [(mirror_auth.route_token(NEIGHBOUR_SECRET, OTHER), None)]},
    })
    live.publish_run(RUN, ROUTE, max_rps=GENUINE, max_tokens_per_day=10**9)
    running = start_collector()
    running.wait_for_gateways(ROUTE, [str(GATEWAY)], run=RUN)
    return running


def mirrored_to(harness: Harness, collector: Running, weights: dict[str, int]) -> DesiredState:
    """ROUTE on `weights`, every request mirrored to the collector, with GATEWAY's token."""
    desired = harness.desired(route(weights, key=ROUTE))
    return replace(desired, mirror_url=collector.url, routes=tuple(
        replace(r, mirror_bp=10_000, mirror_auth=mirror_auth.header_value(GATEWAY, SECRET, r.key))
        for r in desired.routes))


def send(harness: Harness, n: int, **headers: str) -> list[dict[str, object]]:
    """`n` chat requests through the gateway, each of its own, with the client's `headers`;
    returns their bodies."""
    bodies = []
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            body = {"model": MODEL, "max_tokens": 1, "messages": [
                {"role": "user", "content": f"copy me {i} {uuid.uuid4().hex}"}]}
            answer = client.post(f"{harness.url}/v1/chat/completions", content=json.dumps(body),
                                 headers={"content-type": "application/json", **headers})
            assert answer.status_code < 300, answer.text
            bodies.append(body)
    return bodies


FORGED = {
    "no header": None,
    "a wrong HMAC": f"{GATEWAY}.{'0' * 64}",
    "a valid HMAC of another route": mirror_auth.header_value(GATEWAY, SECRET, OTHER),
    "another gateway's genuine token, replayed": mirror_auth.header_value(
        NEIGHBOUR, NEIGHBOUR_SECRET, OTHER),
    "a genuine gateway's own HMAC of a route it does not carry": mirror_auth.header_value(
        NEIGHBOUR, NEIGHBOUR_SECRET, ROUTE),
}


def test_only_copies_the_routes_gateway_mirrored_count_and_forged_ones_are_refused_for_free(
        gateway: Harness, collector: Running, shadow_redis: redis.Redis) -> None:
    desired = mirrored_to(gateway, collector, {"alpha": 10_000, "beta": 0})
    gateway.adapter.apply(desired)
    assert gateway.adapter.matches(desired, gateway.adapter.read_back())
    assert gateway.adapter.mirror_matches(desired)[0]

    # Forged copies, straight to the collector's port, as anyone who can reach it could.
    answers = {what: collector.post({"model": MODEL, "messages": [
        {"role": "user", "content": f"forged: {what}"}]}, route=ROUTE, auth=auth).status_code
        for what, auth in FORGED.items() for _ in range(FORGED_EACH)}
    refused = len(FORGED) * FORGED_EACH
    assert set(answers.values()) == {403}, answers
    counts = counted(RUN, refused_unauthenticated=refused)
    assert (counts["received"], counts["sampled"]) == (0, 0)
    assert shadow_redis.get(live.rate_key(RUN)) is None  # no rate budget spent
    assert shadow_redis.llen(live.SHADOW_QUEUE) == 0

    # Genuine copies, mirrored by the gateway, whose client tries to pick both headers.
    bodies = send(gateway, GENUINE, **{MIRROR_AUTH_HEADER: FORGED["a wrong HMAC"],
                                       MIRROR_HEADER: OTHER})

    counts = counted(RUN, received=GENUINE, sampled=GENUINE)
    assert counts["refused_unauthenticated"] == refused  # the gateway overwrote them
    assert counts["dropped_rate"] == 0  # the whole burst was still there
    queued = [task["request"] for task in queued_kwargs(shadow_redis)]
    assert sorted(map(json.dumps, queued)) == sorted(map(json.dumps, bodies))
    assert collector.healthz()["counters"]["refused_unauthenticated"] == refused


def test_the_live_pool_never_sees_the_token_the_copy_carries(
        gateway: Harness, collector: Running, tmp_path: Path) -> None:
    pool = Sink().start()  # the route's only pool: records what the live request carried
    try:
        gateway.extra_pools = {"sink": PoolTarget("sink", (pool.url,), "US")}
        gateway.adapter.apply(mirrored_to(gateway, collector, {"sink": 10_000}))
        send(gateway, 5)

        counted(RUN, received=5, sampled=5)
        assert len(pool.received(5)) == 5
        token = mirror_auth.route_token(SECRET, ROUTE)
        for copy in pool.copies:
            assert MIRROR_AUTH_HEADER not in copy.headers, copy.headers
            assert MIRROR_HEADER not in copy.headers, copy.headers
            assert token not in json.dumps(copy.headers)
    finally:
        gateway.extra_pools = None
        pool.stop()
