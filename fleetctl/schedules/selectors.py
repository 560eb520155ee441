"""Reads for schedules: the list, a plan's schedules, a schedule's history, a job's link."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery
from django.urls import NoReverseMatch, reverse

from fleetctl.schedules.models import Schedule, ScheduleRun
from migrations_plan.models import Plan

JOB_PAGES = {"bench.run": "bench:run-detail", "conformance.run": "conformance:run-detail",
             "eval.run": "evals:run-detail", "drain": "traffic:drain-detail"}


def schedule_list() -> QuerySet[Schedule]:
    """Every schedule with its last run's outcome and due time (`last_outcome`,
    `last_due_at`)."""
    last = ScheduleRun.objects.filter(schedule=OuterRef("pk")).order_by("-due_at", "-pk")
    return (Schedule.objects.select_related("plan__candidate_pool", "pool", "eval_suite")
            .annotate(last_outcome=Subquery(last.values("outcome")[:1]),
                      last_due_at=Subquery(last.values("due_at")[:1]))
            .order_by("pk"))


def schedule_get(pk: int) -> Schedule | None:
    return schedule_list().filter(pk=pk).first()


def schedules_of_plan(plan: Plan) -> list[Schedule]:
    return list(schedule_list().filter(plan=plan))


def runs_of(schedule: Schedule) -> QuerySet[ScheduleRun]:
    return ScheduleRun.objects.filter(schedule=schedule).order_by("-due_at", "-pk")


def job_url(run: ScheduleRun) -> str:
    """The page of the job a run started ("" when none)."""
    name = JOB_PAGES.get(run.job_kind)
    if not name or run.job_id is None:
        return ""
    try:
        return reverse(name, kwargs={"drain_id" if run.job_kind == "drain" else "run_id":
                                     run.job_id})
    except NoReverseMatch:
        return ""
