"""Envoy: weights through the admin runtime, structure through atomically renamed CDS/RDS files.

GatewaySpec.admin_address is the admin base URL (`http://127.0.0.1:9901`);
GatewaySpec.options["config_dir"] is the directory the bootstrap watches for `clusters.json`
and `routes.json` (see envoy_config and ENVOY.md). Optional options: `load_timeout_s` (how long
to wait for Envoy to load a swapped file, default 5) and `admin_timeout_s` (per admin request,
default 2).

An apply, in an order that never leaves a route half-changed:
1. render and validate (a bad state is refused before anything is written);
2. if pools were added: clusters file = old clusters + new ones, wait until loaded;
3. if the route structure changed: drop runtime keys no loaded route uses, swap the routes
   file, wait until loaded (a rejected file is put back);
4. set every route's runtime weights in one /runtime_modify (one snapshot, so a route's
   weights change together and never all reach 0);
5. if pools were removed: clusters file = exactly the desired ones, wait until loaded.
A weights-only change is steps 1 and 4: one stats read and one POST.
"""

from __future__ import annotations

import fcntl
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from fleetctl.traffic import envoy_config as config
from fleetctl.traffic.adapters.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    PoolCounters,
    register,
)
from fleetctl.traffic.envoy_process import write_atomically

_RDS = f"http.{config.STAT_PREFIX}.rds.{config.ROUTE_CONFIG_NAME}"
_CDS = "cluster_manager.cds"
# A file Envoy cannot parse counts as update_failure, one it parses but refuses as
# update_rejected: both mean "not loaded, and retrying the same file will not help".
_LOAD_STATS = (
    rf"^({re.escape(_CDS)}\.(version_text|update_rejected|update_failure)"
    rf"|cluster_manager\.warming_clusters"
    rf"|{re.escape(_RDS)}\.(version_text|update_rejected|update_failure))$"
)
_POLL_S = 0.005

_shared: httpx.Client | None = None


def _client() -> httpx.Client:
    """One pooled client per process: an apply makes a handful of admin calls, and a
    kept-alive connection saves a TCP handshake on each."""
    global _shared
    if _shared is None:
        _shared = httpx.Client(follow_redirects=False, limits=httpx.Limits(max_connections=32))
    return _shared


@dataclass(frozen=True)
class LoadState:
    """What Envoy reports about its CDS/RDS files."""

    clusters_version: str
    routes_version: str
    clusters_rejected: int
    routes_rejected: int
    warming_clusters: int


