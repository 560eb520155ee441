"""Envoy over xDS: fleetctl's ADS server serves the clusters, routes and weights the Envoy
kind renders; a push is verified by every connected Envoy's ACK (docs/xds.md)."""

from fleetctl.traffic.gateways.envoy.accesslog import parse_line
from fleetctl.traffic.gateways.envoy_xds.adapter import EnvoyXdsAdapter
from fleetctl.traffic.gateways.envoy_xds.options import EnvoyXdsOptions
from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import http_url

KIND = GatewayKind(
    label="Envoy (xDS)",
    adapter=EnvoyXdsAdapter,
    options=EnvoyXdsOptions,
    address=http_url("admin"),
    parse_access_log=parse_line,
    ttft_measures="first body byte of streamed answers",
    summary="Clusters, routes and weights served over xDS (ADS) by fleetctl; a push is "
            "verified when every connected Envoy of the gateway ACKs it.",
)
