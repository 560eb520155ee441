"""The checkpoint store: how batch workers claim chunks, renew their leases and write results,
so that a worker killed at any instant (kill -9) loses at most the requests it had in flight
and no request's result is ever written twice.

The rules, all enforced by the database rather than by memory in a worker:

- **One holder per job.** `claim` locks the job row (SELECT ... FOR UPDATE), refuses a job
  where another chunk holds a live lease, then takes a chunk by conditional UPDATE: state
  pending, or running with `lease_until < now` (its holder died or stalled). So a job's
  concurrency and rate limits are exact, and different jobs run on different workers at once.
  The oldest queued or running job comes first; a paused, finished or expired one is skipped.
- **The checkpoint, in groups.** No request is sent above `dispatched_through`: before
  sending request i the holder makes sure `dispatched_through` >= i, by raising it (one
  UPDATE, committed before the request leaves) to the end of a range it reserves,
  min(i + R - 1, the chunk's last index) with R = min(BATCH_CHECKPOINT_GROUP, 2 x the job's
  concurrency): one dispatch checkpoint per R indices, not per request (R is kept small
  because a reserved request that was never sent is resent, and counted as resent, after a
  kill). Final answers are written in groups: `record_many`
  writes up to BATCH_CHECKPOINT_GROUP `BatchResult` rows (one multi-row INSERT) and their
  chunk's counters in one transaction; the executor commits a group once it is full or its
  oldest answer is BATCH_CHECKPOINT_MS old (100 and 50 ms by default), and when the chunk
  ends or halts. A request counts as done exactly when its result is durable: nothing of a
  group counts (the done share, the drill's trigger, `on_result`) before its commit.
  BATCH_CHECKPOINT_GROUP=1 is the per-request checkpoint (two commits a request).
- **Which requests may be sent twice.** At a claim, every index in [first_index,
  dispatched_through] without a result may have reached the pool: sent and in flight, sent
  and answered in a group not yet committed, or reserved and not yet sent. Those (and only
  those) are recorded as `BatchResend` rows (previous owner, new owner) before they are sent
  again; indices with a result are skipped, indices above dispatched_through were never
  sent. So a kill -9 costs at most the reserved range, the requests in flight and the group
  not yet committed, all below dispatched_through; a result is never lost once committed.
  A claim of a lapsed lease also writes a TAKEOVER event.
- **No result written twice.** The unique constraint (job, index) refuses a second result
  (the old holder was only stalled and its answer arrived after the takeover's). A group's
  writer locks the job row first, then leaves out the indices that already have a result (and
  an index twice in one group); should the INSERT still hit the constraint, the group is
  written row by row, each in a savepoint. Each refused result adds one to
  `job.duplicates_refused` and nothing else changes.

`CheckpointStore` is the database implementation. Tests subclass it to inject a fault into
the store (tests/batch/doubles.py) and run the worker with `--store module:Class`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from fleetctl.batch.models import (
    BatchChunk,
    BatchJob,
    BatchJobEvent,
    BatchResend,
    BatchResult,
)

log = logging.getLogger("fleetctl.batch")

Kind = BatchJobEvent.Kind
State = BatchJob.State
# Jobs looked at per claim: the oldest first; a job whose chunk is held by a live lease is
# passed over, so a few workers spread over the oldest few jobs.
CLAIM_SCAN_JOBS = 20
# The task that compares a sample of a finished job's answers with the primary's
# (fleetctl/batch/compare.py), enqueued by name so the store does not import it.
COMPARE_TASK = "batch.compare"
FAULT_CLEARED = "fault-cleared"  # data["phase"] of the fault-pool drill's second event


@dataclass
class Claim:
    """A chunk held by one worker, and what it has left to send."""

    chunk_id: int
    job_id: int
    number: int
    first_index: int
    last_index: int
    first_line: int
    byte_start: int
    byte_end: int
    owner: str
    previous_owner: str  # "" unless a takeover of a lapsed lease
    pending: list[int]  # indices without a result, to send (ascending)
    resent: list[int] = field(default_factory=list)  # the subset recorded as BatchResend

    @property
    def size(self) -> int:
        return self.last_index - self.first_index + 1


@dataclass
class Outcome:
    """One request's final answer."""

    index: int
    custom_id: str
    status_code: int  # 0: no answer (transport error)
    body: str  # the pool's answer (JSON text), "" when there was none
    error_code: str
    error_message: str
    attempts: int
    prompt_tokens: int
    output_tokens: int
    latency_ms: float | None
    # When the answer came back (the result's finished_at); None: when it is written.
    finished_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


