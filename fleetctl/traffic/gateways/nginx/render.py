"""nginx configuration for one gateway, rendered from a DesiredState by pure functions, and
read back from the file (`parse_config`).

How a request finds its pool. nginx-light has no njs, so no code reads JSON. Two ways:
- `model_source: "body"` (default): the core `mirror` module with `mirror_request_body on`
  makes nginx read the whole body into memory *before* the content phase (the mirror target is
  an internal location answering 204 at once, so nothing leaves nginx), and a `map` over
  `$request_body` takes the first `"model": "<value>"` it finds. It is a regex over JSON, not a
  parser: a request that puts a nested `"model"` key before the top-level one is routed by the
  nested one (a model mix-up the pool then answers, never a residency crossing: residency comes
  from a header). Bodies larger than `max_body_bytes` are refused (413) rather than spilled to a
  temp file, where `$request_body` would be empty.
- `model_source: "header"`: route by `DesiredState.model_header` (e.g. `X-Fleetctl-Model`) set by
  the client or a proxy in front; no body is read.
Either way the model header sent to the pool is the one nginx routed by.

A `map` turns "model|residency|latency class" into an upstream name: exact keys for routes
with a latency class, regexes for routes that take any class, tried in that order; anything
else maps to a refusal (404 unknown model, 403 residency, 503 route with no pool, 400 bad
request) answered by a small server on a unix socket. One `upstream route-<key>` per route
with one `server` per pool endpoint, `weight=` in basis points (nginx has no upper limit that
matters here; 7,000,000 is accepted), scaled so that pools with several endpoints keep exact
shares. A pool at weight 0 is left out of the upstream. Resolution: exactly 0.01 %.

Residency fails closed: a request with a residency header matches only keys carrying that
exact value, so it reaches a route pinned to it or a refusal. Limits of nginx 1.22: it reads
only the first of repeated headers (it cannot refuse a request that names two jurisdictions; it
uses the first) and cannot tell an empty header from a missing one (an empty residency header
counts as none).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    SAFE_NAME,
    TOTAL_WEIGHT,
    AdapterError,
    DesiredState,
    GatewaySpec,
    PoolTarget,
    RouteSpec,
    address_host,
    base_url_problem,
    check_plain_names,
    openai_error,
    pool_base_url_problem,
    url_port,
)
from fleetctl.traffic.gateways.nginx.accesslog import LOG_FORMAT
from fleetctl.traffic.gateways.nginx.options import NginxOptions
from fleetctl.traffic.gateways.schema import collector_url_problem, parse_options
from fleetctl.traffic.gateways.targets import route_target

CONF_NAME = "nginx.conf"
REFUSE_UPSTREAM = "fleetctl-refusal"
COLLECTOR_UPSTREAM = "fleetctl-shadow-collector"  # "route-" prefixes every route's upstream
MIRROR_LOCATION = "/__fleetctl_shadow"
# A copy the collector has not taken within these gives up (the collector answers at once;
# the live request never waits for its copy either way).
MIRROR_CONNECT_TIMEOUT_MS = 500
MIRROR_TIMEOUT_S = 10
REFUSAL_SOCKET = "refusal.sock"
# Unix socket paths must fit sockaddr_un (108 bytes with the NUL).
MAX_SOCKET_PATH = 107
MAX_PREFIX = MAX_SOCKET_PATH - len(REFUSAL_SOCKET) - 1


@dataclass(frozen=True)
class NginxSettings:
    """What rendering and the adapter work from: the gateway's name, its prefix directory
    (`admin_address`) and its options."""

    gateway: str
    prefix: Path
    options: NginxOptions

    @classmethod
    def from_gateway(cls, gateway: GatewaySpec) -> NginxSettings:
        return cls(gateway=gateway.name, prefix=Path(gateway.admin_address),
                   options=parse_options(NginxOptions, gateway.options, "nginx"))

    @property
    def user(self) -> str:
        """The `user` directive's value ("" = none): nobody when started as root."""
        if self.options.user is not None:
            return self.options.user
        return "nobody nogroup" if os.geteuid() == 0 else ""

    @property
    def conf(self) -> Path:
        return self.prefix / CONF_NAME

    @property
    def pid_file(self) -> Path:
        return self.prefix / "nginx.pid"

    @property
    def refusal_socket(self) -> Path:
        return self.prefix / REFUSAL_SOCKET

    @property
    def status_url(self) -> str:
        host, _, port = self.options.listen.rpartition(":")
        host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
        return f"http://{host}:{port}/__fleetctl_version"


