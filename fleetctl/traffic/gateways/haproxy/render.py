"""HAProxy configuration for one gateway, rendered from a DesiredState by pure functions.

How a request finds its pool: the frontend buffers the request body (`option
http-buffer-request`) and reads the model with `req.body,json_query('$.model')` (HAProxy ≥ 2.4);
ACLs on that model, the residency header and the latency-class header pick one backend per
route (`route-<key>`), and every backend holds one server per endpoint of every pool that may
carry the route (`<pool>.<n>`), so a split change is a weight change, never a reload.

Weight resolution: HAProxy weights are 0..256 per server. A pool's basis points become
`round(bp × 256 / 10,000 / endpoints)` per server, never less than 1 for a non-zero share (a
pool with any weight keeps some traffic; 1 bp becomes 1/257 ≈ 0.39 %). `shares()` turns server
weights back into each pool's share in basis points, so the adapter compares at that
resolution.

Residency fails closed: a request carrying the residency header only matches routes pinned
to that exact value (a route without a pin requires the header to be absent); anything else
falls to the `fleetctl.refuse` backend, which answers 403 (or 404 for an unknown model), and
a route whose weights are empty or all zero answers 503 from its own backend, which holds
only pools of its jurisdiction. A header given twice is refused (400).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleetctl.traffic.gateways.base import (
    SAFE_NAME,
    TOTAL_WEIGHT,
    AdapterError,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    RouteSpec,
    address_host,
    check_plain_names,
    openai_error,
    pool_base_url_problem,
    url_port,
)
from fleetctl.traffic.gateways.haproxy.accesslog import LOG_FORMAT
from fleetctl.traffic.gateways.haproxy.options import HAProxyOptions
from fleetctl.traffic.gateways.schema import parse_options
from fleetctl.traffic.gateways.targets import route_target

MAX_WEIGHT = 256
STRUCTURE_ENV = "FLEETCTL_STRUCTURE"
REFUSE_BACKEND = "fleetctl.refuse"
_STATS_SOCKET_OPTIONS = "mode 600 level admin expose-fd listeners"


@dataclass(frozen=True)
class HAProxySettings:
    """What rendering and the adapter work from: the gateway's name, its runtime API address
    (`admin_address`) and its options. Paths are on the HAProxy host, which must be this one:
    the adapter writes the config file and runs `haproxy -c`."""

    gateway: str
    runtime_address: str
    options: HAProxyOptions

    @classmethod
    def from_gateway(cls, gateway: GatewaySpec) -> HAProxySettings:
        return cls(gateway=gateway.name, runtime_address=gateway.admin_address,
                   options=parse_options(HAProxyOptions, gateway.options, "HAProxy"))

    @property
    def config_path(self) -> Path:
        return Path(self.options.config_path)

    @property
    def state_file(self) -> Path:
        return Path(self.options.state_file or self.config_path.parent / "server-state")

def _stats_socket_bind(address: str) -> str:
    return address if address.startswith("/") else f"ipv4@{address}"


# --- layout: what the desired state becomes in HAProxy terms --------------------------------------

@dataclass(frozen=True)
class Server:
    name: str  # <pool>.<n>: pool names have no dots, so the pool is everything before the last
    pool: str
    address: str
    tls_host: str | None  # SNI / verification name when the pool speaks https


@dataclass(frozen=True)
class Backend:
    route: RouteSpec
    servers: tuple[Server, ...]

    @property
    def name(self) -> str:
        return backend_name(self.route.key)


def backend_name(route_key: str) -> str:
    return f"route-{route_key}"


def pool_of(server_name: str) -> str:
    return server_name.rpartition(".")[0]


def layout(desired: DesiredState) -> tuple[Backend, ...]:
    """One backend per route with every pool that may carry it; refuses (permanently) what
    HAProxy cannot express or what would cross a residency border."""
    check_plain_names(desired, where="HAProxy ACLs")
    return tuple(Backend(route=r, servers=_servers(r, desired)) for r in _ordered(desired))


def _ordered(desired: DesiredState) -> list[RouteSpec]:
    # use_backend rules are tried in order: a latency-specific route before the catch-all
    # route of the same model and residency.
    return sorted(desired.routes,
                  key=lambda r: (r.model, r.residency, r.latency_class == "", r.key))


def _servers(route: RouteSpec, desired: DesiredState) -> tuple[Server, ...]:
    for pool, weight in route.weights.items():
        route_target(route, pool, weight, desired)
    eligible = sorted(name for name, pool in desired.pools.items()
                      if not route.residency or pool.jurisdiction == route.residency)
    return tuple(server for pool in eligible
                 for server in _pool_servers(pool, desired.pools[pool].base_urls))


def pool_problem(pool: PoolTarget) -> str | None:
    """Why HAProxy cannot route to `pool` (see Adapter.check_pool). One backend serves
    several pools and HAProxy rewrites paths per backend, not per server, so a base URL is
    the server's root."""
    if not SAFE_NAME.match(pool.name):
        return f"cannot name a server after pool {pool.name!r}: use [a-z0-9-]"
    return pool_base_url_problem(pool)


