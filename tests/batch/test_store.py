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
