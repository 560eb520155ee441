"""Schedules: edit them (people, with `jobs`), and fire them (beat, as `system:schedule`).

Firing (`schedules_due(now)`, beat's `schedules.due` every SCHEDULES_TICK_S):

* Each enabled schedule whose `next_run_at` has come is claimed with a conditional UPDATE
  (`SET next_run_at = <the next occurrence after now> WHERE id = … AND next_run_at = <the
  value read>`): of two beats, a retried task or a restarted worker, exactly one moves the
  row on, and only that one starts the job. The claim, the job's row, the `ScheduleRun`,
  the audit line and any webhook delivery are one transaction: a process that dies before
  the commit leaves the occurrence unclaimed, and the next tick (inside the window) runs it;
  after the commit it is recorded. Nothing is run twice, nothing is lost.
  A drain rehearsal is the exception to "one transaction": its drain pushes to the gateways
  only after a commit. Its occurrence is claimed with a `starting` row first; should the
  process die before the drain is started, the next tick records that row as failed (and
  notifies) instead of draining a second time.
* Occurrences older than the window (beat or the workers were down) are recorded as one
  `missed` row (how many, from when to when), audited and notified (`schedule.missed`); they
  are not run late. The occurrences still inside their window are one run (a late beat does
  not start a burst).
* A refused start (the service's ValidationError or DomainError: the plan is in the wrong
  stage, the pool is busy…) is a `failed` row with the refusal, audited and notified
  (`schedule.failed`). So is a started job that ends failed (`schedule_runs_follow`).
* A re-benchmark repeats the pool's last benchmark run (same trace, model, load shape, SLO,
  pools), and is `skipped` when that run was made the same calendar day (in the schedule's
  time zone): "repeat on a different day".
* An eval run runs the schedule's suite, or the plan's last eval run's suite.

Every line of it is `system:schedule` on the plan's timeline (audit target: the plan; a
pool-only schedule: the schedule).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import (  # type: ignore[import-untyped]
    CroniterBadCronError,
    CroniterBadDateError,
    CroniterNotAlphaError,
    croniter,
)
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import DomainError
from fleetctl.evals.models import EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.schedules.models import Schedule, ScheduleRun
from fleetctl.schedules.starters import (
    ACTOR,
    STARTERS,
    benchmark_same_day,
    last_eval_suite,
    target_pool,
    when,
)
from fleetctl.webhooks.services import notify
from migrations_plan.models import Plan

log = logging.getLogger(__name__)
MAX_WINDOW_MINUTES = 7 * 24 * 60
# A never-firing cron is one croniter finds no time for within this many years.
MAX_YEARS_BETWEEN = 10
# Missed occurrences counted one by one at most this many (then "more than").
MAX_COUNTED = 1000
# A rehearsal's `starting` row older than this: its process died before the drain started.
STARTING_STALE_S = 120
EDITABLE = ("cron", "timezone", "window_minutes", "enabled", "note", "eval_suite")
RUN_ACTION = "schedule.run"
# A drain rehearsal moves live traffic: its plan must be live (stage 4) for it to start.
REHEARSAL_STAGE = 4


# --- validation -------------------------------------------------------------------------------

def parse_cron(cron: Any) -> str:
    """The cron string, five fields separated by single spaces, or a ValidationError on
    `cron` saying what is wrong."""
    if not isinstance(cron, str) or not cron.strip():
        raise ValidationError({"cron": ["Give a cron string of five fields: minute hour "
                                        "day-of-month month day-of-week, e.g. 0 3 * * 1."]})
    fields = cron.split()
    if len(fields) != 5:
        raise ValidationError({"cron": [
            f"{cron.strip()!r} has {len(fields)} field{'s' if len(fields) != 1 else ''}; a "
            f"cron string has five: minute hour day-of-month month day-of-week (e.g. "
            f"*/10 * * * *)."]})
    text = " ".join(fields)
    try:
        croniter(text)
    except (CroniterBadCronError, CroniterNotAlphaError, ValueError) as exc:
        raise ValidationError({"cron": [f"{text!r} is not a valid cron string: {exc}."]}) \
            from None
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC),
                 max_years_between_matches=MAX_YEARS_BETWEEN).get_next(datetime)
    except CroniterBadDateError:
        raise ValidationError({"cron": [
            f"{text!r} never fires (no such date in {MAX_YEARS_BETWEEN} years, e.g. 31 "
            f"February): give a date that exists."]}) from None
    return text


def parse_timezone(name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise ValidationError({"timezone": ["Give an IANA time zone name, e.g. UTC or "
                                            "Europe/Paris."]})
    name = name.strip()
    try:
        if name not in available_timezones():
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError({"timezone": [
            f"{name!r} is not an IANA time zone name (e.g. UTC, Europe/Paris, "
            f"America/New_York)."]}) from None


def parse_window(minutes: Any) -> int:
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not (
            1 <= minutes <= MAX_WINDOW_MINUTES):
        raise ValidationError({"window_minutes": [
            f"Give the window in whole minutes, from 1 to {MAX_WINDOW_MINUTES} (a week): a "
            f"run must start within it of its cron time, else it is missed."]})
    return minutes


def occurrence_after(cron: str, tz: str, after: datetime) -> datetime:
    """The first occurrence of `cron` (read in `tz`) strictly after `after`, in UTC."""
    start = after.astimezone(ZoneInfo(tz))
    found = croniter(cron, start, max_years_between_matches=MAX_YEARS_BETWEEN).get_next(
        datetime)
    return found.astimezone(UTC)  # type: ignore[no-any-return]


def _targets(*, kind: str, plan: Plan | None, pool: Pool | None,
             eval_suite: EvalSuite | None) -> tuple[Plan | None, Pool | None]:
    """(plan, pool as stored): a pool with a plan must be its candidate and is not stored."""
    if kind not in Schedule.Kind.values:
        raise ValidationError({"kind": [f"Kind is one of {', '.join(Schedule.Kind.values)}."]})
    if kind in (Schedule.Kind.REHEARSAL, Schedule.Kind.EVAL) and plan is None:
        what = "A drain rehearsal" if kind == Schedule.Kind.REHEARSAL else "An eval run"
        raise ValidationError({"plan": [f"{what} is of a plan's candidate: name the plan."]})
    if plan is None and pool is None:
        raise ValidationError({"pool": ["Name a plan (its candidate is used) or a pool."]})
    if plan is not None:
        if not plan.is_open:
            raise ValidationError({"plan": [f"Plan {plan.name} is "
                                            f"{plan.get_state_display()}: nothing to verify."]})
        if pool is not None and pool.pk != plan.candidate_pool_id:
            raise ValidationError({"pool": [
                f"With plan {plan.name}, the pool is its candidate "
                f"{plan.candidate_pool.name}; leave the pool out."]})
        pool = None
    if eval_suite is not None and kind != Schedule.Kind.EVAL:
        raise ValidationError({"eval_suite": ["Only an eval schedule names a suite."]})
    if kind == Schedule.Kind.EVAL and eval_suite is None and plan is not None and \
            last_eval_suite(plan) is None:
        raise ValidationError({"eval_suite": [
            f"Plan {plan.name} has no eval run yet to take the suite from: name the suite."]})
    return plan, pool


# --- edits (people) ---------------------------------------------------------------------------

def _audit_target(schedule: Schedule) -> object:
    return schedule.plan if schedule.plan_id else schedule


def _shown(schedule: Schedule) -> dict[str, Any]:
    return {"schedule": schedule.pk, "kind": schedule.kind, "target": schedule.target_name,
            "cron": schedule.cron, "timezone": schedule.timezone,
            "window_minutes": schedule.window_minutes, "enabled": schedule.enabled,
            "eval_suite": schedule.eval_suite_id, "note": schedule.note,
            "next_run_at": schedule.next_run_at.isoformat() if schedule.next_run_at else None}


def schedule_create(*, actor: Actor, kind: str, cron: str, timezone: str = "UTC",
                    window_minutes: int = 60, plan: Plan | None = None,
                    pool: Pool | None = None, eval_suite: EvalSuite | None = None,
                    enabled: bool = True, note: str = "", now: datetime | None = None
                    ) -> Schedule:
    """A new schedule; its first run is the cron's first occurrence after now. Every field
    is checked first: nothing is stored when one is refused (the error names it)."""
    actor.require(roles.JOBS, action="schedule.create", target=plan or pool)
    cron = parse_cron(cron)
    parse_timezone(timezone)
    tz = timezone.strip()
    window_minutes = parse_window(window_minutes)
    plan, pool = _targets(kind=kind, plan=plan, pool=pool, eval_suite=eval_suite)
    now = now or _now()
    schedule = Schedule(kind=kind, plan=plan, pool=pool, eval_suite=eval_suite, cron=cron,
                        timezone=tz, window_minutes=window_minutes, enabled=bool(enabled),
                        note=note or "", created_by=actor.label,
                        next_run_at=occurrence_after(cron, tz, now) if enabled else None)
    schedule.full_clean()
    with transaction.atomic():
        schedule.save()
        audit_record(actor=actor, action="schedule.create", target=_audit_target(schedule),
                     message=f"schedule {schedule.pk}: {schedule.get_kind_display()} at "
                             f"{cron} ({tz}), window {window_minutes} min",
                     after=_shown(schedule))
    return schedule


def schedule_update(*, actor: Actor, schedule: Schedule, now: datetime | None = None,
                    **changes: Any) -> Schedule:
    """Change the cron, time zone, window, suite, note, or enable / disable. A changed cron
    or time zone, or enabling, starts from the next occurrence after now (a disabled spell
    is not reported as missed)."""
    actor.require(roles.JOBS, action="schedule.update", target=_audit_target(schedule))
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ValidationError({name: [f"Not editable (editable: {', '.join(EDITABLE)}; to "
                                      f"change the kind or target, add another schedule)."]
                               for name in unknown})
    now = now or _now()
    with transaction.atomic():
        locked = Schedule.objects.select_for_update(of=("self",)).select_related(
            "plan__candidate_pool", "pool").get(pk=schedule.pk)
        before = _shown(locked)
        if "cron" in changes:
            locked.cron = parse_cron(changes["cron"])
        if "timezone" in changes:
            parse_timezone(changes["timezone"])
            locked.timezone = changes["timezone"].strip()
        if "window_minutes" in changes:
            locked.window_minutes = parse_window(changes["window_minutes"])
        if "eval_suite" in changes:
            _targets(kind=locked.kind, plan=locked.plan, pool=locked.pool,
                     eval_suite=changes["eval_suite"])
            locked.eval_suite = changes["eval_suite"]
        if "note" in changes:
            locked.note = changes["note"] or ""
        enabling = changes.get("enabled") is True and not locked.enabled
        if "enabled" in changes:
            locked.enabled = bool(changes["enabled"])
        if not locked.enabled:
            locked.next_run_at = None
        elif enabling or before["cron"] != locked.cron or \
                before["timezone"] != locked.timezone or locked.next_run_at is None:
            locked.next_run_at = occurrence_after(locked.cron, locked.timezone, now)
        locked.full_clean()
        locked.save()
        after = _shown(locked)
        audit_record(actor=actor, action="schedule.update", target=_audit_target(locked),
                     message=f"schedule {locked.pk} changed: "
                             + ", ".join(k for k in after if after[k] != before[k]),
                     before=before, after=after)
    return locked


def schedule_delete(*, actor: Actor, schedule: Schedule) -> None:
    actor.require(roles.JOBS, action="schedule.delete", target=_audit_target(schedule))
    with transaction.atomic():
        audit_record(actor=actor, action="schedule.delete", target=_audit_target(schedule),
                     message=f"schedule {schedule.pk} ({schedule.get_kind_display()}, "
                             f"{schedule.cron}) deleted", before=_shown(schedule))
        schedule.delete()


# --- firing (beat) ----------------------------------------------------------------------------

def _now() -> datetime:
    return timezone.now()


@dataclass
class _Due:
    missed: list[datetime]
    more_missed: bool
    live: list[datetime]
    next_at: datetime


def _occurrences(schedule: Schedule, now: datetime) -> _Due:
    """The schedule's occurrences from its `next_run_at` up to now: those whose window has
    passed (missed), those still inside it (one run), and the first one after now."""
    assert schedule.next_run_at is not None
    window = timedelta(minutes=schedule.window_minutes)
    tz = ZoneInfo(schedule.timezone)
    missed: list[datetime] = []
    live: list[datetime] = []
    more = False
    at = schedule.next_run_at
    it = croniter(schedule.cron, at.astimezone(tz),
                  max_years_between_matches=MAX_YEARS_BETWEEN)
    while at <= now:
        if now - at > window:
            if len(missed) >= MAX_COUNTED:
                # Too many to count one by one: go on from the window's start.
                more = True
                it = croniter(schedule.cron, (now - window - timedelta(microseconds=1))
                              .astimezone(tz), max_years_between_matches=MAX_YEARS_BETWEEN)
                at = it.get_next(datetime).astimezone(UTC)
                continue
            missed.append(at)
        else:
            live.append(at)
        at = it.get_next(datetime).astimezone(UTC)
    return _Due(missed=missed, more_missed=more, live=live, next_at=at)


def _claim(schedule: Schedule, due: datetime, next_at: datetime, now: datetime) -> bool:
    """The conditional UPDATE: true for the one caller that moved the row on from `due`."""
    return Schedule.objects.filter(pk=schedule.pk, enabled=True, next_run_at=due).update(
        next_run_at=next_at, last_run_at=now) == 1


def _say(schedule: Schedule, run: ScheduleRun, text: str, *, event: str | None = None,
         after: dict[str, Any] | None = None) -> None:
    """The run on the plan's timeline (as system:schedule), and its webhook."""
    audit_record(actor=ACTOR, action=RUN_ACTION, target=_audit_target(schedule),
                 message=text[:2000], after={"schedule": schedule.pk, "run": run.pk,
                                             "outcome": run.outcome, **(after or {})})
    if event is not None:
        notify(event, {"schedule": schedule.pk, "run": run.pk, "kind": schedule.kind,
                       "plan": schedule.plan.name if schedule.plan is not None else None,
                       "pool": _pool_name(schedule), "outcome": run.outcome,
                       "due_at": run.due_at.isoformat(), "occurrences": run.occurrences,
                       "detail": run.detail}, text=text)


