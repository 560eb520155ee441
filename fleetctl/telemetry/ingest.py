"""The telemetry ingester: `python -m fleetctl.telemetry.ingest`.

One process follows the access log of every gateway whose options name one (`access_log`),
parses each complete line with its kind's parser (`registry.find(kind).parse_access_log`,
`parse_line(line, endpoints) -> LogRecord | None`), and adds what it read into 10 s windows per
(gateway, route, pool). Every TELEMETRY_FLUSH_INTERVAL_S it writes the open windows and moves
each file's cursor in the same transaction: a restart resumes from the cursor and counts
every line once. A thread of the same process scrapes every pool's /metrics (scrape.py).
Reading a file and adding its lines into windows is follow.py's (Follower, Aggregator).

Following a file:
- a line counts when it is complete (ends with a newline); a partial last line waits;
- a line the parser refuses (ValueError) is counted in the cursor's `malformed`, never fatal;
- rotation (the path now names another inode): what is left of the old file is read from
  the handle still open, then the new file from its start (`rotations`). If the ingester was
  down during the rotation, the old file's unread tail is lost (it is not looked for);
- truncation (the file is shorter than the offset): read again from 0 (`truncations`).

Only one ingester reads at a time: before it reads anything it takes a lease, a Cursor row
(source_name LEASE_SOURCE "_ingester", path LEASE_PATH "lease") claimed with a conditional
UPDATE (free when expired, or already ours) and renewed by every flush. That row's fields mean:
`last_counters` = {"owner": "host:pid:random", "until": ISO expiry} (for people and logs),
`updated_at` = the lease's expiry (the column the conditional UPDATE compares), `last_read_at` =
its last renewal. The expiry is 3 flush intervals, at least TELEMETRY_LEASE_MIN_S. A second
ingester waits (checking every TELEMETRY_LEASE_WAIT_S) and takes over once the lease expired,
resuming from the cursors. Every flush renews the lease as the first write of the transaction
that writes the windows and cursors: if another ingester took it over meanwhile, nothing is
written, the in-memory windows and file positions are dropped, and the ingester goes back to
waiting.

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
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from fleetctl.telemetry.follow import Aggregator, Follower, Parser

log = logging.getLogger("fleetctl.telemetry.ingest")

REFRESH_S = 5.0  # how often the gateways (and their endpoints) are read again
LEASE_SOURCE, LEASE_PATH = "_ingester", "lease"  # the Cursor row that holds the lease
EXIT_LEASE_HELD = 3  # --once, when another live ingester holds the lease


class LeaseHeld(RuntimeError):
    """Another live ingester holds the lease."""


class LeaseLost(RuntimeError):
    """A flush found the lease taken over by another ingester: it wrote nothing."""


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
    """Follows every gateway's access log, flushes windows and cursors together."""

    def __init__(self, *, window_s: int | None = None, flush_interval_s: float | None = None,
                 parsers: Mapping[str, Parser] | None = None) -> None:
        from django.conf import settings

        self.window_s = int(window_s or settings.TELEMETRY_WINDOW_S)
        self.flush_interval_s = float(flush_interval_s if flush_interval_s is not None
                                      else settings.TELEMETRY_FLUSH_INTERVAL_S)
        self.parsers = dict(parsers or {})
        self.aggregator = Aggregator(self.window_s)
        self.followers: dict[tuple[str, str], Follower] = {}
        self.last_refresh = 0.0
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_s = max(3 * self.flush_interval_s, float(settings.TELEMETRY_LEASE_MIN_S))
        self.lease_wait_s = float(settings.TELEMETRY_LEASE_WAIT_S)
        self.holding = threading.Event()  # set while this ingester holds the lease (run)

    # --- the lease -----------------------------------------------------------------------

    def _lease_values(self, now: datetime) -> dict[str, Any]:
        until = now + timedelta(seconds=self.lease_s)
        return {"last_counters": {"owner": self.owner, "until": until.isoformat()},
                "updated_at": until, "last_read_at": now}

    def claim(self) -> bool:
        """Take the lease if it is free (expired) or already ours; True when we hold it."""
        from django.db.models import Q

        from fleetctl.telemetry.models import Cursor

        now = datetime.now(tz=UTC)
        Cursor.objects.get_or_create(
            source_name=LEASE_SOURCE, path=LEASE_PATH,
            defaults={"updated_at": datetime.fromtimestamp(0, tz=UTC),
                      "last_counters": {"owner": "", "until": None}})
        return bool(Cursor.objects.filter(
            Q(updated_at__lt=now) | Q(last_counters__owner=self.owner),
            source_name=LEASE_SOURCE, path=LEASE_PATH).update(**self._lease_values(now)))

    def _renew(self) -> bool:
        """Inside the flush's transaction: renew the lease if it is still ours (the UPDATE
        also locks the row, so no one can take it over before the flush commits)."""
        from fleetctl.telemetry.models import Cursor

        return bool(Cursor.objects.filter(
            source_name=LEASE_SOURCE, path=LEASE_PATH, last_counters__owner=self.owner,
        ).update(**self._lease_values(datetime.now(tz=UTC))))

    def holder(self) -> tuple[str, str]:
        """(owner, until) of the lease as stored, for messages."""
        from fleetctl.telemetry.models import Cursor

        row = Cursor.objects.filter(source_name=LEASE_SOURCE, path=LEASE_PATH).first()
        info = (row.last_counters or {}) if row is not None else {}
        return str(info.get("owner") or "?"), str(info.get("until") or "?")

    def release(self) -> None:
        """Let the lease go now (a clean stop), so the next ingester need not wait."""
        from fleetctl.telemetry.models import Cursor

        now = datetime.now(tz=UTC)
        Cursor.objects.filter(
            source_name=LEASE_SOURCE, path=LEASE_PATH, last_counters__owner=self.owner,
        ).update(last_counters={"owner": "", "until": None}, updated_at=now)

    def wait_for_lease(self, stop: threading.Event) -> bool:
        """Wait until the lease is ours (True) or stop is set (False)."""
        logged = False
        while not stop.is_set():
            try:
                if self.claim():
                    self.holding.set()
                    log.info("took the ingester lease (%s, %.0f s)", self.owner, self.lease_s)
                    return True
                if not logged:
                    owner, until = self.holder()
                    log.warning("another ingester (owner %s) holds the lease until %s; "
                                "waiting", owner, until)
                    logged = True
            except Exception:
                log.exception("could not read the ingester lease; trying again")
                from django.db import close_old_connections, connection

                connection.close()
                close_old_connections()
            stop.wait(self.lease_wait_s)
        return False

    def _forget(self) -> None:
        """The lease was lost: drop the open windows and the file positions (the cursors
        are read again when the lease is back)."""
        self.holding.clear()
        self.aggregator.open = {}
        for follower in self.followers.values():
            follower.close()
        self.followers = {}
        self.last_refresh = 0.0

    def refresh(self) -> None:
        """Follow the logs the gateways name now (cursor values read once per new file)."""
        from fleetctl.telemetry.models import Cursor
        from fleetctl.traffic.models import Gateway

        wanted: dict[tuple[str, str], tuple[Parser, Any]] = {}
        for gateway in Gateway.objects.all():
            path = (gateway.options or {}).get("access_log")
            if not path:
                continue
            parse = self.parsers.get(gateway.kind) or parser_for(gateway.kind)
            if parse is None:
                log.warning("gateway %s: kind %s has no access log parser", gateway.name,
                            gateway.kind)
                continue
            wanted[(gateway.name, str(path))] = (parse, gateway)
        for key in set(self.followers) - set(wanted):
            self.followers.pop(key).close()
        for key, (parse, gateway) in wanted.items():
            try:
                endpoints = endpoints_of(gateway)
            except Exception as exc:  # a route being edited must not stop the logs being read
                log.warning("gateway %s: no endpoint map: %s", gateway.name, exc)
                endpoints = {}
            follower = self.followers.get(key)
            if follower is None:
                follower = Follower(gateway=key[0], path=key[1], parse=parse)
                cursor = Cursor.objects.filter(source_name=key[0], path=key[1]).first()
                if cursor is not None:
                    follower.inode, follower.offset = cursor.inode, cursor.offset
                    follower.lines, follower.malformed = cursor.lines, cursor.malformed
                    follower.rotations = cursor.rotations
                    follower.truncations = cursor.truncations
                self.followers[key] = follower
            follower.parse = parse
            follower.endpoints = endpoints
        self.last_refresh = time.monotonic()

    def poll(self) -> int:
        return sum(f.poll(self.aggregator) for f in list(self.followers.values()))

    def flush(self) -> int:
        """Renew the lease, add the open windows and move every cursor, in one transaction.
        On a database error nothing is lost: the windows stay open and the next flush tries
        again. If the lease is no longer ours nothing is written: the open windows and file
        positions are dropped and LeaseLost is raised."""
        from django.db import transaction

        from fleetctl.telemetry.models import Cursor
        from fleetctl.telemetry.services import windows_add

        deltas = self.aggregator.take()
        try:
            with transaction.atomic():
                if not self._renew():
                    raise LeaseLost(self.owner)
                windows_add(deltas)
                for follower in self.followers.values():
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
            owner, until = self.holder()
            log.error("lost the ingester lease to %s (until %s): dropping %d unwritten windows "
                      "and going back to waiting", owner, until, len(deltas))
            self._forget()
            raise
        except Exception:
            log.exception("flush failed; keeping %d windows for the next one", len(deltas))
            self.aggregator.reopen(deltas)
            raise
        return len(deltas)

    def once(self, *, release: bool = True) -> int:
        """Take the lease (LeaseHeld when another live ingester holds it), read everything
        there is now, flush, let the lease go, and return the lines read (tests, --once)."""
        if not self.claim():
            raise LeaseHeld("another ingester (owner {}) holds the lease until {}".format(
                *self.holder()))
        try:
            self.refresh()
            total = 0
            while (n := self.poll()) > 0:
                total += n
            self.flush()
        finally:
            if release:
                self.release()
        return total

    def run(self, stop: threading.Event) -> None:
        """Wait for the lease, then follow and flush until stop; back to waiting whenever
        the lease is lost. Lets the lease go on a clean stop."""
        try:
            while self.wait_for_lease(stop):
                self._follow(stop)
        finally:
            self.holding.clear()
            for follower in self.followers.values():
                follower.close()

    def _follow(self, stop: threading.Event) -> None:
        """Follow the logs while the lease is ours; returns when it is lost or on stop."""
        self.last_refresh = 0.0  # refresh (and read the cursors) first
        next_flush = time.monotonic() + self.flush_interval_s
        while not stop.is_set():
            if time.monotonic() - self.last_refresh >= REFRESH_S:
                try:
                    self.refresh()
                except Exception:
                    log.exception("could not read the gateways; trying again")
            read = self.poll()
            if time.monotonic() >= next_flush:
                try:
                    self.flush()
                except LeaseLost:
                    return
                except Exception:
                    # A database that restarted leaves a dead connection: drop it, so the
                    # next flush connects again (the windows are kept until then).
                    from django.db import close_old_connections, connection

                    connection.close()
                    close_old_connections()
                    stop.wait(1.0)
                next_flush = time.monotonic() + self.flush_interval_s
            if not read:
                stop.wait(min(0.2, self.flush_interval_s))
        try:
            self.flush()
        except LeaseLost:
            return
        self.release()


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

    ingester = Ingester(flush_interval_s=args.flush_interval)
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
        # Only while this ingester holds the lease: one scraper at a time.
        thread = threading.Thread(target=scraper.run, args=(stop,),
                                  kwargs={"only_while": ingester.holding},
                                  name="scrape", daemon=True)
        thread.start()
    log.info("ingesting (flush every %.1f s)", ingester.flush_interval_s)
    ingester.run(stop)
    if thread is not None:
        thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
