"""Snapshots per gateway and what each Envoy did with them (ACK or NACK).

A gateway is the set of Envoys whose `node.cluster` names it; `node.id` names one Envoy.
`set_snapshot(gateway, resources)` makes a numbered snapshot the gateway's current one and
wakes every stream of that gateway, which sends each type whose version changed. Each stream
reports what it sent and what came back, so `wait_acked(gateway, number)` can say when every
connected Envoy of the gateway holds snapshot `number` (or a later one), when one refused it
(with Envoy's own error message), or that time ran out.

`SnapshotStore` is the interface the server and the adapter use. `SharedStore`
(fleetctl/xds/shared.py, the default) keeps it in the database and wakes every replica
through Redis, so any process may push and any replica serve; `MemoryStore` keeps it in
this process (in-process tests, where the adapter and the server share one).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetctl.xds.protos import SERVED_TYPES, SHORT
from fleetctl.xds.resources import Resources, unconfigured_resources

# Snapshots kept per gateway, so an ACK of an older one can still be placed.
_HISTORY = 64


@dataclass(frozen=True)
class Snapshot:
    number: int  # 0: nothing set yet (the unconfigured resources)
    types: Resources
    # What the snapshot means, for read-back from ACKs (the adapter's held weights); opaque
    meta: Any = None

    def version(self, type_url: str) -> str:
        return self.types[type_url].version


@dataclass
class TypeAck:
    """One Envoy, one type: what it was last sent, ACKed and NACKed."""

    sent_version: str = ""
    sent_number: int = -1
    acked_version: str = ""
    acked_number: int = -1
    nacked_version: str = ""
    nacked_number: int = -1
    error: str = ""  # the last NACK's error_detail.message
    nonces: dict[str, tuple[str, int]] = field(default_factory=dict)  # nonce -> sent


@dataclass
class EnvoyState:
    node_id: str
    gateway: str
    connected: bool = True
    connected_at: float = field(default_factory=time.time)
    gone_at: float | None = None
    stream: int = 0  # which stream of this node is the live one
    replica: str = ""  # the xDS server process it is (was) connected to
    # Its admin API as its bootstrap gave it (node metadata `fleetctl_admin_url`), "" if not
    admin_url: str = ""
    types: dict[str, TypeAck] = field(default_factory=dict)

    def holds(self, snapshot: Snapshot, type_url: str) -> bool:
        """Has it ACKed this snapshot's version of the type, or a later snapshot's?"""
        ack = self.types.get(type_url)
        if ack is None or ack.acked_number < 0:
            return False
        return (ack.acked_number >= snapshot.number
                or ack.acked_version == snapshot.version(type_url))

    def refused(self, snapshot: Snapshot, type_url: str) -> bool:
        """Did it NACK this snapshot's version of the type (or a later snapshot's), and
        hold none of them?"""
        ack = self.types.get(type_url)
        if ack is None or ack.nacked_number < 0 or self.holds(snapshot, type_url):
            return False
        return (ack.nacked_number >= snapshot.number
                or ack.nacked_version == snapshot.version(type_url))

    def summary(self) -> dict[str, Any]:
        return {"node": self.node_id, "connected": self.connected, "types": {
            SHORT.get(t, t): {"acked": a.acked_version, "nacked": a.nacked_version,
                              "error": a.error} for t, a in sorted(self.types.items())}}


@dataclass(frozen=True)
class EnvoyAck:
    node_id: str
    state: str  # "acked" | "nacked" | "pending"
    error: str = ""  # NACK: Envoy's message, naming the type


@dataclass(frozen=True)
class AckResult:
    gateway: str
    number: int
    envoys: tuple[EnvoyAck, ...]
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Every connected Envoy ACKed (and there was at least one)."""
        return bool(self.envoys) and all(e.state == "acked" for e in self.envoys)

    @property
    def nacked(self) -> tuple[EnvoyAck, ...]:
        return tuple(e for e in self.envoys if e.state == "nacked")