# --- rendering ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Upstream:
    route: RouteSpec
    servers: tuple[tuple[str, str, int], ...]  # (address, pool, weight)

    @property
    def name(self) -> str:
        return f"route-{self.route.key}"


@dataclass(frozen=True)
class Rendered:
    text: str
    version: str


def render_config(desired: DesiredState, settings: NginxSettings) -> Rendered:
    check_plain_names(desired, where="the nginx map")
    upstreams = tuple(_upstream(r, desired) for r in desired.routes)
    body = _http_block(desired, upstreams, settings)
    head = _pool_comments(desired) + _main_block(settings)
    version = hashlib.sha256((head + body).encode()).hexdigest()[:16]
    text = (f"# fleetctl-version: {version}\n"
            f"# Rendered by fleetctl for gateway {settings.gateway}; the next push overwrites it."
            f"\n" + "".join(f"# fleetctl-route {r.key}\n" for r in desired.routes)
            + "".join(f"# fleetctl-mirror {key} {bp}\n" for key, bp in _mirrored(desired))
            + head + body.replace("@VERSION@", version))
    return Rendered(text=text, version=version)


def _pool_comments(desired: DesiredState) -> str:
    """Every declared pool's endpoints, so in_flight() can find connections to a pool that is
    no longer in any upstream (drained) but may still have streams open. (A pool nginx cannot
    reach, https or a path prefix, is left out before rendering: Adapter.apply.)"""
    lines = []
    for name, pool in sorted(desired.pools.items()):
        try:
            addresses = [_address(name, url) for url in pool.base_urls]
        except AdapterError:
            continue
        lines.append(f"# fleetctl-pool {name} {' '.join(addresses)}\n")
    return "".join(lines)


