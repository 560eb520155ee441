"""Envoy: weights through the admin runtime, structure through watched CDS/RDS files."""

from fleetctl.traffic.gateways.envoy.accesslog import parse_line
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.gateways.envoy.options import EnvoyOptions
from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import http_url

KIND = GatewayKind(
    label="Envoy",
    adapter=EnvoyAdapter,
    options=EnvoyOptions,
    address=http_url("admin"),
    parse_access_log=parse_line,
    ttft_measures='first body byte of streamed answers',
    summary="Weights through the admin runtime; routes and clusters through files Envoy "
            "watches, swapped atomically.",
)
