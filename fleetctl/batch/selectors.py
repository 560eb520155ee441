"""Reads for batch jobs: the list, one job, and its progress — one aggregate query over its
chunks (the counters the checkpoint store updates with each result), never over results."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from fleetctl.batch.models import (
    BatchChunk,
    BatchComparison,
    BatchFile,
    BatchJob,
    BatchJobEvent,
    BatchResend,
    Soak,
    SoakEvent,
)
from fleetctl.fleet.costs import TaskCost, task_cost
from fleetctl.fleet.models import Pool


@dataclass(frozen=True)
class Progress:
    total: int
    succeeded: int
    failed: int
    done: int
    fraction: float            # done / total (1.0 for an empty job)
    retries: int
    resends: int               # requests recorded as possibly sent twice (takeovers)
    duplicates_refused: int    # result writes the database refused (already had one)
    prompt_tokens: int
    output_tokens: int
    chunks: int
    chunks_done: int
    chunks_running: int
    elapsed_s: float | None    # since the first claim (to the end, once ended)
    requests_per_s: float | None
    output_tokens_per_s: float | None
    eta_s: float | None        # at the rate so far, while the job is active

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.done if self.done else None


def job_list() -> QuerySet[BatchJob]:
    return BatchJob.objects.select_related("pool", "plan", "input_file", "soak").order_by(
        "-created_at", "-id")


def job_get(pk: int) -> BatchJob | None:
    return job_list().filter(pk=pk).first()


def jobs_filtered(filters: dict[str, Any] | None) -> QuerySet[BatchJob]:
    """The list page's jobs: `filters` as its filter form read them (None, a filter it could
    not read: no jobs, rather than all of them)."""
    return job_list().filter(**filters) if filters is not None else job_list().none()


def chunk_sums(job_ids: list[int]) -> dict[int, dict[str, int]]:
    """Succeeded, failed and retries per job, for one page of the list: one query."""
    rows = (BatchChunk.objects.filter(job_id__in=job_ids).values("job_id")
            .annotate(succeeded=Sum("succeeded"), failed=Sum("failed"), retries=Sum("retries"))
            .order_by())
    return {row["job_id"]: {"succeeded": row["succeeded"] or 0, "failed": row["failed"] or 0,
                            "retries": row["retries"] or 0}
            for row in rows}


def job_events(job: BatchJob, *, newest_first: bool = False) -> QuerySet[BatchJobEvent]:
    """The job's timeline, oldest first (the API) or newest first (its page)."""
    order = ("-at", "-id") if newest_first else ("at", "id")
    return BatchJobEvent.objects.filter(job=job).order_by(*order)


def job_resends(job: BatchJob) -> QuerySet[BatchResend]:
    return BatchResend.objects.filter(job=job).order_by("index", "at")


def job_comparisons(job: BatchJob) -> QuerySet[BatchComparison]:
    return (BatchComparison.objects.filter(job=job).select_related("primary_pool")
            .order_by("index"))


def file_list() -> QuerySet[BatchFile]:
    """Input files that are still there (a deleted one is kept only for its jobs' records)."""
    return BatchFile.objects.filter(deleted_at__isnull=True)


def file_get(pk: int) -> BatchFile | None:
    return file_list().filter(pk=pk).first()


def pool_names() -> list[str]:
    """Every pool's name, in order: the pools a job may be put on."""
    return list(Pool.objects.order_by("name").values_list("name", flat=True))


def soak_list() -> QuerySet[Soak]:
    return Soak.objects.select_related("plan", "pool", "input_file", "evidence",
                                       "cost_evidence").order_by("-started_at", "-id")


def soak_get(pk: int) -> Soak | None:
    return soak_list().filter(pk=pk).first()


def soak_events(soak: Soak, *, limit: int) -> list[SoakEvent]:
    """The soak's newest events first."""
    return list(SoakEvent.objects.filter(soak=soak).order_by("-at", "-id")[:limit])


def plan_soak_jobs(plan_id: int) -> list[BatchJob]:
    """The batch jobs of a plan's soaks, oldest first (with their pools)."""
    return list(BatchJob.objects.filter(soak__plan_id=plan_id).select_related("pool")
                .order_by("created_at", "id"))


def job_task_cost(job: BatchJob, progress: Progress, tax: Any = None) -> TaskCost:
    """The job's cost per custom_id that succeeded: the pool's hourly rate × the job's busy
    time (its first claim to its end, or to now while it runs: the notion batch/cost.py
    measures a soak by) ÷ the custom_ids that succeeded. Attempts are every request sent:
    results, retries, and resends (sent again after a lease lapsed)."""
    pool = job.pool
    return task_cost(pool=pool, unit="custom_id that succeeded", seconds=progress.elapsed_s,
                     succeeded=progress.succeeded, failed=progress.failed,
                     retries=progress.retries,
                     attempts=progress.done + progress.retries + progress.resends, tax=tax)


def job_progress(job: BatchJob, now: datetime | None = None) -> Progress:
    sums = BatchChunk.objects.filter(job_id=job.pk).aggregate(
        succeeded=Sum("succeeded"), failed=Sum("failed"), retries=Sum("retries"),
        prompt_tokens=Sum("prompt_tokens"), output_tokens=Sum("output_tokens"),
        chunks=Count("id"),
        chunks_done=Count("id", filter=Q(state=BatchChunk.State.DONE)),
        chunks_running=Count("id", filter=Q(state=BatchChunk.State.RUNNING)))
    resends = BatchResend.objects.filter(job_id=job.pk).count()
    succeeded, failed = sums["succeeded"] or 0, sums["failed"] or 0
    done = succeeded + failed
    total = job.total
    elapsed = None
    if job.started_at is not None:
        end = job.finished_at or now or timezone.now()
        elapsed = max(0.0, (end - job.started_at).total_seconds())
    output_tokens = sums["output_tokens"] or 0
    rps = done / elapsed if elapsed else None
    eta = None
    if job.is_active and rps:
        eta = max(0, total - done) / rps
    return Progress(
        total=total, succeeded=succeeded, failed=failed, done=done,
        fraction=done / total if total else 1.0, retries=sums["retries"] or 0,
        resends=resends, duplicates_refused=job.duplicates_refused,
        prompt_tokens=sums["prompt_tokens"] or 0, output_tokens=output_tokens,
        chunks=sums["chunks"], chunks_done=sums["chunks_done"],
        chunks_running=sums["chunks_running"], elapsed_s=elapsed, requests_per_s=rps,
        output_tokens_per_s=output_tokens / elapsed if elapsed else None, eta_s=eta)


def job_page(*, before: int | None, limit: int) -> list[BatchJob]:
    """Up to `limit` + 1 jobs, newest first, below id `before` when given (the OpenAI Batch
    API's cursor: `after` names the last job of the previous page). One more than asked says
    whether there is a next page."""
    jobs = job_list().order_by("-id")
    if before is not None:
        jobs = jobs.filter(id__lt=before)
    return list(jobs[:limit + 1])


def file_page(*, before: int | None, limit: int) -> list[BatchFile]:
    """As job_page, for input files."""
    files = file_list().order_by("-id")
    if before is not None:
        files = files.filter(id__lt=before)
    return list(files[:limit + 1])
