"""Running one claimed chunk: read its requests from the input file, send them to the pool and
record each final answer through the checkpoint store (fleetctl/batch/store.py).

Threads, and why:
- The calling thread dispatches and records. Before a request above its reservation it
  writes the dispatch checkpoint for the next min(BATCH_CHECKPOINT_GROUP, 2 x concurrency)
  indices (`store.dispatched`), then hands requests to sender threads; every answer comes back on a
  queue and joins the group not yet committed, committed here in one transaction
  (`store.record_many`) when it holds BATCH_CHECKPOINT_GROUP answers or its oldest is
  BATCH_CHECKPOINT_MS old, and when the chunk ends or halts (the store's module docstring
  has the rule). So a worker uses two database connections (this one and the lease
  renewer's) however high the job's concurrency.
- Sender threads (at most `job.concurrency` busy at once) only talk HTTP: each request is
  `upstream.post` on the process's one aiohttp event loop (fleetctl/inference/upstream.py,
  shared with shadow and eval calls; without a database, a thread a call on httpx sent 758
  requests/s at concurrency 64, this 1,722: benchmarks/batch_checkpoint_writes.py), the body
  sent as given (non-streamed), `job.request_timeout_s` per try, the pool's base_urls taken
  round robin.
- The renewer extends the lease every lease_s / 3 and re-reads the job's concurrency and rate
  limit (a person may edit them while it runs). When a renewal fails (the lease was taken
  over, or the job was paused, cancelled or expired) the chunk halts: nothing more is
  dispatched, no retry is started, and the requests already on the wire finish; their answers
  are still recorded (a second write for the same request is refused by the store, so a result
  counts once). Then the chunk is finished or released.

Retries: 429, 5xx and transport errors (status 0) are tried again after 0.5 s x 2^n with
jitter (at most 30 s; longer when the answer's Retry-After asks for it), up to
`job.max_attempts` tries in all, each retry counted on the chunk in the next group's commit.
A retry that would start after the job's completion window ends is not made: the request is
left without a result and the job expires with its partial output. Any other 4xx is a final
error at once; the last try's error after max_attempts is final with code
"retries_exhausted".

Rate limit: every try (first or retry) takes a start from one token bucket at
`job.rate_limit_rps` (burst of one), so the job never starts more than that per second.

Drills (the job's `drill` option), run by the holder once the job's done share reaches
`job.drill_at`:
- kill-worker: with requests on the wire (and, with group commit, answers back but not yet
  committed), commit drill_fired_at (conditional UPDATE, the first holder only; its event
  names the uncommitted indices) and kill this process with SIGKILL. Another worker takes the
  chunk over once the lease lapses and sends the in-flight, uncommitted and reserved-unsent
  requests again (recorded as resends).
- fault-pool: mark the pool down through each base_url's fault hook (the simulator's
  POST /admin/faults) for FAULT_S seconds, then clear it; requests fail meanwhile and are
  retried. A pool without the hook is noted, and the drill's verdict fails.
"""

from __future__ import annotations

import email.utils
import itertools
import json
import logging
import os
import queue
import random
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleetctl.batch.models import BatchJob, BatchJobEvent
from fleetctl.batch.store import FAULT_CLEARED, CheckpointStore, Claim, Outcome, input_path
from fleetctl.inference import upstream
from fleetctl.inference.upstream import ERROR_BODY_LIMIT

log = logging.getLogger("fleetctl.batch")

MAX_CONCURRENCY = 256  # BatchJob.concurrency's validator
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
FAULT_S = 2.0  # how long the fault-pool drill keeps the pool down
HALT_POLL_S = 0.25

_drill_threads: list[threading.Thread] = []


def wait_for_drills(timeout_s: float = FAULT_S + 15) -> None:
    """Before the process exits: let a fault-pool drill clear the fault it set."""
    deadline = time.monotonic() + timeout_s
    for thread in _drill_threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def retryable(status: int) -> bool:
    return status == 0 or status == 429 or status >= 500


