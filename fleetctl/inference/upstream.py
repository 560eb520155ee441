"""Calls to OpenAI-compatible endpoints: the process's one pooled client for them
(`pooled_client`), and one streamed call read into a compare.Answer with its timing (`call`):
what shadow runs (fleetctl/shadow/triple.py) and eval runs (fleetctl/evals/runner.py) send
to a pool. Batch jobs (fleetctl/batch/executor.py) send their non-streamed requests on the
same client, with the same URL and transport-error rules (`endpoint_url`, `transport_error`).

Directly to the endpoint given, never through a route (a route would add its own split,
retries and failover). Never retried here: an endpoint that does not answer within the
timeout, refuses the connection or drops the stream is an error answer (status 0). The body
is sent as given, nothing added. A caller that may retry (an eval run retries a transport
error before any byte arrived, and only that) reads `Reply.first_byte`: False when no byte of
a response came back (the connection was refused, timed out, or closed before the status
line), so the server cannot have started answering; True from the status line on.

Why httpx here and not fleetctl/core/http.py: that client reads an answer whole, and a
stream's time to first token and time per output token are measured as the chunks arrive.
The bench runner's stream parser keeps only chunk times, not their content. So this module
streams with httpx itself, on the same rules (a timeout on every call, no redirects).

Thread-safe: one pooled client per process, shared by every calling thread.

Where aiohttp stays, and why: the benchmark runner (fleetctl/bench/runner.py, the load
generator) and the simulator (fleetctl/sim/) hold hundreds of streams open at once in one
event loop, where aiohttp measured faster than httpx, and the timing they report is the
point of them; the shadow collector (fleetctl/shadow/collector.py) is an aiohttp server, not
a client. Every other call to a model endpoint goes through this module's client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from fleetctl.inference.compare import Answer

CONNECT_TIMEOUT_S = 10.0
ERROR_BODY_LIMIT = 65536
# Connections kept by the process's client: a shadow worker's pairs (three calls each) and
# an eval run's threads (up to 256) share it; a call waits for a free connection within its
# own timeout.
MAX_CONNECTIONS = 512


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


def call_timeout(timeout_s: float) -> httpx.Timeout:
    """A call's timeout: `timeout_s` for each read, and at most CONNECT_TIMEOUT_S to connect."""
    return httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))


def transport_error(exc: httpx.HTTPError, base_url: str) -> tuple[str, str]:
    """(code, message) for a call that got no HTTP answer and did not time out: the
    connection was refused or failed ("unreachable"), or broke later ("transport")."""
    if isinstance(exc, httpx.ConnectError):
        return "unreachable", f"could not connect to {base_url}: {exc}"
    return "transport", f"{exc.__class__.__name__}: {exc}"


_lock = threading.Lock()
_http: httpx.Client | None = None


def pooled_client() -> httpx.Client:
    """The process's one pooled client for model endpoints, shared by every thread: no
    redirects followed, MAX_CONNECTIONS kept open. Give each call its own timeout
    (`call_timeout`)."""
    global _http
    with _lock:
        if _http is None:
            _http = httpx.Client(follow_redirects=False, limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS))
        return _http


class _Late(Exception):
    """The whole call ran past its timeout (a stream that trickles forever)."""


def _parse_error_body(status: int, body: bytes) -> Answer:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return Answer.from_body(parsed, status=status)
    text = body[:300].decode(errors="replace").strip() or "(empty body)"
    return Answer.from_error(status, message=f"HTTP {status}: {text}")


def _read_stream(response: httpx.Response, started: float, deadline: float) -> Answer:
    chunks: list[dict[str, Any]] = []
    first: float | None = None
    last: float | None = None
    pieces = 0
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise _Late
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            return Answer.from_error(response.status_code, code="malformed_stream",
                                     message="a stream event was not JSON")
        if not isinstance(chunk, dict):
            continue
        chunks.append(chunk)
        if _has_content(chunk):
            now = time.monotonic()
            first = now if first is None else first
            last = now
            pieces += 1
    usage: dict[str, Any] = next(
        (c["usage"] for c in reversed(chunks) if isinstance(c.get("usage"), dict)), {})
    produced = usage.get("completion_tokens") or pieces
    ttft = None if first is None else first - started
    tpot = (None if first is None or last is None or produced < 2
            else (last - first) / (produced - 1))
    return Answer.from_chunks(chunks, status=response.status_code, ttft_s=ttft, tpot_s=tpot)


def _has_content(chunk: Mapping[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if delta is None:
            if choice.get("text"):
                return True
        elif delta.get("content") or delta.get("tool_calls") or delta.get("refusal"):
            return True
    return False


def call(base_url: str, request: Mapping[str, Any], *, timeout_s: float,
         role: str = "") -> Reply:
    """One endpoint's answer to `request`, as sent; errors are answers, never raised."""
    url = request_url(base_url, request)
    started = time.monotonic()
    deadline = started + timeout_s
    first_byte = False
    try:
        with pooled_client().stream("POST", url, json=dict(request),
                                    timeout=call_timeout(timeout_s),
                                    headers={"Accept": "application/json, text/event-stream"}
                                    ) as response:
            first_byte = True  # the status line and headers are in
            if response.status_code >= 400:
                answer = _parse_error_body(response.status_code,
                                           response.read()[:ERROR_BODY_LIMIT])
            elif "text/event-stream" in response.headers.get("content-type", ""):
                answer = _read_stream(response, started, deadline)
            else:  # a whole answer: its latency is the reply's latency_ms, no TTFT
                try:
                    parsed = json.loads(response.read())
                except ValueError:
                    parsed = None
                answer = (Answer.from_body(parsed, status=response.status_code)
                          if isinstance(parsed, dict) else
                          Answer.from_error(response.status_code, code="malformed_body",
                                            message="the answer was not a JSON object"))
    except (httpx.TimeoutException, _Late):
        answer = Answer.from_error(0, code="timeout",
                                   message=f"no complete answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        code, message = transport_error(exc, base_url)
        answer = Answer.from_error(0, code=code, message=message)
    return Reply(role=role, endpoint=base_url, answer=answer,
                 latency_ms=(time.monotonic() - started) * 1000, first_byte=first_byte)
