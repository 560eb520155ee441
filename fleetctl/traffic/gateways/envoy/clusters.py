"""The clusters file's content (CDS): one cluster per pool, and the shadow collector's."""

from __future__ import annotations

import re
from typing import Any

from fleetctl.traffic.gateways.base import DesiredState, PoolTarget
from fleetctl.traffic.gateways.envoy.affinity import affinity_pools, consistent_hash_lb
from fleetctl.traffic.gateways.envoy.names import (
    CA_BUNDLE,
    CIRCUIT_BREAKER_LIMIT,
    CLUSTER_TYPE,
    COLLECTOR_CLUSTER,
    CONNECT_TIMEOUT,
    ENDPOINT_METADATA,
    HTTP_OPTIONS_NAME,
    HTTP_OPTIONS_TYPE,
    OUTLIER_DETECTION,
    TLS_TYPE,
    UPSTREAM_IDLE_TIMEOUT,
    digest,
)
from fleetctl.traffic.gateways.envoy.validate import parse_base_url


def render_clusters(desired: DesiredState) -> dict[str, dict[str, Any]]:
    clusters = {name: render_cluster(desired.pools[name]) for name in sorted(desired.pools)}
    for name in affinity_pools(desired) & set(clusters):  # prefix affinity: affinity.py
        clusters[name].update(consistent_hash_lb())
    if desired.mirror_url:
        # Always there while mirroring is rendered (every route has a policy, at 0 % when it
        # does not mirror): starting or stopping a shadow run is a runtime change.
        collector = render_cluster(PoolTarget(
            name=COLLECTOR_CLUSTER, base_urls=(desired.mirror_url,), jurisdiction=""))
        # One collector, whose answers nobody waits for: nothing to eject it in favour of.
        del collector["outlier_detection"]
        clusters[COLLECTOR_CLUSTER] = collector
    return clusters


def render_cluster(pool: PoolTarget) -> dict[str, Any]:
    endpoints = [parse_base_url(url, pool.name) for url in pool.base_urls]
    cluster: dict[str, Any] = {
        "@type": CLUSTER_TYPE,
        "name": pool.name,
        "type": "STATIC" if all(_is_ip(host) for _, host, _ in endpoints) else "STRICT_DNS",
        "connect_timeout": CONNECT_TIMEOUT,
        # In-flight counts are what loads an LLM server; round robin would ignore them.
        "lb_policy": "LEAST_REQUEST",
        "outlier_detection": dict(OUTLIER_DETECTION),
        "circuit_breakers": {"thresholds": [{
            "max_connections": CIRCUIT_BREAKER_LIMIT,
            "max_pending_requests": CIRCUIT_BREAKER_LIMIT,
            "max_requests": CIRCUIT_BREAKER_LIMIT,
        }]},
        "typed_extension_protocol_options": {HTTP_OPTIONS_NAME: {
            "@type": HTTP_OPTIONS_TYPE,
            "common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE_TIMEOUT},
            "explicit_http_config": {"http_protocol_options": {}},
        }},
        "load_assignment": {"cluster_name": pool.name, "endpoints": [{"lb_endpoints": [
            _endpoint(host, port, pool.name) for _, host, port in endpoints
        ]}]},
    }
    if cluster["type"] == "STRICT_DNS":
        # AUTO would use only the IPv6 answer when there is one (localhost: ::1) and miss a
        # pool that listens on IPv4 alone.
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    if endpoints and endpoints[0][0] == "https":
        cluster["transport_socket"] = _tls_socket(endpoints[0][1])
    return cluster


def _endpoint(host: str, port: int, pool: str) -> dict[str, Any]:
    # `hostname` lets the route's auto_host_rewrite send each pool its own Host header. The
    # metadata names the pool whatever cluster the endpoint is reached through (a tier's
    # aggregate or queue cluster: fallback.py): the access log and POOL_HEADER read it.
    return {
        "endpoint": {
            "address": {"socket_address": {"address": host, "port_value": port}},
            "hostname": f"{host}:{port}",
        },
        "metadata": {"filter_metadata": {ENDPOINT_METADATA: {"pool": pool}}},
    }


def _tls_socket(sni: str) -> dict[str, Any]:
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": TLS_TYPE,
        "sni": sni,
        "common_tls_context": {"validation_context": {"trusted_ca": {"filename": CA_BUNDLE}}},
    }}


def _is_ip(host: str) -> bool:
    return bool(re.match(r"^\d{1,3}(\.\d{1,3}){3}$", host)) or ":" in host


def clusters_version(clusters: dict[str, dict[str, Any]]) -> str:
    return "c-" + digest([clusters[name] for name in sorted(clusters)])