def backoff_s(retry: int, retry_after_s: float | None = None) -> float:
    """Wait before retry number `retry` (1, 2, ...): exponential with jitter, capped; never
    shorter than the server's Retry-After."""
    wait = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry - 1)) * random.uniform(0.75, 1.25)
    return max(wait, retry_after_s or 0.0)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class Reply:
    """One try's answer. status 0: no answer (timeout, refused, dropped)."""

    status: int
    body: str
    error_code: str
    error_message: str
    retry_after_s: float | None
    latency_ms: float
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def send(base_url: str, request: dict[str, Any], *, timeout_s: float) -> Reply:
    """POST one line's body to base_url + its url; errors are replies, never raised."""
    posted = upstream.post(base_url, str(request.get("url") or "/v1/chat/completions"),
                           request.get("body"), timeout_s=timeout_s)
    status, text, latency_ms = posted.status, posted.text, posted.latency_ms
    if status == 0:
        return Reply(0, "", posted.error_code, posted.error_message, None, latency_ms)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if 200 <= status < 300:
        if not isinstance(parsed, dict):
            return Reply(status, "", "malformed_body", "the answer was not a JSON object",
                         None, latency_ms)
        usage = parsed.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return Reply(status, text, "", "", None, latency_ms,
                     prompt_tokens=_int(usage.get("prompt_tokens")),
                     output_tokens=_int(usage.get("completion_tokens")))
    code, message = _error_of(status, parsed, text)
    return Reply(status, text[:ERROR_BODY_LIMIT] if isinstance(parsed, dict) else "", code,
                 message, parse_retry_after(posted.retry_after), latency_ms)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _error_of(status: int, parsed: Any, text: str) -> tuple[str, str]:
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or f"http_{status}"
        return str(code), str(error.get("message") or f"HTTP {status}")
    return f"http_{status}", f"HTTP {status}: {text[:300].strip() or '(empty body)'}"


class RateLimiter:
    """A token bucket of one: starts spaced 1/rps apart (no limit when rps is None)."""

    def __init__(self, rps: float | None) -> None:
        self.rps = rps
        self._next = 0.0
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """0 when a start is granted now (and taken), else the seconds to wait first."""
        with self._lock:
            if not self.rps:
                return 0.0
            now = time.monotonic()
            if now < self._next:
                return self._next - now
            self._next = max(self._next, now - 1.0 / self.rps) + 1.0 / self.rps
            return 0.0

    def acquire(self, abort: threading.Event) -> bool:
        while (wait := self.reserve()) > 0:
            if abort.wait(wait):
                return False
        return True


