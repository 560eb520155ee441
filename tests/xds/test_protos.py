"""The xDS resources are the Envoy kind's rendering converted to protos: every type the
rendering names resolves, and a rich desired state (tiers, affinity, mirror, https pool)
converts whole. No Envoy here; tests/xds/test_xds_envoy.py runs one."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from fleetctl.traffic.gateways.base import (
    DesiredState,
    PoolTarget,
    PrefixAffinity,
    RouteSpec,
    TierSpec,
)
from fleetctl.traffic.gateways.envoy import names
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.names import CLUSTER_TYPE, ROUTE_CONFIG_TYPE, RUNTIME_TYPE
from fleetctl.xds import protos
from fleetctl.xds.resources import rendered_resources, unconfigured_resources


def test_every_type_url_the_rendering_names_resolves() -> None:
    type_urls = {getattr(names, n) for n in dir(names) if n.endswith("_TYPE")}
    assert len(type_urls) >= 15
    for type_url in type_urls:
        assert protos.message_class(type_url).DESCRIPTOR.full_name == type_url.rsplit("/")[-1]


def rich_state() -> DesiredState:
    pools = {"pa": PoolTarget("pa", ("http://127.0.0.1:8001", "http://127.0.0.1:8002"), "US"),
             "pb": PoolTarget("pb", ("https://pool-b.example:8443",), "EU"),
             "pc": PoolTarget("pc", ("http://localhost:8003",), "EU", latency_class="fast")}
    tiers = (TierSpec(bound=4000, above=0, behaviour="fallback", pools=("pa", "pb")),
             TierSpec(bound=None, above=4000, behaviour="queue", pools=("pc",),
                      queue_max=10, retry_after_s=2))
    return DesiredState(
        routes=(RouteSpec("chat", "m1", "", "", 3, {"pa": 5000, "pb": 3000, "pc": 2000},
                          mirror_bp=250, mirror_auth="1." + "a" * 64, tiers=tiers,
                          affinity=PrefixAffinity("prompt", 512)),
                RouteSpec("eu", "m2", "fast", "EU", 1, {"pc": 10000}),
                RouteSpec("off", "m3", "", "", 1, {})),
        pools=pools, mirror_url="http://127.0.0.1:9999")


def test_a_rich_rendering_converts_whole_and_back() -> None:
    rendered = envoy_config.render(rich_state())
    types = rendered_resources(rendered)
    assert types[CLUSTER_TYPE].version == rendered.clusters_version
    assert types[ROUTE_CONFIG_TYPE].version == rendered.routes_version
    assert [name for name, _ in types[CLUSTER_TYPE].resources] == sorted(rendered.clusters)
    # The proto says what the JSON said (read back through the same type registry).
    route_config = protos.message_class(ROUTE_CONFIG_TYPE)()
    types[ROUTE_CONFIG_TYPE].resources[0][1].Unpack(route_config)
    back = json_format.MessageToDict(route_config, preserving_proto_field_name=True)
    assert back["name"] == envoy_config.ROUTE_CONFIG_NAME
    assert json.dumps(back).count("LuaPerRoute") == json.dumps(rendered.route_config).count(
        "LuaPerRoute") > 0
    runtime = protos.message_class(RUNTIME_TYPE)()
    types[RUNTIME_TYPE].resources[0][1].Unpack(runtime)
    assert {k: v for k, v in json_format.MessageToDict(runtime)["layer"].items()
            if not names.is_mirror_key(k)} == {k: str(v) for k, v in rendered.runtime.items()
                                               if not names.is_mirror_key(k)}


def test_an_unchanged_type_keeps_its_converted_protos() -> None:
    state = rich_state()
    first = rendered_resources(envoy_config.render(state))
    routes = state.routes
    moved = RouteSpec("chat", "m1", "", "", 4, {"pa": 2000, "pb": 3000, "pc": 5000},
                      mirror_bp=250, mirror_auth=routes[0].mirror_auth, tiers=routes[0].tiers,
                      affinity=routes[0].affinity)
    second = rendered_resources(envoy_config.render(
        DesiredState(routes=(moved, *routes[1:]), pools=state.pools,
                     mirror_url=state.mirror_url)), previous=first)
    assert second[CLUSTER_TYPE] is first[CLUSTER_TYPE]
    assert second[ROUTE_CONFIG_TYPE] is first[ROUTE_CONFIG_TYPE]
    assert second[RUNTIME_TYPE].version != first[RUNTIME_TYPE].version


def test_a_document_no_proto_holds_is_refused_naming_it() -> None:
    with pytest.raises(protos.ProtoError, match=r"Cluster 'pa'.*no_such_field"):
        protos.to_any({"@type": CLUSTER_TYPE, "name": "pa", "no_such_field": 1})
    with pytest.raises(protos.ProtoError, match=r"no proto acme\.Thing is imported"):
        protos.to_any({"@type": "type.googleapis.com/acme.Thing"})


def test_the_unconfigured_gateway_has_no_clusters_and_no_weights() -> None:
    types = unconfigured_resources()
    assert types[CLUSTER_TYPE].resources == ()
    assert types[ROUTE_CONFIG_TYPE].version == envoy_config.UNCONFIGURED_ROUTES_VERSION
    assert len(types[RUNTIME_TYPE].resources) == 1
