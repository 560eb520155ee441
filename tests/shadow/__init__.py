"""Shadow tests.

The collector's tests and the live-state tests use a Redis database of their own on the suite's
Redis server (ISOLATED_DB_OFFSET above the suite's): the session's Celery worker consumes the
`shadow` queue of the suite's database, and these tests count and read the messages the
collector enqueues there before anything takes them.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

ISOLATED_DB_OFFSET = 8


def isolated_redis_url(url: str) -> str:
    """The same Redis server, database (n + ISOLATED_DB_OFFSET) mod 16."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db + ISOLATED_DB_OFFSET) % 16}"))