def _pool_name(schedule: Schedule) -> str | None:
    pool = schedule.target_pool
    return pool.name if pool is not None else None


def _record_missed(schedule: Schedule, due: _Due, now: datetime) -> ScheduleRun:
    count = len(due.missed)
    many = f"more than {count}" if due.more_missed else str(count)
    span = when(due.missed[0], schedule) + (
        f" to {when(due.missed[-1], schedule)}" if count > 1 else "")
    detail = (f"{many} occurrence{'s' if count > 1 or due.more_missed else ''} ({span}) "
              f"passed their {schedule.window_minutes}-minute window without a start (beat "
              f"or the workers were not running); not run late.")
    run = ScheduleRun.objects.create(schedule=schedule, due_at=due.missed[0],
                                     occurrences=count, recorded_at=now,
                                     outcome=ScheduleRun.Outcome.MISSED, detail=detail)
    _say(schedule, run, f"Scheduled {schedule.get_kind_display()} of "
                        f"{schedule.target_name} missed: {detail}", event="schedule.missed")
    return run


def schedules_due(now: datetime | None = None) -> list[ScheduleRun]:
    """Fire every enabled schedule whose next occurrence has come (beat's `schedules.due`),
    then follow the runs whose jobs were still going. `now`: tests move time. One query says
    what there is to do: the schedules due and those with a run still open (a job to follow,
    a rehearsal `starting`); a tick with neither (most ticks) costs that query alone."""
    now = now or _now()
    done: list[ScheduleRun] = []
    open_runs = Exists(ScheduleRun.objects.filter(schedule=OuterRef("pk"),
                                                  outcome__in=ScheduleRun.OPEN))
    rows = list(Schedule.objects.annotate(following=open_runs)
                .filter(Q(enabled=True, next_run_at__lte=now) | Q(following=True))
                .order_by("next_run_at", "pk").values_list("pk", "enabled", "next_run_at",
                                                           "following"))
    following = any(row[3] for row in rows)
    if following:
        _recover_starting(now)
    due_ids = [pk for pk, enabled, at, _ in rows if enabled and at is not None and at <= now]
    for schedule_id in due_ids:
        try:
            done += _fire(schedule_id, now)
        except Exception:  # one schedule's bug must not stop the others; retried next tick
            log.exception("schedule %s could not be fired", schedule_id)
    if following or due_ids:
        schedule_runs_follow(now)
    return done