def _pool_servers(pool: str, base_urls: tuple[str, ...]) -> list[Server]:
    problem = pool_problem(PoolTarget(name=pool, base_urls=base_urls, jurisdiction=""))
    if problem:
        raise AdapterError(f"pool {pool}: HAProxy {problem}", permanent=True)
    servers = []
    for n, url in enumerate(base_urls):
        parts = urlsplit(url)
        assert parts.hostname is not None  # pool_problem checked it
        https = parts.scheme == "https"
        port = url_port(url, 443 if https else 80)
        servers.append(Server(name=f"{pool}.{n}", pool=pool,
                              address=f"{address_host(parts.hostname)}:{port}",
                              tls_host=parts.hostname if https else None))
    return servers


# --- weights --------------------------------------------------------------------------------------

def server_weights(backend: Backend) -> dict[str, int]:
    """Server name -> HAProxy weight (0..256) for the route's basis points."""
    per_pool = {s.pool: 0 for s in backend.servers}
    for s in backend.servers:
        per_pool[s.pool] += 1
    weights = {}
    for s in backend.servers:
        bp = backend.route.weights.get(s.pool, 0)
        weights[s.name] = _quantise(bp, per_pool[s.pool])
    return weights


def _quantise(bp: int, endpoints: int) -> int:
    if bp <= 0:
        return 0
    # Half-up rounding; a non-zero share never rounds to 0 (that would drain the pool).
    return min(MAX_WEIGHT, max(1, (bp * MAX_WEIGHT * 2 + TOTAL_WEIGHT * endpoints)
                               // (2 * TOTAL_WEIGHT * endpoints)))


def shares(server_to_weight: dict[str, int]) -> dict[str, int]:
    """Server weights of one backend -> each pool's share in basis points (zeros dropped)."""
    per_pool: dict[str, int] = {}
    for server, weight in server_to_weight.items():
        per_pool[pool_of(server)] = per_pool.get(pool_of(server), 0) + weight
    total = sum(per_pool.values())
    if total == 0:
        return {}
    return {pool: (w * TOTAL_WEIGHT * 2 + total) // (2 * total)
            for pool, w in per_pool.items() if w > 0}


# --- rendering ------------------------------------------------------------------------------------

def _error_json(message: str, kind: str, code: str) -> str:
    # Rendered inside single quotes: the message must not contain one.
    return json.dumps(openai_error(message, kind, code), separators=(",", ":"))


@dataclass(frozen=True)
class Rendered:
    text: str  # the whole haproxy.cfg
    structure: str  # hash of everything but the weights: a change needs a reload
    targets: dict[str, dict[str, int]]  # backend -> server -> HAProxy weight

    def expected_shares(self) -> dict[str, dict[str, int]]:
        """What read_back() returns once this is applied: each route's pools in basis points."""
        return {backend[len("route-"):]: shares(weights)
                for backend, weights in self.targets.items()}


def render_config(desired: DesiredState, settings: HAProxySettings) -> Rendered:
    backends = layout(desired)
    targets = {b.name: server_weights(b) for b in backends}
    zero = {name: dict.fromkeys(weights, 0) for name, weights in targets.items()}
    structure = hashlib.sha256(
        (_global(settings, "") + _proxies(desired, backends, settings, zero)).encode()
    ).hexdigest()[:16]
    text = (f"# Rendered by fleetctl for gateway {settings.gateway}; the next push overwrites "
            "it.\n" + _global(settings, structure)
            + _proxies(desired, backends, settings, targets))
    return Rendered(text=text, structure=structure, targets=targets)


def _global(settings: HAProxySettings, structure: str) -> str:
    state = settings.state_file
    # Requests are buffered whole to read the model: room for the body plus headers.
    bufsize = settings.options.max_body_bytes + 32768
    return f"""global
    setenv {STRUCTURE_ENV} {structure or "-"}
    # expose-fd: a reload hands the listening sockets over, so no queued connection is reset.
    stats socket {_stats_socket_bind(settings.runtime_address)} {_STATS_SOCKET_OPTIONS}
    stats timeout 30s
    server-state-file {state}
    tune.bufsize {bufsize}
{_log_target(settings)}    # No hard-stop-after: after a reload, old workers finish their in-flight
    # streams.

defaults
    mode http
    timeout connect {int(settings.options.connect_timeout_s * 1000)}ms
    timeout client {settings.options.stream_timeout_s}s
    timeout server {settings.options.stream_timeout_s}s
    timeout http-request 30s
    timeout http-keep-alive 10s
    timeout queue 5s
    option http-no-delay
    # After a reload, old workers answer the next request on an idle keep-alive connection
    # (with "Connection: close") instead of closing it under a client that is sending.
    option idle-close-on-response
    option forwardfor
    retries 2
    option redispatch
    load-server-state-from-file global
    http-error status 502 content-type application/json string '{_error_json(
        "the pool answered badly or not at all", "server_error", "bad_gateway")}'
    http-error status 503 content-type application/json string '{_error_json(
        "no pool may serve this route now", "service_unavailable", "no_pool_available")}'
    http-error status 504 content-type application/json string '{_error_json(
        "the pool did not answer in time", "server_error", "gateway_timeout")}'
"""


def _proxies(desired: DesiredState, backends: tuple[Backend, ...], settings: HAProxySettings,
             weights: dict[str, dict[str, int]]) -> str:
    return (_frontend(desired, backends, settings) + _refuse_backend(desired)
            + "".join(_backend(b, settings, weights[b.name]) for b in backends))


def _frontend(desired: DesiredState, backends: tuple[Backend, ...],
              settings: HAProxySettings) -> str:
    res, lat, model = (desired.residency_header, desired.latency_class_header,
                       desired.model_header)
    repeated = _error_json("a routing header is given more than once",
                           "invalid_request_error", "bad_header")
    too_large = _error_json("request body too large to route", "invalid_request_error",
                            "too_large")
    lines = [
        "\nfrontend fleetctl",
        f"    bind {settings.options.bind or '127.0.0.1:0'}",
        "    option http-buffer-request",
        *_access_log(settings),
        f"    http-request return status 400 content-type application/json string '{repeated}'"
        f" if {{ req.fhdr_cnt({res}) gt 1 }} || {{ req.fhdr_cnt({lat}) gt 1 }}",
        # The body is read whole (up to tune.bufsize) to find the model; larger ones are refused.
        f"    http-request return status 413 content-type application/json string '{too_large}'"
        f" if {{ req.body_size gt {settings.options.max_body_bytes} }}",
        "    http-request set-var(txn.fleetctl_model) req.body,json_query('$.model')",
        # The model header always reflects the body, never what a client claims.
        f"    http-request del-header {model}",
        f"    http-request set-header {model} %[var(txn.fleetctl_model)]"
        f" if {{ var(txn.fleetctl_model) -m reg ^[A-Za-z0-9._:/@+-]+$ }}",
    ]
    for backend in backends:
        lines.append(f"    use_backend {backend.name} if {_route_acl(backend.route, res, lat)}")
    lines.append(f"    default_backend {REFUSE_BACKEND}")
    return "\n".join(lines) + "\n"


def _log_target(settings: HAProxySettings) -> str:
    if not settings.options.access_log:
        return ""
    # HAProxy writes no files: the log goes to stdout, which whatever starts HAProxy appends
    # to the access_log file (docs/gateways.md). raw: the JSON line alone, no syslog header.
    return "    log stdout format raw local0\n"


def _access_log(settings: HAProxySettings) -> list[str]:
    """The frontend's access log: one JSON object per request (accesslog.LOG_FORMAT), with
    the answer's Content-Type captured so a streamed answer can be told."""
    if not settings.options.access_log:
        return []
    return ["    log global", f"    log-format '{LOG_FORMAT}'",
            "    capture response header Content-Type len 64"]


def _route_acl(route: RouteSpec, res: str, lat: str) -> str:
    conds = [f"{{ var(txn.fleetctl_model) -m str {route.model} }}"]
    if route.residency:
        conds.append(f"{{ req.fhdr({res}) -m str {route.residency} }}")
    else:
        conds.append(f"{{ req.fhdr_cnt({res}) eq 0 }}")
    if route.latency_class:
        conds.append(f"{{ req.fhdr({lat}) -m str {route.latency_class} }}")
    return " ".join(conds)


def _refuse_backend(desired: DesiredState) -> str:
    res = desired.residency_header
    no_model = _error_json("the request body has no model", "invalid_request_error",
                           "missing_model")
    residency = ('{"error":{"message":"no route for model %[var(txn.fleetctl_model),json(utf8s)] '
                 f'in jurisdiction %[req.fhdr({res}),json(utf8s)]: residency fails closed",'
                 '"type":"invalid_request_error","param":null,"code":"residency_unavailable"}}')
    unknown = ('{"error":{"message":"no route for model %[var(txn.fleetctl_model),json(utf8s)]'
               '","type":"invalid_request_error","param":"model","code":"model_not_found"}}')
    return f"""
backend {REFUSE_BACKEND}
    http-request return status 400 content-type application/json string '{no_model}' if !{{ var(txn.fleetctl_model) -m found }}
    http-request return status 403 content-type application/json lf-string '{residency}' if {{ req.fhdr_cnt({res}) gt 0 }}
    http-request return status 404 content-type application/json lf-string '{unknown}'
"""  # noqa: E501 - one HAProxy directive per line


def _backend(backend: Backend, settings: HAProxySettings, weights: dict[str, int]) -> str:
    r = backend.route
    lines = [
        f"\nbackend {backend.name}",
        f"    # model {r.model}, latency class {r.latency_class or 'any'}, "
        f"residency {r.residency or 'none'}",
        "    balance roundrobin",
    ]
    check = ""
    if settings.options.health_checks:
        lines += ["    option httpchk GET /health", "    http-check expect status 200",
                  "    default-server inter 2s fall 3 rise 2"]
        check = " check"
    for s in backend.servers:
        tls = (f" ssl verify required ca-file @system-ca sni str({s.tls_host})"
               if s.tls_host else "")
        lines.append(f"    server {s.name} {s.address} weight {weights[s.name]}{check}{tls}")
    return "\n".join(lines) + "\n"
