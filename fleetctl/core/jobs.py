"""The evidence jobs' common row: one status vocabulary and the columns every job has.

Four jobs produce the evidence plans are judged on — a benchmark run (bench `Run`), a
conformance probe (`ConformanceRun`), a shadow run (`ShadowRun`) and an eval run (`EvalRun`).
Each is a row that is queued, driven by a worker that beats a heartbeat, and ends once. This
module is that row without anything above core: core imports no app, so the part that knows
plans (`plan`, `plan_stage`) and the lifecycle that needs pools, actors and the audit log
(resolve the plan's targets, take, beat, cancel, reap, finish) are in migrations_plan/jobs.py,
the lowest layer every job may import.

One vocabulary for every kind: `queued`, `running`, `complete`, `failed`, `cancelled`. A
kind adds a word only where it means something none of these does (bench's `partial`: the
run ended but some levels could not be measured; shadow's `stopped`: a person — or the
residency fail-safe — pulled a running shadow run's kill switch, and what it judged so far
stands as evidence). A kind that adds words redeclares `status` with its own `Status`; the
five words keep their meaning there (tests/core/test_jobs.py holds them to it).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class JobStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    COMPLETE = "complete", "complete"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


# A job in one of these is not over: it may be cancelled, and a page showing it refreshes.
ACTIVE: tuple[str, ...] = (JobStatus.QUEUED, JobStatus.RUNNING)
STATUS_MAX_LENGTH = 10


class JobVerdict(models.TextChoices):
    """The verdict of a job that compares a candidate with its primary within a margin at a
    confidence (shadow and eval runs): `insufficient` until there are enough pairs to judge.
    Conformance (no `insufficient`; its `warn` means only optional cases fail) and a bench
    level (per load, with `invalid` and `error`) judge other things and keep their own."""

    PASS = "pass", "pass"
    WARN = "warn", "warn"
    FAIL = "fail", "fail"
    INSUFFICIENT = "insufficient", "insufficient data"


class Job(models.Model):
    """The columns of every evidence job (abstract). `worker` names what drives the run now
    (a host, or a token when takeovers are conditional on it); `cancelled_by` who ended it
    early (a cancel, or a shadow run's stop); `error` why it failed."""

    Status = JobStatus
    ACTIVE = ACTIVE

    status = models.CharField(max_length=STATUS_MAX_LENGTH, choices=JobStatus.choices,
                              default=JobStatus.QUEUED)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    @property
    def active(self) -> bool:
        return self.status in self.ACTIVE