def _fire(schedule_id: int, now: datetime) -> list[ScheduleRun]:
    schedule = Schedule.objects.select_related(
        "plan__candidate_pool", "plan__primary_pool", "pool", "eval_suite").filter(
        pk=schedule_id, enabled=True, next_run_at__lte=now).first()
    if schedule is None or schedule.next_run_at is None:
        return []
    read = schedule.next_run_at
    due = _occurrences(schedule, now)
    made: list[ScheduleRun] = []
    if schedule.kind == Schedule.Kind.REHEARSAL and due.live:
        with transaction.atomic():
            if not _claim(schedule, read, due.next_at, now):
                return []
            if due.missed:
                made.append(_record_missed(schedule, due, now))
            run = ScheduleRun.objects.create(
                schedule=schedule, due_at=due.live[0], occurrences=len(due.live),
                recorded_at=now, outcome=ScheduleRun.Outcome.STARTING)
        made.append(_start_rehearsal(schedule, run, now))
        return made
    with transaction.atomic():
        if not _claim(schedule, read, due.next_at, now):
            return []
        if due.missed:
            made.append(_record_missed(schedule, due, now))
        if due.live:
            run = ScheduleRun(schedule=schedule, due_at=due.live[0], occurrences=len(due.live),
                              recorded_at=now)
            made.append(_start(schedule, run, now))
    return made


