"""What a person sets on an Envoy gateway (Gateway.options), typed and checked by the registry."""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.traffic.gateways.schema import (
    access_log_option,
    collector_url_problem,
    option,
    shadow_collector_option,
)


@dataclass(frozen=True)
class EnvoyOptions:
    config_dir: str = option(help="the directory Envoy's bootstrap watches for clusters.json "
                                  "and routes.json (fleetctl writes them there)")
    load_timeout_s: float = option(5.0, minimum=0.01, maximum=600,
                                   help="seconds to wait for Envoy to load a swapped file")
    admin_timeout_s: float = option(2.0, minimum=0.01, maximum=600,
                                    help="seconds per call to Envoy's admin API")
    shadow_collector: str | None = shadow_collector_option()
    # Envoy writes it as the bootstrap says (render_bootstrap(access_log_path=...)): the
    # option tells the ingester where, and must name the same file.
    access_log: str | None = access_log_option()
    # Where callers reach this gateway (its listener), for the routing probe
    # (conformance/routing.py), which sends through it and reads which pool answered.
    listen_url: str | None = option(None, check=collector_url_problem,
                                    help="the URL callers reach this gateway at, "
                                         "http://host:port; the routing probe sends through "
                                         "it (none: the gateway cannot be probed)")
