"""Driving one eval run: every pending result row sent to its pool, scored and written.

One driver per run. A worker takes a run (services.run_execute -> `execute`) with a
conditional UPDATE that sets a new worker token: from `queued`, or from `running` when the
heartbeat is older than EVAL_HEARTBEAT_STALE_S (its worker died; `resumed` += 1). Only one
UPDATE can win, so two tasks for one run never both drive it. Everything the driver writes
afterwards is conditional on that token, so a driver that lost the run (taken over, or
cancelled) stops at its next write or heartbeat.

Rows. The driver claims chunks of pending rows in position order (item x pools + pool: the
pools' answers to one item are sent side by side, interleaved) by a conditional UPDATE that
stamps its token, in the same transaction as a heartbeat conditional on the token (so a taker,
whose UPDATE waits for that row, either sees the claims or the driver sees it lost). Up to
`concurrency` calls at once, paced to `max_rps` across the run, send each row DIRECTLY to its
pool, as coroutines on the process's one upstream event loop (inference/upstream.py:
aiohttp, connections reused; a thread a call on httpx cost 2.7 ms of worker CPU a row,
this 1.2 ms: benchmarks/eval_items_per_second.py): round-robin over the endpoints the run
recorded for the pool at creation, never through a route, never to another pool. Streamed,
with the item's messages or prompt and the run's decoding (the item's own request
parameters over it). A retry happens only when the
attempt failed at transport level before any byte of a response arrived (refused, timed out
connecting or waiting for the status line), at most `max_attempts` attempts, each appended
to the row's `attempts`. The calls touch no database. The MAIN thread scores each answer as it
arrives (scorers.score, which never raises) and writes results in small batches, each row with
`filter(pk=, status="claimed", claim=token).update(...)` (so a row is scored at most once)
and then adds the rows written to run.done in the same transaction. It beats the heartbeat
every second and stops when the run is no longer running with its token (cancelled, taken
over). Rows it claimed and did not write go back to pending.

Taking over: rows a dead worker had claimed go back to pending with an "interrupted"
attempt recorded, and are sent again; rows it wrote stay written. So no row is scored twice
and none is lost. Works alike on PostgreSQL and SQLite: no SELECT ... FOR UPDATE SKIP LOCKED,
only conditional UPDATEs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleetctl.core.bulk import update_rows
from fleetctl.evals import scorers
from fleetctl.evals.models import EvalResult, EvalRun, EvalRunPool
from fleetctl.inference import upstream
from fleetctl.inference.compare import Answer
from migrations_plan import jobs

log = logging.getLogger("fleetctl.evals")

BEAT_EVERY_S = 1.0  # the heartbeat (<= 2 s apart, whatever the calls do)
WAIT_S = 0.25  # the main loop wakes at least this often
WRITE_BATCH = 20  # results per write transaction
WRITE_EVERY_S = 0.5  # ...or sooner, when results have waited this long
MIN_CHUNK = 32  # rows claimed at once (at least; twice the concurrency when more)
RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
INTERRUPTED = ("interrupted: the worker driving the run stopped before this row was scored; "
               "sent again")


@dataclass(frozen=True)
class Job:
    pk: int
    endpoints: tuple[str, ...]
    start: int  # the round-robin index of the first attempt
    body: dict[str, Any]
    scorer: str
    references: tuple[str, ...]
    params: dict[str, Any]
    attempts: tuple[dict[str, Any], ...]  # recorded before (interrupted ones)


@dataclass
class Outcome:
    pk: int
    reply: upstream.Reply
    score: scorers.Score
    attempts: list[dict[str, Any]] = field(default_factory=list)


class Pacer:
    """Spaces attempts 1/max_rps apart across the run's calls (no limit when None)."""

    def __init__(self, max_rps: float | None) -> None:
        self.interval = 1.0 / max_rps if max_rps else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()  # on the one event loop: no lock needed
        at = max(now, self._next)
        self._next = at + self.interval
        if at > now:
            await asyncio.sleep(at - now)


