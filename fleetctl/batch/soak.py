"""Soaks: recurring batch jobs on a stage-3 plan's candidate over a duration (days in
production, minutes in the demo and the tests: the same code), judged at the end.

A person starts a soak (`soak_create`): its first job starts at once. The controller
(`soaks_tick`, from `batch.tick` every BATCH_TICK_INTERVAL_S) claims each running soak with a
conditional UPDATE of its lease (as ramps do), so one controller drives a soak at a time and
a killed one leaves a lease that lapses after BATCH_LEASE_S. A tick starts the next job once
the previous one has ended and `every_s` has passed since it was started, until `ends_at`;
then, once the last job has ended, it judges the soak.

A soak passes only when nobody touched it. Every manual intervention is read from the rows,
never from memory: a person's action on one of its jobs (BatchJobEvent.manual: pause, resume,
edit, cancel), a person's action on the soak itself (SoakEvent.manual: edit, stop), a drain
of the candidate a person requested while it ran (traffic's Drain rows: `requested_by` is the
actor's label, "system:…" for the platform's own), and the plan paused, moved back or
abandoned (its StageMove rows). Any of these, or a job that failed, expired or was cancelled,
fails the soak at the next tick, naming who did what and when. At the end it also needs at
least two jobs, every one completed, each job's error rate (failed / total) within the plan's
`slo_error_rate`, and each job's output tokens per second at least (1 − latency_margin_pct /
100) × the first job's: the soak must not degrade. A drill job waits out a lapsed lease on
purpose, so it is not held to the throughput rule (nor used as its baseline) when the soak has
other jobs.

The verdict is recorded as `soak` evidence (and the measured cost as `cost-arbitrage`
evidence, fleetctl/batch/cost.py) about the candidate, which stage 3's gate reads.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.batch import services
from fleetctl.batch.cost import Arbitrage, plan_arbitrage
from fleetctl.batch.evidence import COST_KIND, SOAK_KIND
from fleetctl.batch.models import (
    ACTIVE_STATES,
    DEFAULT_CHUNK_SIZE,
    BatchFile,
    BatchJob,
    Soak,
    SoakEvent,
)
from fleetctl.batch.soak_verdict import (
    ENDED_BADLY,
    INTERRUPTING_MOVES,
    Intervention,
    JobFigures,
    SoakSummary,
    _duration,
    _summarise,
    soak_interventions,
    soak_summary,
)
from fleetctl.core.errors import ConflictError, DomainError
from fleetctl.webhooks.services import notify
from migrations_plan.models import STAGE_NAMES, Evidence, Plan
from migrations_plan.services import evidence_record

log = logging.getLogger("fleetctl.batch")

# Who starts a soak's later jobs, and who records its evidence.
SOAK_ACTOR = "batch-soak"
EVIDENCE_ACTOR = "batch"
MIN_EVERY_S, MIN_DURATION_S = 10, 60
MAX_DURATION_S = 90 * 86400
# A soak's options a person may change while it runs (each change fails it: an intervention).
EDITABLE = ("every_s", "duration_s", "concurrency", "rate_limit_rps", "completion_window_s",
            "chunk_size")
EVENT_WEBHOOK = "batch.soak"


# The verdict (soak_verdict.py) is re-exported: callers read a soak's summary from here.
__all__ = ["EDITABLE", "ENDED_BADLY", "EVENT_WEBHOOK", "EVIDENCE_ACTOR", "INTERRUPTING_MOVES",
           "MAX_DURATION_S", "MIN_DURATION_S", "MIN_EVERY_S", "SOAK_ACTOR", "Intervention",
           "JobFigures", "SoakSummary", "cost_rejudge", "soak_create", "soak_edit",
           "soak_interventions", "soak_stop", "soak_summary", "soaks_tick"]


# --- a person's actions ----------------------------------------------------------------------

def _option_problems(options: dict[str, Any]) -> dict[str, list[str]]:
    """The soak's own options, and the jobs' options it passes on (the ranges job_create
    checks, said here before anything is stored)."""
    problems: dict[str, list[str]] = {}

    def whole(name: str, low: float, high: float, why: str = "") -> None:
        if name not in options:
            return
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or not float(value).is_integer():
            problems[name] = [f"Give a whole number of {why or 'units'} from {low:g} to "
                              f"{high:g}, not {value!r}."]
        elif not low <= value <= high:
            problems[name] = [f"{value:g} is out of range: from {low:g} to {high:g}"
                              + (f" ({why})" if why else "") + "."]

    whole("every_s", MIN_EVERY_S, MAX_DURATION_S, "seconds between job starts")
    whole("duration_s", MIN_DURATION_S, MAX_DURATION_S, "seconds the soak runs")
    for name in ("concurrency", "completion_window_s", "chunk_size"):
        low, high = services.LIMITS[name]
        whole(name, low, high)
    rate = options.get("rate_limit_rps")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not math.isfinite(rate) or rate < 0.01):
        problems["rate_limit_rps"] = [f"Give requests per second of at least 0.01, or "
                                      f"nothing for no limit; not {rate!r}."]
    if "drill" in options and options["drill"] not in BatchJob.Drill.values:
        problems["drill"] = [f"{options['drill']!r} is not a drill; use kill-worker, "
                             f"fault-pool or nothing."]
    every, length = options.get("every_s"), options.get("duration_s")
    if "every_s" not in problems and "duration_s" not in problems and \
            every is not None and length is not None and every >= length:
        problems["every_s"] = [f"A soak needs at least two jobs: every_s ({every:g} s) must be "
                               f"shorter than duration_s ({length:g} s)."]
    return problems


def _stage_3_refusal(plan: Plan) -> str | None:
    if plan.state == Plan.State.STAGE_3:
        return None
    if plan.state == Plan.State.PAUSED:
        where = f"paused at stage {plan.stage} ({STAGE_NAMES[plan.stage]})"
    elif plan.in_stage:
        where = f"at stage {plan.stage} ({STAGE_NAMES[plan.stage]})"
    else:
        where = plan.get_state_display()
    return (f"Plan {plan.name} is {where}; a soak runs on the candidate while the plan is at "
            f"stage 3 (batch)." + (" Advance it to stage 3 first." if plan.in_stage
                                   and plan.stage < 3 else ""))


def soak_create(*, actor: Actor, plan: Plan, input_file: BatchFile, every_s: int,
                duration_s: int, concurrency: int = 8, rate_limit_rps: float | None = None,
                completion_window_s: int = 3600, chunk_size: int = DEFAULT_CHUNK_SIZE,
                drill: str = "") -> Soak:
    """Start a soak on the plan's candidate: a job of `input_file` every `every_s` seconds
    (once the previous one ended) for `duration_s`, the first one now (with `drill`, if
    given). Refused: the plan not at stage 3 (409), a soak already running on the plan (409),
    options out of range or a model the candidate does not serve (400). Nothing is stored on
    a refusal."""
    actor.require(roles.JOBS, action="batch.soak_create", target=plan)
    drill = drill or ""
    options: dict[str, Any] = {
        "every_s": every_s, "duration_s": duration_s, "concurrency": concurrency,
        "rate_limit_rps": rate_limit_rps, "completion_window_s": completion_window_s,
        "chunk_size": chunk_size, "drill": drill}
    problems = _option_problems(options)
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        locked = Plan.objects.select_for_update().select_related("candidate_pool").get(
            pk=plan.pk)
        refusal = _stage_3_refusal(locked)
        if refusal:
            raise ConflictError(refusal, fields={"plan": [refusal]})
        running = Soak.objects.filter(plan=locked, state=Soak.State.RUNNING).first()
        if running is not None:
            raise ConflictError(
                f"Plan {locked.name} already has a running soak: soak {running.pk}, until "
                f"{running.ends_at:%Y-%m-%d %H:%M} UTC. One soak per plan at a time; stop it "
                f"first (/batch/soaks/{running.pk}/).", extra={"soak": running.pk})
        pool = locked.candidate_pool
        now = timezone.now()
        soak = Soak(plan=locked, pool=pool, input_file=input_file, every_s=int(every_s),
                    duration_s=int(duration_s), concurrency=int(concurrency),
                    rate_limit_rps=float(rate_limit_rps) if rate_limit_rps is not None
                    else None, completion_window_s=int(completion_window_s),
                    chunk_size=int(chunk_size), drill=drill, started_at=now,
                    ends_at=now + timedelta(seconds=int(duration_s)), created_by=actor.label)
        try:
            with transaction.atomic():
                soak.save()
        except IntegrityError:  # the database's one-running-soak-per-plan constraint
            raise ConflictError(f"Plan {locked.name} already has a running soak.") from None
        _soak_event(soak, "started", actor.label,
                    message=f"{actor.label} started a soak of {input_file.name} on "
                            f"{pool.name}: a job every {_duration(soak.every_s)} for "
                            f"{_duration(soak.duration_s)}"
                            + (f", the first with a {drill} drill" if drill else ""),
                    data={k: v for k, v in options.items()})
        _start_job(soak, actor, drill=drill)
        audit_record(actor=actor, action="batch.soak_create", target=soak,
                     after={"plan": locked.name, "pool": pool.name,
                            "input_file": input_file.pk, **options})
    return soak


def _soak_event(soak: Soak, kind: str, actor_label: str, *, manual: bool = False,
                message: str = "", data: dict[str, Any] | None = None) -> SoakEvent:
    return SoakEvent.objects.create(soak=soak, kind=kind, actor=actor_label, manual=manual,
                                    message=message, data=data or {})


def _start_job(soak: Soak, actor: Actor, *, drill: str = "") -> BatchJob:
    """One job of the soak, through the same service as any job (every refusal holds)."""
    job = services.job_create(
        actor=actor, input_file=soak.input_file, pool=soak.pool, concurrency=soak.concurrency,
        rate_limit_rps=soak.rate_limit_rps, completion_window_s=soak.completion_window_s,
        chunk_size=soak.chunk_size, drill=drill, soak=soak)
    soak.next_job_at = job.created_at + timedelta(seconds=soak.every_s)
    Soak.objects.filter(pk=soak.pk).update(next_job_at=soak.next_job_at)
    number = soak.jobs.count()
    _soak_event(soak, "job", actor.label,
                message=f"job {job.pk} started (job {number} of the soak"
                        + (f", with a {drill} drill" if drill else "") + ")",
                data={"job": job.pk, "number": number})
    return job


def _need_reason(reason: str, what: str) -> str:
    return services.person_reason(reason, f"Say why you {what} (it goes in the soak's "
                                          f"timeline, and the soak fails on it).")


def _locked(soak: Soak) -> Soak:
    return Soak.objects.select_for_update(of=("self",)).select_related(
        "plan", "pool", "input_file").get(pk=soak.pk)


def soak_stop(*, actor: Actor, soak: Soak, reason: str) -> Soak:
    """A person stops a running soak: its active job is cancelled (results so far stay), the
    soak ends as stopped — a manual intervention, so it records a failing `soak` verdict —
    with the measured cost so far."""
    actor.require(roles.JOBS, action="batch.soak_stop", target=soak)
    reason = _need_reason(reason, "stop the soak")
    with transaction.atomic():
        locked = _locked(soak)
        if locked.state != Soak.State.RUNNING:
            raise ConflictError(f"Soak {locked.pk} is {locked.get_state_display()}; only a "
                                f"running soak can be stopped.")
        _soak_event(locked, "stopped", actor.label, manual=True,
                    message=f"{actor.label} stopped the soak: {reason}")
        for job in locked.jobs.filter(state__in=ACTIVE_STATES):
            services.job_cancel(actor=actor, job=job,
                                reason=f"soak {locked.pk} stopped by {actor.label}: {reason}")
        audit_record(actor=actor, action="batch.soak_stop", target=locked, message=reason,
                     before={"state": "running"}, after={"state": "stopped"})
        _finish(locked, Soak.State.STOPPED, actor=actor,
                why=f"stopped by {actor.label}: {reason}")
    return Soak.objects.get(pk=soak.pk)


def soak_edit(*, actor: Actor, soak: Soak, reason: str, **changes: Any) -> Soak:
    """A person changes a running soak's schedule or its jobs' options (they apply from its
    next job). A manual intervention: the soak keeps its record and fails at the next tick,
    naming who changed what."""
    actor.require(roles.JOBS, action="batch.soak_edit", target=soak)
    reason = _need_reason(reason, "edit the soak")
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ValidationError({name: [f"Cannot be changed; editable: {', '.join(EDITABLE)}."]
                               for name in unknown})
    if not changes:
        raise ValidationError({"non_field_errors": [
            f"Nothing to change: give one or more of {', '.join(EDITABLE)}."]})
    with transaction.atomic():
        locked = _locked(soak)
        if locked.state != Soak.State.RUNNING:
            raise ConflictError(f"Soak {locked.pk} is {locked.get_state_display()}; only a "
                                f"running soak can be edited.")
        merged = {name: getattr(locked, name) for name in EDITABLE}
        merged.update(changes)
        problems = _option_problems(merged)
        if problems:
            raise ValidationError(problems)
        before = {name: getattr(locked, name) for name in changes}
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.ends_at = locked.started_at + timedelta(seconds=int(locked.duration_s))
        locked.save(update_fields=[*changes, "ends_at"])
        after = {name: getattr(locked, name) for name in changes}
        _soak_event(locked, "edited", actor.label, manual=True,
                    message=f"{actor.label} edited the soak "
                            f"({services.changes_said(before, after)}): {reason}",
                    data={"before": before, "after": after})
        audit_record(actor=actor, action="batch.soak_edit", target=locked, message=reason,
                     before=before, after=after)
    return locked


# --- the controller --------------------------------------------------------------------------

def soaks_tick(now: datetime | None = None) -> None:
    """Drive every running soak one step: fail it on an intervention or a job gone wrong,
    start its next job when due, judge it once its time is up and its last job ended. Never
    raises for one soak's trouble (logged; the next tick tries again)."""
    now = now or timezone.now()
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    running = Soak.objects.filter(free, state=Soak.State.RUNNING)
    for pk in list(running.order_by("started_at", "id").values_list("pk", flat=True)):
        lease = now + timedelta(seconds=settings.BATCH_LEASE_S)
        if not Soak.objects.filter(free, pk=pk, state=Soak.State.RUNNING).update(
                lease_owner=owner, lease_until=lease):
            continue  # another controller holds it
        try:
            _drive(Soak.objects.select_related("plan", "pool", "input_file").get(pk=pk),
                   now=now)
        except Exception:  # one soak's trouble must not stop the others
            log.exception("soak %s: tick failed", pk)
        finally:
            Soak.objects.filter(pk=pk, lease_owner=owner).update(lease_owner="",
                                                                 lease_until=None)


