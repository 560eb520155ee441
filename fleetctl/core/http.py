"""The one outbound HTTP client: every call fleetctl makes to another server goes through here.

Health probes, gateway admin APIs (Envoy's, nginx's version page), the Kubernetes API server
and the readiness checks of the process launchers all use this module, so the transport rules
live in one place:

- a timeout on every call (connect and each read), never a redirect followed;
- connections kept alive: one pooled client per process for one-off calls (`shared_client`),
  or a `Client` of your own when you need a base URL, default headers or your own CA;
- errors a person can read, of three kinds: `OutboundTimeout` (no answer in time),
  `OutboundUnreachable` (refused, no route, unknown host) and `OutboundError` (anything else
  that did not get an HTTP answer; `OutboundCertificateError` when TLS verification failed,
  which retrying cannot fix). An HTTP answer, 4xx and 5xx included, is a response, not an
  error: the caller decides what a status means.

`Client` and `AsyncClient` are httpx underneath. `admin_client()` is the one exception, with
the same `request()` interface: plain HTTP/1.1 from the standard library over connections
kept alive per host. A drain makes several admin calls per gateway, and on a small machine
httpx's CPU cost is on the drain's critical path: a weights push to ten Envoys (apply and
read-back in parallel threads, benchmarks/envoy_push_transport.py, 2-core VM) took 18-20 ms
at the median with this transport (12 ms of client CPU) and 42-47 ms with httpx in its place
(31-38 ms of CPU).

Not here: the benchmark runner (fleetctl/bench/runner.py) and the simulator (fleetctl/sim/)
use aiohttp directly. They hold hundreds of streams open at once in one event loop, where
aiohttp measured faster than httpx, and their timing is what they report. The CLI
(fleetctl/cli/client.py) and `fleetctl sim fault` call httpx themselves: they are programs
apart that import no product code (tests/test_layers.py), with the same rules (timeouts, no
redirects).
"""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlencode, urljoin, urlsplit

import httpx


class OutboundError(Exception):
    """A call that did not get an HTTP answer (refused, timed out, bad TLS...)."""


class OutboundTimeout(OutboundError):
    """No answer within the timeout."""


class OutboundUnreachable(OutboundError):
    """Connection refused, or the host cannot be reached or resolved."""


class OutboundCertificateError(OutboundError):
    """The server's certificate did not verify: configuration, not something a retry fixes."""


@dataclass(frozen=True)
class OutboundResponse:
    """An HTTP answer, read whole."""

    status_code: int
    latency_ms: float
    body: bytes
    content_type: str = ""
    url: str = ""
    reason: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return jsonlib.loads(self.body)


Params = Mapping[str, str | int | float] | None
Files = Mapping[str, tuple[str, IO[bytes], str]] | None


# --- httpx: sync and async ----------------------------------------------------------------------

def _verify(verify: ssl.SSLContext | bool | str) -> ssl.SSLContext | bool:
    """`verify` may name a CA bundle file; anything wrong with it is an OutboundCertificateError."""
    if isinstance(verify, str):
        try:
            return ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as exc:
            raise OutboundCertificateError(f"cannot load CA bundle {verify}: {exc}") from exc
    return verify


def _error(where: str, timeout_s: float, exc: httpx.HTTPError) -> OutboundError:
    if isinstance(exc, httpx.TimeoutException):
        return OutboundTimeout(f"{where} timed out after {timeout_s:g} s")
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return OutboundCertificateError(f"{where} failed: {exc}")
    if isinstance(exc, httpx.ConnectError):
        return OutboundUnreachable(f"{where} could not connect: {exc}")
    return OutboundError(f"{where} failed: {exc.__class__.__name__}: {exc}")


def _response(response: httpx.Response, started: float, limit: int | None) -> OutboundResponse:
    return OutboundResponse(
        status_code=response.status_code,
        latency_ms=(time.monotonic() - started) * 1000,
        body=response.content if limit is None else response.content[:limit],
        content_type=response.headers.get("content-type", ""),
        url=str(response.url),
        reason=response.reason_phrase,
        headers=dict(response.headers),
    )


