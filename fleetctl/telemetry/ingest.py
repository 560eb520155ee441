"""The telemetry ingester: `python -m fleetctl.telemetry.ingest`, as many as you like.

The work is split into shards: the access log of each gateway whose options name one
(`access_log`; shard "log:<gateway>") and the pools' /metrics (shard "scrape", all pools).
An ingester follows the logs of the shards it holds, parses each complete line with its kind's
parser (`registry.find(kind).parse_access_log`, `parse_line(line, endpoints) -> LogRecord |
None`), and adds what it read into 10 s windows per (gateway, route, pool). Every
TELEMETRY_FLUSH_INTERVAL_S it writes each shard's open windows and moves that file's cursor in
one transaction per shard: a restart (or another ingester taking the shard over) resumes from
the cursor and counts every line once. A thread of the process holding the scrape shard
scrapes every pool's /metrics (scrape.py). Reading a file and adding its lines into windows is
follow.py's (Follower, Aggregator).

Following a file:
- a line counts when it is complete (ends with a newline); a partial last line waits;
- a line the parser refuses (ValueError) is counted in the cursor's `malformed`, never fatal;
- rotation (the path now names another inode): what is left of the old file is read from
  the handle still open, then the new file from its start (`rotations`). If the ingester was
  down during the rotation, the old file's unread tail is lost (it is not looked for);
- truncation (the file is shorter than the offset): read again from 0 (`truncations`).

One ingester reads a shard at a time: before reading it, it takes the shard's lease, a Cursor
row (source_name LEASE_SOURCE "_ingester", path "shard:<shard>") claimed with a conditional
UPDATE (free when expired or released, or already ours). That row's fields mean:
`last_counters` = {"owner": "host:pid:random", "until": ISO expiry} (for people and logs),
`updated_at` = the lease's expiry (the column the conditional UPDATE compares), `last_read_at` =
its last renewal. The expiry is 3 flush intervals, at least TELEMETRY_LEASE_MIN_S. Every flush
renews a shard's lease as the first write of the transaction that writes its windows and
cursor: if another ingester took it over meanwhile, nothing of that shard is written, its
in-memory windows and file position are dropped (the new holder reads them again from the
cursor), and the other shards go on.

Balance: every flush an ingester renews its heartbeat (row path "alive:<owner>", expiring as a
lease does; a clean stop deletes it) and counts the live ones; it holds at most
ceil(log shards / live) logs. Beyond that it flushes the excess and lets it go (so a newcomer
gets work); below it takes free logs: released, or orphaned by an ingester that died (its
leases and heartbeat expire together, so the others' quota grows as its shards come free).
The scrape is outside the quota: any ingester that scrapes takes it when it is free (one
started with --no-scrape is live but cannot, and counting the scrape in could leave it to
no one).
Windows of two shards never share a key (a window's source_name is its gateway) and each
add is a locked read-then-add (services.windows_add), so shards flushed at once cannot
overwrite each other. `--once` takes every shard it may hold, or none when a live ingester
holds one (exit status 3).

Memory is bounded by the open windows (one small aggregate per gateway, route, pool and
window start), never by the number of requests.

A request its client abandoned (LogRecord.ended_by "client": each kind's parser says how its
log tells) is counted in `client_disconnects` and nowhere else: not in `requests`, `errors`
or the duration histogram, so anyone who can open a socket to the gateway and hang up cannot
move a pool's error rate or latency. Only its TTFT is kept, when its first body byte came
before the hang-up (see Aggregator.add). A request the pool broke off ("pool") is its error
whatever the status says.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from fleetctl.telemetry.follow import Aggregator, Follower, Parser

log = logging.getLogger("fleetctl.telemetry.ingest")

REFRESH_S = 5.0  # how often the gateways (and their endpoints) are read again
# Every lease and heartbeat is a Cursor row of this source_name (no telemetry source: the
# ingest status leaves them out). path "shard:<shard>": that shard's lease; path
# "alive:<owner>": an ingester's heartbeat.
LEASE_SOURCE = "_ingester"
SHARD_PREFIX, ALIVE_PREFIX = "shard:", "alive:"
SCRAPE_SHARD = "scrape"  # the pools' /metrics, one shard for all of them
# The single lease of ingesters from before shards (path "lease"): while one of those still
# holds it, no shard is taken (an upgrade must not have two ingesters read one log).
OLD_LEASE_PATH = "lease"
EXIT_LEASE_HELD = 3  # --once, when another live ingester holds a shard


def log_shard(gateway: str) -> str:
    """The shard of one gateway's access log."""
    return f"log:{gateway}"