def _error_text(answer: Answer) -> str:
    if not answer.failed:
        return ""
    label = answer.error_code or (f"HTTP {answer.status}" if answer.status else "no answer")
    message = answer.error_message or ""
    return (f"{label}: {message}" if message and message != label else label)[:300]


async def send(job: Job, *, timeout_s: float, max_attempts: int,
               pacer: Pacer) -> tuple[upstream.Reply, list[dict[str, Any]]]:
    """On the upstream event loop: the item to its pool, retried only before a first byte;
    the last reply and every attempt. Touches no database; the caller scores (`scored`)."""
    attempts = [dict(a) for a in job.attempts]
    reply: upstream.Reply | None = None
    for k in range(max_attempts):
        await pacer.wait()
        endpoint = job.endpoints[(job.start + k) % len(job.endpoints)]
        at = timezone.now().isoformat()
        reply = await upstream.acall(endpoint, job.body, timeout_s=timeout_s)
        answer = reply.answer
        attempts.append({"at": at, "endpoint": endpoint, "ms": round(reply.latency_ms, 2),
                         "status": answer.status, "first_byte": reply.first_byte,
                         "error": _error_text(answer)})
        retryable = answer.failed and answer.status == 0 and not reply.first_byte
        if not retryable or k + 1 >= max_attempts:
            break
        await asyncio.sleep(RETRY_BACKOFF_S[min(k, len(RETRY_BACKOFF_S) - 1)])
    assert reply is not None
    return reply, attempts


def scored(job: Job, sent: tuple[upstream.Reply, list[dict[str, Any]]]) -> Outcome:
    reply, attempts = sent
    return Outcome(pk=job.pk, reply=reply,
                   score=scorers.score(job.scorer, reply.answer, job.references, job.params),
                   attempts=attempts)


# --- taking a run -----------------------------------------------------------------------------

def take(run_id: int, token: str) -> EvalRun | None:
    """The run for this worker (token), or None when another drives it or it is over
    (jobs.take: from queued, or from running when its heartbeat is older than
    EVAL_HEARTBEAT_STALE_S, `resumed` += 1). A run taken over from a dead worker gets its
    claimed rows back as pending, each with an "interrupted" attempt."""
    if not jobs.take(EvalRun, run_id, worker=token,
                     resume_after_s=settings.EVAL_HEARTBEAT_STALE_S,
                     resumed=F("resumed") + 1):
        return None
    release_stale_claims(run_id, token)
    return EvalRun.objects.select_related("suite", "plan").get(pk=run_id)


def release_stale_claims(run_id: int, token: str) -> int:
    """Rows claimed by another token (a worker that is gone) back to pending, each with an
    "interrupted" attempt; conditional on that token, row by row (few: at most a chunk)."""
    count = 0
    now = timezone.now().isoformat()
    stale = (EvalResult.objects.filter(run_id=run_id, status=EvalResult.Status.CLAIMED)
             .exclude(claim=token).only("pk", "claim", "attempts"))
    for row in stale:
        attempts = [*(row.attempts or []), {"at": now, "endpoint": "", "ms": None,
                                            "status": None, "first_byte": None,
                                            "error": INTERRUPTED}]
        count += EvalResult.objects.filter(
            pk=row.pk, status=EvalResult.Status.CLAIMED, claim=row.claim).update(
            status=EvalResult.Status.PENDING, claim="", claimed_at=None, attempts=attempts)
    return count


def beat(run: EvalRun, token: str) -> bool:
    """The heartbeat; False once the run is not running with this token (cancelled, taken
    over, finished)."""
    return jobs.heartbeat(run, worker=token)


# --- rows -------------------------------------------------------------------------------------

