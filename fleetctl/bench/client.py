"""The benchmark client's side of one request: the endpoint, the request body (the row's text
or a synthetic prompt), the streamed response read chunk by chunk, and the result with its
timings. `fleetctl.bench.runner` drives many of these as one load level; its docstring says
what each figure means and how synthetic prompts are made."""

from __future__ import annotations

import json
import random
import time
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp

if TYPE_CHECKING:
    from .runner import LevelPlan

Status = Literal["ok", "error", "timeout"]
TokensSource = Literal["usage", "chunks"]


# One token each in the simulator's tokenizer and (with a leading space) in common BPE vocabularies.
WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "as", "with", "by", "at", "from",
    "his", "her", "they", "this", "that", "have", "had", "are", "not", "but", "what", "all",
    "were", "when", "we", "there", "can", "been", "one", "would", "will", "more", "if", "no",
    "out", "so", "said", "time", "people", "year", "way", "day", "man", "thing", "woman", "life",
    "child", "world", "school", "state", "family", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team",
    "minute", "idea", "body", "information", "back", "parent", "face", "others", "level", "office",
    "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning",
    "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education"
)
_ERROR_BODY_LIMIT = 2000


class TraceRequestLike(Protocol):
    """What the runner reads from a trace row (`fleetctl.bench.traces.TraceRequest`)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def messages(self) -> Sequence[Mapping[str, Any]] | None: ...
    @property
    def prefix_group(self) -> str | None: ...
    @property
    def prefix_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One OpenAI-compatible endpoint: `base_url` without `/v1` (e.g. http://host:8000)."""

    base_url: str
    model: str
    api: Literal["chat", "completions"] = "chat"
    api_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    ignore_eos: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        path = "chat/completions" if self.api == "chat" else "completions"
        return f"{self.base_url.rstrip('/')}/v1/{path}"


@dataclass(slots=True)
class RequestResult:
    index: int  # row of the trace
    seq: int  # n-th request sent in this level
    request_id: str
    scheduled_at: float
    started_at: float
    first_token_at: float | None
    finished_at: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    chunk_times: array[float]  # arrival of each content-bearing chunk
    input_tokens: int | None
    output_tokens: int
    tokens_source: TokensSource
    status: Status
    http_status: int | None
    error: str | None
    schedule_lag_s: float
    warmup: bool = False
    window_tokens: float = 0.0  # output tokens that arrived inside the level's window
    stream: int = 0  # fixed concurrency: which stream sent it (trace timing: 0)
    endpoint: int = 0  # index of the endpoint it went to (a pool's base_urls order)

    @property
    def itl_s(self) -> list[float]:
        times = self.chunk_times
        return [times[i] - times[i - 1] for i in range(1, len(times))]


# ---- prompts and request bodies -------------------------------------------------------------


class PromptMaker:
    """Request bodies: the row's messages or prompt, else a synthetic prompt (see module doc)."""

    def __init__(self, endpoint: Endpoint, seed: int = 0) -> None:
        self.endpoint = endpoint
        self.seed = seed
        self._prefixes: dict[str, list[str]] = {}

    def body(self, row: TraceRequestLike, seq: int) -> bytes:
        ep = self.endpoint
        body: dict[str, Any] = {"model": ep.model}
        if ep.api == "chat":
            body["messages"] = list(row.messages) if row.messages else [
                {"role": "user", "content": self.text(row, seq)}]
        else:
            body["prompt"] = self.text(row, seq)
        body.update(max_tokens=row.completion_tokens, stream=True,
                    stream_options={"include_usage": True}, temperature=0)
        if ep.ignore_eos:
            body["ignore_eos"] = True
        body.update(ep.extra_body)
        return json.dumps(body).encode()

    def text(self, row: TraceRequestLike, seq: int) -> str:
        if row.prompt is not None:
            return row.prompt
        if row.messages:  # completions endpoint given a chat row: plain concatenation
            return "\n".join(str(m.get("content", "")) for m in row.messages)
        n = max(1, row.prompt_tokens)
        shared = self._prefix(row.prefix_group, min(row.prefix_tokens, n))
        rng = random.Random(self.seed * 1_000_003 + seq)
        return " ".join(shared + rng.choices(WORDS, k=n - len(shared)))

    def _prefix(self, group: str | None, tokens: int) -> list[str]:
        if group is None or tokens <= 0:
            return []
        words = self._prefixes.get(group)
        if words is None or len(words) < tokens:
            rng = random.Random(zlib.crc32(group.encode()) ^ self.seed)
            words = self._prefixes[group] = rng.choices(WORDS, k=max(tokens, 64))
        return words[:tokens]


# ---- one streamed request ---------------------------------------------------------------------


