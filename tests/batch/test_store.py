"""The checkpoint store on the test database, without worker processes: claims, one holder
per job, the resends of a takeover, a second result refused and counted, the lease after a
pause, finishing; and the executor in this process against the simulator pool."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from fleetctl.batch import services
from fleetctl.batch.executor import backoff_s, parse_retry_after, run_chunk
from fleetctl.batch.models import BatchChunk, BatchJob, BatchJobEvent, BatchResend, BatchResult
from fleetctl.batch.store import CheckpointStore, Claim, Outcome
from fleetctl.fleet.models import Pool
from tests.conftest import SYSTEM
from tests.sim.simproc import SimProcess

from .factory import make_job


def outcome(index: int, status: int = 200, **fields: object) -> Outcome:
    values: dict[str, object] = dict(
        index=index, custom_id=f"req-{index}", status_code=status, body='{"x": 1}',
        error_code="" if status == 200 else "internal_error", error_message="", attempts=1,
        prompt_tokens=5, output_tokens=7, latency_ms=12.0)
    values.update(fields)
    return Outcome(**values)  # type: ignore[arg-type]


def lapse(claim: Claim) -> None:
    """The holder died: its lease is in the past."""
    BatchChunk.objects.filter(pk=claim.chunk_id).update(
        lease_until=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def store() -> CheckpointStore:
    return CheckpointStore(lease_s=30)


def test_claim_takes_the_oldest_job_and_one_holder_per_job(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore) -> None:
    first = make_job(SYSTEM, sim_pool, n=10, tmp_path=tmp_path, chunk_size=5)
    second = make_job(SYSTEM, sim_pool, n=10, tmp_path=tmp_path, chunk_size=5)

    a = store.claim("a:1")
    b = store.claim("b:2")  # the first job has a live holder: the next job
    c = store.claim("c:3")  # both jobs held

    assert a is not None and b is not None and c is None
    assert (a.job_id, a.number, a.pending) == (first.pk, 0, [0, 1, 2, 3, 4])
    assert (b.job_id, b.number, b.previous_owner, b.resent) == (second.pk, 0, "", [])
    first.refresh_from_db()
    assert first.state == "running" and first.started_at is not None
    assert first.events.filter(kind=BatchJobEvent.Kind.STARTED).count() == 1


def test_a_paused_job_is_not_claimed_and_its_holder_cannot_renew(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore) -> None:
    job = make_job(SYSTEM, sim_pool, n=10, tmp_path=tmp_path, chunk_size=5)
    claim = store.claim("a:1")
    assert claim is not None and store.renew(claim)

    services.job_pause(actor=SYSTEM, job=job, reason="maintenance window")

    assert not store.renew(claim) and not store.job_running(job.pk)
    store.release(claim)
    assert store.claim("b:2") is None


def test_a_takeover_records_exactly_the_in_flight_requests_as_resends(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore) -> None:
    job = make_job(SYSTEM, sim_pool, n=10, tmp_path=tmp_path, chunk_size=5)
    old = store.claim("old:1")
    assert old is not None
    for index in (0, 1, 2, 3):
        assert store.dispatched(old, index)
    store.record(old, outcome(0))
    store.record(old, outcome(2))  # 1 and 3 in flight when "old" dies; 4 never sent

    assert store.claim("new:2") is None  # the lease is live: nobody takes it
    lapse(old)
    new = store.claim("new:2")

    assert new is not None and new.chunk_id == old.chunk_id
    assert new.previous_owner == "old:1"
    assert new.pending == [1, 3, 4] and new.resent == [1, 3]
    assert list(BatchResend.objects.filter(job=job).values_list(
        "index", "custom_id", "previous_owner", "new_owner")) == [
        (1, "req-1", "old:1", "new:2"), (3, "req-3", "old:1", "new:2")]
    takeover = job.events.get(kind=BatchJobEvent.Kind.TAKEOVER)
    assert takeover.data["resent"] == [1, 3] and takeover.actor == "new:2"
    # The old holder can no longer checkpoint or renew: the chunk is not its own.
    assert not store.dispatched(old, 4) and not store.renew(old)


def test_a_second_result_for_a_request_is_refused_and_counted_never_stored(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore) -> None:
    job = make_job(SYSTEM, sim_pool, n=5, tmp_path=tmp_path, chunk_size=5)
    claim = store.claim("a:1")
    assert claim is not None

    assert store.record(claim, outcome(3)) is True
    assert store.record(claim, outcome(3, status=500, body="")) is False

    job.refresh_from_db()
    chunk = BatchChunk.objects.get(pk=claim.chunk_id)
    assert job.duplicates_refused == 1
    assert (chunk.succeeded, chunk.failed, chunk.output_tokens) == (1, 0, 7)
    assert list(BatchResult.objects.filter(job=job).values_list("index", "status_code")) == [
        (3, 200)]


def test_finish_completes_the_job_only_when_every_request_has_a_result(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore,
        django_capture_on_commit_callbacks: Any) -> None:
    job = make_job(SYSTEM, sim_pool, n=4, tmp_path=tmp_path, chunk_size=2)
    first = store.claim("a:1")
    assert first is not None
    store.record(first, outcome(0))
    assert store.finish(first) == "released"  # request 1 has no result yet
    assert BatchChunk.objects.get(pk=first.chunk_id).state == "pending"

    again = store.claim("a:1")
    assert again is not None and again.pending == [1]
    store.record(again, outcome(1, status=400, error_code="invalid_request_error"))
    assert store.finish(again) == "done"
    job.refresh_from_db()
    assert job.state == "running"

    last = store.claim("a:1")
    assert last is not None and last.number == 1
    store.record(last, outcome(2))
    store.record(last, outcome(3))
    with compare_tasks_published() as queued, django_capture_on_commit_callbacks(execute=True):
        assert store.finish(last) == "done"
        assert queued == []  # not before the commit
    job.refresh_from_db()
    assert job.state == "completed" and job.finished_at is not None
    assert job.events.filter(kind=BatchJobEvent.Kind.COMPLETED).count() == 1
    # The output comparison is queued (by task name, on the evals queue) once committed.
    assert queued == [[job.pk]]


@contextlib.contextmanager
def compare_tasks_published() -> Iterator[list[list[int]]]:
    """The args of every batch.compare message published to the broker meanwhile (Celery's
    own before_task_publish signal: a worker of the session may take the message off the
    queue before a test could read it there)."""
    from celery.signals import before_task_publish

    found: list[list[int]] = []

    def seen(sender: str | None = None, body: Any = None, routing_key: str = "",
             **_: Any) -> None:
        if sender == "batch.compare" and routing_key == "evals":
            found.append(list(body[0]))

    before_task_publish.connect(seen, weak=False)
    try:
        yield found
    finally:
        before_task_publish.disconnect(seen)


def test_retry_waits_grow_with_jitter_up_to_the_cap_and_honour_retry_after() -> None:
    assert 0.375 <= backoff_s(1) <= 0.625
    assert 3.0 <= backoff_s(4) <= 5.0
    assert backoff_s(30) <= 37.5
    assert backoff_s(1, retry_after_s=7) == 7
    assert parse_retry_after("3") == 3.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None


def set_fault(url: str, **faults: object) -> None:
    httpx.post(f"{url}/admin/faults", json=faults, timeout=5).raise_for_status()


def test_the_executor_retries_server_errors_and_records_one_result_each(
        transactional_db: None, sim_pool: Pool, batch_sim: SimProcess, tmp_path: Path) -> None:
    """In this process (the executor's threads need committed rows): a pool failing a
    quarter of its requests with 500 still gives every request one 200 result, and every
    retry is counted on the chunk and in the result's attempts."""
    job = make_job(SYSTEM, sim_pool, n=30, tmp_path=tmp_path, chunk_size=30, concurrency=6,
                   max_attempts=10)
    store = CheckpointStore(lease_s=5)
    claim = store.claim("here:1")
    assert claim is not None
    job = BatchJob.objects.select_related("pool", "input_file").get(pk=job.pk)
    set_fault(batch_sim.url("batch"), error_rate=0.25)
    try:
        assert run_chunk(store, claim, job, stop=threading.Event()) == "done"
    finally:
        set_fault(batch_sim.url("batch"), error_rate=0.0)

    job.refresh_from_db()
    chunk = BatchChunk.objects.get(pk=claim.chunk_id)
    rows = list(BatchResult.objects.filter(job=job))
    assert job.state == "completed" and len(rows) == 30
    assert all(r.status_code == 200 for r in rows)
    assert chunk.retries == sum(r.attempts - 1 for r in rows) > 0
    retry_event = job.events.get(kind=BatchJobEvent.Kind.RETRY)
    assert retry_event.data["by_status"] == {"500": chunk.retries}


def test_a_group_is_written_in_one_transaction_refusing_what_already_has_a_result(
        db: None, sim_pool: Pool, tmp_path: Path, store: CheckpointStore,
        django_assert_max_num_queries: Any) -> None:
    job = make_job(SYSTEM, sim_pool, n=10, tmp_path=tmp_path, chunk_size=10)
    claim = store.claim("a:1")
    assert claim is not None
    assert store.record(claim, outcome(2)) is True

    group = [outcome(0), outcome(1, status=500, body=""), outcome(2, status=500),
             outcome(3), outcome(3, status=500)]
    # The job row's lock, the check, one INSERT, the duplicates and the counters (and the
    # drill check): not a statement per result.
    with django_assert_max_num_queries(12):
        written = store.record_many(claim, group, retries=4)

    assert written == [True, True, False, True, False]
    job.refresh_from_db()
    chunk = BatchChunk.objects.get(pk=claim.chunk_id)
    assert job.duplicates_refused == 2
    assert (chunk.succeeded, chunk.failed, chunk.retries, chunk.output_tokens) == (3, 1, 4, 28)
    assert list(BatchResult.objects.filter(job=job).values_list("index", "status_code")) == [
        (0, 200), (1, 500), (2, 200), (3, 200)]


def test_the_database_itself_refuses_a_second_result_for_an_index(
        db: None, sim_pool: Pool, tmp_path: Path) -> None:
    """The store's check is an optimisation; the unique constraint is what makes a second
    result impossible, whichever path writes it."""
    from django.db import IntegrityError, transaction

    job = make_job(SYSTEM, sim_pool, n=2, tmp_path=tmp_path)
    row = dict(job=job, index=1, custom_id="req-1", status_code=200, worker="a:1")
    BatchResult.objects.create(**row)
    with pytest.raises(IntegrityError), transaction.atomic():
        BatchResult.objects.bulk_create([BatchResult(**row)])
    assert BatchResult.objects.filter(job=job).count() == 1


class Spy(CheckpointStore):
    """The database store, noting its dispatch checkpoints and the size of each group."""

    def __init__(self) -> None:
        super().__init__(lease_s=10)
        self.reserved: list[int] = []
        self.groups: list[int] = []

    def dispatched(self, claim: Claim, index: int) -> bool:
        self.reserved.append(index)
        return super().dispatched(claim, index)

    def record_many(self, claim: Claim, outcomes: list[Outcome], retries: int = 0
                    ) -> list[bool]:
        self.groups.append(len(outcomes))
        return super().record_many(claim, outcomes, retries)


def test_the_executor_reserves_and_commits_in_groups_and_counts_only_durable_results(
        transactional_db: None, sim_pool: Pool, tmp_path: Path, settings: Any) -> None:
    """Groups of 7, no time limit: a dispatch checkpoint every 7 indices, results committed
    7 at a time; each result is reported (on_result) only once its row is committed."""
    settings.BATCH_CHECKPOINT_GROUP = 7
    settings.BATCH_CHECKPOINT_MS = 600_000
    job = make_job(SYSTEM, sim_pool, n=30, tmp_path=tmp_path, chunk_size=30, concurrency=4)
    store = Spy()
    claim = store.claim("here:1")
    assert claim is not None
    job = BatchJob.objects.select_related("pool", "input_file").get(pk=job.pk)
    seen: list[tuple[int, bool]] = []

    def on_result(index: int) -> None:  # runs on the dispatcher's connection, outside
        from django.db import connection  # any transaction once the group is committed

        seen.append((index, not connection.in_atomic_block and BatchResult.objects.filter(
            job_id=job.pk, index=index).exists()))

    assert run_chunk(store, claim, job, stop=threading.Event(), on_result=on_result) == "done"

    assert store.reserved == [6, 13, 20, 27, 29]
    assert store.groups == [7, 7, 7, 7, 2]
    assert sorted(i for i, _ in seen) == list(range(30)) and all(ok for _, ok in seen)
    assert BatchChunk.objects.get(pk=claim.chunk_id).dispatched_through == 29
    assert BatchResult.objects.filter(job=job).count() == 30


def test_a_group_not_yet_full_is_committed_once_its_oldest_answer_is_due(
        transactional_db: None, sim_pool: Pool, tmp_path: Path, settings: Any) -> None:
    """Groups of up to 1,000 but 50 ms at most: a job of 20 requests started 20 a second
    (about a second) is committed in several groups, not one at the end."""
    settings.BATCH_CHECKPOINT_GROUP = 1000
    settings.BATCH_CHECKPOINT_MS = 50
    job = make_job(SYSTEM, sim_pool, n=20, tmp_path=tmp_path, chunk_size=20, concurrency=2,
                   rate_limit_rps=20)
    store = Spy()
    claim = store.claim("here:1")
    assert claim is not None
    job = BatchJob.objects.select_related("pool", "input_file").get(pk=job.pk)

    assert run_chunk(store, claim, job, stop=threading.Event()) == "done"

    # Reservations are twice the concurrency (4), not the group: a kill resends the range.
    assert store.reserved == [3, 7, 11, 15, 19]
    assert sum(store.groups) == 20 and len(store.groups) > 1, store.groups