def _body(run: EvalRun, row: EvalResult) -> dict[str, Any]:
    item = row.item
    body: dict[str, Any] = {"model": run.model_id}
    if item.messages is not None:
        body["messages"] = item.messages
    else:
        body["prompt"] = item.prompt
    body.update(run.decoding or {})
    body.update(item.request or {})
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def claim(run: EvalRun, token: str, size: int, pools: dict[int, EvalRunPool],
          counters: dict[int, int]) -> list[Job] | None:
    """The next `size` pending rows in position order, claimed for this token; None when the
    run is no longer this worker's. The claim and a heartbeat are one transaction."""
    with transaction.atomic():
        if not beat(run, token):
            return None
        pks = list(EvalResult.objects.filter(run=run, status=EvalResult.Status.PENDING)
                   .order_by("position").values_list("pk", flat=True)[:size])
        if not pks:
            return []
        EvalResult.objects.filter(pk__in=pks, status=EvalResult.Status.PENDING).update(
            status=EvalResult.Status.CLAIMED, claim=token, claimed_at=timezone.now())
    rows = (EvalResult.objects.filter(pk__in=pks, status=EvalResult.Status.CLAIMED,
                                      claim=token)
            .select_related("item").order_by("position"))
    jobs = []
    for row in rows:
        rp = pools[row.run_pool_id]
        start = counters[rp.pk]
        counters[rp.pk] += 1
        jobs.append(Job(pk=row.pk, endpoints=tuple(rp.endpoints), start=start,
                        body=_body(run, row), scorer=row.item.scorer,
                        references=tuple(str(r) for r in row.item.references or []),
                        params=dict(row.item.params or {}),
                        attempts=tuple(row.attempts or [])))
    return jobs


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _fields(outcome: Outcome) -> dict[str, Any]:
    answer = outcome.reply.answer
    usage = answer.usage
    completion = usage.completion_tokens if usage else None
    if completion is None and not answer.failed:
        completion = len(answer.tokens)
    return {
        "status": EvalResult.Status.DONE, "attempts": outcome.attempts,
        "endpoint": outcome.reply.endpoint[:300], "http_status": answer.status,
        "error": _error_text(answer), "text": answer.text,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in answer.tool_calls],
        "finish_reason": (answer.finish_reason or "")[:32],
        "score": outcome.score.value, "reason": outcome.score.reason[:300],
        "extracted": (outcome.score.extracted or "")[:200],
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": completion, "ttft_ms": _ms(answer.ttft_s),
        "latency_ms": round(outcome.reply.latency_ms, 2), "scored_at": timezone.now(),
    }


WRITTEN_FIELDS = ("status", "attempts", "endpoint", "http_status", "error", "text", "tool_calls",
                  "finish_reason", "score", "reason", "extracted", "prompt_tokens",
                  "completion_tokens", "ttft_ms", "latency_ms", "scored_at")


def write(run_id: int, token: str, outcomes: Iterable[Outcome]) -> int:
    """Each row written only if still claimed by this token; run.done counts those written,
    in the same transaction."""
    rows = [(outcome.pk, _fields(outcome)) for outcome in outcomes]
    if not rows:
        return 0
    with transaction.atomic():
        # One UPDATE for the batch, each row only while this token still claims it: the
        # per-row UPDATEs were most of a worker's CPU per row (core/bulk.py has the figures).
        written = update_rows(EvalResult, rows, WRITTEN_FIELDS,
                              where={"status": EvalResult.Status.CLAIMED, "claim": token})
        if written:
            EvalRun.objects.filter(pk=run_id).update(done=F("done") + written)
    return written


def release(run_id: int, token: str) -> int:
    """Rows this token claimed and did not write, back to pending (no attempt recorded: they
    were not sent, or their answers are dropped with the run stopping)."""
    return EvalResult.objects.filter(run_id=run_id, status=EvalResult.Status.CLAIMED,
                                     claim=token).update(
        status=EvalResult.Status.PENDING, claim="", claimed_at=None)


# --- the loop ---------------------------------------------------------------------------------

class _Lost(Exception):
    """The run stopped being this worker's (cancelled, taken over): a beat or claim failed."""