class SnapshotStore(Protocol):
    """What the ADS server and the adapter need from a store."""

    def set_snapshot(self, gateway: str, types: Resources, meta: Any = None) -> Snapshot: ...

    def snapshot(self, gateway: str) -> Snapshot: ...

    def subscribe(self, gateway: str, wake: Callable[[], None]) -> Callable[[], None]: ...

    def stream_opened(self, gateway: str, node_id: str, admin_url: str = "") -> int: ...

    def stream_closed(self, gateway: str, node_id: str, stream: int) -> None: ...

    def sent(self, gateway: str, node_id: str, type_url: str, nonce: str, version: str,
             number: int) -> None: ...

    def answered(self, gateway: str, node_id: str, type_url: str, nonce: str,
                 error: str | None) -> None: ...

    def envoys(self, gateway: str) -> list[EnvoyState]: ...

    def any_connected(self, gateway: str) -> bool: ...

    def wait_acked(self, gateway: str, number: int, *, timeout_s: float,
                   types: tuple[str, ...] = SERVED_TYPES, min_envoys: int = 1) -> AckResult: ...

    def held_meta(self, gateway: str) -> tuple[int, Any] | None: ...

    def forget(self, gateway: str) -> None: ...

    def gateway_of_token(self, secret: str) -> str | None: ...

    def push_lock(self, gateway: str, timeout_s: float) -> AbstractContextManager[None]: ...