class _Base:
    def __init__(self, *, base_url: str = "", timeout_s: float = 5.0,
                 headers: Mapping[str, str] | None = None,
                 verify: ssl.SSLContext | bool | str = True,
                 max_connections: int = 64) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._options: dict[str, Any] = {
            "base_url": self.base_url, "timeout": httpx.Timeout(timeout_s),
            "headers": dict(headers or {}), "verify": _verify(verify),
            "follow_redirects": False,
            "limits": httpx.Limits(max_connections=max_connections,
                                   max_keepalive_connections=max_connections),
        }

    def _where(self, method: str, url: str) -> str:
        return f"{method} {self.base_url}{url}" if self.base_url else f"{method} {url}"

    @staticmethod
    def _arguments(params: Params, json: Any, content: bytes | str | IO[bytes] | None,
                   form: Mapping[str, str] | None, files: Files,
                   headers: Mapping[str, str] | None, timeout_s: float | None,
                   extensions: Mapping[str, Any] | None = None) -> dict[str, Any]:
        arguments: dict[str, Any] = {"params": params, "headers": headers}
        if extensions:
            arguments["extensions"] = dict(extensions)
        if json is not None:
            arguments["json"] = json
        if content is not None:
            arguments["content"] = content
        if form is not None:
            arguments["data"] = form
        if files is not None:
            arguments["files"] = files
        if timeout_s is not None:
            arguments["timeout"] = httpx.Timeout(timeout_s)
        return arguments


class Client(_Base):
    """A synchronous client with its own connection pool (thread-safe). Give it a base URL
    to send paths, default headers (e.g. Accept), or `verify` (a CA bundle path, an SSL
    context, or False)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._http = httpx.Client(**self._options)

    def request(self, method: str, url: str, *, params: Params = None, json: Any = None,
                content: bytes | str | IO[bytes] | None = None,
                form: Mapping[str, str] | None = None, files: Files = None,
                headers: Mapping[str, str] | None = None, timeout_s: float | None = None,
                max_body: int | None = None,
                extensions: Mapping[str, Any] | None = None) -> OutboundResponse:
        """One call; `timeout_s` overrides the client's for it. `max_body` keeps only the
        first bytes of the answer. `extensions` are httpx's (e.g. `sni_hostname` when the URL
        names an address). Raises OutboundError (or a subclass) without an answer."""
        started = time.monotonic()
        try:
            response = self._http.request(method, url, **self._arguments(
                params, json, content, form, files, headers, timeout_s, extensions))
        except httpx.HTTPError as exc:
            raise _error(self._where(method, url), timeout_s or self.timeout_s, exc) from exc
        return _response(response, started, max_body)

    def get(self, url: str, **kwargs: Any) -> OutboundResponse:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> OutboundResponse:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """The same as `Client`, for code running in an event loop."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._http = httpx.AsyncClient(**self._options)

    async def request(self, method: str, url: str, *, params: Params = None, json: Any = None,
                      content: bytes | str | None = None,
                      form: Mapping[str, str] | None = None, files: Files = None,
                      headers: Mapping[str, str] | None = None, timeout_s: float | None = None,
                      max_body: int | None = None) -> OutboundResponse:
        started = time.monotonic()
        try:
            response = await self._http.request(method, url, **self._arguments(
                params, json, content, form, files, headers, timeout_s))
        except httpx.HTTPError as exc:
            raise _error(self._where(method, url), timeout_s or self.timeout_s, exc) from exc
        return _response(response, started, max_body)

    async def get(self, url: str, **kwargs: Any) -> OutboundResponse:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> OutboundResponse:
        return await self.request("POST", url, **kwargs)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_shared: Client | None = None
_shared_lock = threading.Lock()