class ChunkRun:
    """One chunk's run (see the module docstring); `run_chunk` is the entry point."""

    def __init__(self, store: CheckpointStore, claim: Claim, job: BatchJob, *,
                 stop: threading.Event, on_result: Callable[[int], None] | None) -> None:
        self.store, self.claim, self.job = store, claim, job
        self.stop, self.on_result = stop, on_result
        self.halt = threading.Event()  # stop dispatching: stop, lease lost, job not running
        self.renewer_done = threading.Event()
        self.events: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self.limiter = RateLimiter(job.rate_limit_rps)
        self.concurrency = job.concurrency
        self.urls = itertools.cycle(list(job.pool.base_urls) or [""])
        self.urls_lock = threading.Lock()
        self.sending = 0  # tries on the wire now
        self.sending_lock = threading.Lock()
        self.in_flight = 0  # requests handed to senders, not yet back
        self.recorded = 0  # results committed (or refused as second writes) by this run
        # Group commit (see the module docstring): answers back but not yet committed, when
        # the oldest of them came back, retries not yet counted on the chunk, and the last
        # index the dispatch checkpoint covers.
        self.group = max(1, int(settings.BATCH_CHECKPOINT_GROUP))
        self.group_s = max(0.0, float(settings.BATCH_CHECKPOINT_MS) / 1000)
        self.unflushed: list[Outcome] = []
        self.unflushed_since = 0.0
        self.unflushed_retries = 0
        self.reserved_through = -1
        # A dispatch checkpoint reserves at most twice the concurrency: a kill -9 makes the
        # next holder resend the reserved range, and it cannot tell a reserved request that
        # was never sent from one in flight, so the drill's resends (and the interruption
        # tax's lost work, fleet/interruption.py) count them. Twice the concurrency keeps
        # that to the order of what is in flight anyway, at one commit per 2 x concurrency
        # requests (at concurrency 8 and 540 results/s: 34 commits/s).
        self.reserve_n = max(1, min(self.group, 2 * self.concurrency))
        self.retries: Counter[int] = Counter()
        self.done_before = 0
        self.drill_armed = False
        self.halt_reason = ""

    # --- the dispatcher (calling thread) ---------------------------------------------------

    def run(self) -> str:
        # The renewer first: reading the chunk's lines must not eat into the lease.
        renewer = threading.Thread(target=self._renew_loop, name="batch-lease", daemon=True)
        renewer.start()
        senders = ThreadPoolExecutor(max_workers=MAX_CONCURRENCY, thread_name_prefix="batch-send")
        try:
            try:
                requests = dict(self._requests())
            except FileNotFoundError:
                self.store.fail(self.claim, f"the input file {self.job.input_file.path} is "
                                            f"missing from BATCH_FILES_DIR")
                return "failed"
            self.drill_armed = self._drill_armed()
            if self.drill_armed:
                self.done_before = self.store.done_count(self.job.pk)
            self._dispatch(deque(self.claim.pending), requests, senders)
            self._flush()
        finally:
            self.halt.set()
            self.renewer_done.set()
            senders.shutdown(wait=True, cancel_futures=True)
            renewer.join(timeout=5)
        if self.retries:
            self._note_retries()
        return self.store.finish(self.claim)

    def _requests(self) -> Iterator[tuple[int, dict[str, Any]]]:
        from fleetctl.batch.inputs import read_lines

        wanted = set(self.claim.pending)
        lines = read_lines(input_path(self.job), self.claim.byte_start, self.claim.byte_end,
                           first_line=self.claim.first_line)
        for n, (_, request) in enumerate(lines):
            if self.claim.first_index + n in wanted:
                yield self.claim.first_index + n, request

    def _dispatch(self, pending: deque[int], requests: dict[int, dict[str, Any]],
                  senders: ThreadPoolExecutor) -> None:
        while True:
            self._drain(block=False)
            if self.stop.is_set() and not self.halt.is_set():
                self._halt("the worker is stopping")
            if self.halt.is_set() or not pending or self.in_flight >= self.concurrency:
                if not self.in_flight and (self.halt.is_set() or not pending):
                    self._flush()
                    return
                self._drain(block=True, timeout=HALT_POLL_S)
                self._maybe_drill()
                continue
            wait = self.limiter.reserve()
            if wait > 0:
                self._drain(block=True, timeout=wait)
                continue
            index = pending.popleft()
            if index > self.reserved_through:
                # One dispatch checkpoint covers the next `reserve_n` indices of the chunk.
                through = min(self.claim.last_index, index + self.reserve_n - 1)
                if not self.store.dispatched(self.claim, through):
                    self._halt("the chunk is no longer ours")
                    continue
                self.reserved_through = through
            self.in_flight += 1
            senders.submit(self._send, index, requests[index])
            self._maybe_drill()

    def _drain(self, *, block: bool, timeout: float = 0.0) -> None:
        """Take what the senders sent back (answers and retries) into the group, and commit
        the group when it is full or due. A blocking wait ends early when the group falls
        due, so no answer waits longer than BATCH_CHECKPOINT_MS to be committed."""
        if block and (self.unflushed or self.unflushed_retries):
            timeout = min(timeout, max(
                0.0, self.unflushed_since + self.group_s - time.monotonic()))
        try:
            item = self.events.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            self._maybe_flush()
            return
        while True:
            kind, _index, value = item
            if kind == "retry":
                self._buffer_started()
                self.unflushed_retries += 1
                self.retries[value] += 1
            else:
                self.in_flight -= 1
                if value is not None:
                    self._buffer_started()
                    self.unflushed.append(value)
                    if len(self.unflushed) >= self.group:
                        self._flush()
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                self._maybe_flush()
                return

    def _buffer_started(self) -> None:
        if not self.unflushed and not self.unflushed_retries:
            self.unflushed_since = time.monotonic()

    def _maybe_flush(self) -> None:
        if (self.unflushed or self.unflushed_retries) and (
                len(self.unflushed) >= self.group
                or time.monotonic() - self.unflushed_since >= self.group_s):
            self._flush()

    def _flush(self) -> None:
        """Commit the group: its results and the chunk's counters in one transaction. Only
        then do they count (recorded, on_result); a kill before this loses them, and the
        next holder sends them again (they are below dispatched_through, without a result)."""
        if not self.unflushed and not self.unflushed_retries:
            return
        group, retries = self.unflushed, self.unflushed_retries
        self.unflushed, self.unflushed_retries = [], 0
        self.store.record_many(self.claim, group, retries)
        self.recorded += len(group)
        if self.on_result is not None:
            for outcome in group:
                self.on_result(outcome.index)

    def _halt(self, reason: str) -> None:
        if not self.halt.is_set():
            self.halt_reason = reason
            log.info("job %s chunk %s: halting (%s)", self.job.pk, self.claim.number, reason)
            self.halt.set()

    # --- senders -----------------------------------------------------------------------------

    def _send(self, index: int, request: dict[str, Any]) -> None:
        try:
            outcome = self._tries(index, request)
        except Exception:  # a bug must not leave the dispatcher waiting for this request
            log.exception("job %s: request %s failed in the worker", self.job.pk, index)
            outcome = None
        self.events.put(("done", index, outcome))

    def _tries(self, index: int, request: dict[str, Any]) -> Outcome | None:
        """The request's final outcome, or None when it is left without one (halted between
        tries, or the next try would start after the completion window)."""
        custom_id = str(request.get("custom_id", ""))
        attempt = 0
        while True:
            attempt += 1
            with self.urls_lock:
                base_url = next(self.urls)
            with self.sending_lock:
                self.sending += 1
            try:
                reply = send(base_url, request, timeout_s=self.job.request_timeout_s)
            finally:
                with self.sending_lock:
                    self.sending -= 1
            if reply.ok or not retryable(reply.status):
                return self._outcome(index, custom_id, reply, attempt, reply.error_code)
            if attempt >= self.job.max_attempts:
                return self._outcome(index, custom_id, reply, attempt, "retries_exhausted")
            if self.halt.is_set():
                return None
            delay = backoff_s(attempt, reply.retry_after_s)
            left_s = (self.job.expires_at - timezone.now()).total_seconds()
            if delay >= left_s:
                # The window ends first: hold (the renewer halts the chunk at expiry).
                self.halt.wait(max(0.0, left_s) + self.store.lease_s)
                return None
            self.events.put(("retry", index, reply.status))
            if self.halt.wait(delay) or not self.limiter.acquire(self.halt):
                return None

    @staticmethod
    def _outcome(index: int, custom_id: str, reply: Reply, attempts: int,
                 error_code: str) -> Outcome:
        message = reply.error_message
        if error_code == "retries_exhausted":
            message = f"{attempts} tries; the last: {reply.error_code}: {reply.error_message}"
        return Outcome(index=index, custom_id=custom_id, status_code=reply.status,
                       body=reply.body, error_code="" if reply.ok else error_code,
                       error_message="" if reply.ok else message, attempts=attempts,
                       prompt_tokens=reply.prompt_tokens, output_tokens=reply.output_tokens,
                       latency_ms=round(reply.latency_ms, 3), finished_at=timezone.now())

    # --- the lease ---------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        every = max(0.05, self.store.lease_s / 3)
        try:
            while True:
                if not self.store.renew(self.claim):
                    self._halt("the lease was lost or the job is no longer running")
                    return
                self._reload_options()
                if self.renewer_done.wait(every):
                    return
        except Exception:
            log.exception("job %s: lease renewal failed", self.job.pk)
            self._halt("lease renewal failed")
        finally:
            connection.close()

    def _reload_options(self) -> None:
        """A person's edit of concurrency or rate limit reaches the running chunk here."""
        row = BatchJob.objects.filter(pk=self.job.pk).values(
            "concurrency", "rate_limit_rps").first()
        if row:
            self.concurrency = row["concurrency"]
            self.reserve_n = max(1, min(self.group, 2 * self.concurrency))
            self.limiter.rps = row["rate_limit_rps"]

    # --- drills --------------------------------------------------------------------------------

    def _drill_armed(self) -> bool:
        """Whether this holder may still fire the job's drill: it has one, it has not fired,
        and no earlier attempt found it impossible (no fault hook)."""
        job = self.job
        if not job.drill or job.drill_fired_at is not None:
            return False
        return not BatchJobEvent.objects.filter(job_id=job.pk,
                                                kind=BatchJobEvent.Kind.DRILL_FIRED).exists()

    def _maybe_drill(self) -> None:
        if not self.drill_armed or self.halt.is_set():
            return
        done_share = (self.done_before + self.recorded) / max(1, self.job.total)
        if done_share < self.job.drill_at:
            return
        if self.job.drill == BatchJob.Drill.KILL_WORKER:
            if self.sending <= 0:
                return  # wait until a request is on the wire: the kill must catch one
            if self.group > 1 and not self.unflushed:
                return  # and, with group commit, an answer back but not yet committed
            self.drill_armed = False
            unflushed = [o.index for o in self.unflushed]
            if self.store.drill_fire(
                    self.claim, message=(f"kill -9 of worker {self.claim.owner} (pid "
                                         f"{os.getpid()}) with {self.in_flight} request(s) in "
                                         f"flight and {len(unflushed)} answer(s) not yet "
                                         f"committed at {done_share:.0%} done"),
                    data={"pid": os.getpid(), "in_flight": self.in_flight,
                          "unflushed": unflushed[:200], "unflushed_count": len(unflushed),
                          "dispatched_through": self.reserved_through,
                          "done": self.done_before + self.recorded}):
                log.warning("drill: killing this worker (pid %s) now", os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)
        elif self.job.drill == BatchJob.Drill.FAULT_POOL:
            self.drill_armed = False
            # It outlives this chunk (the next one runs while the pool is down); the worker
            # waits for it before exiting (wait_for_drills), so a fault is always cleared.
            thread = threading.Thread(target=self._fault_pool, name="batch-drill", daemon=True)
            _drill_threads.append(thread)
            thread.start()

    def _fault_pool(self) -> None:
        """Down for FAULT_S seconds through each endpoint's fault hook, then cleared (always,
        even when a hook failed half way)."""
        urls = list(self.job.pool.base_urls)
        applied: list[str] = []
        try:
            if not self.store.drill_fire(
                    self.claim, message=f"fault-pool: {len(urls)} endpoint(s) down for "
                                        f"{FAULT_S:g} s through the fault hook",
                    data={"urls": urls, "fault_s": FAULT_S}):
                return
            problem = ""
            for url in urls:
                posted = upstream.post(url, "/admin/faults", {"down": True}, timeout_s=5.0)
                if posted.status == 0:
                    problem = f"{url}: {posted.error_message}"
                    break
                if posted.status != 200:
                    problem = f"{url}/admin/faults answered {posted.status}"
                    break
                applied.append(url)
            if problem:
                self.store.drill_note(self.claim, "no-hook",
                                      f"the pool has no fault hook ({problem})",
                                      {"problem": problem})
            else:
                time.sleep(FAULT_S)
        except Exception:
            log.exception("job %s: the fault-pool drill failed", self.job.pk)
        finally:
            cleared = self._clear_faults(applied)
            if applied and cleared:
                try:
                    self.store.drill_note(self.claim, FAULT_CLEARED,
                                          f"fault cleared on {len(applied)} endpoint(s)",
                                          {"urls": applied})
                except Exception:
                    log.exception("job %s: could not note the fault cleared", self.job.pk)
            connection.close()

    @staticmethod
    def _clear_faults(urls: list[str]) -> bool:
        cleared = True
        for url in urls:
            for _ in range(5):
                if upstream.post(url, "/admin/faults", {"down": False},
                                 timeout_s=5.0).status == 200:
                    break
                time.sleep(0.2)
            else:
                cleared = False
                log.error("could not clear the fault on %s: clear it by hand "
                          "(POST %s/admin/faults {\"down\": false})", url, url)
        return cleared

    def _note_retries(self) -> None:
        parts = ", ".join(f"{status or 'no answer'} x{n}" for status, n in
                          sorted(self.retries.items()))
        try:
            self.store.note_retries(self.claim, dict(self.retries),
                                    f"{sum(self.retries.values())} retries in chunk "
                                    f"{self.claim.number} ({parts})")
        except Exception:
            log.exception("job %s: could not note the retries", self.job.pk)


def run_chunk(store: CheckpointStore, claim: Claim, job: BatchJob, *, stop: threading.Event,
              on_result: Callable[[int], None] | None = None) -> str:
    """Send the claim's pending requests and record their outcomes; then finish the chunk
    ("done": every request has a result) or release it ("released": paused, stopped, or
    requests left unsent) — "released" too when the lease was lost (the new holder goes on).
    "failed": the job failed (its input file is missing). `job` is loaded with its pool and
    input file; `on_result(index)` runs after each recorded result."""
    return ChunkRun(store, claim, job, stop=stop, on_result=on_result).run()
