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
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    ROOT_PATHS,
    TOTAL_WEIGHT,
    DesiredState,
    PoolTarget,
    RouteSpec,
    pool_base_url_problem,
)
from fleetctl.traffic.gateways.envoy.accesslog import LOG_FORMAT as ACCESS_LOG_FORMAT
from fleetctl.traffic.gateways.schema import collector_url_problem

CLUSTERS_FILE = "clusters.json"
ROUTES_FILE = "routes.json"
BOOTSTRAP_FILE = "bootstrap.json"
# The runtime file: <config_dir>/runtime/current.json, a link to one of two files, read by
# Envoy when it starts. In a subdirectory, so swapping the link does not wake the CDS/RDS
# watch on config_dir; and Envoy watches an empty directory for it (RUNTIME_UNWATCHED), not
# the file: a running Envoy holds the same weights in its admin layer already, and re-reading
# the file on every push would cost each Envoy CPU in the middle of a drain.
RUNTIME_DIR = "runtime"
RUNTIME_FILE = "current.json"
RUNTIME_UNWATCHED = "unwatched"
RUNTIME_LAYER = "fleetctl-weights"
RUNTIME_TYPE = "type.googleapis.com/envoy.service.runtime.v3.Runtime"
ROUTE_CONFIG_NAME = "fleetctl"
STAT_PREFIX = "ingress"
RUNTIME_ROOT = "fleetctl"
LUA_FILTER = "envoy.filters.http.lua"
POOL_HEADER = "x-fleetctl-pool"  # response header naming the pool that answered
# The shadow collector's cluster: `_` is no pool name's character, so it never clashes.
COLLECTOR_CLUSTER = "fleetctl_shadow_collector"
# The runtime key of a route's mirror fraction: `<prefix>._mirror`, next to its weights'
# `<prefix>.<pool>` (again `_`: never a pool's key).
MIRROR_KEY = "_mirror"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's; used for https pools

# Streams of an LLM answer last minutes and can be silent for a long prefill; the route
# timeout is off and only a long idle gap ends a stream.
STREAM_IDLE_TIMEOUT = "300s"
UPSTREAM_IDLE_TIMEOUT = "300s"
CONNECT_TIMEOUT = "2s"
# The Lua filter buffers the request body to read `model`; long-context prompts are large.
REQUEST_BUFFER_LIMIT_BYTES = 16 * 1024 * 1024
# A pool may hold thousands of open streams; Envoy's default circuit breakers (1024) would
# answer 503 long before the pool is full.
CIRCUIT_BREAKER_LIMIT = 100_000
# Retries only of requests that never reached a pool's server: a refused or failed connect,
# a stream refused or reset before the request was sent. A 5xx (or a reset) after the server
# took the request is never retried: it may have generated, and a streamed answer may already
# be on its way to the client. Each retry goes to another endpoint of the same pool (the
# weighted cluster is chosen once per request), skipping the hosts already tried.
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
NUM_RETRIES = 2
HOST_SELECTION_RETRY_MAX_ATTEMPTS = 3
# Outlier detection: an endpoint that fails 5 times in a row (any 5xx, or 502/503/504 and
# connection failures) is ejected for 30 s (longer each time), checked every 5 s. At most half
# a pool's endpoints are ejected: a whole pool failing is a pool problem, for the health
# policy and the ramp guard to drain, not for the load balancer to hide (docs/envoy.md).
OUTLIER_DETECTION: dict[str, Any] = {
    "consecutive_5xx": 5,
    "consecutive_gateway_failure": 5,
    "enforcing_consecutive_gateway_failure": 100,
    # The success-rate detector is off: it needs 5 endpoints and 100 requests per interval
    # each, and a detector that wakes up only on big pools surprises people.
    "enforcing_success_rate": 0,
    "interval": "5s",
    "base_ejection_time": "30s",
    "max_ejection_percent": 50,
}

