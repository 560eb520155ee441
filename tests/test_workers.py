"""Each pytest-xdist worker keeps its Redis database, ports and files to itself
(tests/support/workers.py): two workers sharing a Redis database would take each other's
Celery tasks, and two sharing a port range could start simulators on one port."""

from __future__ import annotations

import itertools

import pytest

from tests.shadow import isolated_redis_url
from tests.support import workers


def test_each_worker_has_its_own_redis_databases_and_the_shadow_tests_too() -> None:
    count = 8
    mine = [workers.redis_url_for("redis://127.0.0.1:6379/15", i, count) for i in range(count)]
    isolated = [isolated_redis_url(url) for url in mine]
    assert mine[0] == "redis://127.0.0.1:6379/15"
    assert len(set(mine) | set(isolated)) == 2 * count
    with pytest.raises(RuntimeError, match="at most 8"):
        workers.redis_url_for("redis://127.0.0.1:6379/15", 0, 9)


def test_port_ranges_do_not_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    ranges = []
    for i in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        ranges.append(workers.port_range())
    for (a_start, a_stop), (b_start, b_stop) in itertools.pairwise(ranges):
        assert a_start < a_stop <= b_start < b_stop
    assert ranges[0][0] >= workers.PORTS_FROM and ranges[-1][1] <= workers.PORTS_TO
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert workers.port_range() == (workers.PORTS_FROM, workers.PORTS_TO)
    assert workers.log_name("test-worker", ".log") == "test-worker.log"


class _Item:
    """What the scheduler reads of a collected test: its node id."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_workers_take_the_longest_files_first_each_file_kept_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support import schedule

    longest, second = schedule.LONGEST_FIRST[:2]
    collected = ["tests/a/test_one.py::test_x", f"{second}::test_y", f"{longest}::test_b",
                 "tests/a/test_two.py::test_z", f"{longest}::test_a", "tests/a/test_one.py::test_w"]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    items = [_Item(nodeid) for nodeid in collected]
    schedule.longest_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        f"{longest}::test_b", f"{longest}::test_a", f"{second}::test_y",
        "tests/a/test_one.py::test_x", "tests/a/test_two.py::test_z",
        "tests/a/test_one.py::test_w"]

    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    alone = [_Item(nodeid) for nodeid in collected]
    schedule.longest_first(alone)  # type: ignore[arg-type]
    assert [item.nodeid for item in alone] == collected  # one process: pytest's own order


def test_make_test_runs_workers_that_take_files_in_collection_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetctl.demo import testrun

    monkeypatch.delenv("FLEETCTL_TEST_WORKERS", raising=False)
    assert testrun.pytest_defaults([]) == [
        "--durations=30", "-n", str(testrun.TEST_WORKERS), "--dist", "loadfile",
        "--no-loadscope-reorder"]
    assert testrun.pytest_defaults(["-n", "2"]) == ["--durations=30"]
    monkeypatch.setenv("FLEETCTL_TEST_WORKERS", "0")
    assert testrun.pytest_defaults([]) == ["--durations=30"]
