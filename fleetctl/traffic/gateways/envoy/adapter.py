"""Envoy: weights through the admin runtime, structure through atomically renamed CDS/RDS files.

GatewaySpec.admin_address is the admin base URL (`http://127.0.0.1:9901`); the options
(options.py) name the directory the bootstrap watches for `clusters.json` and `routes.json`
(render.py writes them; docs/envoy.md explains them) and two timeouts.

An apply, in an order that never leaves a route half-changed:
1. render and validate (pools Envoy cannot route to were left out by Adapter.apply; anything
   else bad is refused before anything is written);
2. write the weights to the runtime file (what a restarted Envoy starts from), keeping the
   keys of the loaded routes until the new routes file is in;
3. if pools were added: clusters file = old clusters + new ones, wait until loaded;
4. if the route structure changed: drop runtime keys no loaded route uses and set the new
   routes' keys, swap the routes file, wait until loaded (a rejected file is put back);
5. set every route's runtime weights in one /runtime_modify (one snapshot, so a route's
   weights change together and never all reach 0);
6. if pools were removed: clusters file = exactly the desired ones, wait until loaded; the
   runtime file = exactly the desired keys.
A weights-only change is steps 1, 2 and 5: one small file, a link swap and one POST.
"""

from __future__ import annotations

import fcntl
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from fleetctl.core import http
from fleetctl.core.files import write_atomically
from fleetctl.core.http import OutboundError, OutboundTimeout, OutboundUnreachable
from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    PoolCounters,
    PoolTarget,
)
from fleetctl.traffic.gateways.envoy import render as config
from fleetctl.traffic.gateways.envoy.fallback import pool_of
from fleetctl.traffic.gateways.envoy.options import EnvoyOptions
from fleetctl.traffic.gateways.envoy.routes import is_tier_entry
from fleetctl.traffic.gateways.envoy.runtime import read_runtime_file, write_runtime_file

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
    a 4xx is not. Calls go through fleetctl.core.http.admin_client(), kept alive per admin
    address."""

    def __init__(self, base_url: str, *, timeout_s: float, gateway: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.gateway = gateway

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        body = self._request("GET", path, params=params)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise AdapterError(f"{self._where(path)} answered non-JSON: "
                               f"{body[:200].decode(errors='replace')}",
                               permanent=True) from exc

    def post(self, path: str, data: dict[str, str]) -> None:
        self._request("POST", path, form=data)

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

    def admin_layer_keys(self) -> list[str]:
        """Keys POST /runtime_modify set (the admin layer is the last one)."""
        entries = self.get_json("/runtime", {"format": "json"}).get("entries", {})
        return [key for key, entry in entries.items()
                if (entry.get("layer_values") or [""])[-1] != ""]

    def route_config(self) -> dict[str, Any] | None:
        return self.route_config_and_version()[0]

    def route_config_and_version(self) -> tuple[dict[str, Any] | None, str]:
        """fleetctl's RouteConfiguration as loaded, and the version Envoy loaded it at."""
        dump = self.get_json("/config_dump", {"resource": "dynamic_route_configs"})
        for item in dump.get("configs", []):
            route_config = item.get("route_config", {})
            if route_config.get("name") == config.ROUTE_CONFIG_NAME:
                return dict(route_config), str(item.get("version_info", ""))
        return None, ""

    def _request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                 form: dict[str, str] | None = None) -> bytes:
        where = self._where(path)
        try:
            answer = http.admin_client().request(method, self.base_url + path, params=params,
                                                 form=form, timeout_s=self.timeout_s)
            status, body = answer.status_code, answer.body
        except OutboundTimeout as exc:
            raise AdapterError(f"{where} timed out after {self.timeout_s:g} s") from exc
        except OutboundUnreachable as exc:
            raise AdapterError(f"{where} is unreachable (is Envoy running?): {exc}") from exc
        except OutboundError as exc:
            raise AdapterError(f"{where} failed: {exc}") from exc
        if status >= 400:
            raise AdapterError(
                f"{where} answered {status}: {body.decode(errors='replace').strip()[:200]}",
                permanent=status < 500,
            )
        return body

    def _where(self, path: str) -> str:
        return f"Envoy {self.gateway} admin {self.base_url}{path}"


