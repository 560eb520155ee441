"""Envoy fed over xDS by fleetctl's ADS server (fleetctl/xds/), against real Envoys in front of
real simulated pools: the `envoy-xds` kind's apply sets a snapshot and is verified by the
Envoys' ACKs; which pool served a request is read from the pools' ground truth. The server
runs in this process, on a store of this module's own."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess, XdsSource, validate_config
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import AdapterError, GatewaySpec, PoolTarget
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdmin
from fleetctl.traffic.gateways.envoy.adapter import in_flight as envoy_in_flight
from fleetctl.traffic.gateways.envoy.names import CLUSTER_TYPE
from fleetctl.traffic.gateways.envoy_xds.adapter import EnvoyXdsAdapter
from fleetctl.xds.protos import AdsStub, DiscoveryRequest
from fleetctl.xds.resources import from_documents
from fleetctl.xds.server import XdsServer
from fleetctl.xds.store import MemoryStore
from tests.sim.simproc import SimProcess
from tests.support.waiting import wait_until
from tests.traffic.scenarios import slowed

from .conftest import JURISDICTION, MODEL, POOLS, route, served_by, state

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]

HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class XdsGateway:
    """One gateway (node cluster) and its Envoys, all fed by `server`."""

    name: str
    server: XdsServer
    store: MemoryStore
    sims: SimProcess
    workdir: Path
    envoys: list[EnvoyProcess]
    token: str = ""

    def start_envoy(self, node_id: str) -> EnvoyProcess:
        if not self.token:
            self.token = self.store.issue_token(self.name)
        process = EnvoyProcess(self.workdir / node_id, free_port(), free_port(),
                               xds=XdsSource("127.0.0.1", self.server.port, self.name,
                                             node_id, token=self.token)).start(timeout_s=60)
        self.envoys.append(process)
        return process

    @property
    def envoy(self) -> EnvoyProcess:
        return self.envoys[0]

    def adapter(self, **options: Any) -> EnvoyXdsAdapter:
        # A loaded machine may take a while to ACK; a refusal is reported at once anyway.
        spec = GatewaySpec(self.name, "envoy-xds", self.envoy.admin_url,
                           {"ack_timeout_s": 30, **options})
        return EnvoyXdsAdapter(spec, store=self.store)

    def pools(self, *names: str) -> dict[str, PoolTarget]:
        return {n: PoolTarget(n, (self.sims.url(n),), JURISDICTION[n]) for n in names}

    def ask(self, envoy: EnvoyProcess | None = None) -> tuple[int, str]:
        """One chat completion through an Envoy: (status, the pool that served it or "")."""
        envoy = envoy or self.envoy
        request_id = f"req-{free_port()}-{len(self.envoys)}-{id(envoy)}"
        answer = httpx.post(f"{envoy.listen_url}/v1/chat/completions", timeout=30,
                            json={"model": MODEL, "messages": HELLO, "max_tokens": 1},
                            headers={"x-request-id": request_id})
        if answer.status_code != 200:
            return answer.status_code, ""
        return 200, served_by(self.sims, request_id)[request_id]

    def stop(self) -> None:
        for envoy in self.envoys:
            envoy.stop()


@pytest.fixture(scope="module")
def xds() -> Iterator[tuple[XdsServer, MemoryStore]]:
    store = MemoryStore()
    server = XdsServer(store=store).start()
    yield server, store
    server.stop()


@pytest.fixture
def gw(request: pytest.FixtureRequest, xds: tuple[XdsServer, MemoryStore], sims: SimProcess,
       tmp_path: Path) -> Iterator[XdsGateway]:
    server, store = xds
    name = f"gw-{request.node.name[5:25].strip('_').replace('_', '-')}"
    gateway = XdsGateway(name, server, store, sims, tmp_path, [])
    gateway.start_envoy("e1")
    yield gateway
    gateway.stop()


def config_dump(envoy: EnvoyProcess, resource: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{envoy.admin_url}/config_dump", params={"resource": resource},
                       timeout=5)
    return list(answer.json().get("configs", []))


def dynamic_clusters(envoy: EnvoyProcess) -> set[str]:
    return {c["cluster"]["name"] for c in config_dump(envoy, "dynamic_active_clusters")}


def test_the_xds_bootstrap_is_one_envoy_accepts(tmp_path: Path) -> None:
    bootstrap = envoy_config.render_xds_bootstrap(
        xds_host="127.0.0.1", xds_port=18000, gateway="gw", node_id="e1", listen_port=10000,
        admin_port=9901, access_log_path=tmp_path / "access.log")
    ok, output = validate_config(bootstrap, tmp_path)
    assert ok, output
    assert bootstrap["dynamic_resources"]["cds_config"] == {"ads": {},
                                                            "resource_api_version": "V3"}
    # With the gateway's token and a second replica: Envoy accepts that too.
    bootstrap = envoy_config.render_xds_bootstrap(
        xds_host="127.0.0.1", xds_port=18000, gateway="gw", node_id="e1", listen_port=10000,
        admin_port=9901, token="fxds_secret", replicas=[("127.0.0.2", 18001)])
    ok, output = validate_config(bootstrap, tmp_path)
    assert ok, output
    [service] = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]
    assert service["initial_metadata"] == [{"key": "authorization",
                                            "value": "Bearer fxds_secret"}]
    # A broken ADS stream is retried from 0.25 s up to 5 s apart (jittered), not Envoy's
    # 0.5 s to 30 s: a fleet is back soon after its replica restarts.
    assert service["envoy_grpc"]["retry_policy"] == {"retry_back_off": {
        "base_interval": "0.25s", "max_interval": "5s"}}
    assert bootstrap["node"]["metadata"] == {"fleetctl_admin_url": "http://127.0.0.1:9901"}
    # An admin API on every address needs the URL fleetctl reads it at.
    with pytest.raises(ValueError, match="give admin_url"):
        envoy_config.render_xds_bootstrap(
            xds_host="127.0.0.1", xds_port=18000, gateway="gw", node_id="e1",
            listen_port=10000, admin_port=9901, admin_listen="0.0.0.0")
    wildcard = envoy_config.render_xds_bootstrap(
        xds_host="127.0.0.1", xds_port=18000, gateway="gw", node_id="e1", listen_port=10000,
        admin_port=9901, admin_listen="0.0.0.0", admin_url="http://10.0.0.7:9901")
    ok, output = validate_config(wildcard, tmp_path)
    assert ok, output
    assert wildcard["node"]["metadata"] == {"fleetctl_admin_url": "http://10.0.0.7:9901"}
    [xds] = bootstrap["static_resources"]["clusters"]
    assert [e["endpoint"]["address"]["socket_address"]["port_value"]
            for e in xds["load_assignment"]["endpoints"][0]["lb_endpoints"]] == [18000, 18001]


def test_the_kind_is_registered_with_its_options() -> None:
    kind = registry.get("envoy-xds")
    assert kind.adapter is EnvoyXdsAdapter and kind.supports_context_tiers
    with pytest.raises(AdapterError, match="ack_timeout_s"):
        kind.parse_options({"ack_timeout_s": "soon"})


def test_an_envoy_on_xds_serves_the_rendered_config_and_follows_a_weights_change(
        gw: XdsGateway) -> None:
    adapter = gw.adapter()
    first = state(gw.pools("pa", "pb"), route("chat", {"pa": 10000, "pb": 0}))
    applied = adapter.apply(first)
    assert applied.method == "xds" and "ACKed by 1 Envoy(s)" in applied.detail
    assert gw.ask() == (200, "pa")
    # Read back from the ACKs, and independently from Envoy's own config_dump.
    assert adapter.read_back() == first.held_weights()
    assert adapter.matches(first, adapter.read_back())
    rendered = envoy_config.render(first)
    assert dynamic_clusters(gw.envoy) == set(rendered.clusters)
    [routes] = config_dump(gw.envoy, "dynamic_route_configs")
    assert routes["version_info"] == rendered.routes_version

    moved = state(gw.pools("pa", "pb"), route("chat", {"pa": 0, "pb": 10000}, revision=2))
    weights = adapter.apply(moved)
    assert "(RTDS) ACKed" in weights.detail  # a weights change sends the runtime layer only
    assert [gw.ask()[1] for _ in range(5)] == ["pb"] * 5
    assert adapter.read_back() == moved.held_weights()
    assert not adapter.matches(first, adapter.read_back())


def test_a_restarted_envoy_gets_the_current_state_on_connect(gw: XdsGateway) -> None:
    adapter = gw.adapter()
    desired = state(gw.pools("pa", "pc"), route("chat", {"pa": 0, "pc": 10000}))
    adapter.apply(desired)
    gw.envoy.kill()
    wait_until(lambda: not any(e.connected for e in gw.store.envoys(gw.name)),
               what="the killed Envoy's stream to end")
    assert [e.gone_at is not None for e in gw.store.envoys(gw.name)] == [True]
    gw.envoy.start(timeout_s=60)  # no files: everything comes over xDS
    # Ready means initialised: the first request already follows the pushed weights.
    assert gw.ask() == (200, "pc")
    assert adapter.read_back() == desired.held_weights()


def test_a_config_envoy_refuses_is_nacked_and_the_last_good_keeps_serving(
        gw: XdsGateway) -> None:
    adapter = gw.adapter()
    good = state(gw.pools("pa"), route("chat", {"pa": 10000}))
    adapter.apply(good)
    current = gw.store.snapshot(gw.name)
    # The renderer never makes a cluster Envoy refuses (validate() stops it first), so this
    # one is written by hand: a STATIC cluster on a host name passes the proto's own checks
    # and Envoy refuses it.
    bad_cluster = {"@type": CLUSTER_TYPE, "name": "pa", "type": "STATIC",
                   "connect_timeout": "2s", "load_assignment": {"cluster_name": "pa",
                   "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                       "address": "not-an-ip.example", "port_value": 80}}}}]}]}}
    bad = {**current.types, **from_documents({CLUSTER_TYPE: json.dumps(
        {"version_info": "c-bad", "resources": [bad_cluster]})})}
    refused = gw.store.set_snapshot(gw.name, bad, current.meta)
    with pytest.raises(AdapterError) as caught:
        adapter._verify(refused, current)

    message = str(caught.value)
    assert caught.value.permanent
    assert "e1: CDS:" in message and "not-an-ip.example" in message, message
    assert "previous configuration is served again" in message
    assert gw.store.snapshot(gw.name).types == current.types
    [envoy] = gw.store.envoys(gw.name)
    assert envoy.types[CLUSTER_TYPE].nacked_version == "c-bad"
    # Envoy kept the good cluster, and serves through it.
    assert gw.ask() == (200, "pa")
    assert adapter.read_back() == good.held_weights()
    # And the next apply goes through as usual.
    assert adapter.apply(state(gw.pools("pa", "pb"),
                               route("chat", {"pa": 5000, "pb": 5000}))).applied


def test_an_envoy_gets_only_its_own_gateways_resources(gw: XdsGateway, tmp_path: Path) -> None:
    other = XdsGateway(f"{gw.name}-b", gw.server, gw.store, gw.sims, tmp_path / "b", [])
    other.start_envoy("e1")  # the same node id, another gateway: still apart
    try:
        gw.adapter().apply(state(gw.pools("pa"), route("chat", {"pa": 10000})))
        assert dynamic_clusters(gw.envoy) == {"pa"}
        assert dynamic_clusters(other.envoy) == set()
        assert other.ask()[0] == 503  # unconfigured: fleetctl's own answer, no pool
        other.adapter().apply(state(other.pools("pb"), route("chat", {"pb": 10000})))
        assert dynamic_clusters(other.envoy) == {"pb"}
        assert dynamic_clusters(gw.envoy) == {"pa"}
        assert (gw.ask()[1], other.ask()[1]) == ("pa", "pb")
    finally:
        other.stop()


def test_an_apply_with_no_envoy_connected_fails_and_the_first_to_connect_gets_it(
        gw: XdsGateway) -> None:
    adapter = gw.adapter()
    gw.envoy.stop()
    wait_until(lambda: not any(e.connected for e in gw.store.envoys(gw.name)),
               what="the stopped Envoy's stream to end")
    desired = state(gw.pools("pb"), route("chat", {"pb": 10000}))
    with pytest.raises(AdapterError, match="no Envoy is connected") as caught:
        adapter.apply(desired)
    assert not caught.value.permanent
    with pytest.raises(AdapterError, match="no Envoy is connected"):
        adapter.read_back()
    gw.envoy.start(timeout_s=60)
    assert gw.ask() == (200, "pb")
    assert adapter.read_back() == desired.held_weights()


def test_pools_removed_are_pruned_after_the_routes_no_longer_use_them(gw: XdsGateway) -> None:
    adapter = gw.adapter()
    adapter.apply(state(gw.pools(*POOLS), route("chat", {"pa": 5000, "pb": 5000, "pc": 0})))
    result = adapter.apply(state(gw.pools("pc"), route("chat", {"pc": 10000})))
    assert "in 2 steps (clusters pruned)" in result.detail
    assert dynamic_clusters(gw.envoy) == {"pc"}
    assert gw.ask() == (200, "pc")


def test_two_envoys_of_a_gateway_both_ack_and_a_gone_one_is_not_waited_for(
        gw: XdsGateway) -> None:
    second = gw.start_envoy("e2")
    adapter = gw.adapter()
    result = adapter.apply(state(gw.pools("pa", "pb"), route("chat", {"pa": 10000, "pb": 0})))
    assert "ACKed by 2 Envoy(s)" in result.detail
    second.stop()
    wait_until(lambda: [e.connected for e in gw.store.envoys(gw.name)] == [True, False],
               what="e2 to be marked gone")
    result = adapter.apply(state(gw.pools("pa", "pb"), route("chat", {"pa": 0, "pb": 10000})))
    assert "ACKed by 1 Envoy(s)" in result.detail
    assert (gw.ask(gw.envoy)[1]) == "pb"


def test_in_flight_and_counters_are_summed_over_the_gateways_envoys(gw: XdsGateway) -> None:
    """A gateway is a set of Envoys: a stream held open through one of three is counted
    whichever Envoy admin_address names, and an Envoy that does not answer makes the figure
    unknown (an AdapterError a drain waits on), not a sum of the others."""
    e1, e2, e3 = gw.envoy, gw.start_envoy("e2"), gw.start_envoy("e3")
    adapter = gw.adapter(admin_timeout_s=0.5)
    adapter.apply(state(gw.pools("pa", "pb"), route("chat", {"pa": 10000, "pb": 0})))
    # Each Envoy's admin URL came in its node metadata.
    assert {e.node_id: e.admin_url for e in gw.store.envoys(gw.name)} == {
        "e1": e1.admin_url, "e2": e2.admin_url, "e3": e3.admin_url}
    assert gw.ask(e1) == (200, "pa") and gw.ask(e3) == (200, "pa")
    assert adapter.in_flight("pa") == 0
    with slowed(gw.sims, "pa", 50), httpx.stream(
            "POST", f"{e2.listen_url}/v1/chat/completions", timeout=30,
            json={"model": MODEL, "messages": HELLO, "max_tokens": 30, "stream": True,
                  "ignore_eos": True}) as held:
        lines = held.iter_lines()
        wait_until(lambda: next(lines).startswith("data: {"), what="the stream's first chunk")
        # admin_address is e1's: only the sum over the gateway sees e2's stream.
        assert envoy_in_flight(EnvoyAdmin(e1.admin_url, timeout_s=5, gateway="e1"), "pa") == 0
        assert adapter.in_flight("pa") == 1
        assert e3.proc is not None
        os.kill(e3.proc.pid, signal.SIGSTOP)  # connected, but its admin API does not answer
        try:
            with pytest.raises(AdapterError, match=r"\(e3\) admin .* timed out"):
                adapter.in_flight("pa")
            with pytest.raises(AdapterError, match=r"\(e3\) admin .* timed out"):
                adapter.pool_counters()
        finally:
            os.kill(e3.proc.pid, signal.SIGCONT)
        assert adapter.in_flight("pa") == 1
        assert sum(1 for line in lines if line.startswith("data: {")) > 0
    wait_until(lambda: adapter.in_flight("pa") == 0, what="the stream to end on e2")
    counters = adapter.pool_counters()["pa"]
    assert (counters.requests_total, counters.errors_total, counters.active) == (3, 0, 0)


def test_in_flight_is_unknown_with_no_envoy_or_one_without_an_admin_url(
        gw: XdsGateway, tmp_path: Path) -> None:
    adapter = gw.adapter(admin_timeout_s=0.5)
    adapter.apply(state(gw.pools("pa"), route("chat", {"pa": 10000})))
    metadata = [("authorization", f"Bearer {gw.token}")]

    def beside_e1(node_id: str, admin_url: str | None, says: str) -> None:
        """A stream opened by hand as `node_id` beside the real Envoy e1: in_flight raises
        `says` while it is open, and counts e1 alone once it is gone."""
        request = DiscoveryRequest(type_url=CLUSTER_TYPE)
        request.node.id, request.node.cluster = node_id, gw.name
        if admin_url is not None:
            request.node.metadata.update({"fleetctl_admin_url": admin_url})
        done = threading.Event()

        def requests() -> Iterator[DiscoveryRequest]:
            yield request
            done.wait(30)  # the stream stays open until the check below is made

        with grpc.insecure_channel(gw.server.address) as channel:
            answers = AdsStub(channel).StreamAggregatedResources(
                requests(), metadata=metadata, timeout=30)
            assert next(answers).type_url == CLUSTER_TYPE
            with pytest.raises(AdapterError, match=says):
                adapter.in_flight("pa")
            done.set()
            answers.cancel()
        wait_until(lambda: [e.node_id for e in gw.store.envoys(gw.name)
                            if e.connected] == ["e1"], what=f"{node_id}'s stream to be gone")
        assert adapter.in_flight("pa") == 0

    # A bootstrap from before the metadata: the sum would miss that Envoy, so there is none.
    beside_e1("old", None, r"Envoy\(s\) old gave no admin URL")
    # An admin URL the destination policy refuses (a cloud metadata address) is not read.
    beside_e1("meta", "http://169.254.169.254:80",
              r"Envoy meta's admin URL \(node metadata fleetctl_admin_url\) cannot be read: "
              r".*give the address fleetctl reaches it at")
    request = DiscoveryRequest(type_url=CLUSTER_TYPE)
    request.node.id, request.node.cluster = "bad", gw.name
    # A malformed admin URL is refused when the stream opens, saying what to send.
    request.node.metadata.update({"fleetctl_admin_url": "ftp://10.0.0.1/x"})
    with grpc.insecure_channel(gw.server.address) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        next(AdsStub(channel).StreamAggregatedResources(iter([request]), metadata=metadata,
                                                        timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fleetctl_admin_url must be this Envoy's admin URL" in refused.value.details()
    # No Envoy connected: unknown, not zero.
    gw.envoy.stop()
    wait_until(lambda: not any(e.connected for e in gw.store.envoys(gw.name)),
               what="e1 to be marked gone")
    with pytest.raises(AdapterError, match="no Envoy is connected"):
        adapter.in_flight("pa")
