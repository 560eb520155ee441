"""Shadow tests.

The collector's tests and the live-state tests use a Redis database of their own on the suite's
Redis server (ISOLATED_DB_OFFSET above the suite's): the session's Celery worker consumes the
`shadow` queue of the suite's database, and these tests count and read the messages the
collector enqueues there before anything takes them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

ISOLATED_DB_OFFSET = 8


def isolated_redis_url(url: str) -> str:
    """The same Redis server, database (n + ISOLATED_DB_OFFSET) mod 16."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db + ISOLATED_DB_OFFSET) % 16}"))


def use_isolated_redis(settings: Any) -> redis.Redis:
    """Point fleetctl.shadow.live at the isolated database (for the test's duration, through
    pytest-django's `settings`), emptied of shadow keys; returns its client."""
    from fleetctl.shadow import live

    settings.REDIS_URL = isolated_redis_url(settings.REDIS_URL)
    r = live.client()
    forget_shadow_keys(r)
    return r


def forget_shadow_keys(r: redis.Redis) -> None:
    from fleetctl.shadow import live

    r.delete(*r.scan_iter("fleetctl:shadow:*"), live.SHADOW_QUEUE)
