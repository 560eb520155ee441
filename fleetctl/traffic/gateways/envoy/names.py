"""Names, limits and small encodings every part of an Envoy config shares (render.py
assembles the parts): file and runtime names, timeouts, type URLs, what a name may hold."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

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
# Each endpoint's metadata namespace: {"pool": <its pool>}; ANSWERED_BY formats it.
ENDPOINT_METADATA = "fleetctl"
ANSWERED_BY = f"%UPSTREAM_METADATA({ENDPOINT_METADATA}:pool)%"
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
# A body larger than this gets no prompt estimate ("unknown": the most restrictive tier): at
# ~4 bytes a token it is ~1M tokens, beyond any tier, and it bounds the estimator's cost.
PROMPT_SCAN_LIMIT_BYTES = 4 * 1024 * 1024
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
# Host selection for a retry is re-drawn this many times to avoid the hosts already tried:
# with one dead endpoint of two, the chance that every draw lands on it again is 2^-5 per
# retry (was 2^-3 at 3 draws: a client saw a 503 about once in 128 requests, CI once).
HOST_SELECTION_RETRY_MAX_ATTEMPTS = 5
# The back-off before a retry that falls over to another pool (a tier's fallback): Envoy's
# default (25 ms base, jittered) protects a failing server from its own retries, but the
# retry goes elsewhere; measured, it was most of what a fallback cost (p50 +13.6 ms over a
# direct answer: benchmarks/tier_fallback.py).
FALLBACK_BACK_OFF = {"base_interval": "0.001s", "max_interval": "0.005s"}
# A `queue` tier's slots: requests one endpoint of a pool serves at once (vLLM's default
# max_num_seqs), unless the pool's PoolTarget says otherwise; beyond them requests wait in the
# tier's bounded queue (fallback.py).
QUEUE_SLOTS_PER_ENDPOINT = 256
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
HCM_TYPE = f"{_T}.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
LUA_TYPE = f"{_T}.extensions.filters.http.lua.v3.Lua"
LUA_PER_ROUTE_TYPE = f"{_T}.extensions.filters.http.lua.v3.LuaPerRoute"
ROUTER_TYPE = f"{_T}.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS_TYPE = f"{_T}.extensions.upstreams.http.v3.HttpProtocolOptions"
HTTP_OPTIONS_NAME = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_TYPE = f"{_T}.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
REQUEST_ID_TYPE = f"{_T}.extensions.request_id.uuid.v3.UuidRequestIdConfig"
PREVIOUS_HOSTS_TYPE = f"{_T}.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
PREVIOUS_PRIORITIES_TYPE = (
    f"{_T}.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig")
AGGREGATE_CLUSTER_TYPE = f"{_T}.extensions.clusters.aggregate.v3.ClusterConfig"
FILE_LOG_TYPE = f"{_T}.extensions.access_loggers.file.v3.FileAccessLog"
MAX_CX_TYPE = (
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
LUA_MODEL_CLASS = "[%w%._:/@+-]"  # the same set, as a Lua pattern class
HEADER_VALUE_RE = re.compile(r"^[A-Za-z0-9._:/@+-]{1,64}$")


class ConfigError(ValueError):
    """The desired state cannot be rendered; retrying will not help."""


def check(ok: object, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def is_mirror_key(key: str) -> bool:
    return key.endswith(f".{MIRROR_KEY}")


def fraction(bp: int) -> dict[str, Any]:
    return {"numerator": bp, "denominator": "TEN_THOUSAND"}


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