class _Seen:
    """What this process last saw Envoy report, per gateway: its load state (so a
    weights-only apply can skip the stats read before its POST) and, per routes version,
    the route structure (so a read-back needs no /config_dump). Only an optimisation: every
    apply is still verified by a read-back of Envoy's real state, and any error, mismatch
    or version change drops what was remembered."""

    _MAX_ROUTE_CONFIGS = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._load: dict[tuple[str, str], LoadState] = {}
        self._routes: dict[str, dict[str, Any] | None] = {}

    def load_state(self, gateway: tuple[str, str]) -> LoadState | None:
        with self._lock:
            return self._load.get(gateway)

    def saw_load_state(self, gateway: tuple[str, str], state: LoadState) -> None:
        with self._lock:
            self._load[gateway] = state

    def forget(self, gateway: tuple[str, str]) -> None:
        with self._lock:
            self._load.pop(gateway, None)

    def route_config(self, version: str) -> tuple[bool, dict[str, Any] | None]:
        with self._lock:
            return version in self._routes, self._routes.get(version)

    def saw_route_config(self, version: str, route_config: dict[str, Any] | None) -> None:
        """A route config is known by the version Envoy loaded it at: fleetctl's versions
        are hashes of the route structure (only default weights are left out of it)."""
        if not version:
            return
        with self._lock:
            if len(self._routes) >= self._MAX_ROUTE_CONFIGS:
                self._routes.clear()
            self._routes[version] = route_config


_seen = _Seen()


