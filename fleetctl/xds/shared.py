"""The SnapshotStore every process shares: snapshots and ACK state in the database, wake-ups
through Redis pub/sub (docs/xds.md "Several replicas").

Any process may set a snapshot (a web request, a Celery worker): the row is committed, then
`fleetctl:xds:snapshot:<gateway>` is published. Every xDS replica (`manage.py xds_serve`)
listens on those channels in a thread of its own, loads the gateway's new snapshot once,
builds its protos (from the documents the Envoy kind rendered) and wakes that gateway's
streams; it also re-reads the current numbers every `poll_s` seconds, so a lost message
delays a push by at most that, and loses nothing (with Redis down, pushes fail: their lock
is in Redis). What streams report (sent, ACKed, NACKed, opened, closed) is queued to a
writer thread that commits it in batches (the durable record) and then publishes "rows
committed" on `fleetctl:xds:ack:<gateway>`; ACKs, NACKs and closed streams are also
published there at once, ahead of the commit, by a reports thread. `wait_acked` (in the
pushing process, subscribed before the snapshot was made) reads the rows once and applies
those reports. The event loop of the gRPC server never touches the database itself.

A replica writes a heartbeat every HEARTBEAT_S seconds; an Envoy whose replica has not
written one for REPLICA_GONE_S (killed with -9: its streams never closed) counts as gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections, connection, connections, transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from fleetctl.accounts.selectors import secret_hash
from fleetctl.xds.models import XdsEnvoy, XdsGateway, XdsReplica, XdsSnapshot, XdsTypeAck
from fleetctl.xds.protos import SERVED_TYPES, SHORT
from fleetctl.xds.resources import Resources, TypeResources, from_documents
from fleetctl.xds.store import (
    _HISTORY,
    AckResult,
    EnvoyState,
    Snapshot,
    TypeAck,
    ack_result,
    held_by,
    unconfigured_resources,
)

log = logging.getLogger(__name__)

SNAPSHOT_CHANNEL = "fleetctl:xds:snapshot:"
ACK_CHANNEL = "fleetctl:xds:ack:"
HEARTBEAT_S = 2.0
REPLICA_GONE_S = 10.0

_clients: dict[str, redis.Redis] = {}


def redis_client() -> redis.Redis:
    """One client per Redis URL for the process (the URL read at each call, as
    fleetctl.shadow.live does, so tests that override REDIS_URL get their own)."""
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return _clients[url]


def _fresh(read: Callable[..., Any], *args: Any) -> Any:
    """`read(*args)` on this thread's connection, replaced first if it broke (the database
    restarted under a long-running replica)."""
    close_old_connections()
    return read(*args)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SharedStore:
    """A SnapshotStore in the database, woken through Redis; see the module's docstring.
    `poll_s`: how often a replica re-reads the current numbers without a wake-up."""

    def __init__(self, *, replica: str | None = None, poll_s: float = 2.0) -> None:
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._current: dict[str, Snapshot] = {}  # gateways served here: their snapshot
        self._recent: dict[str, Snapshot] = {}  # gateways pushed from here: the last read
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._streams = itertools.count(1)
        self._live: dict[tuple[str, str], int] = {}  # (gateway, node) -> its stream here
        self._nonces: dict[tuple[str, str, str], dict[str, tuple[str, int]]] = {}
        self._writes: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._reports: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._waits = threading.local()  # a pushing thread's ACK subscriptions
        # gateway -> the Envoys as a wait here last saw them (reports the writer may not
        # have committed yet): held_meta reads them over the rows
        self._seen: dict[str, dict[str, EnvoyState]] = {}
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xds-db")
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._unconfigured: Snapshot | None = None

    # --- snapshots (any process) -------------------------------------------------------------

    def set_snapshot(self, gateway: str, types: Resources, meta: Any = None) -> Snapshot:
        missing = [t for t in SERVED_TYPES if t not in types]
        if not gateway or missing:
            raise ValueError(f"a snapshot needs a gateway and every served type "
                             f"(missing: {', '.join(SHORT[t] for t in missing) or 'none'})")
        bare = [SHORT[t] for t in SERVED_TYPES if not types[t].document]
        if bare:
            raise ValueError(f"the shared store keeps documents: {', '.join(bare)} carries "
                             "none (build resources with from_documents)")
        # The pushing thread listens for ACK reports before the snapshot exists, so none
        # that its wait_acked needs can pass unseen.
        self._listen_acks(gateway)
        meta = json.loads(json.dumps(meta))  # as a reader of the row gets it
        documents = {t: types[t].document for t in SERVED_TYPES}
        versions = {t: types[t].version for t in SERVED_TYPES}
        if connection.vendor == "postgresql":
            number = self._insert_snapshot(gateway, documents, versions, meta)
        else:
            with transaction.atomic():
                row, _ = XdsGateway.objects.select_for_update().get_or_create(name=gateway)
                row.number += 1
                row.save(update_fields=["number"])
                number = row.number
                XdsSnapshot.objects.create(gateway=gateway, number=number, meta=meta,
                                           documents=documents, versions=versions)
                XdsSnapshot.objects.filter(gateway=gateway,
                                           number__lte=number - _HISTORY).delete()
        transaction.on_commit(lambda: self._publish(SNAPSHOT_CHANNEL, gateway))
        snapshot = Snapshot(number=number, types={t: types[t] for t in SERVED_TYPES},
                            meta=meta)
        with self._lock:
            self._recent[gateway] = snapshot
        return snapshot

    @staticmethod
    def _insert_snapshot(gateway: str, documents: dict[str, Any], versions: dict[str, str],
                         meta: Any) -> int:
        """The next number, the snapshot row and the pruning of old ones in one statement
        (one round trip, atomic on its own; the gateway row's lock orders pushes)."""
        g, s = XdsGateway._meta.db_table, XdsSnapshot._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH g AS (INSERT INTO {g} (name, number, token_sha256) VALUES (%s, 1, '') "
                f"ON CONFLICT (name) DO UPDATE SET number = {g}.number + 1 "
                f"RETURNING number), "
                f"s AS (INSERT INTO {s} (gateway, number, documents, versions, meta, "
                f"created_at) SELECT %s, g.number, %s::jsonb, %s::jsonb, %s::jsonb, now() "
                f"FROM g RETURNING number), "
                f"d AS (DELETE FROM {s} WHERE gateway = %s "
                f"AND number <= (SELECT number FROM g) - %s) "
                f"SELECT number FROM s",
                [gateway, gateway, json.dumps(documents), json.dumps(versions),
                 None if meta is None else json.dumps(meta), gateway, _HISTORY])
            return int(cursor.fetchone()[0])

    def _listen_acks(self, gateway: str) -> None:
        waiting = getattr(self._waits, "pubsubs", None)
        if waiting is None:
            waiting = self._waits.pubsubs = {}
        old = waiting.pop(gateway, None)
        if old is not None:
            with contextlib.suppress(redis.RedisError):
                old.close()
        with contextlib.suppress(redis.RedisError):
            pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(ACK_CHANNEL + gateway)
            waiting[gateway] = pubsub

    def _ack_listener(self, gateway: str) -> Any:
        """The subscription set_snapshot opened on this thread, else a new one (or None
        with Redis down)."""
        pubsub = getattr(self._waits, "pubsubs", {}).pop(gateway, None)
        if pubsub is not None:
            return pubsub
        with contextlib.suppress(redis.RedisError):
            pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(ACK_CHANNEL + gateway)
        return pubsub

    def snapshot(self, gateway: str) -> Snapshot:
        with self._lock:
            current = self._current.get(gateway)
        if current is not None:
            return current
        if _in_event_loop():  # a stream's first read: the database from a thread
            return self._db.submit(_fresh, self._load, gateway, None).result()
        # A pushing process: the snapshot read last, while it is the newest; else the protos
        # of types whose version did not change are kept.
        with self._lock:
            previous = self._recent.get(gateway)
        if previous is not None and previous.number == (
                XdsSnapshot.objects.filter(gateway=gateway).aggregate(n=Max("number"))["n"]
                or 0):
            return previous
        loaded = self._load(gateway, previous)
        with self._lock:
            self._recent[gateway] = loaded
        return loaded

    def _load(self, gateway: str, previous: Snapshot | None) -> Snapshot:
        row = XdsSnapshot.objects.filter(gateway=gateway).order_by("-number").first()
        if row is None:
            if self._unconfigured is None:
                self._unconfigured = Snapshot(number=0, types=unconfigured_resources())
            return self._unconfigured
        kept = previous.types if previous is not None else None
        return Snapshot(number=row.number, meta=row.meta,
                        types=from_documents(row.documents, kept))

    def subscribe(self, gateway: str, wake: Callable[[], None]) -> Callable[[], None]:
        """A stream of this replica serves `gateway`: keep its snapshot loaded and wake it on
        each new one."""
        self._start()
        with self._lock:
            first = gateway not in self._subscribers
            self._subscribers.setdefault(gateway, []).append(wake)
        if first:
            snapshot = self.snapshot(gateway)
            with self._lock:
                self._current.setdefault(gateway, snapshot)

        def unsubscribe() -> None:
            with self._lock:
                wakes = self._subscribers.get(gateway, [])
                if wake in wakes:
                    wakes.remove(wake)
                if not wakes:
                    self._subscribers.pop(gateway, None)
                    self._current.pop(gateway, None)
        return unsubscribe

    def _reload(self, gateway: str) -> None:
        """A new snapshot (or none) of a gateway served here: load it, then wake its streams."""
        with self._lock:
            if gateway not in self._subscribers:
                return
            previous = self._current.get(gateway)
        snapshot = self._load(gateway, previous)
        with self._lock:
            if previous is not None and snapshot.number == previous.number:
                return
            self._current[gateway] = snapshot
            wakes = list(self._subscribers.get(gateway, ()))
        for wake in wakes:
            wake()

    # --- what streams report (the replica) ---------------------------------------------------

    def stream_opened(self, gateway: str, node_id: str, admin_url: str = "") -> int:
        self._start()
        stream = next(self._streams)
        with self._lock:
            self._live[(gateway, node_id)] = stream
            for type_url in SERVED_TYPES:
                self._nonces.pop((gateway, node_id, type_url), None)
        self._writes.put(("open", gateway, node_id, stream, timezone.now(), admin_url))
        return stream

    def stream_closed(self, gateway: str, node_id: str, stream: int) -> None:
        with self._lock:
            if self._live.get((gateway, node_id)) == stream:
                del self._live[(gateway, node_id)]
        self._writes.put(("close", gateway, node_id, stream, timezone.now()))
        self._reports.put(("close", gateway, node_id, stream))

    def sent(self, gateway: str, node_id: str, type_url: str, nonce: str, version: str,
             number: int) -> None:
        with self._lock:
            stream = self._live.get((gateway, node_id))
            if stream is None:
                return
            nonces = self._nonces.setdefault((gateway, node_id, type_url), {})
            nonces[nonce] = (version, number)
            if len(nonces) > _HISTORY:
                nonces.pop(next(iter(nonces)))
        self._writes.put(("sent", gateway, node_id, stream, type_url, version, number))

    def answered(self, gateway: str, node_id: str, type_url: str, nonce: str,
                 error: str | None) -> None:
        with self._lock:
            stream = self._live.get((gateway, node_id))
            sent = self._nonces.get((gateway, node_id, type_url), {}).get(nonce)
        if stream is None or sent is None:
            return
        self._writes.put(("answer", gateway, node_id, stream, type_url, *sent, error))
        self._reports.put(("answer", gateway, node_id, stream, type_url, *sent, error))

    # --- pushes ------------------------------------------------------------------------------

    @contextmanager
    def push_lock(self, gateway: str, timeout_s: float) -> Iterator[None]:
        """One push of `gateway` at a time, whichever process makes it (a Redis lock that
        expires after `timeout_s` should its holder die)."""
        lock = redis_client().lock(f"fleetctl:xds:push:{gateway}", timeout=timeout_s,
                                   blocking_timeout=timeout_s)
        try:
            acquired = lock.acquire()
        except redis.RedisError as exc:
            raise TimeoutError(f"cannot take the push lock of gateway {gateway}: {exc}") \
                from exc
        if not acquired:
            raise TimeoutError(f"another push of gateway {gateway} held it for "
                               f"{timeout_s:g} s")
        try:
            yield
        finally:
            # A snapshot set and never waited for (no Envoy connected, a NACK's restore):
            # its ACK subscription ends with the push.
            unread = getattr(self._waits, "pubsubs", {}).pop(gateway, None)
            with contextlib.suppress(redis.RedisError):
                if unread is not None:
                    unread.close()
            with contextlib.suppress(redis.RedisError):  # expired: the next push took it
                lock.release()

    # --- tokens ------------------------------------------------------------------------------

    def gateway_of_token(self, secret: str) -> str | None:
        def find() -> str | None:
            return (XdsGateway.objects.filter(token_sha256=secret_hash(secret))
                    .values_list("name", flat=True).first())
        if not secret:
            return None
        return self._db.submit(_fresh, find).result() if _in_event_loop() else find()

    # --- what callers read (any process) -----------------------------------------------------

    def envoys(self, gateway: str) -> list[EnvoyState]:
        return envoy_states(gateway)

    def any_connected(self, gateway: str) -> bool:
        """Is an Envoy of the gateway connected, as envoy_states counts them (its stream open
        on a replica whose heartbeat is fresh)? One EXISTS, not every Envoy's ACK rows: a
        push asks before it sets a snapshot."""
        alive_after = timezone.now() - timedelta(seconds=REPLICA_GONE_S)
        return XdsEnvoy.objects.filter(
            gateway=gateway, gone_at__isnull=True,
            replica__in=XdsReplica.objects.filter(heartbeat_at__gte=alive_after)
            .values("name")).exists()

    def wait_acked(self, gateway: str, number: int, *, timeout_s: float,
                   types: tuple[str, ...] = SERVED_TYPES, min_envoys: int = 1) -> AckResult:
        """As MemoryStore.wait_acked. The ACK rows are read once; the replicas' reports
        (what each Envoy ACKed or NACKed, which stream closed) come in the messages of the
        gateway's ACK channel and are applied to what was read, so an ACK costs no read.
        The rows are read again when a replica says it committed reports (a report
        published before this thread listened is in them) and, with no message for 0.2 s,
        should one be lost."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            recent = self._recent.get(gateway)
        if recent is not None and recent.number == number:
            snapshot = recent
        else:
            found = snapshot_history(gateway, number=number, meta=False)
            if not found:
                raise ValueError(f"gateway {gateway} has no snapshot {number} (kept: the "
                                 f"last {_HISTORY})")
            snapshot = found[0]
        pubsub = self._ack_listener(gateway)
        reports: list[dict[str, Any]] = []  # every one received, applied again after a read
        try:
            live = _connected(self.envoys(gateway))
            while True:
                result = ack_result(gateway, snapshot, list(live.values()), types)
                if result.nacked or (len(result.envoys) >= min_envoys and result.ok):
                    with self._lock:
                        self._seen[gateway] = live
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    return AckResult(gateway=gateway, number=number, envoys=result.envoys,
                                     timed_out=True)
                wait = min(left, 0.2)
                if pubsub is None:
                    time.sleep(min(wait, 0.02))
                    live = _connected(self.envoys(gateway))
                    continue
                reread = False
                try:
                    message = pubsub.get_message(timeout=wait)
                    reread = message is None
                    while message is not None:  # every queued one, then decide
                        data = message["data"]
                        if data in (b"1", "1"):
                            reread = True
                        else:
                            report = json.loads(data)
                            reports.append(report)
                            _apply_report(live, report)
                        message = pubsub.get_message(timeout=0)
                except redis.RedisError:
                    pubsub, reread = None, True
                if reread:
                    live = _connected(self.envoys(gateway))
                    for report in reports:
                        _apply_report(live, report)
        finally:
            if pubsub is not None:
                with contextlib.suppress(redis.RedisError):
                    pubsub.close()

    def held_meta(self, gateway: str) -> tuple[int, Any] | None:
        """What every connected Envoy holds: from the rows, and the reports a wait here
        received for the same streams (ACKs the replica's writer may not have committed)."""
        live = [e for e in self.envoys(gateway) if e.connected]
        with self._lock:
            seen = self._seen.get(gateway, {})
        for envoy in live:
            known = seen.get(envoy.node_id)
            if known is None or (known.replica, known.stream) != (envoy.replica, envoy.stream):
                continue
            for type_url, ack in known.types.items():
                row = envoy.types.get(type_url)
                if row is None or row.acked_number < ack.acked_number:
                    envoy.types[type_url] = ack
        if not live:
            return None
        held = held_by(live, snapshot_history(gateway, meta=False))
        if held is None or held[0] == 0:
            return held
        with self._lock:
            recent = self._recent.get(gateway)
        if recent is not None and recent.number == held[0]:  # pushed from here: no read
            return held[0], recent.meta
        return held[0], XdsSnapshot.objects.filter(gateway=gateway, number=held[0]).values_list(
            "meta", flat=True).first()

    def forget(self, gateway: str) -> None:
        """Drop the gateway's snapshots and its Envoys no longer connected; numbering (and
        its token) stay."""
        gone = {e.node_id for e in self.envoys(gateway) if not e.connected}
        with transaction.atomic():
            XdsSnapshot.objects.filter(gateway=gateway).delete()
            XdsEnvoy.objects.filter(gateway=gateway, node_id__in=gone).delete()
            transaction.on_commit(lambda: self._publish(SNAPSHOT_CHANNEL, gateway))

    # --- the replica's threads ---------------------------------------------------------------

    def _publish(self, prefix: str, gateway: str) -> None:
        try:
            redis_client().publish(prefix + gateway, "1")
        except redis.RedisError as exc:  # replicas still poll; waiters re-read rows
            log.warning("xds: cannot publish %s%s: %s", prefix, gateway, exc)

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._threads = [threading.Thread(target=self._write_loop, daemon=True,
                                              name="xds-writer"),
                             threading.Thread(target=self._report_loop, daemon=True,
                                              name="xds-reports"),
                             threading.Thread(target=self._listen_loop, daemon=True,
                                              name="xds-listener")]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the threads once what was queued is written (tests; a replica's end)."""
        self._stopping.set()
        self._writes.put(None)
        self._reports.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        self._db.submit(connections.close_all)
        self._db.shutdown(wait=True)

    def _heartbeat(self) -> None:
        XdsReplica.objects.update_or_create(name=self.replica,
                                            defaults={"heartbeat_at": timezone.now()})

    def _write_loop(self) -> None:
        envoys: dict[tuple[str, str, int], int] = {}  # (gateway, node, stream) -> row id
        beat = 0.0
        while True:
            batch: list[tuple[Any, ...] | None] = []
            with contextlib.suppress(queue.Empty):
                batch.append(self._writes.get(timeout=HEARTBEAT_S / 2))
            with contextlib.suppress(queue.Empty):
                while len(batch) < 500:
                    batch.append(self._writes.get_nowait())
            ending = None in batch
            beat_due = time.monotonic() - beat >= HEARTBEAT_S
            touched: set[str] = set()
            for attempt in range(3 if batch or beat_due else 0):
                try:  # a dropped database connection: reconnect and write the batch again
                    close_old_connections()
                    touched = self._write_batch(batch, envoys, beat_due=beat_due)
                    if beat_due:
                        beat = time.monotonic()
                    break
                except Exception:
                    log.exception("xds: writing %d stream report(s) failed (attempt %d of 3)",
                                  len(batch), attempt + 1)
                    connections.close_all()
                    self._stopping.wait(0.5 * (attempt + 1))
            for gateway in touched:
                self._publish(ACK_CHANNEL, gateway)
            if ending:
                connections.close_all()  # this thread's
                return

    def _write_batch(self, batch: Sequence[tuple[Any, ...] | None],
                     envoys: dict[tuple[str, str, int], int], *, beat_due: bool) -> set[str]:
        """One transaction: the heartbeat when due, then the reports in order; the gateways
        whose waiters should read again."""
        touched: set[str] = set()
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Reports are made again by the Envoys on a reconnect: not worth waiting for
                # the WAL flush of each batch.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO OFF")
            if beat_due:
                self._heartbeat()
            locked: dict[tuple[int, int], bool] = {}  # this transaction's record locks
            run: list[tuple[Any, ...]] = []  # sent and answered, written together
            for op in batch:
                if op is None:
                    continue
                if op[0] in ("sent", "answer"):
                    run.append(op)
                else:  # an open or close orders the reports around it
                    self._apply_run(run, envoys, locked)
                    run = []
                    self._apply(op, envoys, locked)
                if op[0] != "sent":  # what a waiter's verdict can change with
                    touched.add(op[1])
            self._apply_run(run, envoys, locked)
        return touched

    def _apply_run(self, run: list[tuple[Any, ...]],
                   envoys: dict[tuple[str, str, int], int],
                   locked: dict[tuple[int, int], bool]) -> None:
        """Reports (sent, answered) with no open or close between them, as `_apply` writes
        them one by one, in three statements: the Envoys' rows locked (those still this
        stream's), the sent versions upserted, then the ACKs and NACKs. A push to 100 Envoys
        wrote 400 statements one by one, and the replica's CPU went on it."""
        if connection.vendor != "postgresql" or len(run) < 2:
            for op in run:
                self._apply(op, envoys, locked)
            return
        wanted = {(envoys[key], op[3]) for op in run if (key := tuple(op[1:4])) in envoys}
        if not wanted:
            return
        # Locked as _apply locks each (in id order here), once per record and transaction
        # (`locked`): another replica's "open" of a newer stream waits for this transaction,
        # then clears what it wrote.
        unlooked = sorted({pk for pk, stream in wanted if (pk, stream) not in locked})
        if unlooked:
            found = set(XdsEnvoy.objects.select_for_update().filter(
                pk__in=unlooked, replica=self.replica).order_by("pk").values_list(
                "pk", "stream"))
            for key in wanted:
                if key[0] in unlooked:
                    locked[key] = key in found
        mine = {key for key in wanted if locked.get(key)}
        sent: dict[tuple[int, str], tuple[str, int]] = {}
        acked: dict[tuple[int, str], tuple[str, int]] = {}
        nacked: dict[tuple[int, str], tuple[str, int, str]] = {}
        for op in run:
            kind, gateway, node_id, stream = op[:4]
            envoy_id = envoys.get((gateway, node_id, stream))
            if envoy_id is None:
                continue
            if (envoy_id, stream) not in mine:  # the Envoy is live elsewhere now
                envoys.pop((gateway, node_id, stream), None)
                continue
            type_url, version, number = op[4:7]
            key = (envoy_id, type_url)
            if kind == "sent":
                sent[key] = (version, number)
            elif op[7] is not None:
                nacked[key] = (version, number, op[7])
            elif key not in acked or acked[key][1] <= number:  # as the guarded UPDATEs
                acked[key] = (version, number)
        table = XdsTypeAck._meta.db_table
        with connection.cursor() as cursor:
            if sent:
                cursor.execute(
                    f"INSERT INTO {table} (envoy_id, type_url, sent_version, sent_number, "
                    f"acked_version, acked_number, nacked_version, nacked_number, error) "
                    f"VALUES {', '.join(['(%s, %s, %s, %s, %s, -1, %s, -1, %s)'] * len(sent))} "
                    f"ON CONFLICT (envoy_id, type_url) DO UPDATE SET "
                    f"sent_version = EXCLUDED.sent_version, sent_number = EXCLUDED.sent_number",
                    [v for (envoy_id, type_url), (version, number) in sent.items()
                     for v in (envoy_id, type_url, version, number, "", "", "")])
            if acked:
                cursor.execute(
                    f"UPDATE {table} AS t SET acked_version = v.version, "
                    f"acked_number = v.number FROM (VALUES "
                    f"{', '.join(['(%s::bigint, %s::text, %s::text, %s::integer)'] * len(acked))}"
                    f") AS v (envoy_id, type_url, version, number) WHERE t.envoy_id = "
                    f"v.envoy_id AND t.type_url = v.type_url AND t.acked_number <= v.number",
                    [v for (envoy_id, type_url), (version, number) in acked.items()
                     for v in (envoy_id, type_url, version, number)])
            if nacked:
                row = "(%s::bigint, %s::text, %s::text, %s::integer, %s::text)"
                cursor.execute(
                    f"UPDATE {table} AS t SET nacked_version = v.version, "
                    f"nacked_number = v.number, error = v.error FROM (VALUES "
                    f"{', '.join([row] * len(nacked))}) AS v (envoy_id, type_url, version, "
                    f"number, error) WHERE t.envoy_id = v.envoy_id AND t.type_url = "
                    f"v.type_url",
                    [v for (envoy_id, type_url), fields in nacked.items()
                     for v in (envoy_id, type_url, *fields)])

    def _apply(self, op: tuple[Any, ...], envoys: dict[tuple[str, str, int], int],
               locked: dict[tuple[int, int], bool]) -> None:
        """One report, in the batch's transaction. `locked`: (record, stream) -> whether the
        Envoy's record was this stream's when this transaction locked it; a lock holds until
        the commit, so one look per record and batch serves every report under it (a
        storm's 100 Envoys are 700 reports)."""
        kind, gateway, node_id, stream = op[:4]
        if kind == "open":
            newer = XdsEnvoy.objects.select_for_update().filter(
                gateway=gateway, node_id=node_id, connected_at__gt=op[4]).exists()
            if newer:
                # The Envoy opened a stream since (on another replica, whose record landed
                # first): this writer's late "open" must not take the record back, or the
                # old stream's ACKs would count for an Envoy that has not ACKed again.
                return
            row, _ = XdsEnvoy.objects.update_or_create(
                gateway=gateway, node_id=node_id,
                defaults={"replica": self.replica, "stream": stream, "connected_at": op[4],
                          "gone_at": None, "admin_url": op[5]})
            XdsTypeAck.objects.filter(envoy=row).delete()
            envoys[(gateway, node_id, stream)] = row.pk
            for key in [k for k in locked if k[0] == row.pk]:  # the record's stream changed
                del locked[key]
            locked[(row.pk, stream)] = True  # update_or_create locked it
            return
        if kind == "close":
            envoys.pop((gateway, node_id, stream), None)
            XdsEnvoy.objects.filter(gateway=gateway, node_id=node_id, replica=self.replica,
                                    stream=stream).update(gone_at=op[4])
            return
        envoy_id = envoys.get((gateway, node_id, stream))
        if envoy_id is None:
            return
        type_url, version, number = op[4:7]
        # Only while the row is still this stream's: the Envoy may be live elsewhere now. The
        # row is locked while this transaction writes under it, so another replica's "open"
        # of a newer stream waits for it and then clears what it wrote (without the lock,
        # ACK rows inserted here landed under the newer stream's record, uncleared).
        mine = locked.get((envoy_id, stream))
        if mine is None:
            mine = locked[(envoy_id, stream)] = bool(list(
                XdsEnvoy.objects.select_for_update().filter(
                    pk=envoy_id, replica=self.replica, stream=stream).values_list(
                    "pk", flat=True)[:1]))
        if not mine:
            envoys.pop((gateway, node_id, stream), None)
            return
        acks = XdsTypeAck.objects.filter(envoy_id=envoy_id, type_url=type_url)
        if kind == "sent":  # one upsert: the row is new after each "open"
            XdsTypeAck.objects.bulk_create(
                [XdsTypeAck(envoy_id=envoy_id, type_url=type_url, sent_version=version,
                            sent_number=number)],
                update_conflicts=True, unique_fields=["envoy", "type_url"],
                update_fields=["sent_version", "sent_number"])
            return
        error = op[7]
        if error is None:
            acks.filter(acked_number__lte=number).update(acked_version=version,
                                                         acked_number=number)
        else:
            acks.update(nacked_version=version, nacked_number=number, error=error)

    def _report_loop(self) -> None:
        """Publish what streams report (ACKs, NACKs, closed streams) at once, ahead of the
        writer's commit: one message per gateway for what queued meanwhile, one pipeline."""
        while True:
            batch = [self._reports.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 1000:
                    batch.append(self._reports.get_nowait())
            by_gateway: dict[str, dict[str, Any]] = {}
            for op in batch:
                if op is None:
                    continue
                report = by_gateway.setdefault(op[1], {"replica": self.replica, "acks": [],
                                                       "closed": []})
                if op[0] == "close":
                    report["closed"].append([op[2], op[3]])
                else:
                    report["acks"].append(list(op[2:]))
            if by_gateway:
                try:
                    pipe = redis_client().pipeline(transaction=False)
                    for gateway, report in by_gateway.items():
                        pipe.publish(ACK_CHANNEL + gateway, json.dumps(report))
                    pipe.execute()
                except redis.RedisError as exc:  # the writer's commits still wake waiters
                    log.warning("xds: cannot publish ACK reports: %s", exc)
            if None in batch:
                return

    def _listen_loop(self) -> None:
        pubsub = None
        polled = 0.0
        while not self._stopping.is_set():
            try:
                if pubsub is None:
                    pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
                    pubsub.psubscribe(SNAPSHOT_CHANNEL + "*")
                    polled = 0.0  # (re)subscribed: whatever was missed is read below
                message = pubsub.get_message(timeout=min(self.poll_s, 0.5))
                if message is not None:
                    channel = message["channel"]
                    if isinstance(channel, bytes):
                        channel = channel.decode()
                    close_old_connections()
                    self._reload(channel[len(SNAPSHOT_CHANNEL):])
            except redis.RedisError as exc:
                log.warning("xds: Redis wake-ups lost (%s); polling every %g s", exc,
                            self.poll_s)
                with contextlib.suppress(Exception):
                    if pubsub is not None:
                        pubsub.close()
                pubsub = None
                self._stopping.wait(self.poll_s)
            except Exception:
                log.exception("xds: reloading a snapshot failed")
            if time.monotonic() - polled >= self.poll_s:
                polled = time.monotonic()
                with contextlib.suppress(Exception):
                    self._poll()
        connections.close_all()  # this thread's
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()

    def _poll(self) -> None:
        """Reload each served gateway whose newest snapshot is not the one held."""
        with self._lock:
            held = {g: s.number for g, s in self._current.items()}
        if not held:
            return
        close_old_connections()
        newest = dict(XdsSnapshot.objects.filter(gateway__in=list(held)).values("gateway")
                      .annotate(n=Max("number")).values_list("gateway", "n"))
        for gateway, number in held.items():
            if newest.get(gateway, 0) != number:
                self._reload(gateway)



def envoy_states(gateway: str) -> list[EnvoyState]:
    """Every Envoy of the gateway recorded by any replica, connected or gone: connected
    while its stream is open on a replica whose heartbeat is fresh. One query (the Envoys
    joined to their ACK rows), no model instances."""
    alive_after = timezone.now() - timedelta(seconds=REPLICA_GONE_S)
    rows = (XdsEnvoy.objects.filter(gateway=gateway)
            .annotate(alive=Exists(XdsReplica.objects.filter(
                name=OuterRef("replica"), heartbeat_at__gte=alive_after)))
            .order_by("node_id")
            .values_list("pk", "node_id", "replica", "stream", "connected_at", "gone_at",
                         "alive", "admin_url", "acks__type_url", "acks__sent_version",
                         "acks__sent_number", "acks__acked_version", "acks__acked_number",
                         "acks__nacked_version", "acks__nacked_number", "acks__error"))
    out: dict[int, EnvoyState] = {}
    for (pk, node_id, replica, stream, connected_at, gone_at, alive, admin_url, type_url,
         sent_version, sent_number, acked_version, acked_number, nacked_version,
         nacked_number, error) in rows:
        envoy = out.get(pk)
        if envoy is None:
            connected = gone_at is None and bool(alive)
            gone = gone_at or (None if connected else connected_at)
            envoy = out[pk] = EnvoyState(
                node_id=node_id, gateway=gateway, connected=connected, replica=replica,
                connected_at=connected_at.timestamp(),
                gone_at=gone.timestamp() if isinstance(gone, datetime) else None,
                stream=stream, admin_url=admin_url, types={})
        if type_url is not None:
            envoy.types[type_url] = TypeAck(
                sent_version=sent_version, sent_number=sent_number,
                acked_version=acked_version, acked_number=acked_number,
                nacked_version=nacked_version, nacked_number=nacked_number, error=error)
    return list(out.values())


def _connected(envoys: list[EnvoyState]) -> dict[str, EnvoyState]:
    return {e.node_id: e for e in envoys if e.connected}


def _apply_report(live: dict[str, EnvoyState], report: dict[str, Any]) -> None:
    """A replica's published reports on the Envoys read from the rows, as its writer will
    write them: only on the stream the row names (the Envoy may be live elsewhere now)."""
    replica = report.get("replica")
    for node_id, stream in report.get("closed", ()):
        envoy = live.get(node_id)
        if envoy is not None and envoy.replica == replica and envoy.stream == stream:
            del live[node_id]
    for node_id, stream, type_url, version, number, error in report.get("acks", ()):
        envoy = live.get(node_id)
        if envoy is None or envoy.replica != replica or envoy.stream != stream:
            continue
        ack = envoy.types.setdefault(type_url, TypeAck())
        if error is None:
            if ack.acked_number <= number:
                ack.acked_version, ack.acked_number = version, number
        else:
            ack.nacked_version, ack.nacked_number, ack.error = version, number, error


def snapshot_history(gateway: str, *, number: int | None = None,
                     meta: bool = True) -> list[Snapshot]:
    """The gateway's kept snapshots (or the one numbered `number`), oldest first: numbers,
    versions and (unless meta=False) meta; no protos."""
    rows = XdsSnapshot.objects.filter(gateway=gateway).order_by("number")
    if number is not None:
        rows = rows.filter(number=number)
    fields = ("number", "versions", "meta") if meta else ("number", "versions")
    return [Snapshot(number=row[0], meta=row[2] if meta else None, types={
                t: TypeResources(version=v, resources=()) for t, v in row[1].items()})
            for row in rows.values_list(*fields)]