def gateway_of(shard: str) -> str | None:
    """The gateway whose log the shard is (None for the scrape)."""
    return shard.removeprefix("log:") if shard.startswith("log:") else None


class LeaseHeld(RuntimeError):
    """Another live ingester holds a shard (--once needs them all)."""


class LeaseLost(RuntimeError):
    """A flush found a shard's lease taken over by another ingester: it wrote nothing."""


def parser_for(kind: str) -> Parser | None:
    """The kind's access log parser (`registry.find(kind).parse_access_log`); None for kinds
    that do not log (e.g. gateway_api) or are not known."""
    from fleetctl.traffic.gateways import registry

    found = registry.find(kind)
    return None if found is None else found.parse_access_log


_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}
RESOLVE_TTL_S = 60.0


def _addresses(host: str) -> tuple[str, ...]:
    """The IP addresses a host name stands for (cached a minute; none when it does not
    resolve): nginx logs the address it connected to, not the name in the base URL."""
    import ipaddress
    import socket

    try:
        ipaddress.ip_address(host)
        return ()
    except ValueError:
        pass
    now = time.monotonic()
    cached = _resolved.get(host)
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        found = tuple(sorted({str(info[4][0]) for info in socket.getaddrinfo(
            host, None, type=socket.SOCK_STREAM)}))
    except OSError:
        found = ()
    _resolved[host] = (now + RESOLVE_TTL_S, found)
    return found


def endpoints_of(gateway: Any) -> dict[str, str]:
    """"host:port" -> pool name for every pool in the gateway's desired state, by the base
    URL's host and by the addresses it resolves to."""
    from fleetctl.traffic.selectors import gateway_desired_state

    out: dict[str, str] = {}
    for name, pool in gateway_desired_state(gateway=gateway).pools.items():
        for url in pool.base_urls:
            parts = urlsplit(url)
            if parts.hostname:
                port = parts.port or (443 if parts.scheme == "https" else 80)
                out[f"{parts.hostname}:{port}"] = name
                for address in _addresses(parts.hostname):
                    host = f"[{address}]" if ":" in address else address
                    out.setdefault(f"{host}:{port}", name)
    return out


