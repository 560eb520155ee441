"""Envoy over xDS: an apply sets the gateway's snapshot in the xDS store and waits for the
ACKs of every Envoy connected as that gateway (node.cluster).

The resources are the Envoy kind's rendering (envoy/render.py, as files.py writes it),
converted to protos (fleetctl/xds/resources.py). An apply that adds pools serves the old and
the new clusters together until every Envoy ACKed the new routes, then the exact clusters
(as the file mode swaps its files). A NACK fails the push with Envoy's message, and the
previous snapshot is served again, so an Envoy that connects next gets the config the others
kept. Read-back is what the Envoys ACKed: the weights of the newest snapshot every connected
Envoy holds. In-flight requests and counters are summed over the gateway's connected
Envoys, each read at the admin URL its bootstrap gave (node metadata); one that does not
answer makes the figure unknown (an AdapterError), never a zero.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

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
from fleetctl.traffic.gateways.envoy.adapter import (
    EnvoyAdmin,
    in_flight,
    pool_counters,
    render_once,
)
from fleetctl.traffic.gateways.envoy.bootstrap import ADMIN_URL_METADATA
from fleetctl.traffic.gateways.envoy_xds.options import EnvoyXdsOptions
from fleetctl.traffic.gateways.schema import http_url
from fleetctl.xds.protos import SERVED_TYPES, SHORT
from fleetctl.xds.resources import rendered_resources
from fleetctl.xds.store import AckResult, Snapshot, SnapshotStore, default_store


@dataclass(frozen=True)
class Held:
    """What a snapshot means, kept beside it: read back once the Envoys ACK it."""

    clusters: dict[str, dict[str, Any]]  # the rendered clusters it serves (JSON)
    weights: dict[str, dict[str, int]]
    mirror: dict[str, int]
    clusters_version: str
    routes_version: str

    @classmethod
    def of(cls, meta: Any) -> Held | None:
        """A snapshot's meta (JSON, as every store keeps it) as a Held; None for a snapshot
        fleetctl's adapter did not set."""
        if isinstance(meta, dict) and set(meta) == {f.name for f in fields(cls)}:
            return cls(**meta)
        return None