def shared_client() -> Client:
    """One pooled client per process for calls to many hosts: building one costs an SSL
    context (~10 ms), which would otherwise be counted in every probe's latency."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Client()
        return _shared


def http_get(url: str, *, timeout_s: float, headers: dict[str, str] | None = None,
             max_body: int = 65536) -> OutboundResponse:
    """GET through the shared client; the body is cut at `max_body` bytes."""
    return shared_client().get(url, headers=headers, timeout_s=timeout_s, max_body=max_body)


# --- kept-alive plain HTTP/1.1, for gateway admin APIs --------------------------------------------

# What a kept-alive connection the server has meanwhile closed fails with on reuse.
_STALE = (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
          BrokenPipeError, ConnectionAbortedError)


class KeepAliveClient:
    """`Client.request` for admin APIs, on the standard library's http.client: one idle
    connection list per host, plain HTTP/1.1, form or raw bodies. About 0.2 ms of CPU per
    call where httpx costs 1-2 ms (see the module notes). A kept-alive connection the server
    closed in the meantime is retried once on a new one (admin calls are idempotent)."""

    MAX_IDLE_PER_HOST = 8

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def request(self, method: str, url: str, *, params: Params = None,
                form: Mapping[str, str] | None = None, content: bytes | None = None,
                headers: Mapping[str, str] | None = None,
                timeout_s: float | None = None) -> OutboundResponse:
        timeout = 5.0 if timeout_s is None else timeout_s
        parts = urlsplit(url)
        scheme, host = parts.scheme or "http", parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        key = (scheme, host, port)
        query = "&".join(part for part in (parts.query, urlencode(params or {})) if part)
        target = (parts.path or "/") + (f"?{query}" if query else "")
        sent = dict(headers or {})
        body = content
        if form is not None:
            body = urlencode(form).encode()
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        where = f"{method} {urljoin(url, parts.path)}"
        started = time.monotonic()
        for _ in range(2):
            conn, reused = self._take(key, timeout)
            try:
                conn.request(method, target, body=body, headers=sent)
                response = conn.getresponse()
                payload = response.read()
            except _STALE as exc:
                conn.close()
                if reused:
                    continue  # the server closed it while idle: once more on a fresh one
                raise OutboundError(f"{where} failed: {exc.__class__.__name__}: {exc}") from exc
            except TimeoutError as exc:
                conn.close()
                raise OutboundTimeout(f"{where} timed out after {timeout:g} s") from exc
            except (ConnectionRefusedError, socket.gaierror) as exc:
                conn.close()
                raise OutboundUnreachable(f"{where} could not connect: {exc}") from exc
            except ssl.SSLCertVerificationError as exc:
                conn.close()
                raise OutboundCertificateError(f"{where} failed: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise OutboundError(f"{where} failed: {exc.__class__.__name__}: {exc}") from exc
            if response.will_close:
                conn.close()
            else:
                self._give(key, conn)
            return OutboundResponse(
                status_code=response.status, latency_ms=(time.monotonic() - started) * 1000,
                body=payload, content_type=response.getheader("content-type", ""), url=url,
                reason=response.reason, headers=dict(response.getheaders()))
        raise OutboundError(f"{where} failed: the connection closed twice")  # pragma: no cover

    def get(self, url: str, **kwargs: Any) -> OutboundResponse:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> OutboundResponse:
        return self.request("POST", url, **kwargs)

    def _take(self, key: tuple[str, str, int],
              timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(key)
            conn = idle.pop() if idle else None
        if conn is not None:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            return conn, True
        scheme, host, port = key
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                               context=self._tls), False
        return http.client.HTTPConnection(host, port, timeout=timeout_s), False

    def _give(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.MAX_IDLE_PER_HOST:
                idle.append(conn)
                return
        conn.close()


_admin = KeepAliveClient()


def admin_client() -> KeepAliveClient | Client:
    """The client for gateway admin APIs called many times per push (Envoy's)."""
    return _admin
