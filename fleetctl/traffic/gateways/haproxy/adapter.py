"""HAProxy adapter (Debian `haproxy` 2.6): weights through the runtime API, structure by reload.

How a request finds its pool: the frontend buffers the request body (`option
http-buffer-request`) and reads the model with `req.body,json_query('$.model')` (HAProxy ≥ 2.4);
ACLs on that model, the residency header and the latency-class header pick one backend per
route (`route-<key>`), and every backend holds one server per endpoint of every pool that may
carry the route (`<pool>.<n>`), so a split change is a weight change, never a reload.

What is applied how:
- Weights: `set weight` / `set server … state drain|ready` on the stats socket
  (`GatewaySpec.admin_address`: a unix socket path or `127.0.0.1:port`). Increases go first,
  decreases and drains last, so no intermediate state leaves a route with nothing to serve it.
  After every change the live state is written to the server-state file, and HAProxy loads it
  on start or reload (`load-server-state-from-file global`): runtime weights survive both.
- Structure (routes, pools, endpoints, matching, settings): the whole config is rendered,
  checked with `haproxy -c`, swapped in atomically and reloaded through the master CLI
  (`-W -S <master socket>`, command `reload`). The apply returns once the worker showing the
  new structure hash (`setenv FLEETCTL_STRUCTURE`, read with `show env`) serves and every
  previous worker is in soft-stop (no longer accepting). Old workers finish their in-flight
  streams and then exit; `expose-fd listeners` and `option idle-close-on-response` keep a
  reload from resetting queued connections or idle keep-alive ones under a sending client.

Weight resolution: HAProxy weights are 0..256 per server. A pool's basis points become
`round(bp × 256 / 10,000 / endpoints)` per server, never less than 1 for a non-zero share (a
pool with any weight keeps some traffic; 1 bp becomes 1/257 ≈ 0.39 %). `read_back()` reports
each pool's real share of its backend in basis points, and `matches()` compares at that
resolution: it quantises the desired weights exactly as `apply()` does.

Residency fails closed: a request carrying the residency header only matches routes pinned
to that exact value (a route without a pin requires the header to be absent); anything else
falls to the `fleetctl.refuse` backend, which answers 403 (or 404 for an unknown model), and
a route whose weights are empty or all zero answers 503 from its own backend, which holds
only pools of its jurisdiction. A header given twice is refused (400).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleetctl.traffic.gateways.base import (
    SAFE_NAME,
    TOTAL_WEIGHT,
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    PoolCounters,
    PoolTarget,
    RouteSpec,
    base_url_problem,
    check_plain_names,
    register,
    url_port,
)

MAX_WEIGHT = 256
MASTER_PATIENCE_S = 1.0
STRUCTURE_ENV = "FLEETCTL_STRUCTURE"
REFUSE_BACKEND = "fleetctl.refuse"
# srv_admin_state bits (HAProxy's SRV_ADMF_*): any maintenance or drain flag means the server
# takes no new requests, whatever its weight says.
_NO_NEW_REQUESTS = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40
_FORCED_DRAIN = 0x08
_STATS_SOCKET_OPTIONS = "mode 600 level admin expose-fd listeners"
_DRAIN_FLAGS = 0x08 | 0x10
# Models, jurisdictions and latency classes are written into ACLs unquoted.


# --- settings -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HAProxySettings:
    """GatewaySpec.options, with defaults. Paths are on the HAProxy host, which must be this one:
    the adapter writes the config file and runs `haproxy -c`."""

    gateway: str
    runtime_address: str
    bind: str
    config_path: Path | None
    master_socket: str
    state_file: Path | None
    haproxy_bin: str
    health_checks: bool
    max_body_bytes: int
    connect_timeout_s: float
    stream_timeout_s: int
    runtime_timeout_s: float
    reload_timeout_s: float

    @classmethod
    def from_gateway(cls, gateway: GatewaySpec) -> HAProxySettings:
        opts = gateway.options
        config = opts.get("config_path")
        state = opts.get("state_file") or (str(Path(config).parent / "server-state")
                                           if config else None)
        return cls(
            gateway=gateway.name,
            runtime_address=gateway.admin_address,
            bind=str(opts.get("bind", "")),
            config_path=Path(config) if config else None,
            master_socket=str(opts.get("master_socket", "")),
            state_file=Path(state) if state else None,
            haproxy_bin=str(opts.get("haproxy_bin", "/usr/sbin/haproxy")),
            health_checks=bool(opts.get("health_checks", True)),
            max_body_bytes=int(opts.get("max_body_bytes", 256 * 1024)),
            connect_timeout_s=float(opts.get("connect_timeout_s", 2.0)),
            stream_timeout_s=int(opts.get("stream_timeout_s", 3600)),
            runtime_timeout_s=float(opts.get("runtime_timeout_s", 2.0)),
            reload_timeout_s=float(opts.get("reload_timeout_s", 10.0)),
        )

    def require_files(self) -> tuple[Path, Path]:
        if not self.bind or self.config_path is None or self.state_file is None:
            raise AdapterError(f"gateway {self.gateway}: options need bind and config_path",
                               permanent=True)
        return self.config_path, self.state_file


# --- the runtime API ------------------------------------------------------------------------------

def runtime_command(address: str, command: str, *, timeout_s: float = 2.0,
                    patience_s: float = 0.0) -> str:
    """One command line (`;` separates several) on a stats or master socket; returns the whole
    answer. `patience_s`: keep retrying a refused connection that long (the master CLI is
    briefly away while the master re-executes itself on reload)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return _exchange(address, command, timeout_s)
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            if time.monotonic() >= deadline:
                raise AdapterError(f"HAProxy at {address} is unreachable: {exc}") from exc
            time.sleep(0.01)


