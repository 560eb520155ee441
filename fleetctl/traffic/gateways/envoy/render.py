"""Envoy configuration for one gateway, rendered from a DesiredState by pure functions.

Three documents (docs/envoy.md says why each choice):

- the **bootstrap**: admin listener, one HTTP listener, an admin runtime layer, and CDS/RDS
  read from two files in a watched directory. It depends on nothing but ports and paths, so it
  is written once when Envoy starts and never changes;
- the **clusters** file (CDS): one cluster per pool;
- the **routes** file (RDS): one Envoy route per RouteSpec plus the error answers around them,
  and the Lua script that copies the body's `model` into a header. Everything that depends on
  the desired state lives here, so a file swap can change all of it.

Weights live three times: as the default weight of each weighted cluster (what a freshly
loaded routes file means), as admin runtime keys `<prefix>.<pool>` (what every change sets, at
once) and as the same keys in the **runtime file** (an RTDS layer read from disk), which Envoy
loads when it starts, before it serves: an Envoy restarted with its files serves the last
pushed weights from its first request, never the routes file's older defaults. The admin
layer sits above the file's, so while Envoy runs the POST decides. The prefix carries a hash
of the route's structure, so a structurally new route starts from its own weights and never
inherits the keys of an older shape of itself.

The parts live beside this module: names.py (names, limits, type URLs), validate.py,
clusters.py, routes.py, lua.py, bootstrap.py and files.py. This module assembles them, and
is the one the adapter, the demo and the tests import.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fleetctl.traffic.gateways.base import DesiredState
from fleetctl.traffic.gateways.envoy.bootstrap import (
    XDS_CLUSTER,
    listener,
    render_bootstrap,
    render_xds_bootstrap,
    socket_address,
)
from fleetctl.traffic.gateways.envoy.clusters import (
    clusters_version,
    render_cluster,
    render_clusters,
)
from fleetctl.traffic.gateways.envoy.fallback import render_tier_clusters
from fleetctl.traffic.gateways.envoy.files import (
    UNCONFIGURED_ROUTES_VERSION,
    clusters_file,
    discovery_file,
    fraction_bp,
    routes_file,
    runtime_file,
    runtime_file_weights,
    runtime_strings,
    runtime_value_bp,
    unconfigured_files,
)
from fleetctl.traffic.gateways.envoy.lua import routing_lua
from fleetctl.traffic.gateways.envoy.names import (
    BOOTSTRAP_FILE,
    CLUSTERS_FILE,
    COLLECTOR_CLUSTER,
    MIRROR_KEY,
    POOL_HEADER,
    ROUTE_CONFIG_NAME,
    ROUTES_FILE,
    RUNTIME_DIR,
    RUNTIME_FILE,
    RUNTIME_ROOT,
    RUNTIME_UNWATCHED,
    STAT_PREFIX,
    ConfigError,
    digest,
)
from fleetctl.traffic.gateways.envoy.routes import (
    mirror_policy,
    render_route_config,
    render_unconfigured_route_config,
    retry_policy,
    runtime_prefix,
    tier_runtime,
    without_weights,
)
from fleetctl.traffic.gateways.envoy.validate import parse_base_url, pool_problem, validate

# What the adapter, the demo and the tests use; the rest is in the part modules.
__all__ = [
    "BOOTSTRAP_FILE",
    "CLUSTERS_FILE",
    "COLLECTOR_CLUSTER",
    "MIRROR_KEY",
    "POOL_HEADER",
    "ROUTES_FILE",
    "ROUTE_CONFIG_NAME",
    "RUNTIME_DIR",
    "RUNTIME_FILE",
    "RUNTIME_ROOT",
    "RUNTIME_UNWATCHED",
    "STAT_PREFIX",
    "UNCONFIGURED_ROUTES_VERSION",
    "XDS_CLUSTER",
    "ConfigError",
    "RenderedConfig",
    "clusters_file",
    "clusters_version",
    "discovery_file",
    "fraction_bp",
    "mirror_policy",
    "parse_base_url",
    "pool_problem",
    "render",
    "render_bootstrap",
    "render_cluster",
    "render_clusters",
    "render_route_config",
    "render_unconfigured_route_config",
    "render_validation_bootstrap",
    "render_xds_bootstrap",
    "retry_policy",
    "routes_file",
    "routing_lua",
    "runtime_file",
    "runtime_file_weights",
    "runtime_prefix",
    "runtime_strings",
    "runtime_value_bp",
    "unconfigured_files",
    "validate",
]


@dataclass(frozen=True)
class RenderedConfig:
    clusters: dict[str, dict[str, Any]]  # cluster name -> Cluster
    route_config: dict[str, Any]  # the RouteConfiguration
    routes_version: str  # hash of the route structure (weights excluded)
    # runtime key -> weight, for every weighted cluster of every route; and, when mirroring
    # is rendered, `<prefix>._mirror` -> the route's mirror basis points
    runtime: dict[str, int]

    @cached_property
    def clusters_version(self) -> str:
        return clusters_version(self.clusters)

    @cached_property
    def runtime_text(self) -> str:
        return runtime_file(self.runtime)

    @cached_property
    def runtime_values(self) -> dict[str, str]:
        """The runtime as POST /runtime_modify takes it."""
        return runtime_strings(self.runtime)


def render(desired: DesiredState) -> RenderedConfig:
    """Validate, then render clusters, routes and runtime weights for one gateway."""
    validate(desired)
    route_config = render_route_config(desired)
    runtime: dict[str, int] = {}
    for route in desired.routes:
        prefix = runtime_prefix(route, desired)
        runtime.update({f"{prefix}.{pool}": weight for pool, weight in route.weights.items()})
        if desired.mirror_url and route.weights:
            runtime[f"{prefix}.{MIRROR_KEY}"] = route.mirror_bp
        for index, tier in enumerate(route.tiers if route.weights else ()):
            runtime.update(tier_runtime(route, tier, index, desired))
    return RenderedConfig(
        clusters=render_clusters(desired) | render_tier_clusters(desired),
        route_config=route_config,
        routes_version="r-" + digest(without_weights(route_config)),
        runtime=runtime,
    )


def render_validation_bootstrap(desired: DesiredState, *, listen_port: int = 10000,
                                admin_port: int = 9901) -> dict[str, Any]:
    """The same listener with clusters and routes inlined as static resources, for
    `envoy --mode validate` (which does not read CDS/RDS files)."""
    rendered = render(desired)
    route_config = {k: v for k, v in rendered.route_config.items() if k != "@type"}
    clusters = [{k: v for k, v in c.items() if k != "@type"} for c in rendered.clusters.values()]
    return {
        "node": {"id": "validate", "cluster": "fleetctl"},
        "admin": {"address": socket_address(listen="127.0.0.1", port=admin_port)},
        "layered_runtime": {"layers": [{"name": "admin", "admin_layer": {}}]},
        "static_resources": {
            "listeners": [listener("127.0.0.1", listen_port, {"route_config": route_config},
                                   None)],
            "clusters": clusters,
        },
    }

