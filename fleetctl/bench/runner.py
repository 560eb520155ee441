"""The benchmark runner: replays a trace against one OpenAI-compatible endpoint, streaming.

Pure asyncio + aiohttp (no Django): a Celery task, the CLI, a test or a benchmark script can
all call `run_level`. One call = one load level; it returns every request's raw timings, which
`fleetctl.bench.stats` turns into percentiles and a verdict.

Two ways to load the endpoint:

- **fixed concurrency** (`concurrency=N`): N workers, each sends the next request of the trace
  as soon as its previous one finished (closed loop). The trace is looped if it runs out.
- **trace timing** (`speed=S`): open loop, request i is sent at `arrival_s[i] / S` seconds after
  the level started, whatever the server is doing. Sends are scheduled on absolute deadlines;
  how late each one went out is its *schedule lag*. In-flight requests are capped by
  `LevelPlan.max_in_flight`; a send that waits for that cap shows as lag, not hidden in TTFT.

**Staggered starts** (fixed concurrency): the N streams do not all send their first request at
once. Stream k's first request goes out at `(k + u_k) / N × ramp_s` seconds after the level's
start, u_k a seeded draw in [0, 0.25) (`stagger_offsets`): spread evenly over the ramp, with a
little jitter so that the starts do not sit on a fixed grid, yet any two streams stay at least
three quarters of a slot apart. After its first request a stream is a plain closed loop (no
think time: a stream that paused would leave fewer than N requests in flight, and
"concurrency N" would be untrue).
Why: N streams started together with equal request lengths stay in lock step — every prompt
reaches the server in the same step, and the level measures bursts the client made. With
start phases spread over at least one request duration they stay spread (closed loop, equal
lengths) and the server sees a steady N in flight. Each stream's start is recorded
(`LevelResult.stream_starts`), and every result says which stream sent it.

**Endpoints**: `run_level` takes one endpoint or several (a pool's `base_urls`); stream k
drives endpoint k mod E (fixed concurrency), request n goes to endpoint n mod E (trace timing).
Every result says which endpoint it went to.

A level = warm-up (results kept but flagged `warmup=True` and left out of the statistics),
then a steady-state window that starts at the end of the warm-up or once the last stream has
sent its first request, whichever is later, and ends once `window_s` has elapsed *and*
`min_samples` requests started inside it have finished (or at `max_duration_s`). Then no new
request is sent and the ones in flight are awaited (up to `drain_timeout_s`); they still
count, because dropping them would favour short requests.

**Clock**: `time.perf_counter()` (CLOCK_MONOTONIC on Linux, the simulator's clock too). Every
time in a result is seconds relative to the level's start.

**Metrics per request** (published definitions):

- TTFT: send → arrival of the first *content-bearing* chunk (non-empty `delta.content`,
  `reasoning_content`, `tool_calls`, or `text` for completions). A role-only first chunk does
  not count.
- E2E: send → end of the stream (`data: [DONE]` or the connection closing after a finish).
- TPOT: (E2E − TTFT) / (N − 1), N = output tokens; None when N ≤ 1.
- ITL: the gaps between consecutive content-bearing chunk arrivals (a server that packs several
  tokens in one chunk gives fewer, longer gaps; TPOT is the per-token figure).
- Tokens: from the server's `usage` (requested with `stream_options.include_usage`). When a
  server sends no usage, output tokens = content-bearing chunks and input tokens = the trace's
  prompt_tokens, and the result says `tokens_source="chunks"`.

Requests ask for `max_tokens = completion_tokens` with `ignore_eos: true` (vLLM's extension,
honoured by vLLM, SGLang and `fleetctl sim`) so the trace's output length is what is generated.
A server that ignores it may stop early at its natural end; the observed token count is what
is recorded and counted, never the requested one. `Endpoint(ignore_eos=False)` leaves it out for
servers that reject unknown fields.

**Synthetic prompts** (a trace row without prompt text or messages): `prompt_tokens` words
drawn from `WORDS`, common lower-case English words that are one token each in the simulator
(`\\w+`) and in the Llama-3 / GPT BPE vocabularies, joined by spaces; so the prompt is about
`prompt_tokens` tokens, plus what the server's chat template adds (the simulator: 11 for chat,
1 for completions; real templates: 5–40). The words are drawn from a seed per request, so
requests do not share a prefix by accident (prefix caching would flatter the server); rows of
one `prefix_group` share their first `prefix_tokens` words. The usage figures, when given, are
what is recorded.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import random
import time
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from .client import (
    WORDS,
    Endpoint,
    PromptMaker,
    RequestResult,
    Status,
    TokensSource,
    TraceRequestLike,
    _Client,
)
from .stats import LevelSamples

__all__ = ["WORDS", "Endpoint", "LevelPlan", "LevelResult", "PromptMaker", "RequestResult",
           "Status", "TokensSource", "TraceRequestLike", "run_level", "stagger_offsets"]

LOOP_PROBE_INTERVAL_S = 0.005


@dataclass(frozen=True, slots=True)
class LevelPlan:
    warmup_s: float = 15.0
    window_s: float = 60.0
    min_samples: int = 50
    max_duration_s: float = 300.0
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    drain_timeout_s: float | None = None  # default: request_timeout_s
    max_in_flight: int = 1024  # trace timing only: cap on open requests (and connections)
    # fixed concurrency: the streams' first requests are spread over this many seconds;
    # None = half the warm-up (RAMP_SHARE_OF_WARMUP), so the queue settles before the window
    ramp_s: float | None = None

    @property
    def ramp(self) -> float:
        return self.ramp_s if self.ramp_s is not None else self.warmup_s * RAMP_SHARE_OF_WARMUP


RAMP_SHARE_OF_WARMUP = 0.5
STAGGER_JITTER = 0.25  # a stream starts somewhere in the first quarter of its slot of the ramp


def stagger_offsets(streams: int, ramp_s: float, seed: int = 0) -> list[float]:
    """When each of `streams` streams sends its first request, in seconds after the level's
    start: stream k in [k/N, (k + 0.25)/N) of the ramp, seeded (reproducible). Stream 0 starts
    at 0 or just after; all are < ramp_s. A ramp of 0 starts every stream at once."""
    if streams < 1:
        raise ValueError("streams must be >= 1")
    if not ramp_s > 0:
        return [0.0] * streams
    rng = random.Random(seed)
    slot = ramp_s / streams
    return [(k + STAGGER_JITTER * rng.random()) * slot for k in range(streams)]


@dataclass(slots=True)
class LevelResult:
    mode: Literal["concurrency", "trace"]
    concurrency: int | None
    speed: float | None
    results: list[RequestResult]
    window_start_s: float
    window_end_s: float
    wall_s: float
    client_cpu_s: float
    loop_lag_s: array[float]
    stopped_by: Literal["window", "max_duration"]
    origin: float = 0.0  # time.perf_counter() at the level's start: result times are after it
    # fixed concurrency: (stream, when it sent its first request, its endpoint), in seconds
    # after the level's start (the planned offset plus any client lateness)
    stream_starts: list[tuple[int, float, int]] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)  # the URLs, by endpoint index

    @property
    def window_s(self) -> float:
        return self.window_end_s - self.window_start_s

    @property
    def client_cpu_share(self) -> float:
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def samples(self) -> LevelSamples:
        return LevelSamples.of(self.results, window_s=self.window_s,
                               client_cpu_s=self.client_cpu_s, wall_s=self.wall_s,
                               loop_lag_s=self.loop_lag_s)


# ---- a level ------------------------------------------------------------------------------------


class _Level:
    """Shared state of one level: when to stop, what has finished, the loop-lag probe."""

    def __init__(self, plan: LevelPlan, t0: float,
                 on_result: Callable[[RequestResult], None] | None) -> None:
        self.plan = plan
        self.t0 = t0
        # The window starts after the warm-up and after the last stream's first send
        # (`started_all`); until then a stream start may still push it later.
        self.warm_end = plan.warmup_s
        self.started_all = asyncio.Event()
        self.results: list[RequestResult] = []
        self.measured_done = 0
        self.enough = asyncio.Event()
        self.stopping = asyncio.Event()
        self.stop_at: float | None = None
        self.loop_lag: array[float] = array("d")
        self.on_result = on_result

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def all_started(self, at: float) -> None:
        """Every stream has sent its first request (at `at`): the window may start."""
        self.warm_end = max(self.plan.warmup_s, at)
        self.started_all.set()

    def record(self, result: RequestResult) -> None:
        # Before every stream has started nothing is measured: the window starts later.
        result.warmup = (not self.started_all.is_set()) or result.started_at < self.warm_end
        self.results.append(result)
        if not result.warmup:
            self.measured_done += 1
            if self.measured_done >= self.plan.min_samples:
                self.enough.set()
        if self.on_result is not None:
            self.on_result(result)

    async def control(self) -> Literal["window", "max_duration"]:
        """Wait until window elapsed and min samples done (or max duration), then stop sends."""
        plan = self.plan
        stopped_by: Literal["window", "max_duration"] = "window"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.started_all.wait(),
                                   timeout=max(0.0, plan.max_duration_s - self.now()))
        window_end = self.warm_end + plan.window_s
        await asyncio.sleep(max(0.0, min(window_end, plan.max_duration_s) - self.now()))
        try:
            await asyncio.wait_for(self.enough.wait(),
                                   timeout=max(0.0, plan.max_duration_s - self.now()))
        except TimeoutError:
            stopped_by = "max_duration"
        if self.now() < window_end:  # max duration shorter than warm-up + window
            stopped_by = "max_duration"
        self.stop_at = self.now()
        self.stopping.set()
        return stopped_by

    async def probe(self) -> None:
        """Event-loop lateness every few ms: a busy client shows here before it skews TTFT."""
        deadline = time.perf_counter()
        while not self.stopping.is_set():
            deadline += LOOP_PROBE_INTERVAL_S
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            now = time.perf_counter()
            late = now - deadline
            if now - self.t0 >= self.warm_end:  # the steady state only: not the opening burst
                self.loop_lag.append(late)
            if late > LOOP_PROBE_INTERVAL_S:  # don't pile up missed ticks
                deadline = time.perf_counter()


async def run_level(
    endpoint: Endpoint | Sequence[Endpoint],
    trace: Sequence[TraceRequestLike],
    plan: LevelPlan,
    *,
    concurrency: int | None = None,
    speed: float | None = None,
    request_id_prefix: str | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    streams: Sequence[int] | None = None,
    start_offsets: Sequence[float] | None = None,
) -> LevelResult:
    """Run one level: give exactly one of `concurrency` (closed loop) or `speed` (trace timing).

    Several endpoints: stream k (closed loop) or request n (trace timing) goes to endpoint
    k (n) mod their number. `streams` numbers this call's streams when a level is split over
    client processes (default 0 … concurrency − 1; the endpoint follows the number) and
    `start_offsets` gives each its first send, in seconds after the start (default:
    `stagger_offsets` over the plan's ramp, seeded from the request-id prefix).

    `on_result` is called in the event loop for every finished request (progress reporting;
    keep it cheap)."""
    endpoints = [endpoint] if isinstance(endpoint, Endpoint) else list(endpoint)
    _check_level(endpoints, trace, plan, concurrency, speed)
    prefix = request_id_prefix or f"bench-{random.getrandbits(32):08x}"
    stream_ids, offsets = _streams(concurrency, plan, prefix, streams, start_offsets)
    connector, timeout = _connection(plan, concurrency)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    level = _Level(plan, t0, on_result)
    starts: list[tuple[int, float, int]] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     auto_decompress=False) as session:
        client = _Client(endpoints, plan, session, t0, prefix)
        probe = asyncio.create_task(level.probe())
        if concurrency is not None:
            stopped_by = await _closed_loop(level, client, trace, stream_ids, offsets, starts)
        else:
            assert speed is not None
            stopped_by = await _open_loop(level, client, trace, speed)
        await probe
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return _level_result(level, endpoints, concurrency, speed, stopped_by, starts,
                         wall=wall, cpu=cpu)


def _check_level(endpoints: Sequence[Endpoint], trace: Sequence[TraceRequestLike],
                 plan: LevelPlan, concurrency: int | None, speed: float | None) -> None:
    """Refuse a level that cannot run, before anything is sent."""
    if not endpoints:
        raise ValueError("give at least one endpoint")
    if not trace:
        raise ValueError("the trace is empty")
    if (concurrency is None) == (speed is None):
        raise ValueError("give exactly one of concurrency or speed")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if speed is not None and speed <= 0:
        raise ValueError("speed must be > 0")
    if plan.ramp < 0:
        raise ValueError("ramp_s must be >= 0")


def _streams(concurrency: int | None, plan: LevelPlan, prefix: str,
             streams: Sequence[int] | None, start_offsets: Sequence[float] | None
             ) -> tuple[list[int], list[float]]:
    """Fixed concurrency: each stream's number and first send (none for trace timing)."""
    stream_ids: list[int] = []
    offsets: list[float] = []
    if concurrency is not None:
        stream_ids = list(streams) if streams is not None else list(range(concurrency))
        offsets = (list(start_offsets) if start_offsets is not None
                   else stagger_offsets(concurrency, plan.ramp, zlib.crc32(prefix.encode())))
        if len(stream_ids) != concurrency or len(offsets) != concurrency:
            raise ValueError("give one stream number and one start offset per stream")
    return stream_ids, offsets


def _connection(plan: LevelPlan, concurrency: int | None
                ) -> tuple[aiohttp.TCPConnector, aiohttp.ClientTimeout]:
    """One connection per stream (or up to the in-flight cap), kept alive across requests."""
    limit = concurrency if concurrency is not None else plan.max_in_flight
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60,
                                     ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=plan.request_timeout_s,
                                    sock_connect=plan.connect_timeout_s)
    return connector, timeout