class EnvoyAdapter(Adapter[EnvoyOptions]):
    kind: ClassVar[str] = "envoy"
    supports_context_tiers: ClassVar[bool] = True
    supports_prefix_affinity: ClassVar[bool] = True

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        return config.pool_problem(pool)

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.load_timeout_s = self.options.load_timeout_s
        self.admin = EnvoyAdmin(gateway.admin_address, gateway=gateway.name,
                                timeout_s=self.options.admin_timeout_s)
        self._seen_key = (self.admin.base_url, self.options.config_dir)
        self._held_mirror: dict[str, int] | None = None

    # --- apply -------------------------------------------------------------------------------

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        try:
            rendered = render_once(desired)
        except config.ConfigError as exc:
            raise AdapterError(f"gateway {self.gateway.name}: {exc}", permanent=True) from exc
        config_dir = self._config_dir()
        try:
            with _apply_lock(config_dir):
                swapped = self._apply_locked(rendered, config_dir)
        except AdapterError:
            _seen.forget(self._seen_key)
            raise
        elapsed_ms = (time.monotonic() - started) * 1000
        keys = f"{len(rendered.runtime)} runtime weight(s) set; {elapsed_ms:.0f} ms"
        if not swapped:
            return ApplyResult(applied=True, method="runtime", detail=keys)
        return ApplyResult(applied=True, method="file-swap",
                           detail=f"{', '.join(swapped)} swapped; {keys}")

    def _apply_locked(self, rendered: config.RenderedConfig, config_dir: Path) -> list[str]:
        on_disk, on_disk_version = _clusters_on_disk(config_dir)
        seen = _seen.load_state(self._seen_key)
        if (seen is not None and seen.routes_version == rendered.routes_version
                and seen.clusters_version == rendered.clusters_version == on_disk_version):
            # The files Envoy last reported are the ones wanted: weights only, without the
            # stats read first. Were Envoy's state different after all (restarted empty,
            # another worker swapped files), the read-back that follows sees it, and the
            # retry takes the path below. Disk first: from here on a restart starts from
            # these weights, whatever becomes of the POST.
            write_runtime_file(config_dir, rendered.runtime_text)
            if rendered.runtime:
                self.admin.post("/runtime_modify", rendered.runtime_values)
            return []
        # Until the new routes file is loaded, a restart would load the one on disk now: its
        # routes read the keys they read today, so those stay (at their current values).
        on_disk_runtime = read_runtime_file(config_dir)
        loaded = config.runtime_file_weights(on_disk_runtime)
        if loaded.keys() - rendered.runtime.keys():
            write_runtime_file(config_dir, config.runtime_file(loaded | rendered.runtime))
        elif on_disk_runtime != rendered.runtime_text:
            write_runtime_file(config_dir, rendered.runtime_text)
        state = self.admin.load_state()
        swapped: list[str] = []
        # Old clusters stay until the new routes no longer use them.
        staged = {**{n: c for n, c in on_disk.items() if n not in rendered.clusters},
                  **rendered.clusters}
        if config.clusters_version(staged) != state.clusters_version:
            state = self._swap_clusters(config_dir, staged, state)
            swapped.append("clusters")
        if rendered.routes_version != state.routes_version:
            self._stage_runtime_keys(rendered)
            state = self._swap(config_dir / config.ROUTES_FILE,
                               config.routes_file(rendered.route_config, rendered.routes_version),
                               rendered.routes_version, state, routes=True)
            swapped.append(f"routes ({rendered.routes_version})")
        if rendered.runtime:
            self.admin.post("/runtime_modify", rendered.runtime_values)
        if staged != rendered.clusters:
            state = self._swap_clusters(config_dir, rendered.clusters, state)
            swapped.append("clusters (pruned)")
        if read_runtime_file(config_dir) != rendered.runtime_text:
            write_runtime_file(config_dir, rendered.runtime_text)
        _seen.saw_load_state(self._seen_key, state)
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
                    f"({self.options.config_dir}) the directory it watches?")
            time.sleep(_POLL_S)

    def _stage_runtime_keys(self, rendered: config.RenderedConfig) -> None:
        """Before new route shapes load, in one runtime snapshot: remove every fleetctl weight
        that no loaded route reads, and set the new shapes' weights (which no loaded route
        reads yet, so nothing changes until the routes file is in). A new shape then reads its
        own weights from its first request: never the leftovers of an older shape, and never
        the runtime file's layer, which Envoy reads only at start (it may hold a shape seen
        before)."""
        live = {rc["runtime_key_prefix"] for rc in _weighted(self.admin.route_config())}
        ours = [key for key in self.admin.admin_layer_keys()
                if key.startswith(f"{config.RUNTIME_ROOT}.")]
        changes = {key: "" for key in ours if key.rsplit(".", 1)[0] not in live}  # "" removes
        changes |= {key: value for key, value in rendered.runtime_values.items()
                    if key.rsplit(".", 1)[0] not in live}
        if changes:
            self.admin.post("/runtime_modify", changes)

    def _config_dir(self) -> Path:
        path = Path(self.options.config_dir)
        if not path.is_dir():
            raise AdapterError(f"gateway {self.gateway.name}: config_dir {path} is not a "
                               "directory", permanent=True)
        return path

    # --- reads -------------------------------------------------------------------------------

    def read_back(self) -> dict[str, dict[str, int]]:
        """Envoy's loaded routes version (stats) and its runtime; the route structure of that
        version comes from /config_dump the first time, later from memory (it is a hash of
        the structure). Default weights are not part of that hash, so whenever a weighted
        route lacks an integer runtime value (e.g. after a restart) the route config is read
        from Envoy again."""
        try:
            state = self.admin.load_state()
            runtime = self.admin.runtime()
            known, route_config = _seen.route_config(state.routes_version)
            if not known or not _runtime_complete(route_config, runtime):
                route_config, version = self.admin.route_config_and_version()
                _seen.saw_route_config(version, route_config)
                if version != state.routes_version:  # swapped in between: read it all again
                    state = self.admin.load_state()
                    runtime = self.admin.runtime()
                    route_config, version = self.admin.route_config_and_version()
                    _seen.saw_route_config(version, route_config)
        except AdapterError:
            _seen.forget(self._seen_key)
            raise
        _seen.saw_load_state(self._seen_key, state)
        self._held_mirror = held_mirror(route_config, runtime)
        return held_weights(route_config, runtime)

    def read_back_mirror(self) -> dict[str, int] | None:
        """The mirror fractions of the same read as the last read_back() (the runtime keys
        `<prefix>._mirror`, else the loaded file's defaults); a read of its own otherwise."""
        if self._held_mirror is None:
            self.read_back()
        held, self._held_mirror = self._held_mirror, None
        return held

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Weights equal and, when a read-back saw them, the loaded clusters and route
        structure are the wanted ones: a pool's new base URLs (or a pool no longer left out)
        change no weight, nor does a new mirror secret (its token is in the routes file)."""
        fit = self.renderable(desired).desired
        seen = _seen.load_state(self._seen_key)
        try:
            if held == fit.held_weights() and (seen is None or (
                    seen.clusters_version == render_once(fit).clusters_version
                    and seen.routes_version == render_once(fit).routes_version)):
                return True
        except config.ConfigError:
            pass  # not renderable: never held (and apply says why)
        _seen.forget(self._seen_key)  # the next apply reads Envoy's state before writing
        return False

    def in_flight(self, pool: str) -> int:
        return in_flight(self.admin, pool)

    def pool_counters(self) -> dict[str, PoolCounters]:
        return pool_counters(self.admin)


def in_flight(admin: EnvoyAdmin, pool: str) -> int:
    """In flight on the pool through any of its clusters (its own, a queue tier's), as one
    Envoy's stats count them."""
    stats = admin.stats(rf"^cluster\.{re.escape(pool)}(_q_[0-9a-f]{{8}})?\.upstream_rq_active$")
    return sum(int(value or 0) for value in stats.values())


def pool_counters(admin: EnvoyAdmin) -> dict[str, PoolCounters]:
    """Per pool, summed over its clusters: its own and a queue tier's copies of it
    (fallback.py; an aggregate cluster sends through those and counts nothing itself)."""
    stats = admin.stats(
        r"^cluster\.[^.]+\.(upstream_rq_total|upstream_rq_5xx|upstream_rq_active)$")
    sums: dict[str, dict[str, int]] = {}
    for name, value in stats.items():
        _, cluster, counter = name.split(".")
        if cluster == config.COLLECTOR_CLUSTER or "_fb_" in cluster:
            continue
        into = sums.setdefault(pool_of(cluster), {})
        into[counter] = into.get(counter, 0) + int(value or 0)
    return {pool: PoolCounters(
        requests_total=found.get("upstream_rq_total", 0),
        # Envoy counts its own 503s for failed connections here too.
        errors_total=found.get("upstream_rq_5xx", 0),
        active=found.get("upstream_rq_active", 0),
    ) for pool, found in sorted(sums.items())}


def held_weights(route_config: dict[str, Any] | None,
                 runtime: dict[str, str]) -> dict[str, dict[str, int]]:
    """Route key -> {pool: weight > 0} as Envoy applies them: a runtime key wins over the
    file's default weight when it holds an integer (as Envoy's runtime lookup does)."""
    held: dict[str, dict[str, int]] = {}
    for route in _routes(route_config):
        name = route.get("name", "")
        if not name or ":" in name or is_tier_entry(route):
            continue  # fleetctl's own answers (errors, model lists), or a tier's entry
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


def held_mirror(route_config: dict[str, Any] | None, runtime: dict[str, str]) -> dict[str, int]:
    """Route key -> mirror basis points > 0 as Envoy applies them: the runtime key's
    FractionalPercent when it holds one, else the policy's default."""
    held: dict[str, int] = {}
    for route in _routes(route_config):
        name = route.get("name", "")
        for policy in route.get("route", {}).get("request_mirror_policies") or []:
            fraction = policy.get("runtime_fraction") or {}
            key = fraction.get("runtime_key", "")
            bp = config.runtime_value_bp(key, runtime.get(key)) if key else None
            if bp is None:
                bp = config.fraction_bp(fraction.get("default_value") or {}) or 0
            if bp > 0 and name and ":" not in name and not is_tier_entry(route):
                held[name] = bp
    return held


def _runtime_complete(route_config: dict[str, Any] | None, runtime: dict[str, str]) -> bool:
    """Does the runtime hold an integer for every weighted cluster of every route (and a
    fraction for every mirror policy), so that held_weights() and held_mirror() do not
    depend on the file's defaults?"""
    for route in _routes(route_config):
        for policy in route.get("route", {}).get("request_mirror_policies") or []:
            key = (policy.get("runtime_fraction") or {}).get("runtime_key", "")
            if not key or config.runtime_value_bp(key, runtime.get(key)) is None:
                return False
        weighted = route.get("route", {}).get("weighted_clusters")
        if weighted is None:
            continue
        prefix = weighted.get("runtime_key_prefix", "")
        if not prefix:
            return False
        for cluster in weighted.get("clusters", []):
            if _as_int(runtime.get(f"{prefix}.{cluster.get('name')}")) is None:
                return False
    return True


def _refusals(stats: dict[str, Any], prefix: str) -> int:
    return sum(int(stats.get(f"{prefix}.{name}") or 0)
               for name in ("update_rejected", "update_failure"))


def _runtime_int(value: str | None, default: int) -> int:
    number = _as_int(value)
    return default if number is None else number


def _as_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _routes(route_config: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    for host in (route_config or {}).get("virtual_hosts", []):
        yield from host.get("routes", [])


def _weighted(route_config: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    for route in _routes(route_config):
        weighted = route.get("route", {}).get("weighted_clusters")
        if weighted and weighted.get("runtime_key_prefix"):
            yield weighted


def _clusters_on_disk(config_dir: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """The clusters file as last written (what Envoy loaded, since a rejected file is put
    back) and its version; unreadable counts as empty. Parsed once per version of the file
    (known by its inode, size and mtime): a drain reads it for every gateway."""
    path = config_dir / config.CLUSTERS_FILE
    try:
        info = path.stat()
        key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
        with _disk_lock:
            cached = _disk_cache.get(str(path))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        document = json.loads(path.read_text())
        clusters = {c["name"]: c for c in document.get("resources", [])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}, config.clusters_version({})
    version = config.clusters_version(clusters)
    with _disk_lock:
        if len(_disk_cache) >= 256:
            _disk_cache.clear()
        _disk_cache[str(path)] = (key, clusters, version)
    return clusters, version


_disk_lock = threading.Lock()
_disk_cache: dict[str, tuple[tuple[str, int, int, int], dict[str, dict[str, Any]], str]] = {}
_render_lock = threading.Lock()
_last_renders: list[tuple[DesiredState, config.RenderedConfig]] = []
# Desired states remembered: each gateway of a push has its own (its mirror tokens differ),
# and the push threads apply and verify them side by side.
_RENDERS_KEPT = 32


def render_once(desired: DesiredState) -> config.RenderedConfig:
    """config.render, once per desired state object (treated as immutable, as it is frozen):
    apply and matches of one attempt both ask."""
    with _render_lock:
        for seen, rendered in _last_renders:
            if seen is desired:
                return rendered
    rendered = config.render(desired)
    with _render_lock:
        _last_renders.insert(0, (desired, rendered))
        del _last_renders[_RENDERS_KEPT:]
    return rendered


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
