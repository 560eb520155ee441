"""A gateway kind that lives outside fleetctl: it keeps its weights in a JSON file.

Added to a deployment by naming this package in the FLEETCTL_GATEWAY_KINDS setting."""

from fleetctl.traffic.gateways.registry import GatewayKind
from fleetctl.traffic.gateways.schema import directory
from tests.traffic.fake_kind.adapter import FileAdapter
from tests.traffic.fake_kind.options import FileOptions

KIND = GatewayKind(label="File", adapter=FileAdapter, options=FileOptions,
                   address=directory("directory it keeps its file in"),
                   summary="Writes each route's weights to a JSON file.")
