"""nginx: a rendered config, checked with nginx -t, swapped and reloaded."""

from fleetctl.traffic.gateways.nginx.accesslog import parse_line
from fleetctl.traffic.gateways.nginx.adapter import NginxAdapter
from fleetctl.traffic.gateways.nginx.options import NginxOptions
from fleetctl.traffic.gateways.nginx.render import MAX_PREFIX
from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import directory

KIND = GatewayKind(
    label="nginx",
    adapter=NginxAdapter,
    options=NginxOptions,
    address=directory("prefix directory fleetctl owns (nginx -p)", max_length=MAX_PREFIX),
    parse_access_log=parse_line,
    ttft_measures=("response headers of streamed answers ($upstream_header_time): a TTFT "
                   "only when the pool sends its headers with its first token"),
    summary="Every change is a rendered config checked with nginx -t, swapped and reloaded "
            "with SIGHUP.",
)
