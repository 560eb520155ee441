"""Calls to OpenAI-compatible endpoints: one streamed call read into a compare.Answer with
its timing (`call`, or `acall` as a coroutine on the process's loop, started with `spawn`):
what shadow runs (fleetctl/shadow/triple.py) and eval runs (fleetctl/evals/runner.py) send to
a pool. Batch jobs (fleetctl/batch/executor.py) send their non-streamed requests on the
same loop (`post`), with the same URL and transport-error rules.

Directly to the endpoint given, never through a route (a route would add its own split,
retries and failover). Never retried here: an endpoint that does not answer within the
timeout, refuses the connection or drops the stream is an error answer (status 0). The body
is sent as given, nothing added. A caller that may retry (an eval run retries a transport
error before any byte arrived, and only that) reads `Reply.first_byte`: False when no byte of
a response came back (the connection was refused, timed out, or closed before the status
line), so the server cannot have started answering; True from the status line on.

Streamed calls run on ONE asyncio loop per process (a daemon thread, made on first use and
again after a fork) with one aiohttp session: a synchronous `call` hands its coroutine to
that loop and waits; an eval run spawns its `concurrency` calls there and needs no thread of
its own per call. Each stream is read to its end (past [DONE]) so its connection is reused.
Why: an eval worker spent 2.7 ms of CPU a row with a thread a call on httpx, most of it in
httpx/h11 and in a new connection a call; on this loop it spends 1.2 ms
(benchmarks/eval_items_per_second.py, docs/figures.md). Why not fleetctl/core/http.py: that
client reads an answer whole, and a stream's time to first token and time per output token
are measured as the chunks arrive.

Where else aiohttp runs: the benchmark runner (fleetctl/bench/runner.py, the load generator)
and the simulator (fleetctl/sim/) hold hundreds of streams open in event loops of their own,
and the shadow collector (fleetctl/shadow/collector.py) is an aiohttp server.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from fleetctl.inference.compare import Answer

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10.0
ERROR_BODY_LIMIT = 65536
# Connections kept by the process's session: a shadow worker's pairs (three calls each), an
# eval run's calls (up to 256 at once) and a batch chunk's (up to 256) share it; a call waits
# for a free connection within its own timeout.
MAX_CONNECTIONS = 512
READ_BUFSIZE = 2**20  # an SSE event may be this long (a long tool call in one chunk)


@dataclass(frozen=True)
class Reply:
    """One endpoint's answer and what a caller keeps about the call.

    `first_byte`: whether any byte of a response arrived (the status line at least). A
    failed call with first_byte False never reached the server's answer: retrying it cannot
    make the server answer twice to a request it began answering."""

    role: str
    endpoint: str
    answer: Answer
    latency_ms: float
    first_byte: bool = True


def endpoint_url(base_url: str, path: str) -> str:
    """base_url + an API path such as /v1/completions, whether or not the base_url already
    ends in /v1."""
    return base_url.rstrip("/").removesuffix("/v1") + path


def request_url(base_url: str, request: Mapping[str, Any]) -> str:
    """chat/completions for a body with messages, completions for one with a prompt."""
    return endpoint_url(
        base_url, f"/v1/{'chat/completions' if 'messages' in request else 'completions'}")


def _parse_error_body(status: int, body: bytes) -> Answer:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return Answer.from_body(parsed, status=status)
    text = body[:300].decode(errors="replace").strip() or "(empty body)"
    return Answer.from_error(status, message=f"HTTP {status}: {text}")


class _Stream:
    """One stream's SSE events as they arrive: chunks kept, content timing measured."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.chunks: list[dict[str, Any]] = []
        self.first: float | None = None
        self.last: float | None = None
        self.pieces = 0
        self.done = False
        self.malformed = False

    def feed(self, line: bytes) -> None:
        if self.done or self.malformed or not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            self.malformed = True
            return
        if not isinstance(chunk, dict):
            return
        self.chunks.append(chunk)
        if _has_content(chunk):
            now = time.monotonic()
            self.first = now if self.first is None else self.first
            self.last = now
            self.pieces += 1

    def answer(self, status: int) -> Answer:
        if self.malformed:
            return Answer.from_error(status, code="malformed_stream",
                                     message="a stream event was not JSON")
        usage: dict[str, Any] = next(
            (c["usage"] for c in reversed(self.chunks) if isinstance(c.get("usage"), dict)),
            {})
        produced = usage.get("completion_tokens") or self.pieces
        first, last = self.first, self.last
        ttft = None if first is None else first - self.started
        tpot = (None if first is None or last is None or produced < 2
                else (last - first) / (produced - 1))
        return Answer.from_chunks(self.chunks, status=status, ttft_s=ttft, tpot_s=tpot)


def _has_content(chunk: Mapping[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if delta is None:
            if choice.get("text"):
                return True
        elif delta.get("content") or delta.get("tool_calls") or delta.get("refusal"):
            return True
    return False


# --- the event loop the calls run on -----------------------------------------------------------

class _Loop:
    """One asyncio loop on a daemon thread and one aiohttp session on it, per process (made
    again in a child after a fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       name="fleetctl-upstream", daemon=True)
        self.thread.start()
        self.session: aiohttp.ClientSession = asyncio.run_coroutine_threadsafe(
            self._session(), self.loop).result()
        atexit.register(self.close)

    def close(self) -> None:
        """Close the session's connections (at exit: no "unclosed session" warning)."""
        if self.pid == os.getpid() and self.loop.is_running():
            with contextlib.suppress(Exception):  # at exit: nothing to tell
                asyncio.run_coroutine_threadsafe(self.session.close(), self.loop).result(2)
            self.loop.call_soon_threadsafe(self.loop.stop)

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None), read_bufsize=READ_BUFSIZE,
            auto_decompress=True, trust_env=False)


