"""Adding into windows, downsampling exactly (and idempotently) and pruning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetctl.telemetry import histogram, services
from fleetctl.telemetry.models import Window
from fleetctl.telemetry.services import WindowDelta, window_add, windows_add
from tests.support.waiting import wait_until

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def _h(*values: float) -> dict[str, int]:
    h: dict[str, int] = {}
    for value in values:
        histogram.add(h, value)
    return h


def _add(start: datetime, *, requests: int, ttft: dict[str, int], pool: str = "pa",
         resolution_s: int = 10, route: str = "chat") -> None:
    window_add(source="gateway", source_name="gw", route=route, pool=pool,
               resolution_s=resolution_s, start=start,
               counts={"requests": requests, "errors": 1},
               histograms={"ttft": ttft, "flags": {"2xx": requests}})


def test_adds_into_the_same_window() -> None:
    start = NOW - timedelta(minutes=1)
    _add(start, requests=3, ttft=_h(10, 20))
    _add(start, requests=2, ttft=_h(20, 400))
    window = Window.objects.get()
    assert (window.requests, window.errors) == (5, 2)
    assert window.ttft == _h(10, 20, 20, 400) and window.flags == {"2xx": 5}


def test_a_batch_merges_equal_keys_and_creates_the_rest() -> None:
    start = NOW - timedelta(minutes=1)
    deltas = [WindowDelta("gateway", "gw", "chat", pool, 10, start, {"requests": 1})
              for pool in ("pa", "pa", "pb")]
    assert windows_add(deltas) == 2
    assert dict(Window.objects.values_list("pool", "requests")) == {"pa": 2, "pb": 1}


def test_downsample_is_exact_and_idempotent() -> None:
    old = NOW - timedelta(hours=2)
    base = old - timedelta(seconds=old.timestamp() % 60)
    values = []
    for i in range(12):  # two minutes of 10 s windows
        batch = [5.0 + i, 50.0 * (i + 1)]
        values += batch
        _add(base + timedelta(seconds=10 * i), requests=2, ttft=_h(*batch))
    recent = NOW - timedelta(minutes=5)
    _add(recent, requests=7, ttft=_h(1.0))
    before = histogram.merge_all(Window.objects.values_list("ttft", flat=True))
    assert services.downsample(NOW) == {"10s": 12, "60s": 0}
    minutes = Window.objects.filter(resolution_s=60).order_by("start")
    assert [w.start for w in minutes] == [base, base + timedelta(seconds=60)]
    assert [w.requests for w in minutes] == [12, 12] and [w.errors for w in minutes] == [6, 6]
    assert histogram.merge_all(w.ttft for w in minutes) == _h(*values)
    assert histogram.merge_all(Window.objects.values_list("ttft", flat=True)) == before
    assert Window.objects.get(resolution_s=10).start == recent  # the last hour stays
    snapshot = sorted(Window.objects.values_list("resolution_s", "start", "requests"))
    assert services.downsample(NOW) == {"10s": 0, "60s": 0}
    assert sorted(Window.objects.values_list("resolution_s", "start", "requests")) == snapshot
    # A late line recreated an old 10 s window: the next run adds it in.
    _add(base, requests=1, ttft=_h(3.0))
    services.downsample(NOW)
    assert Window.objects.get(resolution_s=60, start=base).requests == 13


def test_client_disconnects_add_up_through_flushes_and_downsampling() -> None:
    old = NOW - timedelta(hours=2)
    base = old - timedelta(seconds=old.timestamp() % 60)
    for i in range(6):
        for _ in range(2):  # two flushes into each window
            window_add(source="gateway", source_name="gw", route="chat", pool="pa",
                       resolution_s=10, start=base + timedelta(seconds=10 * i),
                       counts={"requests": 1, "client_disconnects": i})
    assert Window.objects.get(start=base + timedelta(seconds=50)).client_disconnects == 10
    services.downsample(NOW)
    minute = Window.objects.get(resolution_s=60)
    assert (minute.requests, minute.client_disconnects) == (12, 30)


def test_minutes_older_than_a_day_become_ten_minutes() -> None:
    day_old = NOW - timedelta(days=2)
    base = day_old - timedelta(seconds=day_old.timestamp() % 600)
    for i in range(10):
        _add(base + timedelta(minutes=i), requests=1, ttft=_h(100.0 + i), resolution_s=60)
    services.downsample(NOW)
    window = Window.objects.get()
    assert (window.resolution_s, window.start, window.requests) == (600, base, 10)
    assert histogram.count(window.ttft) == 10


def test_prune_keeps_each_resolution_its_time() -> None:
    for resolution_s, age in ((10, timedelta(hours=7)), (10, timedelta(hours=5)),
                              (60, timedelta(days=3)), (60, timedelta(days=1)),
                              (600, timedelta(days=31)), (600, timedelta(days=29))):
        _add(NOW - age, requests=1, ttft={}, resolution_s=resolution_s)
    assert services.prune(NOW) == 3
    assert Window.objects.count() == 3


def test_downsample_task_runs_both(celery_worker: object) -> None:
    from fleetctl.telemetry.tasks import downsample

    _add(datetime.now(tz=UTC) - timedelta(days=40), requests=1, ttft={}, resolution_s=600)
    _add(datetime.now(tz=UTC) - timedelta(hours=3), requests=2, ttft={})
    downsample.delay()  # ignore_result: the rows say what it did
    wait_until(lambda: list(Window.objects.values_list("resolution_s", "requests")) == [(60, 2)],
               what="the task's downsample and prune")


@pytest.mark.django_db(transaction=True)
def test_two_writers_adding_to_the_same_windows_at_once_both_count() -> None:
    """Two shards' flushes (or a flush and the downsampler) may write the same window key at
    the same moment, on connections of their own: each adds, neither overwrites. Every round
    both add to one window that exists (each reads it under a row lock: a read without one
    would let the later write put back a stale sum) and race to create a new one (the loser's
    insert fails on the unique key and its batch is retried from a savepoint, finding the
    row)."""
    import threading

    from django.db import connection

    rounds = 40
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(rounds):
                barrier.wait(timeout=30)
                windows_add([WindowDelta("gateway", "gw", "chat", "pa", 10, start,
                                         {"requests": 1}, {"duration": _h(100),
                                                           "flags": {name: 1}})
                             for start in (NOW, NOW - timedelta(seconds=10 * (i + 1)))
                             for _ in range(2)])
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    shared = Window.objects.get(start=NOW)
    assert (shared.requests, histogram.count(shared.duration)) == (4 * rounds, 4 * rounds)
    assert shared.flags == {"a": 2 * rounds, "b": 2 * rounds}
    rows = list(Window.objects.exclude(start=NOW))
    assert len(rows) == rounds
    for row in rows:
        assert row.requests == 4 and histogram.count(row.duration) == 4, row
        assert row.flags == {"a": 2, "b": 2}