def _drive(soak: Soak, *, now: datetime) -> None:
    system = Actor.for_system(SOAK_ACTOR)
    summary = _summarise(soak, now=now, final=False)
    if summary.reasons:
        # An intervention, a job gone wrong, an error rate or a slowdown: no later job can
        # make up for it.
        _finish(soak, Soak.State.FAILED, actor=system, why=summary.reasons[0])
        return
    if summary.jobs and summary.jobs[-1].state in ACTIVE_STATES:
        return  # the current job runs on (its completion window expires it otherwise)
    if now >= soak.ends_at:
        final = _summarise(soak, now=now, final=True)
        _finish(soak, Soak.State.PASSED if final.passes_so_far else Soak.State.FAILED,
                actor=system, why="" if final.passes_so_far else final.reasons[0])
        return
    if soak.next_job_at is not None and now < soak.next_job_at:
        return
    try:
        with transaction.atomic():
            _start_job(soak, system)
    except (ValidationError, DomainError) as exc:
        said = "; ".join(exc.messages) if isinstance(exc, ValidationError) else exc.message
        _finish(soak, Soak.State.FAILED, actor=system,
                why=f"the next job could not start: {said}")


def _finish(soak: Soak, state: str, *, actor: Actor, why: str) -> Soak | None:
    """End a running soak: record its `soak` and `cost-arbitrage` evidence about the
    candidate, set the state, put the verdict on its timeline and tell the webhooks. Does
    nothing if the soak already ended (another controller, or a person, got there first)."""
    with transaction.atomic():
        locked = _locked(soak)
        if locked.state != Soak.State.RUNNING:
            return None
        now = timezone.now()
        # Judged as ended: the summary reads the final state's rules.
        locked.state, locked.state_reason, locked.finished_at = state, why, now
        summary = _summarise(locked, now=now, final=True)
        verdict = "pass" if state == Soak.State.PASSED else "fail"
        system = Actor.for_system(EVIDENCE_ACTOR)
        data = summary.as_json()
        data["verdict"] = verdict
        soak_row = evidence_record(
            actor=system, pool=locked.pool, kind=SOAK_KIND, verdict=verdict,
            summary=summary.headline if verdict == "pass" else
            f"Soak {locked.pk} failed: {why}"[:300], data=data,
            url=f"/batch/soaks/{locked.pk}/", source=f"batch soak {locked.pk}")
        arbitrage: Arbitrage = plan_arbitrage(locked.plan, locked)
        cost_row = evidence_record(
            actor=system, pool=locked.pool, kind=COST_KIND, verdict=arbitrage.verdict,
            summary=arbitrage.message[:300], data=arbitrage.as_json(),
            url=f"/batch/soaks/{locked.pk}/", source=f"batch soak {locked.pk}")
        locked.evidence, locked.cost_evidence = soak_row, cost_row
        locked.next_job_at = None
        locked.save(update_fields=["state", "state_reason", "finished_at", "evidence",
                                   "cost_evidence", "next_job_at"])
        _soak_event(locked, state, actor.label,
                    message=(summary.headline if verdict == "pass" else
                             f"Soak {locked.pk} {locked.get_state_display()}: {why}")
                    + f" Cost: {arbitrage.message}",
                    data={"verdict": verdict, "reasons": summary.reasons,
                          "evidence": soak_row.pk, "cost_evidence": cost_row.pk,
                          "cost_status": arbitrage.status})
        if actor.system:
            audit_record(actor=actor, action="batch.soak_finish", target=locked,
                         message=why or "passed", before={"state": "running"},
                         after={"state": state, "evidence": soak_row.pk,
                                "cost_evidence": cost_row.pk})
        notify(EVENT_WEBHOOK, {
            "soak": locked.pk, "plan": locked.plan.name, "pool": locked.pool.name,
            "state": state, "verdict": verdict, "reasons": summary.reasons,
            "cost": arbitrage.as_json(), "url": f"/batch/soaks/{locked.pk}/"},
            text=f"fleetctl soak {locked.pk} of plan {locked.plan.name} on "
                 f"{locked.pool.name}: {verdict}"
                 + (f" — {why}" if why else "") + f". Cost: {arbitrage.message}")
    return locked