_loop_lock = threading.Lock()
_loop: _Loop | None = None


def _running() -> _Loop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = _Loop()
        return _loop


def _timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    """A call's socket timeouts: `timeout_s` for each read, at most CONNECT_TIMEOUT_S to
    connect (the whole call is bounded by asyncio.timeout(timeout_s) around it)."""
    return aiohttp.ClientTimeout(total=None, sock_read=timeout_s,
                                 sock_connect=min(CONNECT_TIMEOUT_S, timeout_s))


def _failure(exc: Exception, base_url: str) -> tuple[str, str]:
    """(code, message) for a call that got no HTTP answer and did not time out: the
    connection was refused or failed ("unreachable"), or broke later ("transport")."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "unreachable", f"could not connect to {base_url}: {exc}"
    return "transport", f"{exc.__class__.__name__}: {exc}"


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    data = bytearray()
    while len(data) < limit:
        piece = await response.content.read(limit - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


async def acall(base_url: str, request: Mapping[str, Any], *, timeout_s: float,
                role: str = "") -> Reply:
    """`call` as a coroutine, on the process's loop (`spawn` puts it there)."""
    session = _running().session
    url = request_url(base_url, request)
    started = time.monotonic()
    first_byte = False
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                    url, json=dict(request), allow_redirects=False, timeout=_timeout(timeout_s),
                    headers={"Accept": "application/json, text/event-stream"}) as response:
                first_byte = True  # the status line and headers are in
                status = response.status
                if status >= 400:
                    answer = _parse_error_body(status, await _read_capped(
                        response, ERROR_BODY_LIMIT))
                elif "text/event-stream" in response.headers.get("content-type", ""):
                    stream = _Stream(started)
                    # Read to the end (past [DONE]) so the connection is reused: a new
                    # connection a call cost more CPU than the whole answer's events.
                    async for line in response.content:
                        stream.feed(line)
                    answer = stream.answer(status)
                else:  # a whole answer: its latency is the reply's latency_ms, no TTFT
                    try:
                        parsed = json.loads(await response.read())
                    except ValueError:
                        parsed = None
                    answer = (Answer.from_body(parsed, status=status)
                              if isinstance(parsed, dict) else
                              Answer.from_error(status, code="malformed_body",
                                                message="the answer was not a JSON object"))
    except TimeoutError:
        answer = Answer.from_error(0, code="timeout",
                                   message=f"no complete answer within {timeout_s:g} s")
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        code, message = _failure(exc, base_url)
        answer = Answer.from_error(0, code=code, message=message)
    return Reply(role=role, endpoint=base_url, answer=answer,
                 latency_ms=(time.monotonic() - started) * 1000, first_byte=first_byte)


@dataclass(frozen=True)
class Posted:
    """A non-streamed POST's answer: `status` 0 when no HTTP answer came (then `error_code`
    is "timeout", "unreachable" or "transport" and `error_message` says why)."""

    status: int
    text: str
    retry_after: str | None
    latency_ms: float
    error_code: str = ""
    error_message: str = ""


async def apost(base_url: str, path: str, body: Any, *, timeout_s: float) -> Posted:
    """`post` as a coroutine, on the process's loop."""
    session = _running().session
    started = time.monotonic()

    def failed(code: str, message: str) -> Posted:
        return Posted(0, "", None, (time.monotonic() - started) * 1000, code, message)

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                    endpoint_url(base_url, path), json=body, allow_redirects=False,
                    timeout=_timeout(timeout_s)) as response:
                raw = await response.read()
                text = raw.decode(response.get_encoding() if raw else "utf-8",
                                  errors="replace")
                return Posted(response.status, text, response.headers.get("retry-after"),
                              (time.monotonic() - started) * 1000)
    except TimeoutError:
        return failed("timeout", f"no answer within {timeout_s:g} s")
    except (aiohttp.ClientError, OSError, ValueError, LookupError) as exc:
        return failed(*_failure(exc, base_url))


def post(base_url: str, path: str, body: Any, *, timeout_s: float) -> Posted:
    """POST `body` as JSON to base_url + path (e.g. /v1/chat/completions) and read the whole
    answer; errors are answers (status 0), never raised. Not streamed: a batch line's
    request, as the OpenAI Batch API sends it."""
    return spawn(apost(base_url, path, body, timeout_s=timeout_s)).result()


def spawn(coroutine: Coroutine[Any, Any, T]) -> Future[T]:
    """Run `coroutine` (one that awaits `acall`) on the process's loop; its result as a
    future. Cancelling the future cancels the coroutine."""
    return asyncio.run_coroutine_threadsafe(coroutine, _running().loop)


def call(base_url: str, request: Mapping[str, Any], *, timeout_s: float,
         role: str = "") -> Reply:
    """One endpoint's answer to `request`, as sent; errors are answers, never raised."""
    return spawn(acall(base_url, request, timeout_s=timeout_s, role=role)).result()
