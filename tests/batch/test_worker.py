"""Real worker processes (`python -m fleetctl.batch.worker`) against a real simulator pool,
on the test database: jobs complete with one result per line, survive repeated kill -9s,
follow a person's pause/resume/cancel, retry a faulty pool and expire with partial output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.batch.models import BatchChunk, BatchJob, BatchResult
from fleetctl.fleet.models import Pool
from tests.conftest import SYSTEM, wait_until

from .factory import make_job
from .workerproc import WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(name: str = "w", **kwargs: object) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, name, **kwargs)  # type: ignore[arg-type]
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


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
