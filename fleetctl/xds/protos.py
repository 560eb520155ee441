"""The Envoy protos fleetctl's rendered config uses, from the ecosystem's generated modules
(`xds-protos`), and the conversion of a rendered JSON document into one.

Every type URL an `@type` of the rendering names must be in the protobuf descriptor pool
before ParseDict meets it inside an `Any` (a typed_config, a per-route filter config), so
each module is imported here by name: importing the top-level Cluster does not import the
extensions it may carry. tests/xds/test_protos.py checks that every `*_TYPE` of
envoy/names.py resolves.
"""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.extensions.resource_monitors.downstream_connections.v3 import (
    downstream_connections_pb2,
)
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import (
    previous_priorities_config_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.runtime.v3 import rtds_pb2
from google.protobuf import any_pb2, json_format, symbol_database
from google.protobuf.message import Message

from fleetctl.traffic.gateways.envoy.names import (
    CLUSTER_TYPE,
    ROUTE_CONFIG_TYPE,
    RUNTIME_TYPE,
)

# The modules above, so an import checker keeps them: each registers its types.
REGISTERED = (cluster_pb2, route_pb2, file_pb2, aggregate_pb2, lua_pb2, router_pb2,
              http_connection_manager_pb2, uuid_pb2, downstream_connections_pb2,
              previous_hosts_pb2, previous_priorities_config_pb2, tls_pb2,
              http_protocol_options_pb2, rtds_pb2)

DiscoveryRequest = discovery_pb2.DiscoveryRequest
DiscoveryResponse = discovery_pb2.DiscoveryResponse
AdsServicer = ads_pb2_grpc.AggregatedDiscoveryServiceServicer
add_ads_servicer = ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server
AdsStub = ads_pb2_grpc.AggregatedDiscoveryServiceStub

# The types fleetctl serves, in the order a change is sent on a stream: clusters before the
# routes that name them, routes before the runtime keys they read (docs/xds.md).
SERVED_TYPES = (CLUSTER_TYPE, ROUTE_CONFIG_TYPE, RUNTIME_TYPE)
SHORT = {CLUSTER_TYPE: "CDS", ROUTE_CONFIG_TYPE: "RDS", RUNTIME_TYPE: "RTDS"}


class ProtoError(ValueError):
    """A rendered document that is not a valid proto of its type (a rendering bug)."""


def message_class(type_url: str) -> type[Message]:
    """The generated class of a type URL (`type.googleapis.com/<full name>`)."""
    name = type_url.rsplit("/", 1)[-1]
    try:
        return symbol_database.Default().GetSymbol(name)  # type: ignore[no-any-return]
    except KeyError as exc:
        raise ProtoError(f"no proto {name} is imported (fleetctl/xds/protos.py)") from exc


def to_any(document: dict[str, Any]) -> any_pb2.Any:
    """A rendered resource (JSON with its `@type`) as the `Any` a DiscoveryResponse carries."""
    type_url = document.get("@type", "")
    message = message_class(type_url)()
    body = {key: value for key, value in document.items() if key != "@type"}
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        raise ProtoError(f"{type_url.rsplit('.', 1)[-1]} {document.get('name', '')!r}: "
                         f"{exc}") from exc
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed
