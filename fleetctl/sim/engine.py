"""Continuous-batching engine: one asyncio scheduler loop per pool.

Each scheduler step:

1. drops sequences whose clients went away;
2. makes room in the KV cache for one more token per running sequence, preempting the
   most recently admitted ones (vLLM's recompute preemption) if it is full;
3. admits sequences from the FIFO queue while there is a free sequence slot, the KV
   cache can hold their context plus one token, and the step's prefill budget allows;
4. sleeps until the step's absolute deadline (`deadline = previous deadline + step
   time`, never `sleep(step)`, so timing does not drift); the step time is the profile's
   decode time for the batch, lengthened by the prefill of newly admitted sequences'
   uncached prompt tokens (prefill is not chunked: it joins the step in one piece);
5. emits one token for every running sequence (a newly admitted sequence's first token
   is produced by the step that prefilled it) and retires finished sequences.

Schedule lag (actual wake − deadline) is measured every step and watched by
`LagMonitor`, which flags the pool as lagging instead of silently stretching time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .gcgovernor import GOVERNOR, GcGovernor
from .profiles import Profile
from .textgen import Token, TokenSource
from .timing import DeadlineTimer, sleep_until

log = logging.getLogger("fleetctl.sim")

PREFIX_BLOCK_TOKENS = 16
LAG_WINDOW_STEPS = 200
LAG_MIN_STEPS = 20
LAG_THRESHOLD_S = 0.002
# After a stall this long (e.g. the machine was suspended) start a fresh schedule instead of
# replaying every missed step back to back.
REBASE_AFTER_S = 0.5


class QueueFull(Exception):
    """The waiting queue is at the profile's max_waiting."""


@dataclass(slots=True)
class Delta:
    """Output of one step for one sequence: text to show, the token, and maybe the end."""

    text: str
    token: Token | None
    finish_reason: str | None = None


@dataclass(slots=True)
class SeqParams:
    model: str
    prompt_tokens: int
    prefix_hashes: list[int]
    max_tokens: int
    stops: tuple[str, ...] = ()
    ignore_eos: bool = False


