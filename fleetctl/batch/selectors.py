"""Reads for batch jobs: the list, one job, and its progress — one aggregate query over its
chunks (the counters the checkpoint store updates with each result), never over results."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from fleetctl.batch.models import BatchChunk, BatchJob, BatchResend


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
