"""Real worker processes (`python -m fleetctl.batch.worker`) against a real simulator pool,
on the test database: jobs complete with one result per line, survive repeated kill -9s,
follow a person's pause/resume/cancel, retry a faulty pool and expire with partial output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.batch import outputs, services
from fleetctl.batch.models import BatchChunk, BatchJob, BatchResult
from fleetctl.fleet.models import Pool
from tests.conftest import SYSTEM
from tests.support.waiting import wait_until

from .factory import make_job
from .workerproc import WorkerProcess, worker_starter

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_starter(tmp_path) as start:
        yield start


def results_by_index(job: BatchJob) -> dict[int, int]:
    counts: dict[int, int] = {}
    for index in BatchResult.objects.filter(job=job).values_list("index", flat=True):
        counts[index] = counts.get(index, 0) + 1
    return counts


def job_state(job: BatchJob) -> str:
    job.refresh_from_db()
    return job.state


def test_a_job_completes_with_exactly_one_result_per_line(
        sim_pool: Pool, tmp_path: Path, workers: Callable[..., WorkerProcess]) -> None:
    job = make_job(SYSTEM, sim_pool, n=60, tmp_path=tmp_path, chunk_size=20, concurrency=4)
    worker = workers("one")
    wait_until(lambda: job_state(job) == "completed", timeout_s=30, what=worker.log())
    rows = list(BatchResult.objects.filter(job=job).order_by("index"))
    assert [r.index for r in rows] == list(range(60))
    assert [r.custom_id for r in rows] == [f"req-{i}" for i in range(60)]
    assert all(r.status_code == 200 and r.output_tokens > 0 for r in rows)
    assert {r.worker for r in rows} == {worker.owner}
    assert set(BatchChunk.objects.filter(job=job).values_list("state", flat=True)) == {"done"}
    assert job.started_at is not None and job.finished_at is not None
    assert job.resends.count() == 0 and job.duplicates_refused == 0


def holder(job: BatchJob) -> str:
    """The owner of the job's live lease, or ""."""
    chunk = BatchChunk.objects.filter(job=job, state="running").order_by("-lease_until").first()
    return chunk.lease_owner if chunk else ""


def done(job: BatchJob) -> int:
    return BatchResult.objects.filter(job=job).count()


def after_a_later_job(pool: Pool, tmp_path: Path) -> None:
    """The end of a negative check ("the worker sends nothing more for a job it let go"): a
    one-line job queued now completes. The worker claims the oldest job it can, so a claim
    of the earlier job, and what it would send, comes first; and its work for the job it let
    go is over (a chunk is released once its requests are back)."""
    later = make_job(SYSTEM, pool, n=1, tmp_path=tmp_path)
    wait_until(lambda: job_state(later) == "completed", timeout_s=20,
               what="a later one-line job to complete")


def test_repeated_kill_9_of_the_holder_loses_nothing_and_writes_nothing_twice(
        sim_pool: Pool, tmp_path: Path, workers: Callable[..., WorkerProcess]) -> None:
    """Three kill -9s of whichever worker holds the job, at different points; one of the
    standby workers takes over each time once the lease lapses."""
    job = make_job(SYSTEM, sim_pool, n=75, tmp_path=tmp_path, chunk_size=15, concurrency=4,
                   rate_limit_rps=30, max_tokens=48)
    alive = {w.owner: w for w in [workers("k") for _ in range(4)]}
    caught: list[str] = []  # killed while holding a chunk (not between two chunks)
    for threshold in (10, 30, 50):
        owner = wait_until(lambda t=threshold: done(job) >= t and holder(job) in alive
                           and holder(job), timeout_s=20, what=f"{threshold} results")
        alive.pop(owner).kill()
        if BatchChunk.objects.filter(job=job, state="running", lease_owner=owner).exists():
            caught.append(owner)
    wait_until(lambda: job_state(job) == "completed", timeout_s=30,
               what="the job to complete after three kills")

    assert results_by_index(job) == {i: 1 for i in range(75)}
    assert caught, "no kill caught a holder"
    # Every kill of a holder led to a takeover. (On a loaded machine a live holder can also
    # stall past its 2 s lease and be taken over: that is the design working too, and any
    # late answer of its is refused by the database, so a result is still written once.)
    takeovers = job.events.filter(kind="takeover").values_list("data", flat=True)
    previous_owners = {t["previous_owner"] for t in takeovers}
    assert set(caught) <= previous_owners
    resends = list(job.resends.order_by("at", "id").values_list(
        "index", "previous_owner", "new_owner"))
    assert resends, "the kills caught requests in flight: they were sent again"
    assert {previous for _, previous, _ in resends} <= previous_owners
    # Each resent request's one result came from a holder that sent it again, or from a
    # previous holder that was only stalled (never from a killed one after its death).
    senders: dict[int, set[str]] = {}
    for index, previous, new in resends:
        senders.setdefault(index, set()).update({new} | ({previous} - set(caught)))
    by_index = dict(BatchResult.objects.filter(job=job).values_list("index", "worker"))
    assert all(by_index[index] in who for index, who in senders.items())


