"""The one outbound HTTP client: timeouts always, no redirects, errors a person can read.

Tests and the health probe go through here, so there is one place to change transport rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


class OutboundError(Exception):
    """A call that did not get an HTTP answer (refused, timed out, bad TLS...)."""


@dataclass(frozen=True)
class OutboundResponse:
    status_code: int
    latency_ms: float
    body: bytes
    content_type: str


_shared: httpx.Client | None = None


def _client() -> httpx.Client:
    """One pooled client per process: building one costs an SSL context (~10 ms), which
    would otherwise be counted in every probe's latency. httpx clients are thread-safe."""
    global _shared
    if _shared is None:
        _shared = httpx.Client(follow_redirects=False, limits=httpx.Limits(max_connections=64))
    return _shared


def http_get(
    url: str, *, timeout_s: float, headers: dict[str, str] | None = None
) -> OutboundResponse:
    started = time.monotonic()
    try:
        response = _client().get(url, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException as exc:
        raise OutboundError(f"GET {url} timed out after {timeout_s:g} s") from exc
    except httpx.ConnectError as exc:
        raise OutboundError(f"GET {url} could not connect: {exc}") from exc
    except httpx.HTTPError as exc:
        raise OutboundError(f"GET {url} failed: {exc.__class__.__name__}: {exc}") from exc
    latency_ms = (time.monotonic() - started) * 1000
    return OutboundResponse(
        status_code=response.status_code,
        latency_ms=latency_ms,
        body=response.content[:65536],
        content_type=response.headers.get("content-type", ""),
    )
