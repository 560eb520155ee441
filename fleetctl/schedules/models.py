"""Schedules: recurring evidence jobs a person edits (dashboard, REST), fired by beat.

A `Schedule` row says what to start (a re-benchmark, a drain rehearsal, a conformance probe,
an eval run), for which plan or pool, on which cron in which time zone, and how late a run may
start (`window_minutes`, the maintenance window). `next_run_at` is the next occurrence not yet
claimed: beat's `schedules.due` claims it with a conditional UPDATE (services.schedules_due),
so one occurrence is started once whatever restarts or runs twice. Every occurrence leaves a
`ScheduleRun` (the history): started (with the job it started), skipped, missed or failed,
then complete / failed / cancelled once its job ended.
"""

from __future__ import annotations

from django.db import models
from django.utils.timezone import now

from fleetctl.evals.models import EvalSuite
from fleetctl.fleet.models import Pool
from migrations_plan.models import Plan


class Schedule(models.Model):
    class Kind(models.TextChoices):
        BENCHMARK = "benchmark", "re-benchmark (on another day than the last)"
        REHEARSAL = "rehearsal", "drain rehearsal of the plan's candidate"
        CONFORMANCE = "conformance", "conformance probe"
        EVAL = "eval", "eval run"

    kind = models.CharField(max_length=11, choices=Kind.choices)
    plan = models.ForeignKey(Plan, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="schedules")
    # Without a plan (benchmark, conformance): the pool. With a plan: its candidate, always.
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="schedules")
    # Eval schedules: the suite to run; blank: the plan's last eval run's suite.
    eval_suite = models.ForeignKey(EvalSuite, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    cron = models.CharField(max_length=100, help_text="Five fields: minute hour day-of-month "
                                                      "month day-of-week.")
    timezone = models.CharField(max_length=64, default="UTC",
                                help_text="IANA time zone the cron is read in.")
    window_minutes = models.PositiveIntegerField(
        default=60, help_text="A run must start within this many minutes of its cron time, "
                              "else it is recorded as missed.")
    enabled = models.BooleanField(default=True)
    # The next occurrence not yet claimed (UTC); null while disabled.
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="schedule_due")]

    def __str__(self) -> str:
        return f"schedule {self.pk} ({self.kind} {self.target_name})"

    @property
    def target_pool(self) -> Pool | None:
        return self.plan.candidate_pool if self.plan is not None else self.pool

    @property
    def target_name(self) -> str:
        if self.plan is not None:
            return f"plan {self.plan.name}"
        return f"pool {self.pool.name}" if self.pool is not None else "nothing"


class ScheduleRun(models.Model):
    class Outcome(models.TextChoices):
        STARTING = "starting", "starting"
        STARTED = "started", "started (its job runs)"
        SKIPPED = "skipped", "skipped"
        MISSED = "missed", "missed"
        FAILED = "failed", "failed"
        COMPLETE = "complete", "complete"
        CANCELLED = "cancelled", "cancelled"

    # The job is still to end: the tick reads its row.
    OPEN = (Outcome.STARTING, Outcome.STARTED)
    BAD = (Outcome.MISSED, Outcome.FAILED)

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    # The cron occurrence (UTC); a missed row: the first one missed, `occurrences` how many.
    due_at = models.DateTimeField()
    occurrences = models.PositiveIntegerField(default=1)
    recorded_at = models.DateTimeField(default=now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=9, choices=Outcome.choices)
    # The job started: "bench.run", "conformance.run", "eval.run" or "drain", and its id.
    job_kind = models.CharField(max_length=20, blank=True)
    job_id = models.PositiveBigIntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-due_at", "-id"]
        indexes = [models.Index(fields=["outcome"], name="schedule_run_outcome")]

    def __str__(self) -> str:
        return f"schedule run {self.pk} ({self.outcome})"