def cost_rejudge_for_pool(pool_id: int, what: str) -> None:
    """The candidate's interruption tax changed (fleet.hooks.TAX_HOOKS): judge the cost
    arbitrage of each open plan on it again, as for a changed prediction."""
    from migrations_plan.models import Plan

    plans = Plan.objects.filter(candidate_pool_id=pool_id, closed_at__isnull=True)
    for plan in plans.order_by("id"):
        if plan.soaks.exists():
            log.info("cost arbitrage of %s judged again: %s", plan.name, what)
            cost_rejudge(plan, what)


def cost_rejudge(plan: Plan, why: str = "the plan's predicted cost changed") -> Evidence | None:
    """The plan's predicted cost or its cost unit changed (`why`): judge the last finished
    soak's measured cost against the prediction now in force, in the unit now in force, and
    record it as a new `cost-arbitrage` row (the stage-3 check reads the newest; an approval
    bound to the old row is voided by the usual refresh). Nothing when no soak of the plan
    has ended."""
    soak = (plan.soaks.exclude(state=Soak.State.RUNNING).select_related("pool")
            .order_by(F("finished_at").desc(nulls_last=True), "-id").first())
    if soak is None:
        return None
    arbitrage = plan_arbitrage(plan, soak)
    return evidence_record(
        actor=Actor.for_system(EVIDENCE_ACTOR), pool=soak.pool, kind=COST_KIND,
        verdict=arbitrage.verdict, summary=arbitrage.message[:300], data=arbitrage.as_json(),
        url=f"/batch/soaks/{soak.pk}/",
        source=f"batch soak {soak.pk}, judged again: {why}")
