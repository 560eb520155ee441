"""HAProxy: weights through the runtime API, structure by a checked reload."""

from fleetctl.traffic.gateways.haproxy.accesslog import parse_line
from fleetctl.traffic.gateways.haproxy.adapter import HAProxyAdapter
from fleetctl.traffic.gateways.haproxy.options import HAProxyOptions
from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import socket_address

KIND = GatewayKind(
    label="HAProxy",
    adapter=HAProxyAdapter,
    options=HAProxyOptions,
    address=socket_address("stats socket (runtime API)"),
    parse_access_log=parse_line,
    ttft_measures=("response headers of streamed answers (%Tr): a TTFT only when the "
                   "pool sends its headers with its first token"),
    summary="Weights through the runtime API; routes and pools by a config checked with "
            "haproxy -c and a reload through the master CLI.",
)