class Sequence:
    """One request inside the engine: its KV footprint, timings and output mailbox."""

    def __init__(self, params: SeqParams, stream: TokenSource, *, arrival: float) -> None:
        self.params = params
        self.stream = stream
        self.model = params.model
        self.arrival = arrival
        self.enqueued = arrival
        self.admitted: float | None = None
        self.prefill_start: float | None = None
        self.prefill_end: float | None = None
        self.finished_at: float | None = None
        self.last_token_at: float | None = None
        self.prev_token_at: float | None = None
        # Whatever the HTTP layer needs back in engine callbacks (ground-truth identity).
        self.request_info: object | None = None
        self.token_times: list[float] | None = None
        # When each streamed token's chunk was handed to the kernel: a step writes its
        # sequences one after another, so a late sequence's token leaves after its step time.
        self.written_times: list[float] | None = None
        self.cached_tokens = 0
        self.generated = 0
        self.kv_tokens = 0
        self.preemptions = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        self.pending: list[Delta] = []
        # Output goes either straight to `sink` (called inside the scheduler step) or into
        # `pending`, read by a handler task that is woken per token or only at the end.
        self.sink: Callable[[Delta], None] | None = None
        self.wake_each_token = False
        self._waiter: asyncio.Future[None] | None = None
        self._text = ""
        self._emitted_chars = 0
        self._stop_hold = max((len(s) for s in params.stops), default=0) - 1

    # ---- engine side -------------------------------------------------------------------

    def context_tokens(self) -> int:
        """Tokens that must be in the KV cache for this sequence to run (recompute after
        preemption includes what it already generated)."""
        return self.params.prompt_tokens + self.generated

    def on_token(self, token: Token, now: float) -> None:
        self.generated += 1
        self.prev_token_at = self.last_token_at
        self.last_token_at = now
        if self.token_times is not None:
            self.token_times.append(now)
        text, finish = (token.text, None) if self._stop_hold < 0 else self._apply_stops(token.text)
        if finish is None:
            finish = self._natural_finish()
            if finish is not None and self._stop_hold >= 0:
                text += self._flush_held()
        delta = Delta(text, token, finish)
        if finish is not None:
            self.finish_reason = finish
            self.finished_at = now
            self.done = True
        if self.sink is not None:
            self.sink(delta)
            if self.written_times is not None:
                self.written_times.append(time.monotonic())
        else:
            self.pending.append(delta)
        if finish is not None or self.wake_each_token:
            self._wake()

    def _natural_finish(self) -> str | None:
        if self.generated >= self.params.max_tokens:
            return "length"
        if not self.params.ignore_eos and self.generated >= self.stream.natural_length:
            return "stop"
        return None

    def _apply_stops(self, text: str) -> tuple[str, str | None]:
        """Cut at the first stop string; hold back only a tail that could begin one."""
        start = max(0, len(self._text) - self._stop_hold)
        self._text += text
        hits = [i for i in (self._text.find(s, start) for s in self.params.stops) if i >= 0]
        if hits:
            end = min(hits)
            out = self._text[self._emitted_chars : end]
            self._emitted_chars = end
            return out, "stop"
        safe = max(self._emitted_chars, len(self._text) - self._partial_stop_suffix())
        out = self._text[self._emitted_chars : safe]
        self._emitted_chars = safe
        return out, None

    def _partial_stop_suffix(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text, best = self._text, 0
        for stop in self.params.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _flush_held(self) -> str:
        out = self._text[self._emitted_chars :]
        self._emitted_chars = len(self._text)
        return out

    def abort(self, error: str) -> None:
        if self.done:
            return
        self.error = error
        self.done = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- handler side ------------------------------------------------------------------

    def attach_sink(self, sink: Callable[[Delta], None]) -> None:
        """Send output straight to `sink` from now on, starting with anything pending."""
        pending, self.pending = self.pending, []
        for delta in pending:
            sink(delta)
        self.sink = sink

    async def next_output(self) -> list[Delta]:
        """Everything emitted since the last call; empty only once the sequence is done."""
        while not self.pending and not self.done:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        out, self.pending = self.pending, []
        return out

    async def wait_done(self) -> list[Delta]:
        deltas: list[Delta] = []
        while True:
            chunk = await self.next_output()
            deltas.extend(chunk)
            if self.done and not self.pending:
                return deltas


class PrefixCache:
    """LRU of prompt-prefix blocks (16 tokens, hashed cumulatively so a block's hash names
    the whole prefix up to it). Only full blocks are cached."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = capacity_tokens // PREFIX_BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @staticmethod
    def block_hashes(model: str, tokens: list[str]) -> list[int]:
        hashes: list[int] = []
        running = hash(model)
        for start in range(0, len(tokens) - PREFIX_BLOCK_TOKENS + 1, PREFIX_BLOCK_TOKENS):
            running = hash((running, tuple(tokens[start : start + PREFIX_BLOCK_TOKENS])))
            hashes.append(running)
        return hashes

    def peek(self, hashes: list[int]) -> int:
        """Number of leading blocks already cached."""
        hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            hit += 1
        return hit

    def insert(self, hashes: list[int]) -> None:
        """Cache (or refresh) every block, evicting the least recently used beyond capacity."""
        blocks = self._blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()


@dataclass
class LagMonitor:
    """Keeps recent schedule lags; flags (and logs once per transition) when p99 > 2 ms."""

    pool_name: str
    window: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_WINDOW_STEPS))
    lagging: bool = False
    episodes: int = 0
    last_p99_s: float = 0.0
    _steps_since_check: int = 0

    def record(self, lag_s: float) -> None:
        self.window.append(lag_s)
        self._steps_since_check += 1
        if self._steps_since_check >= 10 and len(self.window) >= LAG_MIN_STEPS:
            self._steps_since_check = 0
            self._check()

    def p99(self) -> float:
        n = len(self.window)
        if n == 0:
            return 0.0
        above = n - max(0, -(-99 * n // 100) - 1)  # samples at or above the p99 rank
        return heapq.nlargest(above, self.window)[-1]

    def _check(self) -> None:
        self.last_p99_s = p99 = self.p99()
        lagging = p99 > LAG_THRESHOLD_S
        if lagging == self.lagging:
            return
        self.lagging = lagging
        n = len(self.window)
        if lagging:
            self.episodes += 1
            log.warning(
                "sim pool %s lagging: p99 schedule lag %.2f ms over last %d steps",
                self.pool_name, p99 * 1000, n,
            )
        else:
            log.warning(
                "sim pool %s no longer lagging: p99 schedule lag %.2f ms over last %d steps",
                self.pool_name, p99 * 1000, n,
            )

    def reset(self) -> None:
        self.window.clear()
        self.lagging = False
        self.last_p99_s = 0.0


@dataclass(slots=True)
class StepRecord:
    intended: float
    actual: float
    batch: int
    prefill_tokens: int
    step_s: float
    # Time from the step's wake-up until the stream writers it woke had handed their chunks
    # to the kernel (one event-loop turn); None until known.
    flush_s: float | None = None


@dataclass
class EngineHooks:
    """Callbacks into metrics and ground truth, so the engine knows neither."""

    on_step: Callable[[StepRecord, float], None] = lambda step, lag: None
    on_admit: Callable[[Sequence, int], None] = lambda seq, cached: None
    on_tokens: Callable[[list[Sequence], float], None] = lambda seqs, now: None
    on_finish: Callable[[Sequence], None] = lambda seq: None
    on_flush: Callable[[StepRecord], None] = lambda step: None


class Engine:
    def __init__(
        self,
        profile: Profile,
        *,
        pool_name: str,
        hooks: EngineHooks,
        governor: GcGovernor = GOVERNOR,
    ) -> None:
        self.profile = profile
        self.hooks = hooks
        self.governor = governor
        self.slowdown = 1.0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_used = 0
        self.prefix_cache = PrefixCache(profile.prefix_cache_tokens)
        self.lag = LagMonitor(pool_name)
        self.steps = 0
        self.preemptions = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_step: StepRecord | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-scheduler")

    async def stop(self) -> None:
        self.abort_all("simulator shutting down")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ---- requests ----------------------------------------------------------------------

    def submit(self, seq: Sequence, now: float) -> None:
        if len(self.waiting) >= self.profile.max_waiting:
            raise QueueFull
        seq.enqueued = now
        self.waiting.append(seq)
        self._wakeup.set()

    def cancel(self, seq: Sequence) -> None:
        """The client went away; the scheduler drops it at the next step boundary."""
        if not seq.done:
            seq.abort("client disconnected")
            self.hooks.on_finish(seq)

    def abort_all(self, reason: str) -> None:
        for seq in [*self.running, *self.waiting]:
            if not seq.done:
                seq.abort(reason)
                self.hooks.on_finish(seq)
        self.running.clear()
        self.waiting.clear()
        self.kv_used = 0

    def kv_usage(self) -> float:
        return self.kv_used / self.profile.kv_cache_tokens

    # ---- scheduler loop ----------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        timer = DeadlineTimer(loop)
        try:
            while True:
                try:
                    await self._schedule(loop, timer)
                except Exception:
                    # A bug must not leave every client hanging: fail what is in flight
                    # with an error, say so in the log, and keep serving.
                    log.exception("sim pool %s: scheduler error", self.lag.pool_name)
                    self.abort_all("internal simulator error")
        finally:
            timer.close()

    async def _schedule(self, loop: asyncio.AbstractEventLoop, timer: DeadlineTimer) -> None:
        next_at = loop.time()
        while True:
            if not self.running and not self.waiting:
                self.governor.note_deadline(id(self), None)
                self._wakeup.clear()
                await self._wakeup.wait()
                next_at = loop.time()
            batch_prefill = self._plan_step(next_at)
            if not self.running:
                continue  # everything queued was cancelled meanwhile
            step_s = self.profile.step_seconds(len(self.running), batch_prefill, self.slowdown)
            deadline = next_at + step_s
            self.governor.note_deadline(id(self), deadline)
            # One loop turn lets the stream writers woken by the last step flush their
            # chunks; then, if the next deadline is far enough, garbage is collected now.
            await asyncio.sleep(0)
            self._note_flush(loop.time())
            self.governor.collect_if_quiet(loop.time())
            await sleep_until(loop, timer, deadline)
            now = loop.time()
            lag = now - deadline
            self._finish_step(StepRecord(deadline, now, len(self.running), batch_prefill, step_s))
            next_at = deadline if lag < REBASE_AFTER_S else now

    def _note_flush(self, now: float) -> None:
        step, self._last_step = self._last_step, None
        if step is not None:
            step.flush_s = now - step.actual
            self.hooks.on_flush(step)

    def _plan_step(self, start: float) -> int:
        """Admission and KV bookkeeping at a step boundary; returns prefill tokens."""
        self._drop_done()
        self._make_room()
        return self._admit(start)

    def _drop_done(self) -> None:
        if any(seq.done for seq in self.running):
            keep = []
            for seq in self.running:
                if seq.done:
                    self.kv_used -= seq.kv_tokens
                else:
                    keep.append(seq)
            self.running = keep

    def _make_room(self) -> None:
        capacity = self.profile.kv_cache_tokens
        while self.running and self.kv_used + len(self.running) > capacity:
            victim = self.running.pop()  # newest admitted goes back to the head of the queue
            self.kv_used -= victim.kv_tokens
            victim.kv_tokens = 0
            victim.preemptions += 1
            self.preemptions += 1
            self.waiting.appendleft(victim)

    def _admit(self, start: float) -> int:
        profile = self.profile
        prefill = 0
        while self.waiting and len(self.running) < profile.max_seqs:
            seq = self.waiting[0]
            if seq.done:
                self.waiting.popleft()
                continue
            need = seq.context_tokens()
            if self.kv_used + len(self.running) + need + 1 > profile.kv_cache_tokens:
                break  # strict FIFO: nobody overtakes the head of the queue
            hashes = seq.params.prefix_hashes
            hit_tokens = self.prefix_cache.peek(hashes) * PREFIX_BLOCK_TOKENS
            # At least one prompt token is always computed, as in vLLM.
            cached = max(0, min(hit_tokens, seq.params.prompt_tokens - 1))
            uncached = need - cached
            if prefill and prefill + uncached > profile.max_prefill_tokens_per_step:
                break
            self.waiting.popleft()
            self.prefix_cache.insert(hashes)
            prefill += uncached
            self._start(seq, start, cached, need)
        return prefill

    def _start(self, seq: Sequence, start: float, cached: int, need: int) -> None:
        self.running.append(seq)
        self.kv_used += need
        seq.kv_tokens = need
        if seq.admitted is None:
            seq.admitted = start
            seq.prefill_start = start
            seq.cached_tokens = cached
        self.hooks.on_admit(seq, cached)

    def _finish_step(self, step: StepRecord) -> None:
        now = step.actual
        self.steps += 1
        self._last_step = step
        lag = now - step.intended
        self.lag.record(lag)
        self.hooks.on_step(step, lag)
        emitted: list[Sequence] = []
        finished = False
        for seq in self.running:
            if seq.done:
                continue
            if seq.prefill_end is None:
                seq.prefill_end = now
            seq.on_token(seq.stream.next(), now)
            seq.kv_tokens += 1
            emitted.append(seq)
            finished = finished or seq.done
        self.kv_used += len(emitted)
        self.hooks.on_tokens(emitted, now)
        if finished:
            for seq in emitted:
                if seq.done:
                    self.hooks.on_finish(seq)
            self._drop_done()