def _start(schedule: Schedule, run: ScheduleRun, now: datetime) -> ScheduleRun:
    """Start the job (inside the claim's transaction), or record why not."""
    kind = schedule.get_kind_display()
    if schedule.plan is not None and not schedule.plan.is_open:
        run.outcome = ScheduleRun.Outcome.SKIPPED
        run.detail = f"Plan {schedule.plan.name} is {schedule.plan.get_state_display()}."
        run.save()
        _say(schedule, run, f"Scheduled {kind} skipped: {run.detail}")
        return run
    if schedule.kind == Schedule.Kind.BENCHMARK:
        skip = benchmark_same_day(schedule, now)
        if skip:
            run.outcome, run.detail = ScheduleRun.Outcome.SKIPPED, skip
            run.save()
            _say(schedule, run, f"Scheduled {kind} of {schedule.target_name} skipped: {skip}")
            return run
    starter = STARTERS[schedule.kind]
    try:
        with transaction.atomic():  # a refusal rolls back to here, the claim stays
            job_kind, job_id, what = starter(schedule)
    except (ValidationError, DomainError) as exc:
        return _failed(schedule, run, _refusal(exc), now)
    run.outcome, run.started_at = ScheduleRun.Outcome.STARTED, now
    run.job_kind, run.job_id, run.detail = job_kind, job_id, what
    run.save()
    _say(schedule, run, f"Scheduled {kind} of {schedule.target_name} (due "
                        f"{when(run.due_at, schedule)}): {what}",
         after={"job": job_kind, "job_id": job_id})
    return run


