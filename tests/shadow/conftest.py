"""Fixtures for the tests that run the real shadow collector (tests/shadow/collector_proc.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.shadow import forget_shadow_keys, use_isolated_redis
from tests.shadow.collector_proc import Running, launch


@pytest.fixture
def shadow_redis(settings: Any) -> Iterator[redis.Redis]:
    r = use_isolated_redis(settings)
    yield r
    forget_shadow_keys(r)


@pytest.fixture
def start_collector(shadow_redis: redis.Redis, settings: Any,
                    tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """`start(redis_url=None, **env)`: a collector process on the tests' isolated Redis (or
    `redis_url`), stopped at the end of the test."""
    started: list[Running] = []

    def start(redis_url: str | None = None, **env: str) -> Running:
        running = launch(redis_url or settings.REDIS_URL, tmp_path, **env)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