def _level_result(level: _Level, endpoints: Sequence[Endpoint], concurrency: int | None,
                  speed: float | None, stopped_by: Literal["window", "max_duration"],
                  starts: list[tuple[int, float, int]], *, wall: float, cpu: float
                  ) -> LevelResult:
    """The finished level: the window fixed, each result marked in or out of it."""
    window_end = level.stop_at if level.stop_at is not None else wall
    window_start = min(level.warm_end, window_end)
    for result in level.results:  # the window's final start decides (see _Level.record)
        result.warmup = result.started_at < window_start
    _count_window_tokens(level.results, window_start, window_end)
    level.results.sort(key=lambda r: r.seq)
    return LevelResult(
        mode="concurrency" if concurrency is not None else "trace", concurrency=concurrency,
        speed=speed, results=level.results, window_start_s=window_start,
        window_end_s=window_end, wall_s=wall, client_cpu_s=cpu, loop_lag_s=level.loop_lag,
        stopped_by=stopped_by, origin=level.t0, stream_starts=sorted(starts),
        endpoints=[e.url for e in endpoints],
    )


async def _closed_loop(level: _Level, client: _Client, trace: Sequence[TraceRequestLike],
                       stream_ids: Sequence[int], offsets: Sequence[float],
                       starts: list[tuple[int, float, int]]
                       ) -> Literal["window", "max_duration"]:
    counter = iter(range(1 << 62))
    waiting = len(stream_ids)
    n_endpoints = len(client.endpoints)

    async def worker(stream: int, offset: float) -> None:
        nonlocal waiting
        endpoint = stream % n_endpoints
        delay = offset - level.now()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(level.stopping.wait(), timeout=delay)
        first = True
        while not level.stopping.is_set():
            seq = next(counter)
            index = seq % len(trace)
            # the worker wanted to send now (its first: at its offset); lag = until it did
            ready = offset if first else level.now()
            if first:
                now = level.now()
                starts.append((stream, now, endpoint))
                waiting -= 1
                if waiting == 0:
                    level.all_started(now)
                first = False
            level.record(await client.send(trace[index], index, seq, ready, stream=stream,
                                           endpoint=endpoint))

    workers = [asyncio.create_task(worker(stream, offset))
               for stream, offset in zip(stream_ids, offsets, strict=True)]
    stopped_by = await level.control()
    await _drain(workers, level.plan)
    return stopped_by


