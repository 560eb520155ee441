"""Issue the xDS token of an `envoy-xds` gateway: its Envoys present it on their ADS stream
(render_xds_bootstrap(token=...)). Shown once; issuing again replaces it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleetctl.traffic.selectors import gateway_list
from fleetctl.xds.services import gateway_token_issue


class Command(BaseCommand):
    help = ("Issue a new xDS token for an envoy-xds gateway (printed once; the previous one "
            "stops working).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("gateway", help="the gateway's name (its Envoys' node.cluster)")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["gateway"]
        gateway = gateway_list().filter(name=name).first()
        if gateway is None:
            raise CommandError(f"no gateway named {name!r}")
        if gateway.kind != "envoy-xds":
            raise CommandError(f"gateway {name!r} is of kind {gateway.kind!r}; xDS tokens "
                               "are for envoy-xds gateways")
        self.stdout.write(gateway_token_issue(gateway=name))