@dataclass
class _Feed:
    """The run's pending rows, claimed a chunk at a time as the senders need them, and the
    heartbeat that keeps the claim (a claim counts as a beat)."""

    run: EvalRun
    token: str
    pools: dict[int, EvalRunPool]
    chunk: int
    counters: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    queue: deque[Job] = field(default_factory=deque)
    exhausted: bool = False
    last_beat: float = field(default_factory=time.monotonic)

    def keep_alive(self) -> None:
        if time.monotonic() - self.last_beat >= BEAT_EVERY_S:
            if not beat(self.run, self.token):
                raise _Lost
            self.last_beat = time.monotonic()

    def next_job(self) -> Job | None:
        """The next row to send, or None when the rows ran out."""
        if not self.queue:
            if self.exhausted:
                return None
            jobs = claim(self.run, self.token, self.chunk, self.pools, self.counters)
            if jobs is None:
                raise _Lost
            self.last_beat = time.monotonic()
            if not jobs:
                self.exhausted = True
                return None
            self.queue.extend(jobs)
        return self.queue.popleft()


def drive(run: EvalRun, token: str) -> bool:
    """Send, score and write every pending row. True when the rows ran out; False when the
    run stopped being this worker's (cancelled, taken over)."""
    feed = _Feed(run, token, {rp.pk: rp for rp in EvalRunPool.objects.filter(run=run)},
                 chunk=max(MIN_CHUNK, 2 * run.concurrency))
    pacer = Pacer(run.max_rps)
    inflight: dict[Future[tuple[upstream.Reply, list[dict[str, Any]]]], Job] = {}
    unwritten: list[Outcome] = []
    oldest = 0.0
    try:
        while True:
            feed.keep_alive()
            while len(inflight) < run.concurrency and (job := feed.next_job()) is not None:
                inflight[upstream.spawn(send(job, timeout_s=run.timeout_s,
                                             max_attempts=run.max_attempts,
                                             pacer=pacer))] = job
            if not inflight:
                return True
            finished, _ = wait(inflight, timeout=WAIT_S, return_when=FIRST_COMPLETED)
            for future in finished:
                done = inflight.pop(future)
                if not unwritten:
                    oldest = time.monotonic()
                unwritten.append(scored(done, future.result()))
            if unwritten and (len(unwritten) >= WRITE_BATCH
                              or time.monotonic() - oldest >= WRITE_EVERY_S):
                write(run.pk, token, unwritten)
                unwritten = []
    except _Lost:
        return False
    finally:
        for future in inflight:  # not sent, or sent and not answered: the rows go back
            future.cancel()
        try:
            if unwritten:  # answers already in: kept (each still only if claimed by us)
                write(run.pk, token, unwritten)
            release(run.pk, token)
        except Exception:
            log.exception("eval run %s: could not write the last results back", run.pk)


def execute(run_id: int) -> EvalRun | None:
    """Take the run, drive it, finish it (services.run_finish) once every row is written."""
    from fleetctl.evals import services

    token = services.new_token()
    run = take(run_id, token)
    if run is None:
        return EvalRun.objects.filter(pk=run_id).first()
    try:
        complete = drive(run, token)
    except Exception as exc:
        log.exception("eval run %s failed", run_id)
        jobs.fail(run, f"{type(exc).__name__}: {exc}", worker=token)
        return EvalRun.objects.get(pk=run_id)
    if complete and not EvalResult.objects.filter(run_id=run_id).exclude(
            status=EvalResult.Status.DONE).exists():
        fresh = EvalRun.objects.select_related("suite", "plan").get(pk=run_id)
        if fresh.status == EvalRun.Status.RUNNING and fresh.worker == token:
            try:
                return services.run_finish(fresh)
            except Exception as exc:
                log.exception("eval run %s: could not be finished", run_id)
                jobs.fail(fresh, f"every row was scored, but the statistics or the evidence "
                                 f"failed: {type(exc).__name__}: {exc}")
    return EvalRun.objects.get(pk=run_id)