def _failed(schedule: Schedule, run: ScheduleRun, why: str, now: datetime) -> ScheduleRun:
    run.outcome, run.detail, run.finished_at = ScheduleRun.Outcome.FAILED, why, now
    run.save()
    _say(schedule, run, f"Scheduled {schedule.get_kind_display()} of {schedule.target_name} "
                        f"(due {when(run.due_at, schedule)}) failed: {why}",
         event="schedule.failed")
    return run


def _refusal(exc: ValidationError | DomainError) -> str:
    if isinstance(exc, DomainError):
        return exc.message
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" if field != "__all__" else " ".join(msgs)
                         for field, msgs in exc.message_dict.items())
    return " ".join(exc.messages)


def _start_rehearsal(schedule: Schedule, run: ScheduleRun, now: datetime) -> ScheduleRun:
    """A drain moves live traffic and pushes after its own commit: claimed and recorded
    `starting` first, then started outside any transaction."""
    from migrations_plan.services import rehearsal_start

    plan = schedule.plan
    assert plan is not None, f"schedule {schedule.pk} has no plan"
    if plan.stage < REHEARSAL_STAGE:
        # Scheduled ahead of the stage it needs: waiting is not a failure (nothing notifies),
        # and each occurrence says why on the schedule's history.
        with transaction.atomic():
            run.outcome, run.finished_at = ScheduleRun.Outcome.SKIPPED, now
            run.detail = (f"Plan {plan.name} is in stage {plan.stage}: a rehearsal drains "
                          f"the candidate's live traffic, which it carries from stage "
                          f"{REHEARSAL_STAGE}; the schedule waits for it.")
            run.save()
            _say(schedule, run, f"Scheduled drain rehearsal skipped: {run.detail}")
        return run
    try:
        drain = rehearsal_start(actor=ACTOR, plan=plan)
    except (ValidationError, DomainError) as exc:
        with transaction.atomic():
            return _failed(schedule, run, _refusal(exc), now)
    with transaction.atomic():
        run.outcome, run.started_at = ScheduleRun.Outcome.STARTED, now
        run.job_kind, run.job_id = "drain", drain.pk
        run.detail = (f"drain rehearsal of {target_pool(schedule).name} started (drain "
                      f"{drain.pk})")
        run.save()
        _say(schedule, run, f"Scheduled drain rehearsal of {schedule.target_name} (due "
                            f"{when(run.due_at, schedule)}): {run.detail}",
             after={"job": "drain", "job_id": drain.pk})
    return run