class EnvoyXdsAdapter(Adapter[EnvoyXdsOptions]):
    kind: ClassVar[str] = "envoy-xds"
    supports_context_tiers: ClassVar[bool] = True
    supports_prefix_affinity: ClassVar[bool] = True

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        return config.pool_problem(pool)

    def __init__(self, gateway: GatewaySpec, store: SnapshotStore | None = None) -> None:
        super().__init__(gateway)
        self.store: SnapshotStore = store if store is not None else default_store()
        self.admin = EnvoyAdmin(gateway.admin_address, gateway=gateway.name,
                                timeout_s=self.options.admin_timeout_s)
        self._held: Held | None = None
        self._meta_read: tuple[int, Any] | None = None

    # --- apply -------------------------------------------------------------------------------

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        try:
            rendered = render_once(desired)
        except config.ConfigError as exc:
            raise AdapterError(f"gateway {self.gateway.name}: {exc}", permanent=True) from exc
        name = self.gateway.name
        # Two steps and a NACK's restore must not interleave with another push of the
        # gateway, from this process or another (the store's lock).
        with contextlib.ExitStack() as locked:
            try:
                locked.enter_context(self.store.push_lock(
                    name, timeout_s=4 * self.options.ack_timeout_s + 30))
            except TimeoutError as exc:
                raise AdapterError(f"gateway {name}: {exc}") from exc
            if not self.store.any_connected(name):
                # Set anyway: an Envoy that connects gets it at once.
                self._set(rendered, desired, rendered.clusters)
                raise AdapterError(f"gateway {name}: no Envoy is connected to fleetctl's xDS "
                                   "server as this gateway (node.cluster); the configuration "
                                   "is served to the first that connects")
            current = self.store.snapshot(name)
            current_held = Held.of(current.meta)
            old = current_held.clusters if current_held is not None else {}
            # Old clusters stay until every Envoy has the routes that no longer use them.
            staged = {**{n: c for n, c in old.items() if n not in rendered.clusters},
                      **rendered.clusters}
            snapshot = self._set(rendered, desired, staged, previous=current)
            result = self._verify(snapshot, current)
            steps = 1
            if staged != rendered.clusters:
                result = self._verify(
                    self._set(rendered, desired, rendered.clusters, previous=snapshot),
                    snapshot)
                steps += 1
        changed = [SHORT[t] for t in SERVED_TYPES
                   if current.types[t].version != snapshot.types[t].version]
        elapsed_ms = (time.monotonic() - started) * 1000
        return ApplyResult(
            applied=True, method="xds",
            detail=(f"snapshot {result.number} ({', '.join(changed) or 'unchanged'}) ACKed by "
                    f"{len(result.envoys)} Envoy(s)"
                    f"{' in 2 steps (clusters pruned)' if steps == 2 else ''}; "
                    f"{elapsed_ms:.0f} ms"))

    def _set(self, rendered: config.RenderedConfig, desired: DesiredState,
             clusters: dict[str, dict[str, Any]], *,
             previous: Snapshot | None = None) -> Snapshot:
        held = Held(clusters=clusters, weights=desired.held_weights(),
                    mirror=desired.held_mirror(),
                    clusters_version=config.clusters_version(clusters),
                    routes_version=rendered.routes_version)
        try:
            types = rendered_resources(rendered, clusters=clusters,
                                       previous=previous.types if previous else None)
        except ValueError as exc:  # a rendering no proto holds: a bug, never a retry
            raise AdapterError(f"gateway {self.gateway.name}: {exc}", permanent=True) from exc
        return self.store.set_snapshot(self.gateway.name, types, asdict(held))

    def _verify(self, snapshot: Snapshot, previous: Snapshot) -> AckResult:
        result = self.store.wait_acked(self.gateway.name, snapshot.number,
                                       timeout_s=self.options.ack_timeout_s)
        if result.ok:
            return result
        name = self.gateway.name
        if result.nacked:
            # Envoy keeps its last good config; serve that again, so the next Envoy to
            # connect gets what the others hold.
            self.store.set_snapshot(name, previous.types, previous.meta)
            refusals = "; ".join(f"{e.node_id}: {e.error}" for e in result.nacked)
            raise AdapterError(f"gateway {name}: Envoy refused snapshot {snapshot.number} "
                               f"({refusals}); the previous configuration is served again",
                               permanent=True)
        pending = [e.node_id for e in result.envoys if e.state == "pending"]
        if not result.envoys:
            raise AdapterError(f"gateway {name}: every Envoy disconnected before ACKing "
                               f"snapshot {snapshot.number}")
        raise AdapterError(f"gateway {name}: Envoy(s) {', '.join(pending)} did not ACK "
                           f"snapshot {snapshot.number} within "
                           f"{self.options.ack_timeout_s:g} s")

    # --- reads -------------------------------------------------------------------------------

    def read_back(self) -> dict[str, dict[str, int]]:
        """The weights of the newest snapshot every connected Envoy ACKed ({} when they
        all ACKed the unconfigured resources of a gateway fleetctl has not configured)."""
        held = self._meta_read = self.store.held_meta(self.gateway.name)
        if held is not None and held[0] == 0:  # unconfigured: fleetctl serves it nothing yet
            self._held = Held(clusters={}, weights={}, mirror={}, clusters_version="",
                              routes_version="")
            return {}
        kept = Held.of(held[1]) if held is not None else None
        if kept is None:
            self._held = None
            envoys = [e for e in self.store.envoys(self.gateway.name) if e.connected]
            raise AdapterError(
                f"gateway {self.gateway.name}: " + (
                    "no Envoy is connected to fleetctl's xDS server as this gateway"
                    if not envoys else "its Envoys have not all ACKed one snapshot of "
                    "fleetctl's: " + ", ".join(str(e.summary()) for e in envoys)))
        self._held = kept
        return dict(kept.weights)

    def read_back_mirror(self) -> dict[str, int] | None:
        if self._held is None:
            self.read_back()
        assert self._held is not None
        held, self._held = self._held, None
        return dict(held.mirror)

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Weights equal, and the ACKed snapshot serves the wanted clusters and routes."""
        fit = self.renderable(desired).desired
        if held != fit.held_weights():
            return False
        # What read_back just read (a push reads back, then matches), else a new read.
        meta, self._meta_read = self._meta_read or self.store.held_meta(self.gateway.name), None
        acked = Held.of(meta[1]) if meta is not None else None
        if acked is None:
            return False
        try:
            rendered = render_once(fit)
        except config.ConfigError:
            return False  # not renderable: never held (and apply says why)
        return (acked.clusters_version == rendered.clusters_version
                and acked.routes_version == rendered.routes_version)

    # --- what the gateway's Envoys count -----------------------------------------------------

    def in_flight(self, pool: str) -> int:
        """Summed over every Envoy connected as this gateway; unknown (AdapterError) when one
        cannot be read, so a drain never counts a silent Envoy as idle."""
        return sum(in_flight(admin, pool) for admin in self._admins("in-flight requests"))

    def pool_counters(self) -> dict[str, PoolCounters]:
        """Per pool, summed over every Envoy connected as this gateway (an Envoy that joins
        or leaves moves the sums: a drop reads as a counter reset, a join as one interval's
        jump)."""
        sums: dict[str, PoolCounters] = {}
        for admin in self._admins("counters"):
            for pool, c in pool_counters(admin).items():
                was = sums.get(pool, PoolCounters(requests_total=0, errors_total=0, active=0))
                sums[pool] = PoolCounters(requests_total=was.requests_total + c.requests_total,
                                          errors_total=was.errors_total + c.errors_total,
                                          active=was.active + c.active)
        return dict(sorted(sums.items()))

    def _admins(self, what: str) -> list[EnvoyAdmin]:
        """The admin API of each Envoy connected as this gateway, at the URL its bootstrap
        sent (node metadata `fleetctl_admin_url`, checked as an admin address is). An Envoy
        without one is read at admin_address only when it is the gateway's one Envoy (a
        bootstrap from before the metadata); with several, the sum would miss it."""
        name = self.gateway.name
        live = [e for e in self.store.envoys(name) if e.connected]
        if not live:
            raise AdapterError(
                f"gateway {name}: no Envoy is connected to fleetctl's xDS server as this "
                f"gateway, so its {what} cannot be read (an Envoy whose stream broke may still "
                "serve requests)")
        if len(live) == 1 and not live[0].admin_url:
            return [self.admin]
        unknown = [e.node_id for e in live if not e.admin_url]
        if unknown:
            raise AdapterError(
                f"gateway {name}: Envoy(s) {', '.join(unknown)} gave no admin URL in their "
                f"bootstrap (node metadata {ADMIN_URL_METADATA}; render_xds_bootstrap writes "
                f"it), so the {what} of the gateway's {len(live)} Envoys cannot be summed")
        admins = []
        for envoy in live:
            problem = _ADMIN_ADDRESS.check(envoy.admin_url)
            if problem:
                raise AdapterError(
                    f"gateway {name}: Envoy {envoy.node_id}'s admin URL (node metadata "
                    f"{ADMIN_URL_METADATA}) cannot be read: {problem}; give the address "
                    "fleetctl reaches it at (render_xds_bootstrap(admin_listen=..., "
                    "admin_url=...))")
            admins.append(EnvoyAdmin(envoy.admin_url, gateway=f"{name} ({envoy.node_id})",
                                     timeout_s=self.options.admin_timeout_s))
        return admins


_ADMIN_ADDRESS = http_url("admin")