def _upstream(route: RouteSpec, desired: DesiredState) -> Upstream:
    endpoints = {}
    for pool, weight in sorted(route.weights.items()):
        target = route_target(route, pool, weight, desired)
        if weight > 0:
            endpoints[pool] = [_address(pool, url) for url in target.base_urls]
    # Scale so every endpoint gets an integer share and the pools' totals stay exact.
    scale = math.lcm(*(len(e) for e in endpoints.values())) if endpoints else 1
    servers = tuple((address, pool, route.weights[pool] * scale // len(addresses))
                    for pool, addresses in endpoints.items() for address in addresses)
    return Upstream(route=route, servers=servers)


def pool_problem(pool: PoolTarget) -> str | None:
    """Why nginx cannot route to `pool` (see Adapter.check_pool): one `proxy_pass` serves
    every pool of a route, so one scheme (http) and no per-pool path."""
    if not SAFE_NAME.match(pool.name):
        return f"cannot list pool {pool.name!r} in its config: use [a-z0-9-]"
    return pool_base_url_problem(pool, schemes=("http",))


def _address(pool: str, url: str) -> str:
    problem = base_url_problem(url, schemes=("http",))
    if problem:
        raise AdapterError(f"pool {pool}: nginx {problem}", permanent=True)
    parts = urlsplit(url)
    assert parts.hostname is not None  # base_url_problem checked it
    return f"{address_host(parts.hostname)}:{url_port(url, 80)}"


def _mirrored(desired: DesiredState) -> list[tuple[str, int]]:
    """(route key, basis points) of the routes that mirror, when a collector is set."""
    if not desired.mirror_url:
        return []
    return [(r.key, r.mirror_bp) for r in desired.routes if r.mirror_bp > 0 and r.weights]


def _mirror_blocks(desired: DesiredState) -> str:
    """Which requests are copied: per mirroring route a split_clients over $request_id (a
    fresh random id per request) that yields the route's key for its share (2 decimals of a
    percent: exactly its basis points), and a map from the route the request took to that
    draw. $fleetctl_shadow is the key of a request to copy, "" for every other, and
    $fleetctl_shadow_auth the mirror header this gateway's copies of that route carry."""
    mirrored = _mirrored(desired)
    if not mirrored:
        return ""
    problem = collector_url_problem(desired.mirror_url)
    if problem:
        raise AdapterError(f"shadow collector {problem}", permanent=True)
    parts = urlsplit(desired.mirror_url)
    assert parts.hostname is not None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    lines = [f"    upstream {COLLECTOR_UPSTREAM} {{ server {host}:{parts.port}; }}"]
    choices = []
    for key, bp in mirrored:
        if bp >= TOTAL_WEIGHT:
            choices.append(f'        "route-{key}" "{key}";')
            continue
        variable = f"$fleetctl_shadow_{key.replace('-', '_')}"
        lines.append(f'    split_clients "${{request_id}}" {variable} {{\n'
                     f'        {bp // 100}.{bp % 100:02d}% "{key}";\n        * "";\n    }}')
        choices.append(f'        "route-{key}" {variable};')
    lines.append('    map $fleetctl_route $fleetctl_shadow {\n        default "";\n'
                 + "\n".join(choices) + "\n    }")
    auth = {r.key: r.mirror_auth for r in desired.routes}
    lines.append('    map $fleetctl_shadow $fleetctl_shadow_auth {\n        default "";\n'
                 + "".join(f'        "{key}" "{auth[key]}";\n' for key, _ in mirrored
                           if auth.get(key)) + "    }")
    return "\n".join(lines) + "\n"


def _mirror_location(desired: DesiredState) -> str:
    """The copy: a background subrequest (nginx `mirror`) with the request's method, headers
    and body, sent to the collector under the request's own URI with the route header and
    the mirror auth header, or answered 204 inside nginx when this request is not drawn.
    nginx never holds the live answer for it. A header named by proxy_set_header replaces
    the client's of that name (an empty value sends none), so a client cannot choose
    either; the live location sets neither."""
    if not _mirrored(desired):
        return ""
    return f"""        location = {MIRROR_LOCATION} {{
            internal;
            if ($fleetctl_shadow = "") {{ return 204; }}
            proxy_pass http://{COLLECTOR_UPSTREAM}$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header {MIRROR_HEADER} $fleetctl_shadow;
            proxy_set_header {MIRROR_AUTH_HEADER} $fleetctl_shadow_auth;
            proxy_connect_timeout {MIRROR_CONNECT_TIMEOUT_MS}ms;
            proxy_read_timeout {MIRROR_TIMEOUT_S}s;
            proxy_send_timeout {MIRROR_TIMEOUT_S}s;
            proxy_next_upstream off;
        }}
"""


def _main_block(settings: NginxSettings) -> str:
    user = f"user {settings.user};\n" if settings.user else ""
    return f"""{user}worker_processes {settings.options.worker_processes};
pid {settings.pid_file};
error_log {settings.prefix / "error.log"} warn;
events {{ worker_connections 4096; }}
"""


def _var(header: str) -> str:
    return "$http_" + header.replace("-", "_")


def _error(status: int, message: str, kind: str, code: str) -> str:
    body = json.dumps(openai_error(message, kind, code))
    return f"return {status} '{body}\\n';"


def _http_block(desired: DesiredState, upstreams: tuple[Upstream, ...],
                settings: NginxSettings) -> str:
    p = settings.prefix
    temp = "".join(f"    {kind}_temp_path {p / 'tmp' / kind};\n"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""http {{
{_access_log(settings)}    server_tokens off;
    # Off by default: on reload nginx closes idle keep-alive connections, and a client that
    # sends on one at that instant gets a connection error (1.22 has no way around it).
    keepalive_timeout {settings.options.client_keepalive_s}s;
    default_type application/json;
{temp}    # The whole body in one memory buffer, or $request_body is empty; larger bodies get 413.
    client_body_buffer_size {settings.options.max_body_bytes};
    client_max_body_size {settings.options.max_body_bytes};
    client_body_in_single_buffer on;

{_model_map(desired, settings)}
{_route_map(desired, upstreams)}
    map $fleetctl_route $fleetctl_upstream {{
        "~^!" {REFUSE_UPSTREAM};
        default $fleetctl_route;
    }}

    upstream {REFUSE_UPSTREAM} {{ server unix:{settings.refusal_socket}; }}
{"".join(_upstream_block(u) for u in upstreams if u.servers)}{_mirror_blocks(desired)}
{_refusal_server(settings)}
{_main_server(desired, settings)}}}
"""


def _access_log(settings: NginxSettings) -> str:
    """One JSON object per request (accesslog.LOG_FORMAT) to the access_log file, flushed
    at least every 250 ms (as Envoy's is), or no access log."""
    if not settings.options.access_log:
        return "    access_log off;\n"
    return (f"    log_format fleetctl escape=json '{LOG_FORMAT}';\n"
            f"    access_log {settings.options.access_log} fleetctl buffer=64k flush=250ms;\n")


def _model_map(desired: DesiredState, settings: NginxSettings) -> str:
    if settings.options.model_source == "header":
        return (f"    map {_var(desired.model_header)} $fleetctl_model {{\n"
                f"        default {_var(desired.model_header)};\n    }}")
    # nginx unescapes \\ and \" inside quotes; PCRE then sees "model"\s*:\s*"([^"\\]*)"
    return r'''    map $request_body $fleetctl_model {
        "~\"model\"\s*:\s*\"(?<fleetctl_m>[^\"\\\\]*)\"" $fleetctl_m;
        default "";
    }'''


def _route_map(desired: DesiredState, upstreams: tuple[Upstream, ...]) -> str:
    key = (f'"$fleetctl_model|{_var(desired.residency_header)}|'
           f'{_var(desired.latency_class_header)}"')
    exact, regex = [], []
    for u in sorted(upstreams, key=lambda u: u.route.key):
        target = u.name if u.servers else "!empty"
        r = u.route
        if r.latency_class:
            exact.append(f'        "{r.model}|{r.residency}|{r.latency_class}" "{target}";')
        else:
            pattern = f"^{re.escape(r.model)}\\|{re.escape(r.residency)}\\|[^|]*$"
            regex.append(f'        "~{pattern}" "{target}";')
    lines = [
        f"    map {key} $fleetctl_route {{",
        '        default "!unknown";',
        # Exact keys win over regexes; regexes are tried in this order.
        *exact,
        '        "~\\|.*\\|.*\\|" "!bad";',  # a value containing "|" could forge a key
        '        "~^\\|" "!nomodel";',
        *regex,
        '        "~^[^|]*\\|[^|]+\\|" "!residency";',
        "    }",
    ]
    return "\n".join(lines)


def _upstream_block(u: Upstream) -> str:
    servers = "".join(f"        server {address} weight={weight};  # pool={pool}\n"
                      for address, pool, weight in u.servers)
    return f"    upstream {u.name} {{\n{servers}    }}\n"


def _refusal_server(settings: NginxSettings) -> str:
    residency = _error(403, "no route serves this model in the jurisdiction the request names: "
                       "residency fails closed", "invalid_request_error", "residency_unavailable")
    empty = _error(503, "no pool may serve this route now", "service_unavailable",
                   "no_pool_available")
    bad = _error(400, "a routing header is repeated or holds |", "invalid_request_error",
                 "bad_header")
    no_model = _error(400, "the request has no model", "invalid_request_error", "missing_model")
    unknown = _error(404, "no route for this model", "invalid_request_error", "model_not_found")
    # Reached through proxy_pass, so refusals are decided after the body was read.
    return f"""    # Refusals.
    server {{
        listen unix:{settings.refusal_socket};
        # The request was logged where it arrived; this is nginx talking to itself.
        access_log off;
        location / {{
            if ($http_x_fleetctl_route = "!residency") {{ {residency} }}
            if ($http_x_fleetctl_route = "!empty") {{ {empty} }}
            if ($http_x_fleetctl_route = "!bad") {{ {bad} }}
            if ($http_x_fleetctl_route = "!nomodel") {{ {no_model} }}
            {unknown}
        }}
    }}
"""


def _main_server(desired: DesiredState, settings: NginxSettings) -> str:
    mirrors = ["/__fleetctl_body"] if settings.options.model_source == "body" else []
    if _mirrored(desired):
        mirrors.append(MIRROR_LOCATION)
    mirror = "".join(f"            mirror {uri};\n" for uri in mirrors)
    if mirrors:
        mirror += "            mirror_request_body on;\n"
    too_large = _error(413, "request body too large to route", "invalid_request_error",
                       "too_large")
    bad_gateway = _error(502, "the pool answered badly or not at all", "server_error",
                         "bad_gateway")
    timeout = _error(504, "the pool did not answer in time", "server_error", "gateway_timeout")
    return f"""    server {{
        listen {settings.options.listen};
        location = /__fleetctl_version {{
            access_log off;
            default_type text/plain;
            return 200 "@VERSION@\\n";
        }}
        # The mirror target: reading the body for it is the point; nothing is sent anywhere.
        location = /__fleetctl_body {{ internal; return 204; }}
{_mirror_location(desired)}        location @fleetctl_too_large {{ {too_large} }}
        location @fleetctl_bad_gateway {{ {bad_gateway} }}
        location @fleetctl_timeout {{ {timeout} }}
        location / {{
{mirror}            proxy_pass http://$fleetctl_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Fleetctl-Route $fleetctl_route;
            proxy_set_header {desired.model_header} $fleetctl_model;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            # Streams (SSE) pass through as they are written, for as long as they last.
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_connect_timeout {int(settings.options.connect_timeout_s * 1000)}ms;
            proxy_read_timeout {settings.options.stream_timeout_s}s;
            proxy_send_timeout {settings.options.stream_timeout_s}s;
            # A failed connect may try another server of the same upstream (same route, same
            # jurisdiction); a request already sent is never repeated (POST is not idempotent).
            proxy_next_upstream error timeout;
            # error_page at this level replaces the server's, so all three are here.
            error_page 413 = @fleetctl_too_large;
            error_page 502 = @fleetctl_bad_gateway;
            error_page 504 = @fleetctl_timeout;
        }}
    }}
"""


# --- reading the live config ----------------------------------------------------------------------

@dataclass(frozen=True)
class LiveConfig:
    version: str
    routes: dict[str, dict[str, int]]  # route key -> pool -> basis points
    addresses: dict[str, set[str]]  # pool -> host:port
    mirror: dict[str, int]  # route key -> mirror basis points > 0


def parse_config(text: str) -> LiveConfig:
    version_match = re.search(r"^# fleetctl-version: (\S+)$", text, re.M)
    routes: dict[str, dict[str, int]] = {
        key: {} for key in re.findall(r"^# fleetctl-route (\S+)$", text, re.M)}
    addresses: dict[str, set[str]] = {}
    for pool, endpoints in re.findall(r"^# fleetctl-pool (\S+) (.*)$", text, re.M):
        addresses[pool] = set(endpoints.split())
    for key, block in re.findall(r"^\s*upstream route-(\S+) \{(.*?)\}", text, re.M | re.S):
        per_pool: dict[str, int] = {}
        for _, weight, pool in re.findall(
                r"server (\S+) weight=(\d+);\s*# pool=(\S+)", block):
            per_pool[pool] = per_pool.get(pool, 0) + int(weight)
        total = sum(per_pool.values())
        routes[key] = {pool: w * TOTAL_WEIGHT // total for pool, w in per_pool.items() if w}
    mirror = {key: int(bp) for key, bp in
              re.findall(r"^# fleetctl-mirror (\S+) (\d+)$", text, re.M) if int(bp) > 0}
    return LiveConfig(version=version_match.group(1) if version_match else "",
                      routes=routes, addresses=addresses, mirror=mirror)