class Ingester:
    """Follows the access logs of the shards it holds, flushes each shard's windows and
    cursor together; with `scrape`, the pools' /metrics is a shard it may hold too (its
    scraper thread runs while `scraping` is set)."""

    def __init__(self, *, window_s: int | None = None, flush_interval_s: float | None = None,
                 parsers: Mapping[str, Parser] | None = None, scrape: bool = False) -> None:
        from django.conf import settings

        self.window_s = int(window_s or settings.TELEMETRY_WINDOW_S)
        self.flush_interval_s = float(flush_interval_s if flush_interval_s is not None
                                      else settings.TELEMETRY_FLUSH_INTERVAL_S)
        self.parsers = dict(parsers or {})
        self.scrape = scrape
        # The logs the gateways name: shard -> (gateway, path, parser, Gateway row).
        self.sources: dict[str, tuple[str, str, Parser, Any]] = {}
        self.held: set[str] = set()  # the shards whose lease is ours
        # Per gateway: where we stand in its file (kept after a clean release: it is what the
        # cursor says then, and a handle still open reads a rotated file's tail), and its
        # open windows.
        self.followers: dict[str, Follower] = {}
        self.aggregators: dict[str, Aggregator] = {}
        self.last_refresh = 0.0
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_s = max(3 * self.flush_interval_s, float(settings.TELEMETRY_LEASE_MIN_S))
        self.lease_wait_s = float(settings.TELEMETRY_LEASE_WAIT_S)
        self.scraping = threading.Event()  # set while this ingester holds the scrape shard
        self.live = 0  # live ingesters at the last balance (this one included)
        self.old_lease_seen = False

    # --- leases and heartbeats -----------------------------------------------------------

    def _lease_values(self, now: datetime) -> dict[str, Any]:
        until = now + timedelta(seconds=self.lease_s)
        return {"last_counters": {"owner": self.owner, "until": until.isoformat()},
                "updated_at": until, "last_read_at": now}

    def shards(self) -> list[str]:
        """The shards this ingester may hold: every followed log, and the scrape."""
        return sorted(self.sources) + ([SCRAPE_SHARD] if self.scrape else [])

    def claim(self, shard: str) -> bool:
        """Take the shard's lease if it is free (expired, released) or already ours; True
        when we hold it. Taking a log shard reads its cursor."""
        from django.db.models import Q

        from fleetctl.telemetry.models import Cursor

        now = datetime.now(tz=UTC)
        path = SHARD_PREFIX + shard
        Cursor.objects.get_or_create(
            source_name=LEASE_SOURCE, path=path,
            defaults={"updated_at": datetime.fromtimestamp(0, tz=UTC),
                      "last_counters": {"owner": "", "until": None}})
        if not Cursor.objects.filter(
                Q(updated_at__lt=now) | Q(last_counters__owner=self.owner),
                source_name=LEASE_SOURCE, path=path).update(**self._lease_values(now)):
            return False
        if shard not in self.held:
            self._take(shard)
            log.info("took shard %s (%s, %.0f s)", shard, self.owner, self.lease_s)
        return True

    def _take(self, shard: str) -> None:
        from fleetctl.telemetry.models import Cursor

        self.held.add(shard)
        if shard == SCRAPE_SHARD:
            self.scraping.set()
        if shard not in self.sources:
            return
        gateway, path, parse, row = self.sources[shard]
        follower = self.followers.get(gateway)
        cursor = Cursor.objects.filter(source_name=gateway, path=path).first()
        stored = ((cursor.inode, cursor.offset, cursor.lines) if cursor is not None
                  else (None, 0, 0))
        if follower is None or follower.path != path or (
                follower.inode, follower.offset, follower.lines) != stored:
            # Someone else read it since (or we never did): start from the cursor.
            if follower is not None:
                follower.close()
            follower = Follower(gateway=gateway, path=path, parse=parse)
            if cursor is not None:
                follower.inode, follower.offset = cursor.inode, cursor.offset
                follower.lines, follower.malformed = cursor.lines, cursor.malformed
                follower.rotations = cursor.rotations
                follower.truncations = cursor.truncations
            self.followers[gateway] = follower
        try:
            follower.endpoints = endpoints_of(row)
        except Exception as exc:  # a route being edited must not stop the logs being read
            log.warning("gateway %s: no endpoint map: %s", gateway, exc)
            follower.endpoints = {}
        self.aggregators[gateway] = Aggregator(self.window_s)

    def _drop(self, shard: str, *, keep_position: bool) -> None:
        """The shard is no longer ours. After a clean release the follower stays (it is at
        the cursor); after a lost lease its position and unflushed windows are dropped."""
        self.held.discard(shard)
        if shard == SCRAPE_SHARD:
            self.scraping.clear()
        if (gateway := gateway_of(shard)) is None:
            return
        self.aggregators.pop(gateway, None)
        if not keep_position and (follower := self.followers.pop(gateway, None)) is not None:
            follower.close()

    def _renew(self, shard: str) -> bool:
        """Inside a shard's flush transaction: renew its lease if it is still ours (the
        UPDATE also locks the row, so no one can take it over before the flush commits)."""
        from fleetctl.telemetry.models import Cursor

        return bool(Cursor.objects.filter(
            source_name=LEASE_SOURCE, path=SHARD_PREFIX + shard,
            last_counters__owner=self.owner,
        ).update(**self._lease_values(datetime.now(tz=UTC))))

    def holder(self, shard: str) -> tuple[str, str]:
        """(owner, until) of the shard's lease as stored, for messages."""
        from fleetctl.telemetry.models import Cursor

        row = Cursor.objects.filter(source_name=LEASE_SOURCE,
                                    path=SHARD_PREFIX + shard).first()
        info = (row.last_counters or {}) if row is not None else {}
        return str(info.get("owner") or "?"), str(info.get("until") or "?")

    def release(self, shards: Iterable[str] | None = None) -> None:
        """Let shards go now (every one we hold by default: a clean stop), so another
        ingester need not wait. Flush first: what was read and not flushed is read again by
        the next holder."""
        from fleetctl.telemetry.models import Cursor

        shards = sorted(self.held if shards is None else set(shards) & self.held)
        if not shards:
            return
        Cursor.objects.filter(
            source_name=LEASE_SOURCE, path__in=[SHARD_PREFIX + s for s in shards],
            last_counters__owner=self.owner,
        ).update(last_counters={"owner": "", "until": None}, updated_at=datetime.now(tz=UTC))
        for shard in shards:
            self._drop(shard, keep_position=True)

    def heartbeat(self) -> int:
        """Say this ingester is alive (for a lease's length) and return how many are (this
        one included); heartbeats long expired are deleted."""
        from fleetctl.telemetry.models import Cursor

        now = datetime.now(tz=UTC)
        path = ALIVE_PREFIX + self.owner
        values = self._lease_values(now)
        if not Cursor.objects.filter(source_name=LEASE_SOURCE, path=path).update(**values):
            Cursor.objects.get_or_create(source_name=LEASE_SOURCE, path=path, defaults=values)
        alive = Cursor.objects.filter(source_name=LEASE_SOURCE, path__startswith=ALIVE_PREFIX)
        alive.filter(updated_at__lt=now - timedelta(seconds=10 * self.lease_s)).delete()
        return max(1, alive.filter(updated_at__gte=now).count())

    def leave(self) -> None:
        """A clean stop: let every shard go and take the heartbeat away, so the others count
        one ingester fewer at once."""
        from fleetctl.telemetry.models import Cursor

        self.release()
        Cursor.objects.filter(source_name=LEASE_SOURCE,
                              path=ALIVE_PREFIX + self.owner).delete()

    def quota(self) -> int:
        """The most log shards this ingester takes: ceil(log shards / live ingesters). The
        scrape is outside it: an ingester started with --no-scrape is live but cannot take
        it, so counting it in would leave the scrape to no one when the quota is full."""
        return math.ceil(len(self.sources) / max(1, self.live))

    def balance(self) -> None:
        """Heartbeat; let go of the log shards beyond our quota (flushed first, so the next
        holder starts where we stopped) and of logs no gateway names any more; take free log
        shards (a newcomer's, released or orphaned: expired) up to the quota, and the scrape
        when it is free and we scrape."""
        from fleetctl.telemetry.models import Cursor

        self.live = self.heartbeat()
        shards = self.shards()
        quota = self.quota()
        gone = self.held - set(shards)
        logs = sorted(self.held - gone - {SCRAPE_SHARD}, reverse=True)
        excess = set(logs[:max(0, len(logs) - quota)])
        if gone or excess:
            self.flush(gone | excess)
            for shard in sorted(excess):
                log.info("letting shard %s go: %d logs, %d live ingesters, at most %d each",
                         shard, len(self.sources), self.live, quota)
            self.release(gone | excess)
        logs_full = len(self.held - {SCRAPE_SHARD}) >= quota
        wanted = [s for s in shards if s not in self.held and (s == SCRAPE_SHARD or not logs_full)]
        if not wanted:
            return
        from django.db.models import Q

        now = datetime.now(tz=UTC)
        taken = {row.path.removeprefix(SHARD_PREFIX) for row in Cursor.objects.filter(
            Q(path__startswith=SHARD_PREFIX) | Q(path=OLD_LEASE_PATH),
            source_name=LEASE_SOURCE, updated_at__gte=now,
        ).exclude(last_counters__owner=self.owner).only("path")}
        if OLD_LEASE_PATH in taken:
            if not self.old_lease_seen:
                log.warning("an ingester from before shards holds the single lease; taking no "
                            "shard until it stops")
                self.old_lease_seen = True
            return
        for shard in wanted:
            if shard in taken:
                continue
            if shard == SCRAPE_SHARD or len(self.held - {SCRAPE_SHARD}) < quota:
                self.claim(shard)

    # --- reading and flushing --------------------------------------------------------------

    def refresh(self) -> None:
        """Read which logs the gateways name now (the endpoint maps of the held ones too)."""
        from fleetctl.traffic.models import Gateway

        wanted: dict[str, tuple[str, str, Parser, Any]] = {}
        for row in Gateway.objects.all():
            path = (row.options or {}).get("access_log")
            if not path:
                continue
            parse = self.parsers.get(row.kind) or parser_for(row.kind)
            if parse is None:
                log.warning("gateway %s: kind %s has no access log parser", row.name, row.kind)
                continue
            wanted[log_shard(row.name)] = (row.name, str(path), parse, row)
        self.sources = wanted
        for gateway, follower in list(self.followers.items()):
            shard = log_shard(gateway)
            source = wanted.get(shard)
            if source is not None and source[1] == follower.path:
                continue
            if shard in self.held:
                self.flush([shard])  # what was read of the old file lands first
            follower.close()
            del self.followers[gateway]
            self.aggregators.pop(gateway, None)
            if source is not None and shard in self.held:
                self._take(shard)  # the gateway names another file now
        for shard in self.held:
            if shard not in wanted or (held := self.followers.get(wanted[shard][0])) is None:
                continue
            held.parse = wanted[shard][2]
            try:
                held.endpoints = endpoints_of(wanted[shard][3])
            except Exception as exc:  # a route being edited must not stop the logs being read
                log.warning("gateway %s: no endpoint map: %s", wanted[shard][0], exc)
                held.endpoints = {}
        self.last_refresh = time.monotonic()

    def poll(self) -> int:
        read = 0
        for gateway, aggregator in list(self.aggregators.items()):
            follower = self.followers.get(gateway)
            if follower is not None:
                read += follower.poll(aggregator)
        return read

    def flush(self, shards: Iterable[str] | None = None) -> int:
        """Per shard we hold (or those of `shards` we hold), one transaction: renew its lease,
        add its open windows and move its cursor. On a database error nothing is lost: the
        windows stay open and the next flush tries again. A shard whose lease is no longer
        ours writes nothing: its open windows and file position are dropped (the new holder
        reads them again from the cursor). Returns the windows written."""
        written = 0
        for shard in sorted(self.held if shards is None else set(shards) & self.held):
            try:
                written += self._flush_shard(shard)
            except LeaseLost:
                owner, until = self.holder(shard)
                log.error("lost shard %s to %s (until %s): dropping what was read since the "
                          "last flush", shard, owner, until)
                self._drop(shard, keep_position=False)
        return written

    def _flush_shard(self, shard: str) -> int:
        from django.db import transaction

        from fleetctl.telemetry.models import Cursor
        from fleetctl.telemetry.services import windows_add

        gateway = gateway_of(shard)
        aggregator = self.aggregators.get(gateway) if gateway is not None else None
        follower = self.followers.get(gateway) if gateway is not None else None
        deltas = aggregator.take() if aggregator is not None else []
        try:
            with transaction.atomic():
                if not self._renew(shard):
                    raise LeaseLost(shard)
                if follower is None:
                    return 0
                windows_add(deltas)
                cursor, _ = Cursor.objects.select_for_update().get_or_create(
                    source_name=follower.gateway, path=follower.path)
                cursor.inode, cursor.offset = follower.inode, follower.offset
                cursor.lines, cursor.malformed = follower.lines, follower.malformed
                cursor.rotations = follower.rotations
                cursor.truncations = follower.truncations
                cursor.last_error = follower.last_error
                cursor.last_read_at = follower.last_read_at
                cursor.updated_at = datetime.now(tz=UTC)
                cursor.save()
        except LeaseLost:
            raise
        except Exception:
            log.exception("flush of shard %s failed; keeping %d windows for the next one",
                          shard, len(deltas))
            if aggregator is not None:
                aggregator.reopen(deltas)
            raise
        return len(deltas)

    def once(self, *, release: bool = True) -> int:
        """Take every shard (LeaseHeld, reading nothing, when another live ingester holds
        one), read everything there is now, flush, let them go, and return the lines read
        (tests, --once)."""
        from fleetctl.telemetry.models import Cursor

        self.refresh()
        old = Cursor.objects.filter(source_name=LEASE_SOURCE, path=OLD_LEASE_PATH,
                                    updated_at__gte=datetime.now(tz=UTC)).first()
        if old is not None:
            raise LeaseHeld("an ingester from before shards (owner {}) holds the single lease "
                            "until {}".format(*((old.last_counters or {}).get(k, "?")
                                                for k in ("owner", "until"))))
        for shard in self.shards():
            if not self.claim(shard):
                self.release()
                owner, until = self.holder(shard)
                raise LeaseHeld(f"another ingester (owner {owner}) holds shard {shard} until "
                                f"{until}")
        try:
            total = 0
            while (n := self.poll()) > 0:
                total += n
            self.flush()
        finally:
            if release:
                self.release()
        return total

    def run(self, stop: threading.Event) -> None:
        """Balance, follow and flush until stop; on a clean stop flush and let everything
        go. A database error (a restart) is retried with a new connection."""
        joined = False
        next_flush = 0.0
        try:
            while not stop.is_set():
                try:
                    if time.monotonic() - self.last_refresh >= REFRESH_S:
                        self.refresh()
                    if time.monotonic() >= next_flush:
                        self.flush()
                        self.balance()
                        next_flush = time.monotonic() + self.flush_interval_s
                        if not joined:
                            log.info("joined the ingesters as %s: %d live, holding %s",
                                     self.owner, self.live, ", ".join(sorted(self.held))
                                     or "no shard yet")
                            joined = True
                except Exception:
                    # A database that restarted leaves a dead connection: drop it, so the
                    # next try connects again (the windows are kept until then).
                    log.exception("could not flush or balance; trying again")
                    self._reconnect()
                    stop.wait(min(1.0, self.lease_wait_s))
                    continue
                read = self.poll()
                if not read:
                    stop.wait(min(0.2, self.flush_interval_s))
            self.flush()
            self.leave()
        finally:
            self.scraping.clear()
            for follower in self.followers.values():
                follower.close()

    @staticmethod
    def _reconnect() -> None:
        from django.db import close_old_connections, connection

        connection.close()
        close_old_connections()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleetctl.telemetry.ingest",
        description="Follow the gateways' access logs and scrape the pools' /metrics into "
                    "telemetry windows.")
    parser.add_argument("--once", action="store_true",
                        help="read what is there, scrape once, flush and exit")
    parser.add_argument("--flush-interval", type=float, default=None,
                        help="seconds between flushes (default TELEMETRY_FLUSH_INTERVAL_S)")
    parser.add_argument("--no-scrape", action="store_true", help="do not scrape /metrics")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    import django

    django.setup()
    from fleetctl.telemetry.scrape import Scraper

    ingester = Ingester(flush_interval_s=args.flush_interval, scrape=not args.no_scrape)
    scraper = None if args.no_scrape else Scraper()
    if args.once:
        try:
            lines = ingester.once(release=False)
        except LeaseHeld as exc:
            log.error("%s; not reading (--once)", exc)
            return EXIT_LEASE_HELD
        try:
            scraped = scraper.scrape_all() if scraper else 0
            if scraper:
                scraper.read_prometheus()
        finally:
            ingester.release()
        log.info("read %d lines, scraped %d pool endpoints", lines, scraped)
        return 0
    stop = threading.Event()
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = None
    if scraper is not None:
        # Only while this ingester holds the scrape shard: one scraper at a time.
        thread = threading.Thread(target=scraper.run, args=(stop,),
                                  kwargs={"only_while": ingester.scraping},
                                  name="scrape", daemon=True)
        thread.start()
    log.info("ingesting (flush every %.1f s)", ingester.flush_interval_s)
    ingester.run(stop)
    if thread is not None:
        thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
