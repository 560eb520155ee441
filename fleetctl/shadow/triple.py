"""One sampled request sent to the primary, the primary again (the secondary) and the
candidate at the same moment, each answer read into a compare.Answer with its timing.

Directly to each pool's endpoint, never through a route (a route would add its own split,
retries and failover, and a mirrored request must not come back to the gateway that copied
it). Never retried, never failed over: an endpoint that does not answer within the timeout,
refuses the connection or drops the stream is an error answer (status 0), which is what the
comparison is for. The body is sent exactly as received, `model` and every parameter kept,
nothing added: a request that did not ask for usage is not made to carry it.

Why httpx here and not fleetctl/core/http.py: that client reads an answer whole, and a
stream's time to first token and time per output token are measured as the chunks arrive.
The bench runner's stream parser keeps only chunk times, not their content. So this module
streams with httpx itself, on the same rules (a timeout on every call, no redirects).

Concurrency: the three calls run on a shared thread pool (two) and the calling thread (one);
a shadow worker thread waits for its three and nothing else.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from fleetctl.core.compare import Answer

SIDES = ("primary", "secondary", "candidate")
# Threads for the secondary and candidate calls of every pair in this process: a shadow
# worker runs 8 task threads (docs/queues.md), two calls each, with room for a test worker.
POOL_THREADS = 48
CONNECT_TIMEOUT_S = 10.0
ERROR_BODY_LIMIT = 65536


@dataclass(frozen=True)
class Side:
    """One side's answer and what the pair row keeps about the call."""

    role: str
    endpoint: str
    answer: Answer
    latency_ms: float


def pick_endpoints(primary_urls: Sequence[str], candidate_urls: Sequence[str],
                   index: int) -> dict[str, str]:
    """The three base URLs of pair `index`: the primary's i-th endpoint, the NEXT one of the
    primary for the secondary (the same again when the primary has only one: then the noise
    floor is one replica's own nondeterminism), the candidate's i-th."""
    n, m = len(primary_urls), len(candidate_urls)
    if not n or not m:
        raise ValueError("both pools need at least one endpoint")
    return {"primary": primary_urls[index % n],
            "secondary": primary_urls[(index + 1) % n] if n > 1 else primary_urls[index % n],
            "candidate": candidate_urls[index % m]}


def request_url(base_url: str, request: Mapping[str, Any]) -> str:
    """chat/completions for a body with messages, completions for one with a prompt."""
    base = base_url.rstrip("/").removesuffix("/v1")
    return f"{base}/v1/{'chat/completions' if 'messages' in request else 'completions'}"


_lock = threading.Lock()
_http: httpx.Client | None = None
_pool: ThreadPoolExecutor | None = None


def _client() -> httpx.Client:
    global _http
    with _lock:
        if _http is None:
            _http = httpx.Client(follow_redirects=False, limits=httpx.Limits(
                max_connections=3 * POOL_THREADS, max_keepalive_connections=3 * POOL_THREADS))
        return _http


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_THREADS,
                                       thread_name_prefix="shadow-triple")
        return _pool


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
         role: str = "") -> Side:
    """One endpoint's answer to `request`, as sent; errors are answers, never raised."""
    url = request_url(base_url, request)
    started = time.monotonic()
    deadline = started + timeout_s
    timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
    try:
        with _client().stream("POST", url, json=dict(request), timeout=timeout,
                              headers={"Accept": "application/json, text/event-stream"}
                              ) as response:
            if response.status_code >= 400:
                answer = _parse_error_body(response.status_code,
                                           response.read()[:ERROR_BODY_LIMIT])
            elif "text/event-stream" in response.headers.get("content-type", ""):
                answer = _read_stream(response, started, deadline)
            else:  # a whole answer: its latency is the side's latency_ms, no TTFT
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
    except httpx.ConnectError as exc:
        answer = Answer.from_error(0, code="unreachable",
                                   message=f"could not connect to {base_url}: {exc}")
    except httpx.HTTPError as exc:
        answer = Answer.from_error(0, code="transport",
                                   message=f"{exc.__class__.__name__}: {exc}")
    return Side(role=role, endpoint=base_url, answer=answer,
                latency_ms=(time.monotonic() - started) * 1000)


def send(request: Mapping[str, Any], endpoints: Mapping[str, str], *,
         timeout_s: float) -> dict[str, Side]:
    """The three calls at once: secondary and candidate on the shared pool, the primary on
    the calling thread. Returns role -> Side."""
    pool = _threads()
    futures = {role: pool.submit(call, endpoints[role], request, timeout_s=timeout_s,
                                 role=role)
               for role in ("secondary", "candidate")}
    sides = {"primary": call(endpoints["primary"], request, timeout_s=timeout_s,
                             role="primary")}
    for role, future in futures.items():
        sides[role] = future.result()
    return {role: sides[role] for role in SIDES}