def _exchange(address: str, command: str, timeout_s: float) -> str:
    # The write side is shut so HAProxy answers and closes (the master CLI waits for it).
    deadline = time.monotonic() + timeout_s
    try:
        with _connect(address, timeout_s) as sock:
            sock.sendall(command.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                sock.settimeout(max(0.01, deadline - time.monotonic()))
    except (ConnectionRefusedError, FileNotFoundError):
        raise
    except TimeoutError as exc:
        raise AdapterError(f"HAProxy at {address} did not answer {command.split()[0]!r} "
                           f"within {timeout_s:g} s") from exc
    except OSError as exc:
        raise AdapterError(f"HAProxy at {address} is unreachable: {exc}") from exc
    return b"".join(chunks).decode(errors="replace")


def _connect(address: str, timeout_s: float) -> socket.socket:
    if address.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(address)
        return sock
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)


def _stats_socket_bind(address: str) -> str:
    return address if address.startswith("/") else f"ipv4@{address}"


@dataclass(frozen=True)
class LiveServer:
    backend: str
    server: str
    admin_state: int
    weight: int

    @property
    def effective(self) -> int:
        return 0 if self.admin_state & _NO_NEW_REQUESTS else self.weight


def parse_servers_state(text: str) -> list[LiveServer]:
    """`show servers state`: a version line, a `#` header, one line per server."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 9 or line.startswith("#"):
            continue
        rows.append(LiveServer(backend=fields[1], server=fields[3],
                               admin_state=int(fields[6]), weight=int(fields[7])))
    return rows


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
        target = desired.pools.get(pool)
        if target is None:
            raise AdapterError(f"route {route.key}: pool {pool} is not declared", permanent=True)
        if weight and route.residency and target.jurisdiction != route.residency:
            raise AdapterError(f"route {route.key} is pinned to {route.residency}; pool {pool} "
                               f"is in {target.jurisdiction}", permanent=True)
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
    for url in pool.base_urls:
        problem = base_url_problem(url)
        if problem:
            return problem
    return None


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
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        servers.append(Server(name=f"{pool}.{n}", pool=pool, address=f"{host}:{port}",
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
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}, separators=(",", ":"))


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
    state = settings.state_file or Path("/dev/null")
    # Requests are buffered whole to read the model: room for the body plus headers.
    bufsize = settings.max_body_bytes + 32768
    return f"""global
    setenv {STRUCTURE_ENV} {structure or "-"}
    # expose-fd: a reload hands the listening sockets over, so no queued connection is reset.
    stats socket {_stats_socket_bind(settings.runtime_address)} {_STATS_SOCKET_OPTIONS}
    stats timeout 30s
    server-state-file {state}
    tune.bufsize {bufsize}
    # No hard-stop-after: after a reload, old workers finish their in-flight streams.