class MemoryStore:
    """A SnapshotStore in this process's memory, safe across threads (the gRPC server's
    event loop and the callers that set snapshots and wait)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._snapshots: dict[str, list[Snapshot]] = {}  # newest last
        self._numbers: dict[str, int] = {}
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._envoys: dict[str, dict[str, EnvoyState]] = {}
        self._streams = 0
        self._unconfigured: Snapshot | None = None
        self._tokens: dict[str, str] = {}  # SHA-256 of a secret -> its gateway
        self._push_locks: dict[str, threading.Lock] = {}

    # --- pushes ------------------------------------------------------------------------------

    @contextmanager
    def push_lock(self, gateway: str, timeout_s: float) -> Iterator[None]:
        """One push of `gateway` at a time in this process (the store is this process's)."""
        with self._changed:
            lock = self._push_locks.setdefault(gateway, threading.Lock())
        if not lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"another push of gateway {gateway} held it for "
                               f"{timeout_s:g} s")
        try:
            yield
        finally:
            lock.release()

    # --- tokens ------------------------------------------------------------------------------

    def issue_token(self, gateway: str) -> str:
        """A token for `gateway`'s Envoys, kept in this process (the shared store keeps them
        in the database: fleetctl.xds.services.gateway_token_issue)."""
        secret = secrets.token_urlsafe(32)
        with self._changed:
            self._tokens = {h: g for h, g in self._tokens.items() if g != gateway}
            self._tokens[hashlib.sha256(secret.encode()).hexdigest()] = gateway
        return secret

    def gateway_of_token(self, secret: str) -> str | None:
        with self._changed:
            return self._tokens.get(hashlib.sha256(secret.encode()).hexdigest())

    # --- snapshots ---------------------------------------------------------------------------

    def set_snapshot(self, gateway: str, types: Resources, meta: Any = None) -> Snapshot:
        missing = [t for t in SERVED_TYPES if t not in types]
        if not gateway or missing:
            raise ValueError(f"a snapshot needs a gateway and every served type "
                             f"(missing: {', '.join(SHORT[t] for t in missing) or 'none'})")
        with self._changed:
            number = self._numbers.get(gateway, 0) + 1
            self._numbers[gateway] = number
            snapshot = Snapshot(number=number, types=dict(types), meta=meta)
            history = self._snapshots.setdefault(gateway, [])
            history.append(snapshot)
            del history[:-_HISTORY]
            wakes = list(self._subscribers.get(gateway, ()))
            self._changed.notify_all()
        for wake in wakes:
            wake()
        return snapshot

    def snapshot(self, gateway: str) -> Snapshot:
        with self._changed:
            history = self._snapshots.get(gateway)
            if history:
                return history[-1]
            if self._unconfigured is None:
                self._unconfigured = Snapshot(number=0, types=unconfigured_resources())
            return self._unconfigured

    def subscribe(self, gateway: str, wake: Callable[[], None]) -> Callable[[], None]:
        with self._changed:
            self._subscribers.setdefault(gateway, []).append(wake)

        def unsubscribe() -> None:
            with self._changed:
                wakes = self._subscribers.get(gateway, [])
                if wake in wakes:
                    wakes.remove(wake)
        return unsubscribe

    # --- what streams report -----------------------------------------------------------------

    def stream_opened(self, gateway: str, node_id: str, admin_url: str = "") -> int:
        """A stream of `node_id` began; a node that reconnects starts from nothing ACKed
        (a restarted Envoy holds nothing until it ACKs again). `admin_url`: where its admin
        API is read (its node metadata), "" if its bootstrap did not say."""
        with self._changed:
            self._streams += 1
            self._envoys.setdefault(gateway, {})[node_id] = EnvoyState(
                node_id=node_id, gateway=gateway, stream=self._streams, admin_url=admin_url)
            self._changed.notify_all()
            return self._streams

    def stream_closed(self, gateway: str, node_id: str, stream: int) -> None:
        """The stream ended: the Envoy is gone (not failing), unless a newer stream of the
        same node is already live."""
        with self._changed:
            envoy = self._envoys.get(gateway, {}).get(node_id)
            if envoy is not None and envoy.stream == stream:
                envoy.connected = False
                envoy.gone_at = time.time()
            self._changed.notify_all()

    def sent(self, gateway: str, node_id: str, type_url: str, nonce: str, version: str,
             number: int) -> None:
        with self._changed:
            ack = self._ack(gateway, node_id, type_url)
            if ack is None:
                return
            ack.sent_version, ack.sent_number = version, number
            ack.nonces[nonce] = (version, number)
            if len(ack.nonces) > _HISTORY:
                ack.nonces.pop(next(iter(ack.nonces)))

    def answered(self, gateway: str, node_id: str, type_url: str, nonce: str,
                 error: str | None) -> None:
        """Envoy answered the response `nonce`: an ACK (error None) or a NACK with its
        error_detail.message. An unknown nonce (stale) is ignored."""
        with self._changed:
            ack = self._ack(gateway, node_id, type_url)
            if ack is None or nonce not in ack.nonces:
                return
            version, number = ack.nonces[nonce]
            if error is None:
                if number >= ack.acked_number:
                    ack.acked_version, ack.acked_number = version, number
            else:
                ack.nacked_version, ack.nacked_number, ack.error = version, number, error
            self._changed.notify_all()

    def _ack(self, gateway: str, node_id: str, type_url: str) -> TypeAck | None:
        envoy = self._envoys.get(gateway, {}).get(node_id)
        if envoy is None:
            return None
        return envoy.types.setdefault(type_url, TypeAck())

    # --- what callers read -------------------------------------------------------------------

    def envoys(self, gateway: str) -> list[EnvoyState]:
        """Every Envoy of the gateway seen by this store, connected or gone (copies)."""
        with self._changed:
            return [EnvoyState(node_id=e.node_id, gateway=e.gateway, connected=e.connected,
                               connected_at=e.connected_at, gone_at=e.gone_at,
                               stream=e.stream, admin_url=e.admin_url,
                               types={t: TypeAck(**{k: v for k, v in vars(a).items()
                                                    if k != "nonces"})
                                      for t, a in e.types.items()})
                    for _, e in sorted(self._envoys.get(gateway, {}).items())]

    def any_connected(self, gateway: str) -> bool:
        """Is an Envoy of the gateway connected (what `envoys` says, without the copies)?"""
        with self._changed:
            return any(e.connected for e in self._envoys.get(gateway, {}).values())

    def wait_acked(self, gateway: str, number: int, *, timeout_s: float,
                   types: tuple[str, ...] = SERVED_TYPES, min_envoys: int = 1) -> AckResult:
        """Wait until every connected Envoy of `gateway` (at least `min_envoys` of them) holds
        snapshot `number` or a later one for `types`, or one refused it, or `timeout_s`
        passed. An Envoy that disconnects meanwhile no longer counts."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            snapshot = self._find(gateway, number)
            if snapshot is None:
                raise ValueError(f"gateway {gateway} has no snapshot {number} (kept: the last "
                                 f"{_HISTORY})")
            while True:
                result = self._result(gateway, snapshot, types)
                connected = len(result.envoys)
                if result.nacked or (connected >= min_envoys and result.ok):
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    return AckResult(gateway=gateway, number=number, envoys=result.envoys,
                                     timed_out=True)
                self._changed.wait(left)

    def held_meta(self, gateway: str) -> tuple[int, Any] | None:
        """(number, meta) of the newest snapshot every connected Envoy holds for every type;
        (0, None) when the gateway has none (new, or forgotten) and every connected Envoy
        ACKed what it was served; None when no Envoy is connected or they hold none kept."""
        with self._changed:
            live = [e for e in self._envoys.get(gateway, {}).values() if e.connected]
            return held_by(live, self._snapshots.get(gateway, []))

    def forget(self, gateway: str) -> None:
        """Drop the gateway's snapshots (its Envoys are served the unconfigured resources
        again) and the Envoys no longer connected; numbering goes on."""
        with self._changed:
            self._snapshots.pop(gateway, None)
            envoys = self._envoys.get(gateway, {})
            for node_id in [n for n, e in envoys.items() if not e.connected]:
                del envoys[node_id]
            wakes = list(self._subscribers.get(gateway, ()))
            self._changed.notify_all()
        for wake in wakes:
            wake()

    def _find(self, gateway: str, number: int) -> Snapshot | None:
        for snapshot in self._snapshots.get(gateway, []):
            if snapshot.number == number:
                return snapshot
        return None

    def _result(self, gateway: str, snapshot: Snapshot, types: tuple[str, ...]) -> AckResult:
        live = [e for _, e in sorted(self._envoys.get(gateway, {}).items()) if e.connected]
        return ack_result(gateway, snapshot, live, types)


def held_by(live: list[EnvoyState], history: list[Snapshot]) -> tuple[int, Any] | None:
    """(number, meta) of the newest snapshot of `history` (oldest first) every live Envoy
    holds for every type; (0, None) when there is no history and every live Envoy ACKed
    what it was served; None otherwise (or when no Envoy is live)."""
    if not live:
        return None
    for snapshot in reversed(history):
        if all(e.holds(snapshot, t) for e in live for t in SERVED_TYPES):
            return snapshot.number, snapshot.meta
    if not history and all(e.types.get(t) is not None and e.types[t].acked_number >= 0
                           for e in live for t in SERVED_TYPES):
        return 0, None
    return None


def ack_result(gateway: str, snapshot: Snapshot, live: list[EnvoyState],
               types: tuple[str, ...]) -> AckResult:
    """Where each connected Envoy stands with `snapshot` (every store judges alike)."""
    acks = []
    for envoy in live:
        refused = [t for t in types if envoy.refused(snapshot, t)]
        if refused:
            acks.append(EnvoyAck(envoy.node_id, "nacked", "; ".join(
                f"{SHORT.get(t, t)}: {envoy.types[t].error}" for t in refused)))
        elif all(envoy.holds(snapshot, t) for t in types):
            acks.append(EnvoyAck(envoy.node_id, "acked"))
        else:
            acks.append(EnvoyAck(envoy.node_id, "pending"))
    return AckResult(gateway=gateway, number=snapshot.number, envoys=tuple(acks))


_default_lock = threading.Lock()
_default: SnapshotStore | None = None


def default_store() -> SnapshotStore:
    """The store this process's adapters and xDS server use: the shared one (the database,
    woken through Redis: fleetctl/xds/shared.py) unless set_default_store() chose another."""
    global _default
    with _default_lock:
        if _default is None:
            from fleetctl.xds.shared import SharedStore

            _default = SharedStore()
        return _default


def set_default_store(store: SnapshotStore | None) -> None:
    """Make `store` this process's default (None: the shared store again, on next use).
    For in-process tests that keep everything in one MemoryStore."""
    global _default
    with _default_lock:
        _default = store
