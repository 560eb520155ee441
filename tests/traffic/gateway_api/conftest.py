"""The fake Kubernetes API server every Gateway API client test talks to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fake_apiserver import FakeApiServer

TOKEN = "test-token-123"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(token=TOKEN).start()
    yield server
    server.stop()