defaults
    mode http
    timeout connect {int(settings.connect_timeout_s * 1000)}ms
    timeout client {settings.stream_timeout_s}s
    timeout server {settings.stream_timeout_s}s
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
        f"    bind {settings.bind or '127.0.0.1:0'}",
        "    option http-buffer-request",
        f"    http-request return status 400 content-type application/json string '{repeated}'"
        f" if {{ req.fhdr_cnt({res}) gt 1 }} || {{ req.fhdr_cnt({lat}) gt 1 }}",
        # The body is read whole (up to tune.bufsize) to find the model; larger ones are refused.
        f"    http-request return status 413 content-type application/json string '{too_large}'"
        f" if {{ req.body_size gt {settings.max_body_bytes} }}",
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
    if settings.health_checks:
        lines += ["    option httpchk GET /health", "    http-check expect status 200",
                  "    default-server inter 2s fall 3 rise 2"]
        check = " check"
    for s in backend.servers:
        tls = (f" ssl verify required ca-file @system-ca sni str({s.tls_host})"
               if s.tls_host else "")
        lines.append(f"    server {s.name} {s.address} weight {weights[s.name]}{check}{tls}")
    return "\n".join(lines) + "\n"


# --- the adapter ----------------------------------------------------------------------------------

@register
class HAProxyAdapter(Adapter):
    kind = "haproxy"
    label = "HAProxy"
    weight_resolution = ("1/256 per backend (≈0.39 %); each non-zero weight keeps at least 1, "
                         "so it never rounds to 0")

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.settings = HAProxySettings.from_gateway(gateway)
        self._live_structure: str | None = None

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        return pool_problem(pool)

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        rendered = render_config(desired, self.settings)
        reload_ms = None
        if self._running_structure() != rendered.structure:
            reload_ms = self._reload(rendered)
        changed = self._set_weights(rendered)
        total_ms = (time.monotonic() - started) * 1000
        if reload_ms is not None:
            return ApplyResult(applied=True, method="reload", detail=(
                f"structure changed: config checked and reloaded, new worker serving after "
                f"{reload_ms:.0f} ms; {changed} runtime change(s); {total_ms:.0f} ms in all"))
        return ApplyResult(applied=True, method="runtime", detail=(
            f"{changed} runtime weight/state change(s) in {total_ms:.0f} ms, no reload"))

    def read_back(self) -> dict[str, dict[str, int]]:
        return {backend[len("route-"):]: shares(weights)
                for backend, weights in self._live_weights().items()}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Equal at HAProxy's resolution (desired is quantised exactly as apply() quantises
        it), and the worker read back runs the desired structure."""
        try:
            rendered = render_config(self.renderable(desired).desired, self.settings)
        except AdapterError:
            return False
        if self._live_structure is not None and self._live_structure != rendered.structure:
            return False
        return held == rendered.expected_shares()

    def in_flight(self, pool: str) -> int:
        """Current sessions (`scur`) on the pool's servers, summed over every backend and over
        old workers still finishing streams after a reload (reached through the master CLI)."""
        return sum(_sessions(stat, pool) for stat in self._stats_of_every_worker())

    def pool_counters(self) -> dict[str, PoolCounters]:
        """Per pool, over every route backend: sessions (`stot`) and errors (`hrsp_5xx` +
        `econ` + `eresp`) of the current worker — they restart from 0 at each reload, like a
        restart — and in-flight sessions of every worker."""
        stats = self._stats_of_every_worker()
        return _pool_counters(stats[0], stats)

    # --- helpers ---

    def _runtime(self, command: str) -> str:
        return runtime_command(self.settings.runtime_address, command,
                               timeout_s=self.settings.runtime_timeout_s)

    def _master(self, command: str) -> str:
        return runtime_command(self.settings.master_socket, command,
                               timeout_s=self.settings.runtime_timeout_s,
                               patience_s=MASTER_PATIENCE_S)

    def _running_structure(self) -> str:
        return _structure_of(self._runtime(f"show env {STRUCTURE_ENV}"))

    def _ask_worker(self, command: str) -> tuple[str, str]:
        """(structure of the worker that answered, its answer to `command`). One connection,
        so both come from the same worker even if another one is still winding down."""
        answer = self._runtime(f"show env {STRUCTURE_ENV}; {command}")
        head, _, rest = answer.partition("\n\n")
        return _structure_of(head), rest

    def _ask_current(self, structure: str, command: str) -> str:
        answered_by, answer = self._ask_worker(command)
        if answered_by != structure:
            raise AdapterError(f"a worker with config {answered_by or '?'} answered, not the "
                               f"one with {structure}: a reload is under way")
        return answer

    def _live_weights(self) -> dict[str, dict[str, int]]:
        self._live_structure, state = self._ask_worker("show servers state")
        live: dict[str, dict[str, int]] = {}
        for row in parse_servers_state(state):
            if row.backend.startswith("route-"):
                live.setdefault(row.backend, {})[row.server] = row.effective
        return live

    def _set_weights(self, rendered: Rendered) -> int:
        state = self._ask_current(rendered.structure, "show servers state")
        rows = {(r.backend, r.server): r for r in parse_servers_state(state)}
        raise_first, lower_last = [], []
        for backend, servers in rendered.targets.items():
            for server, weight in servers.items():
                row = rows.get((backend, server))
                if row is None:
                    raise AdapterError(f"HAProxy has no server {backend}/{server}")
                up, down = _commands(f"{backend}/{server}", row, weight)
                raise_first += up
                lower_last += down
        commands = raise_first + lower_last
        if commands:
            answer = self._ask_current(rendered.structure, "; ".join(commands))
            if answer.strip():
                raise AdapterError(f"HAProxy refused a runtime change: {answer.strip()[:300]}")
            self._save_state(rendered.structure)
        return len(commands)

    def _save_state(self, structure: str) -> None:
        """Keep the state file current, so a reload or restart by anyone restores it."""
        _, state_file = self.settings.require_files()
        _write_atomic(state_file, self._ask_current(structure, "show servers state"))

    def _reload(self, rendered: Rendered) -> float:
        config_path, state_file = self.settings.require_files()
        if not self.settings.master_socket:
            raise AdapterError("a structural change needs a reload: set options.master_socket",
                               permanent=True)
        self._check(rendered.text, config_path)
        started = time.monotonic()
        previous = config_path.read_text() if config_path.exists() else None
        # The new worker starts from this file: live state with fleetctl's weights written over
        # it, so a surviving server never starts with a stale runtime weight.
        live_state = self._runtime("show servers state")
        _write_atomic(state_file, with_weights(live_state, rendered.targets))
        _write_atomic(config_path, rendered.text)
        try:
            self._master_reload(rendered.structure)
        except AdapterError:
            # Put back what the running worker was started from and holds now.
            if previous is not None:
                _write_atomic(config_path, previous)
            _write_atomic(state_file, live_state)
            raise
        return (time.monotonic() - started) * 1000

    def _check(self, config: str, config_path: Path) -> None:
        candidate = config_path.with_name(config_path.name + ".fleetctl-check")
        candidate.write_text(config)
        try:
            done = subprocess.run([self.settings.haproxy_bin, "-c", "-f", str(candidate)],
                                  capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdapterError(f"could not run {self.settings.haproxy_bin} -c: {exc}") from exc
        finally:
            candidate.unlink(missing_ok=True)
        if done.returncode != 0:
            output = (done.stderr + done.stdout).splitlines()
            alerts = [line for line in output if "[ALERT]" in line] or output
            raise AdapterError("haproxy -c rejected the rendered config: "
                               + " | ".join(alerts)[:800], permanent=True)

    def _master_reload(self, structure: str) -> None:
        """Reload and return once the new worker serves `structure` and every previous worker
        is in soft-stop (it stopped accepting; it still finishes what it has in flight)."""
        show_proc = self._master("show proc")
        failed_before = _failed_reloads(show_proc)
        previous, _ = _workers(show_proc)
        self._master("reload")
        deadline = time.monotonic() + self.settings.reload_timeout_s
        while time.monotonic() < deadline:
            # While the master re-executes, either socket may briefly refuse: keep polling.
            show_proc = _quietly(lambda: self._master("show proc")) or ""
            if _failed_reloads(show_proc) > failed_before:
                raise AdapterError("HAProxy failed to load the new config on reload; the "
                                   "previous one keeps serving")
            current, _ = _workers(show_proc)
            if current and not set(current) & set(previous) \
                    and _quietly(self._running_structure) == structure \
                    and all(self._stopping(pid) for pid in previous):
                return
            time.sleep(0.005)
        raise AdapterError(f"no worker runs the new config alone after "
                           f"{self.settings.reload_timeout_s:g} s; the previous one keeps serving")

    def _stopping(self, pid: int) -> bool:
        answer = _quietly(lambda: self._master(f"@!{pid} show info")) or ""
        return "Stopping: 1" in answer or "Pid:" not in answer  # in soft-stop, or gone

    def _stats_of_every_worker(self) -> list[str]:
        """`show stat` of the current worker first, then of each old one."""
        pids = _worker_pids(self._master("show proc")) if self.settings.master_socket else []
        if not pids:
            return [self._runtime("show stat")]
        return [self._master(f"@!{pid} show stat") for pid in pids]


def _commands(target: str, row: LiveServer, weight: int) -> tuple[list[str], list[str]]:
    """(commands that add capacity, commands that remove it) bringing one server to `weight`.
    Weight 0 is a drain: the server keeps its in-flight requests and gets no new ones."""
    live = row.effective
    if weight == 0:
        return [], ([] if live == 0 else [f"set server {target} state drain"])
    commands = [] if row.weight == weight else [f"set weight {target} {weight}"]
    if row.admin_state & _NO_NEW_REQUESTS:
        commands.append(f"set server {target} state ready")
    return (commands, []) if weight >= live else ([], commands)


def with_weights(state: str, targets: dict[str, dict[str, int]]) -> str:
    """A `show servers state` dump with the weights and drain flags of `targets` written in."""
    lines = []
    for line in state.splitlines():
        fields = line.split()
        if len(fields) >= 9 and not line.startswith("#") \
                and fields[3] in targets.get(fields[1], {}):
            weight = targets[fields[1]][fields[3]]
            admin = int(fields[6]) & ~_DRAIN_FLAGS
            fields[6] = str(admin | (_FORCED_DRAIN if weight == 0 else 0))
            fields[7] = str(weight)
            line = " ".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _structure_of(show_env: str) -> str:
    answer = show_env.strip()
    return answer.partition("=")[2] if answer.startswith(f"{STRUCTURE_ENV}=") else ""


def _quietly(call: Callable[[], str]) -> str | None:
    try:
        return call()
    except AdapterError:
        return None


def _failed_reloads(show_proc: str) -> int:
    match = re.search(r"\[failed: (\d+)\]", show_proc)
    return int(match.group(1)) if match else 0


def _worker_pids(show_proc: str) -> list[int]:
    current, old = _workers(show_proc)
    return current + old


def _workers(show_proc: str) -> tuple[list[int], list[int]]:
    """`show proc` on the master CLI -> (current workers, old workers finishing requests)."""
    sections: dict[str, list[int]] = {"# workers": [], "# old workers": []}
    section = ""
    for line in show_proc.splitlines():
        if line.startswith("#"):
            section = line.strip()
            continue
        fields = line.split()
        if section in sections and len(fields) >= 2 and fields[0].isdigit():
            sections[section].append(int(fields[0]))
    return sections["# workers"], sections["# old workers"]


def _server_rows(show_stat: str) -> list[dict[str, str]]:
    """`show stat` CSV -> one dict per server of a route backend."""
    header: list[str] = []
    rows = []
    for line in show_stat.splitlines():
        if line.startswith("# "):
            header = line[2:].split(",")
            continue
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname", "").startswith("route-") and row.get("svname") not in (
                None, "FRONTEND", "BACKEND"):
            rows.append(row)
    return rows


def _count(row: dict[str, str], *names: str) -> int:
    return sum(int(row.get(name) or 0) for name in names)


def _sessions(show_stat: str, pool: str) -> int:
    return sum(_count(row, "scur") for row in _server_rows(show_stat)
               if pool_of(row["svname"]) == pool)


def _pool_counters(current: str, every_worker: list[str]) -> dict[str, PoolCounters]:
    totals: dict[str, list[int]] = {}
    for row in _server_rows(current):
        counts = totals.setdefault(pool_of(row["svname"]), [0, 0, 0])
        counts[0] += _count(row, "stot")
        counts[1] += _count(row, "hrsp_5xx", "econ", "eresp")
    for stat in every_worker:
        for row in _server_rows(stat):
            totals.setdefault(pool_of(row["svname"]), [0, 0, 0])[2] += _count(row, "scur")
    return {pool: PoolCounters(requests_total=t, errors_total=e, active=a)
            for pool, (t, e, a) in totals.items()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