async def _open_loop(level: _Level, client: _Client, trace: Sequence[TraceRequestLike],
                     speed: float) -> Literal["window", "max_duration"]:
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    first = trace[order[0]].arrival_s
    span = trace[order[-1]].arrival_s - first
    period = span + span / (len(order) - 1) if len(order) > 1 and span > 0 else 1.0
    slots = asyncio.Semaphore(level.plan.max_in_flight)
    tasks: set[asyncio.Task[None]] = set()
    n_endpoints = len(client.endpoints)
    level.all_started(0.0)  # no streams: the window starts after the warm-up

    async def one(index: int, seq: int, scheduled: float) -> None:
        try:
            level.record(await client.send(trace[index], index, seq, scheduled,
                                           endpoint=seq % n_endpoints))
        finally:
            slots.release()

    async def dispatch() -> None:
        for seq in range(1 << 62):
            loop_n, pos = divmod(seq, len(order))
            index = order[pos]
            scheduled = (trace[index].arrival_s - first + loop_n * period) / speed
            delay = scheduled - level.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(level.stopping.wait(), timeout=delay)
            if level.stopping.is_set():
                return
            await slots.acquire()
            task = asyncio.create_task(one(index, seq, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    dispatcher = asyncio.create_task(dispatch())
    stopped_by = await level.control()
    await dispatcher
    await _drain(list(tasks), level.plan)
    return stopped_by


async def _drain(tasks: Sequence[asyncio.Task[None]], plan: LevelPlan) -> None:
    """Let in-flight requests finish; past the drain timeout cancel them (recorded nowhere:
    they never finished, and the level says how it stopped)."""
    if not tasks:
        return
    timeout = plan.drain_timeout_s if plan.drain_timeout_s is not None else plan.request_timeout_s
    _done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def _count_window_tokens(results: Sequence[RequestResult], start: float, end: float) -> None:
    """Tokens whose chunk arrived inside [start, end]: the steady-state throughput's numerator.
    With usage, each chunk is worth output_tokens / chunks (servers may pack tokens)."""
    for result in results:
        times = result.chunk_times  # ascending
        if not times or end <= start:
            continue
        inside = bisect.bisect_right(times, end) - bisect.bisect_left(times, start)
        result.window_tokens = inside * result.output_tokens / len(times)