class EnvoyAdmin:
    """The admin API, with errors an operator can read: unreachable or 5xx is worth a retry,
    a 4xx is not."""

    def __init__(self, base_url: str, *, timeout_s: float, gateway: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.gateway = gateway

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = self._request("GET", path, params=params)
        try:
            return response.json()
        except ValueError as exc:
            raise AdapterError(f"{self._where(path)} answered non-JSON: {response.text[:200]}",
                               permanent=True) from exc

    def post(self, path: str, data: dict[str, str]) -> None:
        self._request("POST", path, data=data)

    def stats(self, pattern: str) -> dict[str, Any]:
        """Stat name -> value for the stats whose names match the RE2 `pattern`."""
        answer = self.get_json("/stats", {"format": "json", "filter": pattern})
        return {s["name"]: s.get("value") for s in answer.get("stats", []) if "name" in s}

    def load_state(self) -> LoadState:
        stats = self.stats(_LOAD_STATS)
        return LoadState(
            clusters_version=str(stats.get(f"{_CDS}.version_text", "")),
            routes_version=str(stats.get(f"{_RDS}.version_text", "")),
            clusters_rejected=_refusals(stats, _CDS),
            routes_rejected=_refusals(stats, _RDS),
            warming_clusters=int(stats.get("cluster_manager.warming_clusters") or 0),
        )

    def runtime(self) -> dict[str, str]:
        entries = self.get_json("/runtime", {"format": "json"}).get("entries", {})
        return {key: str(entry.get("final_value", "")) for key, entry in entries.items()}

    def route_config(self) -> dict[str, Any] | None:
        dump = self.get_json("/config_dump", {"resource": "dynamic_route_configs"})
        for item in dump.get("configs", []):
            route_config = item.get("route_config", {})
            if route_config.get("name") == config.ROUTE_CONFIG_NAME:
                return dict(route_config)
        return None

    def _request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                 data: dict[str, str] | None = None) -> httpx.Response:
        where = self._where(path)
        try:
            response = _client().request(method, self.base_url + path, params=params, data=data,
                                         timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise AdapterError(f"{where} timed out after {self.timeout_s:g} s") from exc
        except httpx.ConnectError as exc:
            raise AdapterError(f"{where} is unreachable (is Envoy running?): {exc}") from exc
        except httpx.HTTPError as exc:
            raise AdapterError(f"{where} failed: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise AdapterError(
                f"{where} answered {response.status_code}: {response.text.strip()[:200]}",
                permanent=response.status_code < 500,
            )
        return response

    def _where(self, path: str) -> str:
        return f"Envoy {self.gateway} admin {self.base_url}{path}"


@register
class EnvoyAdapter(Adapter):
    kind: ClassVar[str] = "envoy"

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        options = gateway.options
        self.load_timeout_s = float(options.get("load_timeout_s", 5.0))
        self.admin = EnvoyAdmin(gateway.admin_address, gateway=gateway.name,
                                timeout_s=float(options.get("admin_timeout_s", 2.0)))

    # --- apply -------------------------------------------------------------------------------

    def apply(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        try:
            rendered = config.render(desired)
        except config.ConfigError as exc:
            raise AdapterError(f"gateway {self.gateway.name}: {exc}", permanent=True) from exc
        config_dir = self._config_dir()
        with _apply_lock(config_dir):
            swapped = self._apply_locked(rendered, config_dir)
        elapsed_ms = (time.monotonic() - started) * 1000
        keys = f"{len(rendered.runtime)} runtime weight(s) set; {elapsed_ms:.0f} ms"
        if not swapped:
            return ApplyResult(applied=True, method="runtime", detail=keys)
        return ApplyResult(applied=True, method="file-swap",
                           detail=f"{', '.join(swapped)} swapped; {keys}")

    def _apply_locked(self, rendered: config.RenderedConfig, config_dir: Path) -> list[str]:
        state = self.admin.load_state()
        swapped: list[str] = []
        on_disk = _clusters_on_disk(config_dir)
        # Old clusters stay until the new routes no longer use them.
        staged = {**{n: c for n, c in on_disk.items() if n not in rendered.clusters},
                  **rendered.clusters}
        if config.clusters_version(staged) != state.clusters_version:
            state = self._swap_clusters(config_dir, staged, state)
            swapped.append("clusters")
        if rendered.routes_version != state.routes_version:
            self._drop_unused_runtime_keys()
            state = self._swap(config_dir / config.ROUTES_FILE,
                               config.routes_file(rendered.route_config, rendered.routes_version),
                               rendered.routes_version, state, routes=True)
            swapped.append(f"routes ({rendered.routes_version})")
        if rendered.runtime:
            self.admin.post("/runtime_modify", {k: str(v) for k, v in rendered.runtime.items()})
        if staged != rendered.clusters:
            self._swap_clusters(config_dir, rendered.clusters, state)
            swapped.append("clusters (pruned)")
        return swapped

    def _swap_clusters(self, config_dir: Path, clusters: dict[str, dict[str, Any]],
                       state: LoadState) -> LoadState:
        return self._swap(config_dir / config.CLUSTERS_FILE, config.clusters_file(clusters),
                          config.clusters_version(clusters), state, routes=False)

    def _swap(self, path: Path, text: str, version: str, state: LoadState, *,
              routes: bool) -> LoadState:
        """Rename the new file into place and wait until Envoy reports its version; a file
        Envoy rejects is replaced by the previous one, so disk and Envoy agree again."""
        previous = path.read_text() if path.exists() else None
        write_atomically(path, text)
        try:
            return self._wait_loaded(path.name, version, state, routes=routes)
        except AdapterError as exc:
            if exc.permanent and previous is not None:
                write_atomically(path, previous)
            raise

    def _wait_loaded(self, name: str, version: str, before: LoadState, *,
                     routes: bool) -> LoadState:
        deadline = time.monotonic() + self.load_timeout_s
        while True:
            state = self.admin.load_state()
            if routes:
                loaded = state.routes_version == version
                rejected = state.routes_rejected > before.routes_rejected
            else:
                loaded = state.clusters_version == version and state.warming_clusters == 0
                rejected = state.clusters_rejected > before.clusters_rejected
            if loaded:
                return state
            if rejected:
                raise AdapterError(f"Envoy {self.gateway.name} rejected {name} ({version}); "
                                   "its log says why. The previous file is back in place.",
                                   permanent=True)
            if time.monotonic() > deadline:
                raise AdapterError(
                    f"Envoy {self.gateway.name} did not load {name} ({version}) within "
                    f"{self.load_timeout_s:g} s; is options.config_dir "
                    f"({self.gateway.options.get('config_dir')}) the directory it watches?")
            time.sleep(_POLL_S)

    def _drop_unused_runtime_keys(self) -> None:
        """Before new route shapes load, remove every fleetctl weight that no loaded route
        reads: a new shape then starts from its file's weights, never from leftovers."""
        live = {rc["runtime_key_prefix"] for rc in _weighted(self.admin.route_config())}
        ours = [key for key in self.admin.runtime() if key.startswith(f"{config.RUNTIME_ROOT}.")]
        unused = [key for key in ours if key.rsplit(".", 1)[0] not in live]
        if unused:
            self.admin.post("/runtime_modify", {key: "" for key in unused})  # "" removes

    def _config_dir(self) -> Path:
        value = self.gateway.options.get("config_dir")
        if not value:
            raise AdapterError(f"gateway {self.gateway.name}: options.config_dir is required "
                               "(the directory Envoy watches for CDS/RDS files)", permanent=True)
        path = Path(value)
        if not path.is_dir():
            raise AdapterError(f"gateway {self.gateway.name}: config_dir {path} is not a "
                               "directory", permanent=True)
        return path

    # --- reads -------------------------------------------------------------------------------

    def read_back(self) -> dict[str, dict[str, int]]:
        route_config = self.admin.route_config()
        runtime = self.admin.runtime()
        return held_weights(route_config, runtime)

    def in_flight(self, pool: str) -> int:
        name = f"cluster.{pool}.upstream_rq_active"
        return int(self.admin.stats(f"^{re.escape(name)}$").get(name) or 0)

    def pool_counters(self) -> dict[str, PoolCounters]:
        stats = self.admin.stats(
            r"^cluster\.[^.]+\.(upstream_rq_total|upstream_rq_5xx|upstream_rq_active)$")
        pools = {name.split(".")[1] for name in stats}
        return {pool: PoolCounters(
            requests_total=int(stats.get(f"cluster.{pool}.upstream_rq_total") or 0),
            # Envoy counts its own 503s for failed connections here too.
            errors_total=int(stats.get(f"cluster.{pool}.upstream_rq_5xx") or 0),
            active=int(stats.get(f"cluster.{pool}.upstream_rq_active") or 0),
        ) for pool in sorted(pools)}


def held_weights(route_config: dict[str, Any] | None,
                 runtime: dict[str, str]) -> dict[str, dict[str, int]]:
    """Route key -> {pool: weight > 0} as Envoy applies them: a runtime key wins over the
    file's default weight when it holds an integer (as Envoy's runtime lookup does)."""
    held: dict[str, dict[str, int]] = {}
    for route in _routes(route_config):
        name = route.get("name", "")
        if not name or ":" in name:
            continue  # fleetctl's own answers (errors, model lists), not a RouteSpec
        if "direct_response" in route:
            held[name] = {}
            continue
        weighted = route.get("route", {}).get("weighted_clusters")
        if weighted is None:
            continue
        prefix = weighted.get("runtime_key_prefix", "")
        weights = {c["name"]: _runtime_int(runtime.get(f"{prefix}.{c['name']}"),
                                           int(c.get("weight", 0)))
                   for c in weighted.get("clusters", [])}
        held[name] = {pool: w for pool, w in weights.items() if w > 0}
    return held


def _refusals(stats: dict[str, Any], prefix: str) -> int:
    return sum(int(stats.get(f"{prefix}.{name}") or 0)
               for name in ("update_rejected", "update_failure"))


def _runtime_int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _routes(route_config: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    for host in (route_config or {}).get("virtual_hosts", []):
        yield from host.get("routes", [])


def _weighted(route_config: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    for route in _routes(route_config):
        weighted = route.get("route", {}).get("weighted_clusters")
        if weighted and weighted.get("runtime_key_prefix"):
            yield weighted


def _clusters_on_disk(config_dir: Path) -> dict[str, dict[str, Any]]:
    """The clusters file as last written (what Envoy loaded, since a rejected file is put
    back); unreadable counts as empty."""
    try:
        document = json.loads((config_dir / config.CLUSTERS_FILE).read_text())
        return {c["name"]: c for c in document.get("resources", [])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


@contextmanager
def _apply_lock(config_dir: Path) -> Iterator[None]:
    """One apply at a time per gateway directory, across processes (two workers pushing to
    the same gateway would interleave file swaps)."""
    with (config_dir / ".fleetctl-apply.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
