"""Kubernetes Gateway API: one HTTPRoute per route, by server-side apply."""

from fleetctl.traffic.gateways.gateway_api.adapter import GatewayApiAdapter
from fleetctl.traffic.gateways.gateway_api.options import GatewayApiOptions
from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import http_url

KIND = GatewayKind(
    label="Kubernetes Gateway API",
    adapter=GatewayApiAdapter,
    options=GatewayApiOptions,
    address=http_url("API server"),
    summary="One HTTPRoute per route, written by server-side apply; the Gateway "
            "implementation programs its data plane.",
)