_T = "type.googleapis.com/envoy"
CLUSTER_TYPE = f"{_T}.config.cluster.v3.Cluster"
ROUTE_CONFIG_TYPE = f"{_T}.config.route.v3.RouteConfiguration"
_HCM_TYPE = f"{_T}.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_LUA_TYPE = f"{_T}.extensions.filters.http.lua.v3.Lua"
_LUA_PER_ROUTE_TYPE = f"{_T}.extensions.filters.http.lua.v3.LuaPerRoute"
_ROUTER_TYPE = f"{_T}.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS_TYPE = f"{_T}.extensions.upstreams.http.v3.HttpProtocolOptions"
_HTTP_OPTIONS_NAME = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_TLS_TYPE = f"{_T}.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_REQUEST_ID_TYPE = f"{_T}.extensions.request_id.uuid.v3.UuidRequestIdConfig"
_PREVIOUS_HOSTS_TYPE = f"{_T}.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_FILE_LOG_TYPE = f"{_T}.extensions.access_loggers.file.v3.FileAccessLog"
_MAX_CX_TYPE = (
    f"{_T}.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)

# Pool and route names as the registry allows them (fleet.models.slug_validator): a name it
# stores must never be one Envoy's config cannot hold.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
HEADER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Characters a model name may have. The Lua script accepts exactly these from the body (so a
# header value is always safe) and they never mean anything to Envoy's formatter (no `%`).
MODEL_CHARS = "A-Za-z0-9._:/@+-"
MODEL_RE = re.compile(rf"^[{MODEL_CHARS}]{{1,256}}$")
_LUA_MODEL_CLASS = "[%w%._:/@+-]"  # the same set, as a Lua pattern class
HEADER_VALUE_RE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,64}$")


class ConfigError(ValueError):
    """The desired state cannot be rendered; retrying will not help."""


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


# --- validation ------------------------------------------------------------------------------

def validate(desired: DesiredState) -> None:
    """Everything that would make Envoy reject the files, or make them mean something other
    than `desired`, raised before anything is written."""
    for name in (desired.model_header, desired.residency_header, desired.latency_class_header):
        _check(HEADER_NAME_RE.match(name), f"header name {name!r} is not a lowercase token")
    headers = {desired.model_header, desired.residency_header, desired.latency_class_header}
    _check(len(headers) == 3, "model, residency and latency-class headers must differ")
    for key, pool in desired.pools.items():
        _validate_pool(key, pool)
    if desired.mirror_url:
        problem = collector_url_problem(desired.mirror_url)
        _check(problem is None, f"shadow collector {problem}")
    seen_keys: set[str] = set()
    seen_matches: dict[tuple[str, str, str], str] = {}
    for route in desired.routes:
        _validate_route(route, desired)
        _check(route.key not in seen_keys, f"route key {route.key!r} appears twice")
        seen_keys.add(route.key)
        match = (route.model, route.latency_class, route.residency)
        other = seen_matches.setdefault(match, route.key)
        _check(other == route.key, f"routes {other} and {route.key} match the same requests")


def _validate_pool(key: str, pool: PoolTarget) -> None:
    _check(key == pool.name, f"pool {pool.name!r} is filed under {key!r}")
    problem = pool_problem(pool)
    _check(problem is None, f"pool {pool.name}: Envoy {problem}")


def pool_problem(pool: PoolTarget) -> str | None:
    """Why Envoy cannot route to `pool`, worded to follow "the gateway" (Adapter.check_pool),
    or None. A path prefix other than /v1 cannot be expressed per weighted cluster (Envoy
    rewrites paths per route, and every pool of a route shares it), so it is refused rather
    than silently dropped; a cluster speaks one scheme."""
    if not NAME_RE.match(pool.name):
        return f"cannot name a cluster after pool {pool.name!r}: use [a-z0-9-], at most 63"
    problem = pool_base_url_problem(pool)
    if problem:
        return problem
    if len({urlsplit(url).scheme for url in pool.base_urls}) > 1:
        return "cannot mix http and https base URLs in one pool (one cluster, one scheme)"
    return None


def _validate_route(route: RouteSpec, desired: DesiredState) -> None:
    _check(NAME_RE.match(route.key), f"route key {route.key!r} is not [a-z0-9-]")
    _check(MODEL_RE.match(route.model), f"route {route.key}: model {route.model!r} has "
           f"characters outside {MODEL_CHARS}")
    for what, value in (("latency class", route.latency_class), ("residency", route.residency)):
        _check(not value or HEADER_VALUE_RE.match(value),
               f"route {route.key}: {what} {value!r} is not a plain token")
    for pool, weight in route.weights.items():
        _check(pool in desired.pools, f"route {route.key}: pool {pool!r} is not declared")
        _check(isinstance(weight, int) and 0 <= weight <= TOTAL_WEIGHT,
               f"route {route.key}: weight {weight!r} of {pool} is not 0..{TOTAL_WEIGHT}")
        _check(weight == 0 or desired.pools[pool].base_urls,
               f"route {route.key}: pool {pool} has weight but no base URL")
    total = sum(route.weights.values())
    _check(not route.weights or total == TOTAL_WEIGHT,
           f"route {route.key}: weights sum to {total}, not {TOTAL_WEIGHT}")


def _check(ok: object, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def parse_base_url(url: str, pool: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a pool base URL. A path prefix other than /v1 cannot be
    expressed per weighted cluster in Envoy, so it is refused rather than silently dropped."""
    parts = urlsplit(url)
    _check(parts.scheme in ("http", "https") and parts.hostname,
           f"pool {pool}: base URL {url!r} is not http(s)://host[:port]")
    _check(parts.path in ROOT_PATHS and not parts.query,
           f"pool {pool}: base URL {url!r} has a path prefix; Envoy forwards /v1/... as is")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"pool {pool}: base URL {url!r} has a bad port") from exc
    assert parts.hostname is not None
    return parts.scheme, parts.hostname, port


# --- clusters --------------------------------------------------------------------------------

def render_clusters(desired: DesiredState) -> dict[str, dict[str, Any]]:
    clusters = {name: render_cluster(desired.pools[name]) for name in sorted(desired.pools)}
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
        "typed_extension_protocol_options": {_HTTP_OPTIONS_NAME: {
            "@type": _HTTP_OPTIONS_TYPE,
            "common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE_TIMEOUT},
            "explicit_http_config": {"http_protocol_options": {}},
        }},
        "load_assignment": {"cluster_name": pool.name, "endpoints": [{"lb_endpoints": [
            _endpoint(host, port) for _, host, port in endpoints
        ]}]},
    }
    if cluster["type"] == "STRICT_DNS":
        # AUTO would use only the IPv6 answer when there is one (localhost: ::1) and miss a
        # pool that listens on IPv4 alone.
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    if endpoints and endpoints[0][0] == "https":
        cluster["transport_socket"] = _tls_socket(endpoints[0][1])
    return cluster


def _endpoint(host: str, port: int) -> dict[str, Any]:
    # `hostname` lets the route's auto_host_rewrite send each pool its own Host header.
    return {"endpoint": {
        "address": {"socket_address": {"address": host, "port_value": port}},
        "hostname": f"{host}:{port}",
    }}


def _tls_socket(sni: str) -> dict[str, Any]:
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": _TLS_TYPE,
        "sni": sni,
        "common_tls_context": {"validation_context": {"trusted_ca": {"filename": CA_BUNDLE}}},
    }}


def _is_ip(host: str) -> bool:
    return bool(re.match(r"^\d{1,3}(\.\d{1,3}){3}$", host)) or ":" in host


def clusters_version(clusters: dict[str, dict[str, Any]]) -> str:
    return "c-" + _digest([clusters[name] for name in sorted(clusters)])


# --- routes ----------------------------------------------------------------------------------

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
    return RenderedConfig(
        clusters=render_clusters(desired),
        route_config=route_config,
        routes_version="r-" + _digest(_without_weights(route_config)),
        runtime=runtime,
    )


def render_route_config(desired: DesiredState) -> dict[str, Any]:
    return {
        "@type": ROUTE_CONFIG_TYPE,
        "name": ROUTE_CONFIG_NAME,
        "virtual_hosts": [{
            "name": "fleetctl",
            "domains": ["*"],
            "routes": _routes(desired),
            # The script arrives with the routes, so the header it writes always is the one
            # these routes match on, and the bootstrap never changes.
            "typed_per_filter_config": {LUA_FILTER: {
                "@type": _LUA_PER_ROUTE_TYPE,
                "source_code": {"inline_string": routing_lua(desired)},
            }},
        }],
    }


def render_unconfigured_route_config() -> dict[str, Any]:
    """What a gateway holds before fleetctl first pushes to it: every request gets a 503."""
    return {
        "@type": ROUTE_CONFIG_TYPE,
        "name": ROUTE_CONFIG_NAME,
        "virtual_hosts": [{"name": "fleetctl", "domains": ["*"], "routes": [_error_route(
            "fleetctl:unconfigured", {"prefix": "/"}, 503, "service_unavailable",
            "gateway_unconfigured", "this gateway has not been configured by fleetctl yet",
        )]}],
    }


def _routes(desired: DesiredState) -> list[dict[str, Any]]:
    """Most specific first. Per model: routes pinned to a jurisdiction, then a refusal of any
    other jurisdiction, then unpinned routes (which also require the header to be absent)."""
    models = sorted({route.model for route in desired.routes})
    entries = _models_routes(models)
    for model in models:
        specs = [route for route in desired.routes if route.model == model]
        pinned = sorted((r for r in specs if r.residency), key=_specificity)
        unpinned = sorted((r for r in specs if not r.residency), key=_specificity)
        entries += [_spec_route(route, desired) for route in pinned]
        entries.append(_residency_refused(model, desired))
        entries += [_spec_route(route, desired) for route in unpinned]
        entries.append(_no_route_for(model, desired))
    entries += _fallback_routes(desired)
    return entries


def _specificity(route: RouteSpec) -> tuple[bool, str, str]:
    return (not route.latency_class, route.residency, route.key)


def _spec_route(route: RouteSpec, desired: DesiredState) -> dict[str, Any]:
    headers = [_exact(desired.model_header, route.model)]
    if route.latency_class:
        headers.append(_exact(desired.latency_class_header, route.latency_class))
    headers.append(_exact(desired.residency_header, route.residency) if route.residency
                   else _absent(desired.residency_header))
    match = {"prefix": "/v1/", "headers": headers}
    if not route.weights:
        where = f"in jurisdiction {route.residency} " if route.residency else ""
        return _error_route(
            route.key, match, 503, "service_unavailable", "no_pool_available",
            f"route {route.key}: no pool {where}may serve model {route.model} now",
        )
    action: dict[str, Any] = {
        "weighted_clusters": {
            "runtime_key_prefix": runtime_prefix(route, desired),
            "clusters": [{"name": pool, "weight": route.weights[pool]}
                         for pool in sorted(route.weights)],
        },
        "timeout": "0s",
        "auto_host_rewrite": True,
        "retry_policy": retry_policy(),
    }
    if desired.mirror_url:
        action["request_mirror_policies"] = [mirror_policy(route, desired)]
    return {
        "name": route.key,
        "match": match,
        "route": action,
        "response_headers_to_add": [{
            "header": {"key": POOL_HEADER, "value": "%UPSTREAM_CLUSTER%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }],
    }


def retry_policy() -> dict[str, Any]:
    """Retry a request that failed before any byte of it reached a server (RETRY_ON) on
    another endpoint of the same pool; the access log counts the attempts."""
    return {
        "retry_on": RETRY_ON,
        "num_retries": NUM_RETRIES,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": _PREVIOUS_HOSTS_TYPE},
        }],
        "host_selection_retry_max_attempts": HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    }


def mirror_policy(route: RouteSpec, desired: DesiredState) -> dict[str, Any]:
    """Copy the route's requests, `mirror_bp` of 10,000 of them, to the shadow collector.
    The share is a runtime key beside the weights' (one /runtime_modify changes it, no file
    swap; the runtime file keeps it over a restart); the default is what a freshly loaded
    file means. Envoy sends the copy and never waits for it: its answer, or its absence, is
    dropped, so a slow or dead collector costs the live request nothing. Only the copy
    carries MIRROR_HEADER and MIRROR_AUTH_HEADER (the live pool never sees them), each
    overwriting what the client sent; without a mirror_auth the client's is removed. Envoy
    appends "-shadow" to the copy's Host."""
    auth: dict[str, Any] = {"remove": MIRROR_AUTH_HEADER}
    if route.mirror_auth:
        auth = {"append": {
            "header": {"key": MIRROR_AUTH_HEADER, "value": route.mirror_auth},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }}
    return {
        "cluster": COLLECTOR_CLUSTER,
        "runtime_fraction": {
            "default_value": _fraction(route.mirror_bp),
            "runtime_key": f"{runtime_prefix(route, desired)}.{MIRROR_KEY}",
        },
        "request_headers_mutations": [{"append": {
            "header": {"key": MIRROR_HEADER, "value": route.key},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }}, auth],
    }


def runtime_prefix(route: RouteSpec, desired: DesiredState) -> str:
    """`fleetctl.<route>.<shape hash>`: a new shape of the route never reads the runtime
    weights of an old one (whose pools may differ, or all be 0 for the new list)."""
    shape = [route.model, route.latency_class, route.residency, sorted(route.weights),
             desired.model_header, desired.residency_header, desired.latency_class_header]
    return f"{RUNTIME_ROOT}.{route.key}.{_digest(shape)[:8]}"


def _residency_refused(model: str, desired: DesiredState) -> dict[str, Any]:
    match = {"prefix": "/v1/", "headers": [_exact(desired.model_header, model),
                                           _present(desired.residency_header)]}
    jurisdiction = f"%REQ({desired.residency_header}):64%"
    return _error_route(
        f"fleetctl:residency:{model}", match, 403, "invalid_request_error",
        "residency_unavailable",
        f"no route serves model {model} in jurisdiction {jurisdiction}", dynamic=True,
    )


def _no_route_for(model: str, desired: DesiredState) -> dict[str, Any]:
    match = {"prefix": "/v1/", "headers": [_exact(desired.model_header, model)]}
    latency = f"%REQ({desired.latency_class_header}):64%"
    return _error_route(
        f"fleetctl:no-route:{model}", match, 404, "invalid_request_error", "route_not_found",
        f"no route serves model {model} for latency class {latency}", dynamic=True,
    )


def _fallback_routes(desired: DesiredState) -> list[dict[str, Any]]:
    unknown = {"prefix": "/v1/", "headers": [_present(desired.model_header)]}
    missing = {"prefix": "/v1/", "headers": [_exact(":method", "POST")]}
    return [
        _error_route("fleetctl:unknown-model", unknown, 404, "invalid_request_error",
                     "model_not_found",
                     f"The model `%REQ({desired.model_header})%` does not exist "
                     "or no route serves it", dynamic=True),
        _error_route("fleetctl:missing-model", missing, 400, "invalid_request_error",
                     "missing_model", "the JSON body needs a top-level string `model` "
                     f"of the characters {MODEL_CHARS}"),
        _error_route("fleetctl:unknown-url", {"prefix": "/"}, 404, "invalid_request_error",
                     "unknown_url", "Unknown request URL: %REQ(:METHOD)% %REQ(:PATH):256%",
                     dynamic=True),
    ]


def _models_routes(models: list[str]) -> list[dict[str, Any]]:
    """GET /v1/models lists the models this gateway routes (not what each pool serves:
    the gateway answers for the set, and a pool's own list may be wider)."""
    listing = {"object": "list", "data": [_model_object(m) for m in models]}
    entries = [_static_route("fleetctl:models", {"path": "/v1/models"}, 200, listing)]
    entries += [_static_route(f"fleetctl:model:{m}", {"path": f"/v1/models/{m}"}, 200,
                              _model_object(m)) for m in models]
    return entries


def _model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "fleetctl"}


def _error_route(name: str, match: dict[str, Any], status: int, kind: str, code: str,
                 message: str, *, dynamic: bool = False) -> dict[str, Any]:
    """An OpenAI-style error answered by Envoy itself. `dynamic` messages contain Envoy
    format commands (json_format escapes what they expand to); others are static text."""
    if not dynamic:
        message = message.replace("%", "%%")
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return {"name": name, "match": match, "direct_response": {
        "status": status, "body_format": {"json_format": body},
    }}


def _static_route(name: str, match: dict[str, Any], status: int,
                  body: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(body, separators=(",", ":")).replace("%", "%%")
    return {"name": name, "match": match, "direct_response": {
        "status": status, "body_format": {
            "text_format_source": {"inline_string": text}, "content_type": "application/json",
        },
    }}


def _exact(header: str, value: str) -> dict[str, Any]:
    return {"name": header, "string_match": {"exact": value}}


def _present(header: str) -> dict[str, Any]:
    return {"name": header, "present_match": True}


def _absent(header: str) -> dict[str, Any]:
    return {"name": header, "present_match": True, "invert_match": True}


def _without_weights(node: Any) -> Any:
    """The route config minus default weights and mirror fractions: two configs that differ
    only in those have the same version, and such a change goes through the runtime, not a
    file swap."""
    if isinstance(node, dict):
        if "runtime_fraction" in node and "cluster" in node:  # a request mirror policy
            node = {**node, "runtime_fraction": {
                k: v for k, v in node["runtime_fraction"].items() if k != "default_value"}}
        if "weighted_clusters" in node:
            node = {**node, "weighted_clusters": {
                **node["weighted_clusters"],
                "clusters": [{k: v for k, v in c.items() if k != "weight"}
                             for c in node["weighted_clusters"]["clusters"]],
            }}
        return {key: _without_weights(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_without_weights(item) for item in node]
    return node


# --- the Lua script --------------------------------------------------------------------------

_LUA = r"""
-- fleetctl: copy the top-level "model" of a POST /v1/ JSON body into the route header.
-- Whatever value of that header the client sent is removed first: clients never pick a route.
local MODEL_HEADER = "@MODEL_HEADER@"
-- Envoy matches a repeated header by one of its values; joined into one ("EU,US") it matches
-- no pinned route, so an ambiguous jurisdiction is refused rather than guessed.
local JOINED_HEADERS = {"@RESIDENCY_HEADER@", "@LATENCY_HEADER@"}

-- From just after an opening quote: the index of the closing quote. A quote preceded by an
-- odd number of backslashes is escaped. Plain find (memchr) keeps long prompts cheap.
local function string_end(body, from)
  local i = from
  while true do
    local q = string.find(body, '"', i, true)
    if q == nil then return nil end
    local k = q - 1
    while k >= from and string.byte(body, k) == 92 do k = k - 1 end
    if (q - 1 - k) % 2 == 0 then return q end
    i = q + 1
  end
end

-- The value of the key "model" of the outermost object (the last one, like Python's json),
-- or nil. Strings are skipped whole, so a "model" inside a prompt or a nested object never
-- counts.
local function top_level_model(body)
  local depth, i, found = 0, 1, nil
  while true do
    local j = string.find(body, '[{}%[%]"]', i)
    if j == nil then return found end
    local c = string.byte(body, j)
    if c == 34 then
      local close = string_end(body, j + 1)
      if close == nil then return nil end
      i = close + 1
      if depth == 1 and close - j == 6 and string.sub(body, j + 1, close - 1) == "model" then
        local _, colon = string.find(body, '^%s*:%s*', i)
        if colon ~= nil then
          found = nil
          if string.byte(body, colon + 1) == 34 then
            local value_end = string_end(body, colon + 2)
            if value_end == nil then return nil end
            found = string.sub(body, colon + 2, value_end - 1)
            i = value_end + 1
          end
        end
      end
    elseif c == 123 or c == 91 then
      depth = depth + 1
      i = j + 1
    else
      depth = depth - 1
      i = j + 1
    end
  end
end

function envoy_on_request(handle)
  local headers = handle:headers()
  headers:remove(MODEL_HEADER)
  for _, name in ipairs(JOINED_HEADERS) do
    if headers:getNumValues(name) > 1 then headers:replace(name, headers:get(name)) end
  end
  local path = headers:get(":path") or ""
  if headers:get(":method") == "POST" and string.sub(path, 1, 4) == "/v1/" then
    -- body() waits for the whole body; wrappers taken before it are stale afterwards.
    local body = handle:body()
    if body ~= nil and body:length() > 0 then
      local model = top_level_model(body:getBytes(0, body:length()))
      if model ~= nil and #model <= 256 and string.find(model, "^@MODEL_CLASS@+$") then
        handle:headers():replace(MODEL_HEADER, model)
      end
    end
  end
  handle:clearRouteCache()
end
"""

# Before the first routes file arrives: still never let a client-sent header through.
_LUA_DEFAULT = r"""
function envoy_on_request(handle)
  handle:headers():remove("@MODEL_HEADER@")
end
"""


def routing_lua(desired: DesiredState) -> str:
    """The per-request script for these routes (header names are validated tokens)."""
    return (_LUA.replace("@MODEL_HEADER@", desired.model_header)
            .replace("@RESIDENCY_HEADER@", desired.residency_header)
            .replace("@LATENCY_HEADER@", desired.latency_class_header)
            .replace("@MODEL_CLASS@", _LUA_MODEL_CLASS).lstrip())


# --- bootstrap -------------------------------------------------------------------------------

def render_bootstrap(*, config_dir: Path, listen_port: int, admin_port: int,
                     node_id: str = "fleetctl", listen_address: str = "127.0.0.1",
                     access_log_path: Path | None = None) -> dict[str, Any]:
    """The static part: listeners, runtime layers and where the CDS/RDS files are.
    `config_dir` must be absolute; both files must exist before Envoy starts."""
    config_dir = config_dir.resolve()
    return {
        "node": {"id": node_id, "cluster": "fleetctl"},
        "admin": {"address": _socket(listen="127.0.0.1", port=admin_port)},
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
        "static_resources": {"listeners": [_listener(
            listen_address, listen_port,
            {"rds": {"route_config_name": ROUTE_CONFIG_NAME,
                     "config_source": _file_source(config_dir, ROUTES_FILE)}},
            access_log_path,
        )]},
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {"@type": _MAX_CX_TYPE, "max_active_downstream_connections": 50_000},
        }]},
    }


