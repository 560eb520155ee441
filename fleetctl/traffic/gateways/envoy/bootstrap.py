"""The bootstrap: the static part of an Envoy's config (listener, runtime layers, where
the CDS/RDS files are), written once when Envoy starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetctl.traffic.gateways.envoy.accesslog import LOG_FORMAT as ACCESS_LOG_FORMAT
from fleetctl.traffic.gateways.envoy.lua import default_lua
from fleetctl.traffic.gateways.envoy.names import (
    CLUSTERS_FILE,
    FILE_LOG_TYPE,
    HCM_TYPE,
    HTTP_OPTIONS_NAME,
    HTTP_OPTIONS_TYPE,
    LUA_FILTER,
    LUA_TYPE,
    MAX_CX_TYPE,
    REQUEST_BUFFER_LIMIT_BYTES,
    REQUEST_ID_TYPE,
    ROUTE_CONFIG_NAME,
    ROUTER_TYPE,
    ROUTES_FILE,
    RUNTIME_DIR,
    RUNTIME_FILE,
    RUNTIME_LAYER,
    RUNTIME_UNWATCHED,
    STAT_PREFIX,
    STREAM_IDLE_TIMEOUT,
)


def render_bootstrap(*, config_dir: Path, listen_port: int, admin_port: int,
                     node_id: str = "fleetctl", listen_address: str = "127.0.0.1",
                     access_log_path: Path | None = None) -> dict[str, Any]:
    """The static part: listeners, runtime layers and where the CDS/RDS files are.
    `config_dir` must be absolute; both files must exist before Envoy starts."""
    config_dir = config_dir.resolve()
    return {
        "node": {"id": node_id, "cluster": "fleetctl"},
        "admin": {"address": socket_address(listen="127.0.0.1", port=admin_port)},
        # The admin layer is what POST /runtime_modify writes: weights, at once. Below it, the
        # same weights from a file, loaded before Envoy serves: a restart keeps them. Both
        # runtime directories must exist before Envoy starts.
        "layered_runtime": {"layers": [
            {"name": RUNTIME_LAYER, "rtds_layer": {"name": RUNTIME_LAYER, "rtds_config": {
                "resource_api_version": "V3", "path_config_source": {
                    "path": str(config_dir / RUNTIME_DIR / RUNTIME_FILE),
                    "watched_directory": {
                        "path": str(config_dir / RUNTIME_DIR / RUNTIME_UNWATCHED)},
                },
            }}},
            {"name": "admin", "admin_layer": {}},
        ]},
        "dynamic_resources": {"cds_config": _file_source(config_dir, CLUSTERS_FILE)},
        "static_resources": {"listeners": [listener(
            listen_address, listen_port,
            {"rds": {"route_config_name": ROUTE_CONFIG_NAME,
                     "config_source": _file_source(config_dir, ROUTES_FILE)}},
            access_log_path,
        )]},
        "overload_manager": _overload_manager(),
    }


# The static cluster an xDS bootstrap reaches fleetctl's ADS server through (`_`: never a
# pool's name).
XDS_CLUSTER = "xds_cluster"
ADS_SOURCE = {"ads": {}, "resource_api_version": "V3"}
# The node metadata key under which an Envoy tells fleetctl where its admin API is (read by
# fleetctl.xds.server.node_admin_url).
ADMIN_URL_METADATA = "fleetctl_admin_url"
# How soon Envoy retries a broken ADS stream: jittered exponential back-off from the base to
# the max (Envoy's default, 0.5 s to 30 s, left 100 Envoys reconnecting ~20 s after a
# replica restart; docs/xds.md "Reconnect storm").
XDS_RETRY_BASE = "0.25s"
XDS_RETRY_MAX = "5s"


def render_xds_bootstrap(*, xds_host: str, xds_port: int, gateway: str, node_id: str,
                         listen_port: int, admin_port: int, listen_address: str = "127.0.0.1",
                         access_log_path: Path | None = None, token: str = "",
                         replicas: Sequence[tuple[str, int]] = (), admin_listen: str = "127.0.0.1",
                         admin_url: str = "") -> dict[str, Any]:
    """The bootstrap of an Envoy fed by fleetctl's xDS server (fleetctl/xds/): the same
    listener, Lua filter and access log as render_bootstrap, but clusters, routes and the
    weights layer come over one ADS stream. `gateway` is the node cluster (the fleetctl
    gateway whose resources it gets), `node_id` this Envoy's own name within it, `token`
    the gateway's xDS token (manage.py xds_token; sent as `authorization: Bearer` on the
    stream), `replicas` further xDS servers (host, port) beside xds_host:xds_port: the
    stream goes to one of them, and to another when it breaks. The admin API listens on
    `admin_listen`; `admin_url` is where fleetctl reads it (in-flight requests and counters
    are summed over a gateway's Envoys), sent as node metadata: by default
    http://<admin_listen>:<admin_port>, required when admin_listen is a wildcard."""
    if not admin_url:
        if admin_listen in ("0.0.0.0", "::"):
            raise ValueError("admin_listen is a wildcard: give admin_url, the address "
                             "fleetctl reaches this Envoy's admin API at")
        host = f"[{admin_listen}]" if ":" in admin_listen else admin_listen
        admin_url = f"http://{host}:{admin_port}"
    grpc_service: dict[str, Any] = {"envoy_grpc": {
        "cluster_name": XDS_CLUSTER,
        # Reconnect soon after the control plane is back (a restart, a replica failing over),
        # with jitter so a fleet does not come back in one wave.
        "retry_policy": {"retry_back_off": {"base_interval": XDS_RETRY_BASE,
                                            "max_interval": XDS_RETRY_MAX}},
    }}
    if token:
        grpc_service["initial_metadata"] = [{"key": "authorization",
                                             "value": f"Bearer {token}"}]
    servers = [(xds_host, xds_port), *replicas]
    return {
        "node": {"id": node_id, "cluster": gateway,
                 "metadata": {ADMIN_URL_METADATA: admin_url}},
        "admin": {"address": socket_address(listen=admin_listen, port=admin_port)},
        # Weights arrive as an RTDS layer over ADS; the admin layer above it stays for an
        # operator's manual override, as in file mode (fleetctl does not write it here).
        "layered_runtime": {"layers": [
            {"name": RUNTIME_LAYER, "rtds_layer": {"name": RUNTIME_LAYER,
                                                   "rtds_config": ADS_SOURCE}},
            {"name": "admin", "admin_layer": {}},
        ]},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC", "transport_api_version": "V3",
                "grpc_services": [grpc_service],
                # One request per type at a time, answered in order: Envoy's default.
                "set_node_on_first_message_only": True,
            },
            "cds_config": ADS_SOURCE,
        },
        "static_resources": {
            "listeners": [listener(
                listen_address, listen_port,
                {"rds": {"route_config_name": ROUTE_CONFIG_NAME, "config_source": ADS_SOURCE}},
                access_log_path,
            )],
            "clusters": [{
                "name": XDS_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": socket_address(listen=host, port=port)}}
                    for host, port in servers
                ]}]},
                "typed_extension_protocol_options": {HTTP_OPTIONS_NAME: {
                    "@type": HTTP_OPTIONS_TYPE,
                    "explicit_http_config": {"http2_protocol_options": {
                        # Envoy pings the stream: a control plane that vanished without a
                        # FIN is noticed and Envoy reconnects.
                        "connection_keepalive": {"interval": "15s", "timeout": "5s"},
                    }},
                }},
            }],
        },
        "overload_manager": _overload_manager(),
    }


