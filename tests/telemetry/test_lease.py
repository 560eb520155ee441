"""Sharded ingestion: one lease per shard (a gateway's log, the pools' scrape), each a Cursor
row taken before reading and renewed by the flush that writes that shard's windows and
cursor; heartbeats say how many ingesters are alive, and none takes more than
ceil(shards / live) shards."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetctl.telemetry.ingest import (
    ALIVE_PREFIX,
    EXIT_LEASE_HELD,
    LEASE_SOURCE,
    SCRAPE_SHARD,
    SHARD_PREFIX,
    Ingester,
    LeaseHeld,
    log_shard,
    main,
)
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.traffic.models import Gateway
from tests.telemetry.lines import envoy_line

T0 = 1_800_000_000.0

pytestmark = pytest.mark.django_db


def _gateways(tmp_path: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        path = tmp_path / f"access-{i}.log"
        path.touch()
        Gateway.objects.create(name=f"gw-{i}", kind="envoy", admin_address="http://127.0.0.1:1",
                               options={"access_log": str(path)})
        paths.append(path)
    return paths


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    return _gateways(tmp_path, 1)[0]


def _write(path: Path, n: int) -> None:
    with open(path, "ab") as fp:
        fp.write(b"".join(envoy_line(start=T0 + i % 10) for i in range(n)))


def _requests() -> int:
    return sum(Window.objects.values_list("requests", flat=True))


def _lines() -> int:
    return sum(Cursor.objects.exclude(source_name=LEASE_SOURCE).values_list("lines", flat=True))


def _expire(owner: str | None = None) -> None:
    """The holder stopped renewing (killed, paused) long enough for its leases (and its
    heartbeat) to expire: every holder's, or one owner's."""
    rows = Cursor.objects.filter(source_name=LEASE_SOURCE)
    if owner is not None:
        rows = rows.filter(last_counters__owner=owner)
    rows.update(updated_at=datetime.now(tz=UTC) - timedelta(seconds=1))


def _follow(ingester: Ingester) -> int:
    ingester.refresh()
    total = 0
    while (n := ingester.poll()) > 0:
        total += n
    ingester.flush()
    return total


def _owners() -> dict[str, str]:
    """shard -> owner of every live lease."""
    now = datetime.now(tz=UTC)
    return {row.path.removeprefix(SHARD_PREFIX): row.last_counters["owner"]
            for row in Cursor.objects.filter(source_name=LEASE_SOURCE,
                                             path__startswith=SHARD_PREFIX, updated_at__gte=now)}


def test_a_shard_lease_row_names_its_owner_and_expiry(log_file: Path) -> None:
    a = Ingester(window_s=10, flush_interval_s=1.0)
    assert a.lease_s == 10.0  # 3 flush intervals, at least 10 s
    a.refresh()
    assert a.shards() == [log_shard("gw-0")]
    assert a.claim("log:gw-0") and a.held == {"log:gw-0"}
    row = Cursor.objects.get(source_name=LEASE_SOURCE, path="shard:log:gw-0")
    assert row.last_counters["owner"] == a.owner and a.owner.count(":") == 2
    assert datetime.fromisoformat(row.last_counters["until"]) == row.updated_at
    assert a.claim("log:gw-0")  # renewing our own lease
    b = Ingester(window_s=10)
    b.refresh()
    assert not b.claim("log:gw-0") and b.held == set()
    a.release()
    assert a.held == set()
    assert b.claim("log:gw-0")  # released: the next one need not wait
    assert Ingester(scrape=True).shards() == [SCRAPE_SHARD]  # no gateway read yet


def test_two_ingesters_over_one_log_count_every_line_once(log_file: Path) -> None:
    a, b = Ingester(window_s=10), Ingester(window_s=10)
    _write(log_file, 5)
    a.refresh()
    b.refresh()
    assert a.claim("log:gw-0") and not b.claim("log:gw-0")
    assert _follow(a) == 5
    with pytest.raises(LeaseHeld, match=f"owner {a.owner}.* holds shard log:gw-0"):
        b.once()
    _write(log_file, 3)
    assert _follow(a) == 3
    assert (_requests(), _lines()) == (8, 8)
    # a stops renewing (killed): once its lease expired, b takes over from the cursor.
    _write(log_file, 4)
    assert not b.claim("log:gw-0")
    _expire()
    assert b.claim("log:gw-0")
    assert _follow(b) == 4
    assert (_requests(), _lines()) == (12, 12)
    with pytest.raises(LeaseHeld):
        a.once()
    assert a.held == set()  # --once let go of what it had claimed before giving up


def test_a_flush_after_losing_a_shard_writes_nothing_of_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = _gateways(tmp_path, 2)
    a, b = Ingester(window_s=10), Ingester(window_s=10)
    a.refresh()
    b.refresh()
    _write(paths[0], 3)
    assert a.claim("log:gw-0") and a.claim("log:gw-1") and _follow(a) == 3
    _write(paths[0], 6)
    _write(paths[1], 2)
    a.refresh()
    assert a.poll() == 8  # read, not yet flushed
    _expire(a.owner)  # a was paused longer than its leases ...
    assert b.claim("log:gw-0")  # ... and b took one of them over
    assert a.claim("log:gw-1")  # (a renews the other in time)
    with caplog.at_level(logging.ERROR, logger="fleetctl.telemetry.ingest"):
        a.flush()
    assert f"lost shard log:gw-0 to {b.owner}" in caplog.text
    # gw-0's windows and cursor did not move; gw-1's did, in its own transaction.
    assert Cursor.objects.get(source_name="gw-0").lines == 3
    assert Cursor.objects.get(source_name="gw-1").lines == 2
    assert (_requests(), _lines()) == (5, 5)
    assert a.held == {"log:gw-1"} and "gw-0" not in a.followers
    assert "gw-0" not in a.aggregators
    assert _follow(b) == 6  # b reads from the cursor: the 6 lines counted once
    assert (_requests(), _lines()) == (11, 11)
    assert _owners() == {"log:gw-0": b.owner, "log:gw-1": a.owner}


def test_each_takes_at_most_ceil_shards_over_live_a_newcomer_gets_work_orphans_are_taken(
        tmp_path: Path) -> None:
    paths = _gateways(tmp_path, 5)
    a, b, c = (Ingester(window_s=10) for _ in range(3))
    for path in paths:
        _write(path, 10)
    a.refresh()
    a.balance()  # alone: every shard
    assert (a.live, len(a.held)) == (1, 5)
    a.poll()  # read, not yet flushed: letting a shard go flushes it first
    b.refresh()
    b.balance()  # two live: at most 3 each, but a holds all 5 for now
    assert (b.live, b.quota(), b.held) == (2, 3, set())
    a.balance()  # a sees two live and lets 2 go
    assert (a.quota(), len(a.held)) == (3, 3)
    b.balance()
    assert len(b.held) == 2 and not a.held & b.held
    assert _lines() == 20  # the two let go were flushed by a before it released them
    c.refresh()
    c.balance()  # three live: at most 2 each; a holds 3 until it sees c
    a.balance()
    c.balance()
    assert [len(i.held) for i in (a, b, c)] == [2, 2, 1]
    assert set(_owners().values()) == {a.owner, b.owner, c.owner}
    for ingester in (a, b, c):
        _follow(ingester)
    assert (_requests(), _lines()) == (50, 50)
    # c dies (no clean stop): once its heartbeat and lease expired, two live, at most 3
    # each, and its orphaned shard is taken by whoever has room.
    orphan = next(iter(c.held))
    _write(paths[int(orphan.removeprefix("log:gw-"))], 7)
    _expire(c.owner)
    a.balance()
    b.balance()
    assert (a.live, b.live) == (2, 2)
    assert orphan in a.held | b.held and len(a.held) + len(b.held) == 5
    for ingester in (a, b):
        _follow(ingester)
    assert (_requests(), _lines()) == (57, 57)
    # A clean stop takes the heartbeat away and lets the shards go at once.
    a.leave()
    b.balance()
    assert (b.live, len(b.held)) == (1, 5)
    assert not Cursor.objects.filter(source_name=LEASE_SOURCE,
                                     path=ALIVE_PREFIX + a.owner).exists()


def test_a_gateway_gone_lets_its_shard_go(tmp_path: Path) -> None:
    paths = _gateways(tmp_path, 2)
    a = Ingester(window_s=10)
    a.refresh()
    a.balance()
    _write(paths[1], 4)
    a.poll()  # read: the flush before letting go writes it
    Gateway.objects.filter(name="gw-1").update(options={})
    a.refresh()
    a.balance()
    assert a.held == {"log:gw-0"} and _lines() == 4
    assert "log:gw-1" not in _owners()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_once_exits_3_while_another_live_ingester_holds_a_shard(log_file: Path) -> None:
    _write(log_file, 2)
    holder = Ingester(window_s=10)
    holder.refresh()
    assert holder.claim("log:gw-0")
    records = _Records()
    logger = logging.getLogger("fleetctl.telemetry.ingest")
    logger.addHandler(records)
    try:
        assert main(["--once", "--no-scrape", "--log-level", "WARNING"]) == EXIT_LEASE_HELD
    finally:
        logger.removeHandler(records)
    assert any(m.startswith(f"another ingester (owner {holder.owner}) holds shard log:gw-0 "
                            "until ") for m in records.messages)
    assert _requests() == 0
    holder.release()
    assert main(["--once", "--no-scrape", "--log-level", "WARNING"]) == 0
    assert _requests() == 2
    assert not _owners()  # --once let everything go


@pytest.mark.slow
def test_two_real_ingesters_count_once_and_the_second_takes_over_a_killed_first(
        transactional_db: None, tmp_path: Path) -> None:
    import os
    import signal

    from tests.support.waiting import wait_until
    from tests.telemetry.lines import start_ingester

    path = _gateways(tmp_path, 1)[0]
    args = ("--no-scrape", "--flush-interval", "0.2")
    first = start_ingester(tmp_path / "ingest-1.log", *args)
    wait_until(lambda: "log:gw-0" in _owners(), timeout_s=30,
               what="the first to take the shard")
    second = start_ingester(tmp_path / "ingest-2.log", *args)
    try:
        _write(path, 300)
        wait_until(lambda: _lines() == 300, timeout_s=30, what="a first flush")
        # Both run: the second joined (two live, one shard each at most) and counted nothing.
        wait_until(lambda: "joined the ingesters" in (tmp_path / "ingest-2.log").read_text(),
                   timeout_s=30, what="the second to join")
        assert _requests() == 300
        assert len(_owners()) == 1 and "took shard" not in (tmp_path / "ingest-2.log").read_text()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        _write(path, 200)
        wait_until(lambda: _lines() == 500, timeout_s=40, what="the second to take over")
        assert _requests() == 500
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
    assert "took shard log:gw-0" in (tmp_path / "ingest-2.log").read_text()
    assert not _owners()  # the second let it go on its clean stop


def test_the_scrape_is_a_shard_of_its_own_and_only_its_holder_scrapes(log_file: Path) -> None:
    a, b = Ingester(window_s=10, scrape=True), Ingester(window_s=10, scrape=True)
    no_scraper = Ingester(window_s=10)  # started with --no-scrape: never takes it
    for ingester in (a, b, no_scraper):
        ingester.refresh()
    assert a.shards() == ["log:gw-0", SCRAPE_SHARD] and no_scraper.shards() == ["log:gw-0"]
    a.balance()
    assert a.held == {"log:gw-0", SCRAPE_SHARD} and a.scraping.is_set()
    b.balance()
    no_scraper.balance()  # three live, every shard held: they wait, and do not scrape
    a.balance()  # at most 1 log each, the scrape outside that: a keeps both
    assert a.held == {"log:gw-0", SCRAPE_SHARD}
    assert b.held == no_scraper.held == set()
    assert not b.scraping.is_set() and not no_scraper.scraping.is_set()
    a.leave()  # a clean stop: its shards are free at once
    assert not a.scraping.is_set()
    b.balance()
    no_scraper.balance()
    # Two live, one log: b takes it and the scrape too. A quota counting the scrape in
    # (ceil(2 shards / 2 live) = 1) would have left the scrape to no one: the other one live
    # does not scrape.
    assert b.held == {"log:gw-0", SCRAPE_SHARD} and b.scraping.is_set()
    assert no_scraper.held == set() and not no_scraper.scraping.is_set()


def test_no_shard_is_taken_while_an_ingester_from_before_shards_holds_its_lease(
        log_file: Path) -> None:
    _write(log_file, 3)
    until = datetime.now(tz=UTC) + timedelta(seconds=30)
    Cursor.objects.create(source_name=LEASE_SOURCE, path="lease", updated_at=until,
                          last_counters={"owner": "old:1:x", "until": until.isoformat()})
    a = Ingester(window_s=10)
    a.refresh()
    a.balance()
    assert a.held == set()
    with pytest.raises(LeaseHeld, match="from before shards \\(owner old:1:x\\)"):
        a.once()
    _expire()  # the old one stopped
    assert a.once() == 3 and _requests() == 3
