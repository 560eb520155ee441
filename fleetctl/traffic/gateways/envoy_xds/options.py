"""What a person sets on an Envoy (xDS) gateway (Gateway.options)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.traffic.gateways.schema import (
    access_log_option,
    collector_url_problem,
    option,
    shadow_collector_option,
)


@dataclass(frozen=True)
class EnvoyXdsOptions:
    ack_timeout_s: float = option(5.0, minimum=0.01, maximum=600,
                                  help="seconds to wait for every connected Envoy of the "
                                       "gateway to ACK a pushed snapshot")
    admin_timeout_s: float = option(2.0, minimum=0.01, maximum=600,
                                    help="seconds per call to the admin API (in-flight "
                                         "requests and counters are read there)")
    shadow_collector: str | None = shadow_collector_option()
    access_log: str | None = access_log_option()
    listen_url: str | None = option(None, check=collector_url_problem,
                                    help="the URL callers reach this gateway at, "
                                         "http://host:port; the routing probe sends through "
                                         "it (none: the gateway cannot be probed)")
