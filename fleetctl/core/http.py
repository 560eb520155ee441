"""The one outbound HTTP client: timeouts always, no redirects, errors a person can read.

Tests and the health probe go through here, so there is one place to change transport rules.
Gateway admin APIs that are called many times per push (Envoy's) use `admin_request`, a
kept-alive plain HTTP/1.1 connection per host, which costs a fraction of httpx's CPU.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

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


# --- kept-alive plain HTTP/1.1, for gateway admin APIs ------------------------------------------

class OutboundTimeout(OutboundError):
    """No answer within the timeout."""


class OutboundUnreachable(OutboundError):
    """Connection refused or the host cannot be reached."""


_idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
_idle_lock = threading.Lock()
_MAX_IDLE_PER_HOST = 8
_tls: ssl.SSLContext | None = None
# What a kept-alive connection the server has meanwhile closed fails with on reuse.
_STALE = (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
          BrokenPipeError, ConnectionAbortedError)


def admin_request(base_url: str, method: str, path: str, *, timeout_s: float,
                  params: dict[str, str] | None = None,
                  form: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request to an admin API (e.g. Envoy's), on a connection kept alive per host:
    (status, body). Costs ~0.2 ms of CPU where httpx costs ~1-2 ms, which counts when a
    drain makes dozens of these calls on a small machine. `timeout_s` bounds the connect and
    each read, like httpx's. A kept-alive connection the server closed in the meantime is
    retried once on a new one (admin calls are idempotent). Raises OutboundTimeout,
    OutboundUnreachable or OutboundError."""
    parts = urlsplit(base_url)
    scheme, host = parts.scheme or "http", parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    key = (scheme, host, port)
    target = parts.path.rstrip("/") + path + (f"?{urlencode(params)}" if params else "")
    body = urlencode(form).encode() if form is not None else None
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
    where = f"{method} {base_url.rstrip('/')}{path}"
    for _ in range(2):
        conn, reused = _take(key, timeout_s)
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        except _STALE as exc:
            conn.close()
            if reused:
                continue  # the server closed it while idle: once more on a fresh one
            raise OutboundError(f"{where} failed: {exc.__class__.__name__}: {exc}") from exc
        except TimeoutError as exc:
            conn.close()
            raise OutboundTimeout(f"{where} timed out after {timeout_s:g} s") from exc
        except (ConnectionRefusedError, socket.gaierror) as exc:
            conn.close()
            raise OutboundUnreachable(f"{where} could not connect: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise OutboundError(f"{where} failed: {exc.__class__.__name__}: {exc}") from exc
        if response.will_close:
            conn.close()
        else:
            _give(key, conn)
        return response.status, payload
    raise OutboundError(f"{where} failed: the connection closed twice")  # pragma: no cover


def _take(key: tuple[str, str, int], timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
    with _idle_lock:
        idle = _idle.get(key)
        conn = idle.pop() if idle else None
    if conn is not None:
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, True
    scheme, host, port = key
    if scheme == "https":
        global _tls
        if _tls is None:
            _tls = ssl.create_default_context()
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=_tls), False
    return http.client.HTTPConnection(host, port, timeout=timeout_s), False


def _give(key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
    with _idle_lock:
        idle = _idle.setdefault(key, [])
        if len(idle) < _MAX_IDLE_PER_HOST:
            idle.append(conn)
            return
    conn.close()