def render_validation_bootstrap(desired: DesiredState, *, listen_port: int = 10000,
                                admin_port: int = 9901) -> dict[str, Any]:
    """The same listener with clusters and routes inlined as static resources, for
    `envoy --mode validate` (which does not read CDS/RDS files)."""
    rendered = render(desired)
    route_config = {k: v for k, v in rendered.route_config.items() if k != "@type"}
    clusters = [{k: v for k, v in c.items() if k != "@type"} for c in rendered.clusters.values()]
    return {
        "node": {"id": "validate", "cluster": "fleetctl"},
        "admin": {"address": _socket(listen="127.0.0.1", port=admin_port)},
        "layered_runtime": {"layers": [{"name": "admin", "admin_layer": {}}]},
        "static_resources": {
            "listeners": [_listener("127.0.0.1", listen_port, {"route_config": route_config},
                                    None)],
            "clusters": clusters,
        },
    }


def _listener(address: str, port: int, routes: dict[str, Any],
              access_log_path: Path | None) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": _HCM_TYPE,
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
            "@type": _REQUEST_ID_TYPE, "pack_trace_reason": False,
        }},
        "http_filters": [
            {"name": LUA_FILTER, "typed_config": {
                "@type": _LUA_TYPE,
                "default_source_code": {"inline_string": _LUA_DEFAULT.replace(
                    "@MODEL_HEADER@", DesiredState.model_header).lstrip()},
            }},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": _ROUTER_TYPE, "suppress_envoy_headers": True,
            }},
        ],
    }
    if access_log_path is not None:
        # One JSON object per request (accesslog.LOG_FORMAT), which the telemetry ingester
        # follows. Envoy's file logger is asynchronous and buffered: a slow disk or a stopped
        # ingester never holds a request (docs/envoy.md).
        hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": _FILE_LOG_TYPE, "path": str(access_log_path),
            "log_format": {"json_format": dict(ACCESS_LOG_FORMAT)},
        }}]
    return {
        "name": "fleetctl-ingress",
        "address": _socket(listen=address, port=port),
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


def _socket(*, listen: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": listen, "port_value": port}}


# --- files -----------------------------------------------------------------------------------

def discovery_file(resources: list[dict[str, Any]], version: str) -> str:
    """A CDS/RDS file: a DiscoveryResponse whose version_info Envoy reports back once loaded."""
    return json.dumps({"version_info": version, "resources": resources}, indent=1,
                      sort_keys=True) + "\n"


def clusters_file(clusters: dict[str, dict[str, Any]]) -> str:
    return discovery_file([clusters[n] for n in sorted(clusters)], clusters_version(clusters))


def routes_file(route_config: dict[str, Any], version: str) -> str:
    return discovery_file([route_config], version)


def runtime_file(weights: dict[str, int]) -> str:
    """The runtime file: an RTDS DiscoveryResponse whose layer holds every weight key (and
    every mirror fraction)."""
    # A mirror fraction is an object here: Envoy reads a FractionalPercent from an RTDS
    # layer's struct value, not from a string (which the admin endpoint does parse).
    layer: dict[str, Any] = {key: (_fraction(weights[key]) if _is_mirror_key(key)
                                   else str(weights[key])) for key in sorted(weights)}
    return json.dumps({"version_info": "w-" + _digest(layer), "resources": [{
        "@type": RUNTIME_TYPE, "name": RUNTIME_LAYER, "layer": layer,
    }]}, separators=(",", ":")) + "\n"


def runtime_file_weights(text: str) -> dict[str, int]:
    """The weights (and mirror fractions) a runtime file holds ({} for one that is not
    fleetctl's)."""
    try:
        layer = json.loads(text)["resources"][0]["layer"]
        values = {str(key): (fraction_bp(value) if _is_mirror_key(str(key))
                             else runtime_value_bp(str(key), str(value)))
                  for key, value in layer.items()}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return {}
    if any(value is None for value in values.values()):
        return {}
    return {key: value for key, value in values.items() if value is not None}


def runtime_strings(runtime: dict[str, int]) -> dict[str, str]:
    """Runtime values as Envoy reads them: a weight is an integer; a mirror fraction is a
    FractionalPercent in basis points (an integer there would mean whole percent)."""
    return {key: (json.dumps(_fraction(value), separators=(",", ":"))
                  if _is_mirror_key(key) else str(value))
            for key, value in runtime.items()}


def _is_mirror_key(key: str) -> bool:
    return key.endswith(f".{MIRROR_KEY}")


def _fraction(bp: int) -> dict[str, Any]:
    return {"numerator": bp, "denominator": "TEN_THOUSAND"}


def runtime_value_bp(key: str, text: str | None) -> int | None:
    """A runtime value as runtime_strings wrote it, back as an integer (basis points for a
    mirror key); None when it is not one of those (Envoy then uses the default)."""
    if text is None:
        return None
    if not _is_mirror_key(key):
        try:
            return int(text)
        except ValueError:
            return None
    return fraction_bp(text)


_DENOMINATORS = {"HUNDRED": 100, "TEN_THOUSAND": 10_000, "MILLION": 1_000_000}
_DEBUG_FIELD = re.compile(r'key: "(numerator|denominator)"\s*value \{\s*'
                          r'(?:number_value: ([0-9.e+]+)|string_value: "([A-Z_]+)")')


def _debug_struct(text: str) -> dict[str, Any] | None:
    """A FractionalPercent as /runtime shows a struct value of the runtime file's layer
    (protobuf debug text, not JSON), or None."""
    found = {name: (float(number) if number else word)
             for name, number, word in _DEBUG_FIELD.findall(text)}
    return found or None


def fraction_bp(value: Any) -> int | None:
    """A FractionalPercent (a dict, or its JSON text) in basis points, capped at 10,000;
    None when it is not one. Envoy reads a bare integer as whole percent."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = _debug_struct(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return min(TOTAL_WEIGHT, value * 100)
    if not isinstance(value, dict):
        return None
    try:
        numerator = int(value.get("numerator", 0))
        denominator = _DENOMINATORS[str(value.get("denominator", "HUNDRED"))]
    except (ValueError, TypeError, KeyError):
        return None
    return min(TOTAL_WEIGHT, numerator * TOTAL_WEIGHT // denominator)


UNCONFIGURED_ROUTES_VERSION = "unconfigured"


def unconfigured_files() -> dict[str, str]:
    """File name -> content for a gateway fleetctl has not configured yet."""
    return {
        CLUSTERS_FILE: clusters_file({}),
        ROUTES_FILE: routes_file(render_unconfigured_route_config(),
                                 UNCONFIGURED_ROUTES_VERSION),
    }


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
