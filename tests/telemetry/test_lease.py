"""One ingester at a time: the lease (a Cursor row) taken before reading, renewed by every
flush in the transaction that writes windows and cursors, taken over once it expired."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetctl.telemetry.ingest import (
    EXIT_LEASE_HELD,
    LEASE_PATH,
    LEASE_SOURCE,
    Ingester,
    LeaseHeld,
    LeaseLost,
    main,
)
from fleetctl.telemetry.models import Cursor, Window
from fleetctl.traffic.models import Gateway
from tests.telemetry.lines import envoy_line

T0 = 1_800_000_000.0

pytestmark = pytest.mark.django_db


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "access.log"
    Gateway.objects.create(name="gw-a", kind="envoy", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)})
    return path


def _write(path: Path, n: int) -> None:
    with open(path, "ab") as fp:
        fp.write(b"".join(envoy_line(start=T0 + i % 10) for i in range(n)))


def _requests() -> int:
    return sum(Window.objects.values_list("requests", flat=True))


def _lines() -> int:
    return Cursor.objects.get(source_name="gw-a").lines


def _expire() -> None:
    """The holder stopped renewing (killed, paused) long enough for its lease to expire."""
    Cursor.objects.filter(source_name=LEASE_SOURCE, path=LEASE_PATH).update(
        updated_at=datetime.now(tz=UTC) - timedelta(seconds=1))


def _follow(ingester: Ingester) -> int:
    ingester.refresh()
    total = 0
    while (n := ingester.poll()) > 0:
        total += n
    ingester.flush()
    return total


def test_the_lease_row_names_its_owner_and_expiry() -> None:
    a = Ingester(window_s=10, flush_interval_s=1.0)
    assert a.lease_s == 10.0  # 3 flush intervals, at least 10 s
    assert a.claim()
    row = Cursor.objects.get(source_name=LEASE_SOURCE, path=LEASE_PATH)
    assert row.last_counters["owner"] == a.owner and a.owner.count(":") == 2
    assert datetime.fromisoformat(row.last_counters["until"]) == row.updated_at
    assert a.claim()  # renewing our own lease
    a.release()
    assert Ingester(window_s=10).claim()  # released: the next one need not wait


def test_two_ingesters_over_one_log_count_every_line_once(log_file: Path) -> None:
    a, b = Ingester(window_s=10), Ingester(window_s=10)
    _write(log_file, 5)
    assert a.claim() and not b.claim()
    assert _follow(a) == 5
    with pytest.raises(LeaseHeld, match=a.owner):
        b.once()
    _write(log_file, 3)
    assert _follow(a) == 3
    assert (_requests(), _lines()) == (8, 8)
    # a stops renewing (killed): once its lease expired, b takes over from the cursors.
    _write(log_file, 4)
    assert not b.claim()
    _expire()
    assert b.claim()
    assert _follow(b) == 4
    assert (_requests(), _lines()) == (12, 12)
    with pytest.raises(LeaseHeld):
        a.once()


def test_a_flush_after_losing_the_lease_writes_nothing(
        log_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = Ingester(window_s=10), Ingester(window_s=10)
    _write(log_file, 3)
    assert a.claim() and _follow(a) == 3
    _write(log_file, 6)
    a.refresh()
    assert a.poll() == 6  # read, not yet flushed
    _expire()  # a was paused longer than its lease ...
    assert b.claim()  # ... and b took over
    with caplog.at_level(logging.ERROR, logger="fleetctl.telemetry.ingest"), \
            pytest.raises(LeaseLost):
        a.flush()
    assert "lost the ingester lease to " + b.owner in caplog.text
    assert (_requests(), _lines()) == (3, 3)  # neither windows nor cursor moved
    assert a.aggregator.open == {} and a.followers == {} and not a.holding.is_set()
    assert _follow(b) == 6  # b reads from the cursor: the 6 lines counted once
    assert (_requests(), _lines()) == (9, 9)
    row = Cursor.objects.get(source_name=LEASE_SOURCE)
    assert row.last_counters["owner"] == b.owner


def test_a_second_ingester_waits_logging_once_then_takes_over(
        log_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = Ingester(window_s=10), Ingester(window_s=10)
    b.lease_wait_s = 0.05
    assert a.claim()
    stop = threading.Event()
    timer = threading.Timer(0.4, stop.set)
    timer.start()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fleetctl.telemetry.ingest"):
        assert not b.wait_for_lease(stop)  # still held when told to stop
    timer.join()
    assert time.monotonic() - began >= 0.35
    waiting = [r.getMessage() for r in caplog.records if "holds the lease" in r.getMessage()]
    assert len(waiting) == 1
    assert waiting[0].startswith(f"another ingester (owner {a.owner}) holds the lease until ")
    assert waiting[0].endswith("; waiting")
    _expire()
    assert b.wait_for_lease(threading.Event()) and b.holding.is_set()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_once_exits_3_while_another_live_ingester_holds_the_lease(log_file: Path) -> None:
    _write(log_file, 2)
    holder = Ingester(window_s=10)
    assert holder.claim()
    records = _Records()
    logger = logging.getLogger("fleetctl.telemetry.ingest")
    logger.addHandler(records)
    try:
        assert main(["--once", "--no-scrape", "--log-level", "WARNING"]) == EXIT_LEASE_HELD
    finally:
        logger.removeHandler(records)
    assert any(m.startswith(f"another ingester (owner {holder.owner}) holds the lease until ")
               for m in records.messages)
    assert _requests() == 0
    holder.release()
    assert main(["--once", "--no-scrape", "--log-level", "WARNING"]) == 0
    assert _requests() == 2


@pytest.mark.slow
def test_two_real_ingesters_count_once_and_the_second_takes_over_a_killed_first(
        transactional_db: None, tmp_path: Path) -> None:
    import os
    import signal

    from tests.support.waiting import wait_until
    from tests.telemetry.lines import start_ingester

    path = tmp_path / "access.log"
    path.touch()
    Gateway.objects.create(name="gw-a", kind="envoy", admin_address="http://127.0.0.1:1",
                           options={"access_log": str(path)})
    args = ("--no-scrape", "--flush-interval", "0.2")
    first = start_ingester(tmp_path / "ingest-1.log", *args)
    wait_until(lambda: Cursor.objects.filter(source_name=LEASE_SOURCE).exclude(
        last_counters__owner="").exists(), timeout_s=30, what="the first to take the lease")
    second = start_ingester(tmp_path / "ingest-2.log", *args)
    try:
        _write(path, 300)
        wait_until(lambda: (Cursor.objects.filter(source_name="gw-a").values_list(
            "lines", flat=True).first() or 0) == 300, timeout_s=30, what="a first flush")
        # Both run: the second only waits (it said so), and counted nothing.
        wait_until(lambda: "holds the lease until" in (tmp_path / "ingest-2.log").read_text(),
                   timeout_s=30, what="the second to wait for the lease")
        assert _requests() == 300
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
    waited = (tmp_path / "ingest-2.log").read_text()
    assert waited.count("holds the lease until") == 1 and "; waiting" in waited
    assert "took the ingester lease" in waited
