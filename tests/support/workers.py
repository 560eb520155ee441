"""What each pytest-xdist worker keeps to itself, set before Django reads its settings
(loaded with `-p tests.support.workers`, so it runs before pytest-django imports them).

`make test` runs the suite in several worker processes. pytest-django gives each its own test
database (`test_<name>_gw0`, `_gw1`, …). This module gives each:
- its own Redis database: the suite's (15 by default) minus the worker's number, so that one
  worker's Celery worker never takes another's tasks, and cache keys, throttles and shadow
  counters never meet (tests/shadow's isolated database follows, 8 above);
- its own range of ports for the processes tests start on chosen ports (`port_range()`);
- its own data folder (`FLEETCTL_DATA_DIR`: traces, batch files) under var/workers/, and its
  own log names (`log_name()`).
Without xdist (one process), nothing changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PORTS_FROM, PORTS_TO = 20000, 32768  # below Linux's ephemeral range (32768-60999)


def worker() -> tuple[int, int]:
    """(this worker's number, how many there are); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return 0, 1
    return int(name[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def port_range() -> tuple[int, int]:
    """[start, stop) of the ports this worker may choose from."""
    index, count = worker()
    width = (PORTS_TO - PORTS_FROM) // count
    start = PORTS_FROM + index * width
    return start, start + width


def log_name(stem: str, suffix: str) -> str:
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"{stem}-{name}{suffix}" if name else f"{stem}{suffix}"


def redis_url_for(url: str, index: int, count: int) -> str:
    """The suite's Redis URL for worker `index` of `count`: database (n - index) mod 16."""
    if count > 8:
        raise RuntimeError("at most 8 test workers: each needs two of Redis's 16 databases")
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db - index) % 16}"))


def _own_redis_database() -> None:
    index, count = worker()
    url = os.environ.get("REDIS_URL")
    if count > 1 and url:
        os.environ["REDIS_URL"] = redis_url_for(url, index, count)


def _own_data_dir() -> None:
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name or "FLEETCTL_DATA_DIR" in os.environ:
        return
    root = Path(__file__).resolve().parents[2]
    os.environ["FLEETCTL_DATA_DIR"] = str(root / "var" / "workers" / name)


_own_redis_database()
_own_data_dir()