def _overload_manager() -> dict[str, Any]:
    return {"resource_monitors": [{
        "name": "envoy.resource_monitors.global_downstream_max_connections",
        "typed_config": {"@type": MAX_CX_TYPE, "max_active_downstream_connections": 50_000},
    }]}


def listener(address: str, port: int, routes: dict[str, Any],
             access_log_path: Path | None) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": HCM_TYPE,
        "stat_prefix": STAT_PREFIX,
        "codec_type": "AUTO",
        **routes,
        "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
        "request_timeout": "0s",
        "use_remote_address": True,
        # `/v1/../x` or `//v1/x` must be matched (and forwarded) as the path it means.
        "normalize_path": True,
        "merge_slashes": True,
        # A client's x-request-id reaches the pool unchanged (by default Envoy keeps it but
        # rewrites one character of it to carry a tracing flag).
        "preserve_external_request_id": True,
        "request_id_extension": {"typed_config": {
            "@type": REQUEST_ID_TYPE, "pack_trace_reason": False,
        }},
        "http_filters": [
            {"name": LUA_FILTER, "typed_config": {
                "@type": LUA_TYPE,
                "default_source_code": {"inline_string": default_lua()},
            }},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": ROUTER_TYPE, "suppress_envoy_headers": True,
            }},
        ],
    }
    if access_log_path is not None:
        # One JSON object per request (accesslog.LOG_FORMAT), which the telemetry ingester
        # follows. Envoy's file logger is asynchronous and buffered: a slow disk or a stopped
        # ingester never holds a request (docs/envoy.md).
        hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": FILE_LOG_TYPE, "path": str(access_log_path),
            "log_format": {"json_format": dict(ACCESS_LOG_FORMAT)},
        }}]
    return {
        "name": "fleetctl-ingress",
        "address": socket_address(listen=address, port=port),
        "per_connection_buffer_limit_bytes": REQUEST_BUFFER_LIMIT_BYTES,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm,
        }]}],
    }


def _file_source(config_dir: Path, name: str) -> dict[str, Any]:
    # Envoy re-reads the file when anything is *moved* into the directory: fleetctl writes a
    # temporary file there and renames it over the old one, so a reader never sees half.
    return {"resource_api_version": "V3", "path_config_source": {
        "path": str(config_dir / name), "watched_directory": {"path": str(config_dir)},
    }}


def socket_address(*, listen: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": listen, "port_value": port}}