def job_event(job: BatchJob | int, kind: str, actor_label: str, *, message: str = "",
              data: dict[str, Any] | None = None) -> None:
    """A worker's timeline event (never manual), through the batch services' one writer."""
    from fleetctl.batch.services import job_event as write

    if isinstance(job, int):
        job = BatchJob.objects.get(pk=job)
    write(job, kind, actor_label, message=message, data=data)


def input_path(job: BatchJob) -> Path:
    return Path(settings.BATCH_FILES_DIR) / job.input_file.path


def custom_ids(job: BatchJob, claim: Claim) -> dict[int, str]:
    """index -> custom_id for the claim's chunk, read from the input file's byte range."""
    from fleetctl.batch.inputs import read_lines

    lines = read_lines(input_path(job), claim.byte_start, claim.byte_end,
                       first_line=claim.first_line)
    return {claim.first_index + n: str(request.get("custom_id", ""))
            for n, (_, request) in enumerate(lines)}


class CheckpointStore:
    """The database checkpoint store (see the module docstring for the rules)."""

    def __init__(self, lease_s: float | None = None) -> None:
        self.lease_s = float(lease_s if lease_s is not None else settings.BATCH_LEASE_S)
        # Jobs whose drill_resumed_at this process saw set: no more checks for them.
        self._resume_noted: set[int] = set()

    # --- claiming ------------------------------------------------------------------------

    def claim(self, owner: str) -> Claim | None:
        """A chunk for `owner` from the oldest job that can take one, or None. Marks the job
        running at its first claim (STARTED event); records the resends at a takeover."""
        now = timezone.now()
        # Jobs held by a live lease are left out before any lock is taken (an idle worker's
        # poll must not queue behind a holder's writes); the claim checks again under it.
        held = BatchChunk.objects.filter(state=BatchChunk.State.RUNNING, lease_until__gte=now)
        candidates = list(
            BatchJob.objects.filter(state__in=(State.QUEUED, State.RUNNING), expires_at__gt=now)
            .exclude(pk__in=held.values("job_id"))
            .order_by("created_at", "id").values_list("id", flat=True)[:CLAIM_SCAN_JOBS])
        for job_id in candidates:
            claim = self._claim_in_job(job_id, owner)
            if claim is not None:
                return claim
        return None

    def _claim_in_job(self, job_id: int, owner: str) -> Claim | None:
        with transaction.atomic():
            # FOR NO KEY UPDATE: claims queue behind each other, not behind result inserts
            # (their foreign key takes a KEY SHARE lock on the job row).
            job = (BatchJob.objects.select_for_update(no_key=True).select_related("input_file")
                   .filter(pk=job_id, state__in=(State.QUEUED, State.RUNNING),
                           expires_at__gt=timezone.now()).first())
            if job is None:
                return None
            now = timezone.now()  # after the lock: the lease is measured from the claim
            chunks = BatchChunk.objects.filter(job=job)
            if chunks.filter(state=BatchChunk.State.RUNNING, lease_until__gte=now).exists():
                return None  # another holder is live: one holder per job
            claimable = Q(state=BatchChunk.State.PENDING) | Q(state=BatchChunk.State.RUNNING,
                                                              lease_until__lt=now)
            chunk = chunks.filter(claimable).order_by("number").first()
            if chunk is None:
                if not chunks.exclude(state=BatchChunk.State.DONE).exists():
                    self._complete(job, owner)  # every chunk done, the job not yet marked
                return None
            taken = BatchChunk.objects.filter(pk=chunk.pk).filter(claimable).update(
                state=BatchChunk.State.RUNNING, lease_owner=owner,
                lease_until=now + timedelta(seconds=self.lease_s), claims=F("claims") + 1)
            if not taken:
                return None
            takeover = chunk.state == BatchChunk.State.RUNNING
            if job.state == State.QUEUED:
                BatchJob.objects.filter(pk=job.pk).update(state=State.RUNNING, started_at=now)
                job_event(job, Kind.STARTED, owner, message=f"first chunk claimed by {owner}")
            claim = self._build_claim(job, chunk, owner, takeover=takeover)
        return claim

    def _build_claim(self, job: BatchJob, chunk: BatchChunk, owner: str, *,
                     takeover: bool) -> Claim:
        """The claim's pending indices, and the resends: dispatched earlier, no result."""
        done = set(BatchResult.objects.filter(
            job_id=job.pk, index__gte=chunk.first_index, index__lte=chunk.last_index,
        ).values_list("index", flat=True))
        pending = [i for i in range(chunk.first_index, chunk.last_index + 1) if i not in done]
        in_flight = [i for i in pending if i <= chunk.dispatched_through]
        claim = Claim(chunk_id=chunk.pk, job_id=job.pk, number=chunk.number,
                      first_index=chunk.first_index, last_index=chunk.last_index,
                      first_line=chunk.first_line, byte_start=chunk.byte_start,
                      byte_end=chunk.byte_end, owner=owner,
                      previous_owner=chunk.lease_owner if takeover else "",
                      pending=pending, resent=in_flight)
        if in_flight:
            ids = custom_ids(job, claim)
            BatchResend.objects.bulk_create([
                BatchResend(job_id=job.pk, index=i, custom_id=ids.get(i, ""),
                            previous_owner=chunk.lease_owner or "(unknown)", new_owner=owner)
                for i in in_flight])
        if takeover:
            job_event(job, Kind.TAKEOVER, owner,
                      message=(f"chunk {chunk.number} taken over from {chunk.lease_owner} "
                               f"(lease lapsed); {len(in_flight)} in-flight request(s) to "
                               f"send again, {len(done)} already done"),
                      data={"chunk": chunk.number, "previous_owner": chunk.lease_owner,
                            "resent": in_flight[:100], "resent_count": len(in_flight),
                            "done": len(done)})
        return claim

    # --- holding ---------------------------------------------------------------------------

    def renew(self, claim: Claim) -> bool:
        """Extend the lease; False when it is no longer ours (taken over) or the job is no
        longer running (paused, cancelled, expired): the holder then stops dispatching."""
        now = timezone.now()
        return bool(BatchChunk.objects.filter(
            pk=claim.chunk_id, lease_owner=claim.owner, state=BatchChunk.State.RUNNING,
            job__state=State.RUNNING, job__expires_at__gt=now,
        ).update(lease_until=now + timedelta(seconds=self.lease_s)))

    def job_running(self, job_id: int) -> bool:
        return BatchJob.objects.filter(pk=job_id, state=State.RUNNING,
                                       expires_at__gt=timezone.now()).exists()

    def dispatched(self, claim: Claim, index: int) -> bool:
        """The dispatch checkpoint: every request up to `index` may be sent once this returns
        (dispatched_through raised to `index`, committed first; never lowered). The executor
        calls it once per group, with `index` the end of the range it reserves. False when
        the chunk is no longer ours: nothing more may be sent."""
        chunk = BatchChunk.objects.filter(pk=claim.chunk_id, lease_owner=claim.owner,
                                          state=BatchChunk.State.RUNNING)
        if chunk.filter(dispatched_through__lt=index).update(dispatched_through=index):
            return True
        return chunk.exists()

    def record(self, claim: Claim, outcome: Outcome, retries: int = 0) -> bool:
        """Write one final answer and its chunk's counters in one transaction (a group of
        one: see record_many). False when the request already had a result."""
        return self.record_many(claim, [outcome], retries)[0]

    def record_many(self, claim: Claim, outcomes: list[Outcome], retries: int = 0
                    ) -> list[bool]:
        """Write a group of final answers and their chunk's counters in one transaction: one
        multi-row INSERT and one UPDATE, one commit, however many answers. Per outcome, True
        when written, False when the request already had a result: refused (the unique
        constraint (job, index) is the last word), counted in job.duplicates_refused, nothing
        else written for it. Nothing of the group counts until the commit returns.
        `retries`: retries not yet counted on the chunk, added in the same transaction."""
        if not outcomes and not retries:
            return []
        with transaction.atomic():
            # The job row first, as every writer does (a person's pause or cancel locks it,
            # then the chunks): PostgreSQL checks the result's foreign key at commit (Django's
            # are deferred), which would otherwise take the job row after the chunk's and
            # deadlock with them. Writers of one job queue here, so the check below sees
            # every result committed before this group.
            list(BatchJob.objects.select_for_update(no_key=True).filter(pk=claim.job_id)
                 .values_list("pk", flat=True))
            written = self._insert_results(claim, outcomes)
            refused = written.count(False)
            if refused:
                BatchJob.objects.filter(pk=claim.job_id).update(
                    duplicates_refused=F("duplicates_refused") + refused)
                log.warning("job %s: %d result(s) already written; refused the second (%s): "
                            "%s", claim.job_id, refused, claim.owner,
                            [o.index for o, w in zip(outcomes, written, strict=True) if not w])
            kept = [o for o, w in zip(outcomes, written, strict=True) if w]
            if kept or retries:
                BatchChunk.objects.filter(pk=claim.chunk_id).update(
                    succeeded=F("succeeded") + sum(o.ok for o in kept),
                    failed=F("failed") + sum(not o.ok for o in kept),
                    retries=F("retries") + retries,
                    prompt_tokens=F("prompt_tokens") + sum(o.prompt_tokens for o in kept),
                    output_tokens=F("output_tokens") + sum(o.output_tokens for o in kept))
            if kept:
                self._note_resume(claim, any(o.ok for o in kept))
        return written

    def _insert_results(self, claim: Claim, outcomes: list[Outcome]) -> list[bool]:
        """Insert the outcomes without a result yet (inside record_many's transaction, the
        job row locked): one bulk INSERT; the row by row path, each in a savepoint, only
        when that INSERT hit the constraint anyway (a writer that did not queue on the job
        row)."""
        have = set(BatchResult.objects.filter(
            job_id=claim.job_id, index__in=[o.index for o in outcomes],
        ).values_list("index", flat=True))
        written: list[bool] = []
        fresh: list[Outcome] = []
        for outcome in outcomes:
            new = outcome.index not in have
            have.add(outcome.index)  # the same index twice in one group: the second refused
            written.append(new)
            if new:
                fresh.append(outcome)
        if not fresh:
            return written
        try:
            with transaction.atomic():  # a savepoint: a refused insert rolls back alone
                BatchResult.objects.bulk_create([self._row(claim, o) for o in fresh])
            return written
        except IntegrityError:
            pass
        by_index = {o.index: n for n, o in enumerate(outcomes)}
        for outcome in fresh:
            try:
                with transaction.atomic():
                    self._row(claim, outcome).save(force_insert=True)
            except IntegrityError:
                if not BatchResult.objects.filter(job_id=claim.job_id,
                                                  index=outcome.index).exists():
                    raise  # not the (job, index) constraint: a real error
                written[by_index[outcome.index]] = False
        return written

    @staticmethod
    def _row(claim: Claim, outcome: Outcome) -> BatchResult:
        return BatchResult(
            job_id=claim.job_id, index=outcome.index, custom_id=outcome.custom_id,
            status_code=outcome.status_code, body=outcome.body,
            error_code=outcome.error_code[:60], error_message=outcome.error_message,
            attempts=outcome.attempts, prompt_tokens=outcome.prompt_tokens,
            output_tokens=outcome.output_tokens, latency_ms=outcome.latency_ms,
            worker=claim.owner, finished_at=outcome.finished_at or timezone.now())

    def _note_resume(self, claim: Claim, ok: bool) -> None:
        """drill_resumed_at, the first time the work went on after the drill: for kill-worker,
        a result written by an owner other than the killed one after drill_fired_at; for
        fault-pool, a success after the fault was cleared. Conditional UPDATEs: the first
        writer wins, later ones change nothing."""
        if claim.job_id in self._resume_noted:
            return
        job = BatchJob.objects.filter(pk=claim.job_id).values(
            "drill", "drill_fired_at", "drill_worker", "drill_resumed_at").first()
        if job is None or not job["drill"] or job["drill_resumed_at"] is not None:
            self._resume_noted.add(claim.job_id)
            return
        if job["drill_fired_at"] is None:
            return
        pending = BatchJob.objects.filter(pk=claim.job_id, drill_resumed_at__isnull=True,
                                          drill_fired_at__isnull=False)
        if job["drill"] == BatchJob.Drill.KILL_WORKER:
            if claim.owner != job["drill_worker"]:
                pending.exclude(drill_worker=claim.owner).update(
                    drill_resumed_at=timezone.now())
                self._resume_noted.add(claim.job_id)
        elif job["drill"] == BatchJob.Drill.FAULT_POOL and ok:
            cleared = BatchJobEvent.objects.filter(job_id=claim.job_id, kind=Kind.DRILL_FIRED,
                                                   data__phase=FAULT_CLEARED).exists()
            if cleared:
                pending.update(drill_resumed_at=timezone.now())
                self._resume_noted.add(claim.job_id)

    def add_retries(self, claim: Claim, n: int) -> None:
        if n:
            BatchChunk.objects.filter(pk=claim.chunk_id).update(retries=F("retries") + n)

    def note_retries(self, claim: Claim, by_status: dict[int, int], message: str) -> None:
        """One RETRY event per chunk run that retried (the counts by status), not one per
        retry: the counters already hold the numbers."""
        job_event(claim.job_id, Kind.RETRY, claim.owner, message=message,
                  data={"chunk": claim.number,
                        "by_status": {str(k): v for k, v in sorted(by_status.items())}})

    # --- letting go ----------------------------------------------------------------------

    def finish(self, claim: Claim) -> str:
        """"done" when every request of the chunk has a result: the chunk is done, and the
        job completed if it was its last (then the comparison is enqueued and a drill job's
        evidence recorded, after commit). "released" otherwise (back to pending, for the next
        claim to send the rest), or when the chunk is no longer ours."""
        with transaction.atomic():
            job = BatchJob.objects.select_for_update(no_key=True).get(pk=claim.job_id)
            results = BatchResult.objects.filter(job_id=claim.job_id,
                                                 index__gte=claim.first_index,
                                                 index__lte=claim.last_index).count()
            if results < claim.size:
                self.release(claim)
                return "released"
            marked = BatchChunk.objects.filter(
                pk=claim.chunk_id, lease_owner=claim.owner, state=BatchChunk.State.RUNNING,
            ).update(state=BatchChunk.State.DONE, lease_until=None)
            if not marked:
                return "released"
            if not BatchChunk.objects.filter(job_id=claim.job_id).exclude(
                    state=BatchChunk.State.DONE).exists():
                self._complete(job, claim.owner)
        return "done"

    def _complete(self, job: BatchJob, owner: str) -> None:
        """The job's last chunk is done (inside the job row's lock). A paused job whose every
        request has a result is complete too; a cancelled or expired one stays so."""
        if job.state not in (State.RUNNING, State.PAUSED, State.QUEUED):
            return
        now = timezone.now()
        BatchJob.objects.filter(pk=job.pk).update(state=State.COMPLETED, finished_at=now)
        totals = BatchChunk.objects.filter(job_id=job.pk).aggregate(
            succeeded=Sum("succeeded"), failed=Sum("failed"), retries=Sum("retries"))
        job_event(job, Kind.COMPLETED, owner,
                  message=f"{totals['succeeded'] or 0} succeeded, {totals['failed'] or 0} "
                          f"failed, {totals['retries'] or 0} retries",
                  data={k: v or 0 for k, v in totals.items()})
        job_id, drill = job.pk, job.drill
        transaction.on_commit(lambda: after_completion(job_id, drill))

    def release(self, claim: Claim) -> None:
        """Back to pending for the next claim (pause, stop, or requests left unsent). The
        owner stays on the row: the next claim names it as the previous owner of any request
        dispatched without a result."""
        BatchChunk.objects.filter(pk=claim.chunk_id, lease_owner=claim.owner,
                                  state=BatchChunk.State.RUNNING).update(
            state=BatchChunk.State.PENDING, lease_until=None)

    def fail(self, claim: Claim, reason: str) -> None:
        """A worker error that is not a request's (the input file is missing): the job
        fails with the reason, the chunk goes back to pending."""
        self.release(claim)
        now = timezone.now()
        with transaction.atomic():
            if BatchJob.objects.filter(pk=claim.job_id, state__in=(State.QUEUED, State.RUNNING)
                                       ).update(state=State.FAILED, state_reason=reason[:500],
                                                finished_at=now):
                job_event(claim.job_id, Kind.FAILED, claim.owner, message=reason)

    # --- drills ----------------------------------------------------------------------------

    def drill_fire(self, claim: Claim, *, message: str, data: dict[str, Any] | None = None
                   ) -> bool:
        """Mark the job's drill as fired by this holder (conditional: drill_fired_at IS NULL)
        and commit, with its DRILL_FIRED event. True when this call fired it."""
        with transaction.atomic():
            fired = BatchJob.objects.filter(pk=claim.job_id, drill_fired_at__isnull=True).update(
                drill_fired_at=timezone.now(), drill_worker=claim.owner)
            if fired:
                job_event(claim.job_id, Kind.DRILL_FIRED, claim.owner, message=message,
                          data={"phase": "fired", "chunk": claim.number, **(data or {})})
        return bool(fired)

    def drill_note(self, claim: Claim, phase: str, message: str,
                   data: dict[str, Any] | None = None) -> None:
        """A later step of a drill (the fault cleared, or the drill could not run)."""
        job_event(claim.job_id, Kind.DRILL_FIRED, claim.owner, message=message,
                  data={"phase": phase, **(data or {})})

    def done_count(self, job_id: int) -> int:
        """Requests of the job with a result (the sum of the chunks' counters)."""
        totals = BatchChunk.objects.filter(job_id=job_id).aggregate(
            s=Sum("succeeded"), f=Sum("failed"))
        return int(totals["s"] or 0) + int(totals["f"] or 0)


def after_completion(job_id: int, drill: str) -> None:
    """After a job completed (committed): the output comparison on the evals queue, and a
    drill job's checkpoint-resume evidence. Neither may fail the worker."""
    try:
        from fleetctl.celery import app

        app.send_task(COMPARE_TASK, args=[job_id])
    except Exception:
        log.exception("job %s: could not enqueue %s", job_id, COMPARE_TASK)
    if drill:
        try:
            from fleetctl.batch.drill import drill_record

            drill_record(BatchJob.objects.get(pk=job_id))
        except Exception:
            log.exception("job %s: could not record the drill's evidence", job_id)