def _recover_starting(now: datetime) -> None:
    """A rehearsal left `starting` by a process that died before it started the drain: failed
    (and notified), never started a second time."""
    stale = now - timedelta(seconds=STARTING_STALE_S)
    for run in ScheduleRun.objects.filter(outcome=ScheduleRun.Outcome.STARTING,
                                          recorded_at__lt=stale).select_related(
            "schedule__plan__candidate_pool", "schedule__pool"):
        with transaction.atomic():
            if ScheduleRun.objects.filter(pk=run.pk, outcome=ScheduleRun.Outcome.STARTING
                                          ).update(outcome=ScheduleRun.Outcome.FAILED) != 1:
                continue
            _failed(run.schedule, run, "The process starting it stopped before the drain was "
                                       "started (it is not started again: see the plan's "
                                       "timeline and the drains list for what happened).", now)


# --- following the jobs -----------------------------------------------------------------------

def job_model(job_kind: str) -> type[models.Model] | None:
    from fleetctl.bench.models import Run
    from fleetctl.conformance.models import ConformanceRun
    from fleetctl.evals.models import EvalRun
    from fleetctl.traffic.models import Drain

    return {"bench.run": Run, "conformance.run": ConformanceRun, "eval.run": EvalRun,
            "drain": Drain}.get(job_kind)


ENDED = {"complete": ScheduleRun.Outcome.COMPLETE, "partial": ScheduleRun.Outcome.COMPLETE,
         "failed": ScheduleRun.Outcome.FAILED, "cancelled": ScheduleRun.Outcome.CANCELLED}


def _jobs(runs: list[ScheduleRun]) -> dict[tuple[str, int | None], Any]:
    """The job rows of these runs, one query per kind of job."""
    ids: dict[str, set[int | None]] = {}
    for run in runs:
        ids.setdefault(run.job_kind, set()).add(run.job_id)
    found: dict[tuple[str, int | None], Any] = {}
    for job_kind, pks in ids.items():
        model = job_model(job_kind)
        if model is not None:
            found.update({(job_kind, job.pk): job
                          for job in model._default_manager.filter(pk__in=pks)})
    return found


def job_ended(run: ScheduleRun, job: Any) -> tuple[str, str] | None:
    """(outcome, what the job row says: `job`, None when it is gone) once the run's job
    ended; None while it runs."""
    if job is None:
        return ScheduleRun.Outcome.FAILED, f"{run.job_kind} {run.job_id} is gone."
    status = str(job.status)
    if run.job_kind == "drain" and status == "partial":
        status = "failed"
    outcome = ENDED.get(status)
    if outcome is None:
        return None
    said = [f"{run.job_kind} {run.job_id} {status}"]
    if getattr(job, "verdict", ""):
        said.append(f"verdict {job.verdict}")
    for field in ("error", "failure_reason", "last_error"):
        why = str(getattr(job, field, None) or "")
        if outcome == ScheduleRun.Outcome.FAILED and why:
            said.append(why[:500])
            break
    return outcome, ": ".join(said[:1]) + ("; " + "; ".join(said[1:]) if said[1:] else "")


def schedule_runs_follow(now: datetime | None = None) -> int:
    """Runs whose job has ended take its outcome (complete, failed, cancelled); a failed job
    is audited and notified once (the row moves on by a conditional UPDATE)."""
    now = now or _now()
    moved = 0
    runs = list(ScheduleRun.objects.filter(outcome=ScheduleRun.Outcome.STARTED).select_related(
        "schedule__plan__candidate_pool", "schedule__pool"))
    jobs = _jobs(runs)
    for run in runs:
        ended = job_ended(run, jobs.get((run.job_kind, run.job_id)))
        if ended is None:
            continue
        outcome, said = ended
        with transaction.atomic():
            if ScheduleRun.objects.filter(pk=run.pk, outcome=ScheduleRun.Outcome.STARTED
                                          ).update(outcome=outcome, finished_at=now) != 1:
                continue
            run.outcome, run.finished_at = outcome, now
            run.detail = f"{run.detail}; {said}"[:4000]
            run.save(update_fields=["detail"])
            moved += 1
            failed = outcome == ScheduleRun.Outcome.FAILED
            _say(run.schedule, run, f"Scheduled {run.schedule.get_kind_display()} of "
                                    f"{run.schedule.target_name}: {said}",
                 event="schedule.failed" if failed else None)
    return moved