class _Stream:
    """Parse state of one SSE response. Per network read: one split; per `data:` line: one
    json.loads and a few dict lookups. Times are recorded per read, not per line."""

    __slots__ = ("buffer", "chunks", "done", "done_at", "error", "finished", "t0", "usage_in",
                 "usage_out")

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.buffer = b""
        self.chunks: array[float] = array("d")
        self.done = False
        self.done_at: float | None = None
        self.finished = False
        self.error: str | None = None
        self.usage_in: int | None = None
        self.usage_out: int | None = None

    def feed(self, block: bytes, now: float) -> None:
        lines = (self.buffer + block).split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            self.done_at = now - self.t0
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self.error = f"malformed stream event: {payload[:200]!r}"
            return
        if not isinstance(event, dict):
            return
        choices = event.get("choices")
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta is None:
                content: Any = choice.get("text")
            else:
                content = (delta.get("content") or delta.get("reasoning_content")
                           or delta.get("reasoning") or delta.get("tool_calls"))
            if content:
                self.chunks.append(now - self.t0)
            if choice.get("finish_reason"):
                self.finished = True
        usage = event.get("usage")
        if usage:
            self.usage_in = usage.get("prompt_tokens")
            self.usage_out = usage.get("completion_tokens")
        if "error" in event:
            self.error = _error_text(event["error"], where="in stream")


def _error_text(error: Any, *, where: str) -> str:
    if isinstance(error, dict):
        return f"{where}: {error.get('message') or error}"
    return f"{where}: {error}"


def _http_error(status: int, body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict | str):
        error = parsed["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
    elif isinstance(parsed, dict) and "message" in parsed:
        message = parsed["message"]
    else:
        message = body[:300].decode(errors="replace").strip() or "(empty body)"
    return f"HTTP {status}: {message}"


class _Client:
    """One level's HTTP session and request bookkeeping."""

    def __init__(self, endpoints: Sequence[Endpoint], plan: LevelPlan,
                 session: aiohttp.ClientSession, t0: float, prefix: str) -> None:
        self.endpoints = endpoints
        self.plan = plan
        self.session = session
        self.t0 = t0
        self.prefix = prefix
        # One model and API for the level: the endpoints differ only in where they are.
        self.prompts = PromptMaker(endpoints[0], seed=zlib.crc32(prefix.encode()))
        self.headers: list[dict[str, str]] = []
        for endpoint in endpoints:
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       **endpoint.headers}
            if endpoint.api_key:
                headers["Authorization"] = f"Bearer {endpoint.api_key}"
            self.headers.append(headers)

    async def send(self, row: TraceRequestLike, index: int, seq: int,
                   scheduled_at: float, *, stream: int = 0, endpoint: int = 0
                   ) -> RequestResult:
        body = self.prompts.body(row, seq)
        request_id = f"{self.prefix}-{seq}"
        headers = {**self.headers[endpoint], "x-request-id": request_id}
        url = self.endpoints[endpoint].url
        state = _Stream(self.t0)
        http_status: int | None = None
        status: Status = "ok"
        error: str | None = None
        started = time.perf_counter() - self.t0
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                http_status = resp.status
                error = await self._read(resp, state)
        except TimeoutError:
            status, error = "timeout", f"timed out after {self.plan.request_timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            error = (f"cannot connect to {exc.host}:{exc.port} ({exc.os_error.strerror or exc}):"
                     " the pool is down or unreachable")
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as exc:
            error = (f"connection dropped mid-stream after {len(state.chunks)} content chunks:"
                     f" {exc.__class__.__name__}: {exc}")
        except aiohttp.ClientError as exc:
            error = f"{exc.__class__.__name__}: {exc}"
        finished = time.perf_counter() - self.t0
        if state.done_at is not None:
            finished = state.done_at
        if error is not None and status == "ok":
            status = "error"
        result = _result(row, index, seq, request_id, scheduled_at, started, finished, state,
                         status, http_status, error)
        result.stream, result.endpoint = stream, endpoint
        return result

    async def _read(self, resp: aiohttp.ClientResponse, state: _Stream) -> str | None:
        if resp.status >= 400:
            return _http_error(resp.status, await resp.content.read(_ERROR_BODY_LIMIT))
        content_type = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in content_type:
            await resp.read()
            return f"endpoint did not stream (HTTP {resp.status}, Content-Type: {content_type!r})"
        # Read to the end of the body even after [DONE]: a connection left with unread bytes
        # is closed instead of kept alive, and the next request would pay for a new one.
        async for block in resp.content.iter_any():
            state.feed(block, time.perf_counter())
            if state.error:
                break
        if state.error:
            return state.error
        if not state.done and not state.finished:
            return (f"stream ended before completion after {len(state.chunks)} content chunks"
                    " (no finish_reason, no [DONE])")
        return None


def _result(row: TraceRequestLike, index: int, seq: int, request_id: str, scheduled_at: float,
            started: float, finished: float, state: _Stream, status: Status,
            http_status: int | None, error: str | None) -> RequestResult:
    chunks = state.chunks
    if state.usage_out is not None:
        source: TokensSource = "usage"
        n_out, n_in = int(state.usage_out), state.usage_in
    else:
        source, n_out, n_in = "chunks", len(chunks), row.prompt_tokens
    first = chunks[0] if chunks else None
    e2e = finished - started
    ttft = None if first is None else first - started
    tpot = None if ttft is None or n_out <= 1 else (e2e - ttft) / (n_out - 1)
    return RequestResult(
        index=index, seq=seq, request_id=request_id, scheduled_at=scheduled_at,
        started_at=started, first_token_at=first, finished_at=finished, ttft_s=ttft,
        tpot_s=tpot, e2e_s=e2e, chunk_times=chunks, input_tokens=n_in, output_tokens=n_out,
        tokens_source=source, status=status, http_status=http_status, error=error,
        schedule_lag_s=started - scheduled_at,
    )