def test_a_running_worker_follows_pause_resume_and_cancel(
        sim_pool: Pool, tmp_path: Path, workers: Callable[..., WorkerProcess]) -> None:
    job = make_job(SYSTEM, sim_pool, n=80, tmp_path=tmp_path, chunk_size=20, concurrency=2,
                   rate_limit_rps=20)
    worker = workers("p")
    wait_until(lambda: done(job) >= 10, timeout_s=20, what="10 results")

    services.job_pause(actor=SYSTEM, job=job, reason="pool maintenance")
    wait_until(lambda: not holder(job), timeout_s=10, what="the holder to release its chunk")
    paused_at = done(job)
    after_a_later_job(sim_pool, tmp_path)  # nothing more is sent
    assert done(job) == paused_at < 80
    assert job_state(job) == "paused"

    services.job_resume(actor=SYSTEM, job=job, reason="maintenance over")
    wait_until(lambda: done(job) >= paused_at + 10, timeout_s=20, what="work after resume")

    released = worker.log().count(": released")
    services.job_cancel(actor=SYSTEM, job=job, reason="not needed any more")
    wait_until(lambda: worker.log().count(": released") > released, timeout_s=10,
               what="the holder to stop")
    cancelled_at = done(job)
    after_a_later_job(sim_pool, tmp_path)
    assert done(job) == cancelled_at < 80
    assert job_state(job) == "cancelled"
    assert results_by_index(job) == {i: 1 for i in results_by_index(job)}
    # The partial output stays downloadable: one output line per successful result.
    assert len(list(outputs.output_lines(job))) == cancelled_at


def test_a_job_past_its_window_expires_with_its_partial_output(
        sim_pool: Pool, tmp_path: Path, workers: Callable[..., WorkerProcess]) -> None:
    job = make_job(SYSTEM, sim_pool, n=100, tmp_path=tmp_path, chunk_size=25, concurrency=2,
                   rate_limit_rps=15)
    worker = workers("e")
    wait_until(lambda: done(job) >= 5, timeout_s=20, what="5 results")
    # The window ends now (the test shortens it; the form's least is 10 s).
    BatchJob.objects.filter(pk=job.pk).update(expires_at=timezone.now())
    # The tick's expiry skips a job row locked at that instant; it runs again on the next.
    wait_until(services.jobs_expire, timeout_s=10, what="the tick to expire the job")
    wait_until(lambda: ": released" in worker.log(), timeout_s=10,
               what="the holder to let its chunk go")
    partial = done(job)
    after_a_later_job(sim_pool, tmp_path)  # the worker is still running: it sends no more

    assert job_state(job) == "expired" and 0 < done(job) == partial < 100
    assert len(list(outputs.output_lines(job))) == partial
    assert results_by_index(job) == {i: 1 for i in results_by_index(job)}
    assert worker.alive()
