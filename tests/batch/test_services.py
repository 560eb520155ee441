"""Batch services: uploads, job creation and its refusals, a person's pause / resume /
cancel / edit, and the tick's expiry."""

from __future__ import annotations

from fleetctl.batch.models import BatchChunk, BatchJob, BatchJobEvent

from .factory import make_job


def test_a_job_is_created_on_the_sim_pool_split_into_chunks(sim_pool, tmp_path, system):
    job = make_job(system, sim_pool, n=23, tmp_path=tmp_path, chunk_size=10)
    assert job.state == BatchJob.State.QUEUED and job.total == 23
    chunks = list(BatchChunk.objects.filter(job=job).order_by("number"))
    assert [(c.first_index, c.last_index, c.first_line) for c in chunks] == [
        (0, 9, 1), (10, 19, 11), (20, 22, 21)]
    assert [e.kind for e in BatchJobEvent.objects.filter(job=job)] == ["created"]
