"""A batch job's cost per custom_id that succeeded (fleetctl/batch/selectors.py
`job_task_cost`, the formula in fleetctl/fleet/costs.py): a real job run by the executor on a
real simulated pool failing most of its requests with 500, so some custom_ids succeed after
retries and some fail for good; the spend is the pool's hourly rate × the job's busy time."""

from __future__ import annotations

import threading
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from django.urls import reverse

from fleetctl.batch import selectors
from fleetctl.batch.executor import run_chunk
from fleetctl.batch.models import BatchJob, BatchResult
from fleetctl.batch.store import CheckpointStore
from fleetctl.fleet.models import Pool
from tests.batch.test_store import set_fault
from tests.conftest import SYSTEM
from tests.sim.simproc import SimProcess

from .factory import make_job


def test_a_jobs_cost_per_successful_custom_id_counts_failures_and_retries(
        transactional_db: None, sim_pool: Pool, batch_sim: SimProcess, tmp_path: Path,
        client_for: Any) -> None:
    Pool.objects.filter(pk=sim_pool.pk).update(node_hourly_rate=Decimal("3600.00"))
    job = make_job(SYSTEM, sim_pool, n=30, tmp_path=tmp_path, chunk_size=30, concurrency=6,
                   max_attempts=2)
    store = CheckpointStore(lease_s=5)
    claim = store.claim("here:1")
    assert claim is not None
    job = BatchJob.objects.select_related("pool", "input_file").get(pk=job.pk)
    set_fault(batch_sim.url("batch"), error_rate=0.6)
    try:
        assert run_chunk(store, claim, job, stop=threading.Event()) == "done"
    finally:
        set_fault(batch_sim.url("batch"), error_rate=0.0)
    job = BatchJob.objects.select_related("pool").get(pk=job.pk)
    rows = list(BatchResult.objects.filter(job=job))
    ok = sum(r.status_code == 200 for r in rows)
    failed = len(rows) - ok
    retries = sum(r.attempts - 1 for r in rows)
    # 0.6 per attempt, two attempts: each custom_id fails with p = 0.36; 30 of them.
    assert 0 < ok < 30 and failed > 0 and retries > 0

    progress = selectors.job_progress(job)
    cost = selectors.job_task_cost(job, progress)
    assert job.started_at and job.finished_at
    busy = (job.finished_at - job.started_at).total_seconds()
    assert cost.seconds == busy and (cost.succeeded, cost.failed, cost.retries) == (
        ok, failed, retries)
    assert cost.attempts == 30 + retries  # every custom_id's attempts, no resend here
    spent = (Decimal("3600.00") * Decimal(str(busy)) / 3600).quantize(
        Decimal("1e-8"), rounding=ROUND_HALF_UP)
    assert cost.spend == str(spent)
    assert spent > 0  # 1.00 a second: a job of a few hundred ms costs something
    assert cost.cost_per_success == str((spent / ok).quantize(
        Decimal("1e-8"), rounding=ROUND_HALF_UP))
    assert f"{ok:,} custom_id that succeeded" in cost.how and not cost.not_measured

    viewer = client_for("viewer")
    detail = viewer.get(f"/api/v1/batch/jobs/{job.pk}/").json()
    assert detail["task_cost"] == cost.as_dict()
    page = viewer.get(reverse("batch:job-detail", args=[job.pk])).content.decode()
    assert "Cost per successful custom_id" in page and cost.how in page


def test_a_job_not_started_or_without_a_rate_is_not_measured(
        db: None, sim_pool: Pool, tmp_path: Path) -> None:
    job = make_job(SYSTEM, sim_pool, n=3, tmp_path=tmp_path)
    queued = selectors.job_task_cost(job, selectors.job_progress(job))
    assert queued.cost_per_success is None and queued.spend is None
    assert queued.not_measured == "not measured: no busy time yet (it has not started)"
    Pool.objects.filter(pk=sim_pool.pk).update(node_hourly_rate=0)
    job = BatchJob.objects.select_related("pool").get(pk=job.pk)
    job.started_at = job.created_at
    free = selectors.job_task_cost(job, selectors.job_progress(job))
    assert free.cost_per_success is None
    assert free.not_measured.startswith("not measured: batch-sim's hourly rate is 0")
