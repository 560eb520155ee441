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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, Sum
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
    BatchChunk,
    BatchFile,
    BatchJob,
    BatchJobEvent,
    BatchResend,
    Soak,
    SoakEvent,
)
from fleetctl.core.errors import ConflictError, DomainError
from fleetctl.traffic.models import Drain
from fleetctl.webhooks.services import notify
from migrations_plan.models import STAGE_NAMES, Evidence, Plan, StageMove
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
ENDED_BADLY = (BatchJob.State.FAILED, BatchJob.State.EXPIRED, BatchJob.State.CANCELLED)
# Stage moves made by a person that interrupt a soak.
INTERRUPTING_MOVES = (StageMove.Kind.PAUSE, StageMove.Kind.REGRESS, StageMove.Kind.ABANDON)
EVENT_WEBHOOK = "batch.soak"


# --- what a soak looks like ------------------------------------------------------------------

@dataclass
class JobFigures:
    """One job of a soak, as the verdict reads it."""

    job_id: int
    state: str
    drill: str
    total: int
    succeeded: int
    failed: int
    retries: int
    resends: int
    output_tokens: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    elapsed_s: float | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    manual_events: int

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def error_rate(self) -> float | None:
        """Failed requests over the job's requests (None for an empty job)."""
        return self.failed / self.total if self.total else None

    def as_json(self) -> dict[str, Any]:
        def r(value: float | None, places: int = 3) -> float | None:
            return None if value is None else round(value, places)

        return {"job": self.job_id, "state": self.state, "drill": self.drill,
                "total": self.total, "succeeded": self.succeeded, "failed": self.failed,
                "error_rate": r(self.error_rate, 5), "retries": self.retries,
                "resends": self.resends, "output_tokens": self.output_tokens,
                "elapsed_s": r(self.elapsed_s), "requests_per_s": r(self.requests_per_s),
                "output_tokens_per_s": r(self.output_tokens_per_s),
                "manual_interventions": self.manual_events,
                "started_at": self.started_at.isoformat() if self.started_at else None,
                "finished_at": self.finished_at.isoformat() if self.finished_at else None}


@dataclass
class Intervention:
    """A person's action during the soak: who, when, what (and on what)."""

    at: datetime
    who: str
    what: str
    source: str  # "job 12", "soak", "drain 4", "plan"

    @property
    def text(self) -> str:
        return f"{self.who} at {self.at:%Y-%m-%d %H:%M:%S} UTC: {self.what}"

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "who": self.who, "what": self.what,
                "source": self.source}


@dataclass
class SoakSummary:
    """A soak's jobs with their figures, the interventions, and the verdict with its reasons:
    one reading for the dashboard, the API and the evidence row. While the soak runs, the
    verdict is "running" and `reasons` says what already stands against it."""

    soak: Soak
    jobs: list[JobFigures]
    interventions: list[Intervention]
    verdict: str  # pass | fail | running
    reasons: list[str]
    baseline_job: int | None
    baseline_output_tokens_per_s: float | None
    min_output_tokens_per_s: float | None
    slo_error_rate: float
    latency_margin_pct: float
    passes_so_far: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def headline(self) -> str:
        """One line: the verdict, the jobs, and the first reason against it."""
        soak = self.soak
        completed = sum(1 for job in self.jobs if job.state == BatchJob.State.COMPLETED)
        jobs = f"{completed} of {len(self.jobs)} job{'s' if len(self.jobs) != 1 else ''} " \
               f"completed"
        every = _duration(soak.every_s)
        length = _duration(soak.duration_s)
        if self.verdict == "pass":
            return (f"Soak {soak.pk} passed: {jobs} every {every} over {length} on "
                    f"{soak.pool.name}, no manual intervention, error rate and throughput "
                    f"within the plan's margins.")
        if self.verdict == "fail":
            first = self.reasons[0] if self.reasons else soak.state_reason
            more = f" (and {len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
            return f"Soak {soak.pk} failed ({jobs}): {first}{more}."
        status = "on track" if not self.reasons else f"failing: {self.reasons[0]}"
        return f"Soak {soak.pk} running, {jobs} so far; {status}."

    def as_json(self) -> dict[str, Any]:
        soak = self.soak
        return {
            "soak": soak.pk, "plan": soak.plan.name, "pool": soak.pool.name,
            "input_file": soak.input_file_id, "every_s": soak.every_s,
            "duration_s": soak.duration_s, "started_at": soak.started_at.isoformat(),
            "ends_at": soak.ends_at.isoformat(), "verdict": self.verdict,
            "reasons": self.reasons, "notes": self.notes,
            "interventions": [i.as_json() for i in self.interventions],
            "jobs": [job.as_json() for job in self.jobs],
            "slo_error_rate": self.slo_error_rate,
            "latency_margin_pct": self.latency_margin_pct,
            "baseline_job": self.baseline_job,
            "baseline_output_tokens_per_s": (
                round(self.baseline_output_tokens_per_s, 3)
                if self.baseline_output_tokens_per_s is not None else None),
            "min_output_tokens_per_s": (round(self.min_output_tokens_per_s, 3)
                                        if self.min_output_tokens_per_s is not None else None),
        }


def _duration(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds // 86400:g} d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60:g} min"
    return f"{seconds:g} s"


def _job_figures(soak: Soak, now: datetime) -> list[JobFigures]:
    """Every job of the soak with its figures, in three queries whatever the number of jobs
    (a week at one job every 5 minutes is two thousand)."""
    jobs = list(soak.jobs.order_by("created_at", "id"))
    ids = [job.pk for job in jobs]
    per_job = (BatchChunk.objects.filter(job__in=ids).values("job")
               .annotate(s=Sum("succeeded"), f=Sum("failed"), r=Sum("retries"),
                         o=Sum("output_tokens")))
    sums: dict[int, dict[str, Any]] = {row["job"]: dict(row) for row in per_job}
    resends = dict(BatchResend.objects.filter(job__in=ids).values("job")
                   .annotate(n=Count("id")).values_list("job", "n"))
    manual = dict(BatchJobEvent.objects.filter(job__in=ids, manual=True).values("job")
                  .annotate(n=Count("id")).values_list("job", "n"))
    figures = []
    for job in jobs:
        row = sums.get(job.pk, {})
        succeeded, failed = int(row.get("s") or 0), int(row.get("f") or 0)
        output = int(row.get("o") or 0)
        elapsed = None
        if job.started_at is not None:
            end = job.finished_at or now
            elapsed = max((end - job.started_at).total_seconds(), 0.0)
        rps = (succeeded + failed) / elapsed if elapsed else None
        tps = output / elapsed if elapsed else None
        figures.append(JobFigures(
            job_id=job.pk, state=job.state, drill=job.drill, total=job.total,
            succeeded=succeeded, failed=failed, retries=int(row.get("r") or 0),
            resends=int(resends.get(job.pk, 0)), output_tokens=output,
            created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
            elapsed_s=elapsed, requests_per_s=rps, output_tokens_per_s=tps,
            manual_events=int(manual.get(job.pk, 0))))
    return figures


def _by_platform(label: str) -> bool:
    """Actor labels: "system:…" is the platform's own work (the health policy's drains, the
    soak's own jobs). Anything else — a person, a personal token, a service token's
    automation — is an intervention from outside the soak."""
    return label.startswith("system:")


def soak_interventions(soak: Soak) -> list[Intervention]:
    """Every manual intervention during the soak, oldest first, from the rows."""
    since = soak.started_at
    until = soak.finished_at
    found: list[Intervention] = []
    for event in (BatchJobEvent.objects.filter(job__soak=soak, manual=True)
                  .order_by("at", "id")):
        if _by_platform(event.actor):
            continue
        found.append(Intervention(at=event.at, who=event.actor,
                                  what=event.message or f"{event.get_kind_display()} job "
                                                        f"{event.job_id}",
                                  source=f"job {event.job_id}"))
    for soak_event in soak.events.filter(manual=True).order_by("at", "id"):
        found.append(Intervention(at=soak_event.at, who=soak_event.actor,
                                  what=soak_event.message or soak_event.kind, source="soak"))
    candidate = soak.pool
    drains = Drain.objects.filter(action=Drain.Action.DRAIN, requested_at__gte=since)
    if until is not None:
        drains = drains.filter(requested_at__lte=until)
    for drain in drains.select_related("route").order_by("requested_at", "id"):
        if _by_platform(drain.requested_by):
            continue
        if drain.pool_id != candidate.pk and candidate.name not in (drain.drained_pools or []):
            continue
        where = f"route {drain.route.name}" if drain.route else "every route"
        found.append(Intervention(at=drain.requested_at, who=drain.requested_by,
                                  what=f"drained {candidate.name} off {where} (drain "
                                       f"{drain.pk}): {drain.reason}",
                                  source=f"drain {drain.pk}"))
    moves = StageMove.objects.filter(plan_id=soak.plan_id, at__gte=since,
                                     kind__in=INTERRUPTING_MOVES)
    if until is not None:
        moves = moves.filter(at__lte=until)
    for move in moves.order_by("at", "id"):
        found.append(Intervention(at=move.at, who=move.by,
                                  what=f"{StageMove.Kind(move.kind).label} plan "
                                       f"{soak.plan.name} ({move.from_state} → "
                                       f"{move.to_state})"
                                       + (f": {move.reason}" if move.reason else ""),
                                  source="plan"))
    found.sort(key=lambda item: item.at)
    return found


def soak_summary(soak: Soak, *, now: datetime | None = None) -> SoakSummary:
    """The soak's figures and its verdict as the rows stand now: final once it ended; while
    it runs, verdict "running" with what already stands against it."""
    fresh = Soak.objects.select_related("plan", "pool").get(pk=soak.pk)
    return _summarise(fresh, now=now or timezone.now(),
                      final=fresh.state != Soak.State.RUNNING)


def _summarise(soak: Soak, *, now: datetime, final: bool) -> SoakSummary:
    """The verdict's rules over the rows. `final`: the soak is over, so the end's rules apply
    too (at least two jobs, every one completed)."""
    plan = soak.plan
    jobs = _job_figures(soak, now)
    interventions = soak_interventions(soak)
    reasons = [f"manual intervention by {item.text}" for item in interventions]
    notes: list[str] = []
    if soak.state == Soak.State.STOPPED and not any(i.source == "soak" for i in interventions):
        reasons.append(f"stopped by a person: {soak.state_reason}")
    badly = {job.job_id for job in jobs if job.state in ENDED_BADLY}
    why = dict(BatchJob.objects.filter(pk__in=badly).values_list("pk", "state_reason"))
    for job in jobs:
        if job.job_id in badly:
            reasons.append(f"job {job.job_id} {job.state}"
                           + (f" ({why[job.job_id]})" if why.get(job.job_id) else ""))
    if plan.state != Plan.State.STAGE_3 and soak.state == Soak.State.RUNNING and \
            not any(i.source == "plan" for i in interventions):
        reasons.append(f"plan {plan.name} left stage 3: it is {plan.get_state_display()}")
    slo = float(plan.slo_error_rate)
    margin = float(plan.latency_margin_pct)
    for job in jobs:
        rate = job.error_rate
        if job.failed and rate is not None and rate > slo:
            reasons.append(f"job {job.job_id}: error rate {rate:.2%} ({job.failed} of "
                           f"{job.total} failed) over the plan's {slo:.2%}")
    completed = [job for job in jobs if job.state == BatchJob.State.COMPLETED
                 and job.output_tokens_per_s is not None]
    plain = [job for job in completed if not job.drill]
    judged = plain if plain else completed
    if plain and len(plain) < len(completed):
        notes.append("drill job " + ", ".join(str(j.job_id) for j in completed if j.drill)
                     + " not held to the throughput rule: a drill waits out a lapsed lease "
                       "on purpose")
    baseline = judged[0] if judged else None
    base_tps = baseline.output_tokens_per_s if baseline else None
    floor = None
    if baseline is not None and base_tps is not None:
        floor = max(0.0, (1 - margin / 100) * base_tps)
        for job in judged[1:]:
            tps = job.output_tokens_per_s
            if tps is not None and tps < floor:
                reasons.append(f"job {job.job_id}: {tps:,.1f} output tok/s, below "
                               f"{floor:,.1f} ({100 - margin:g} % of job {baseline.job_id}'s "
                               f"{base_tps:,.1f}): the candidate slowed down over the soak")
    if final:
        if len(jobs) < 2:
            reasons.append(f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} ran; a soak "
                           f"needs at least 2 to show the candidate holds up")
        for job in jobs:
            if job.state != BatchJob.State.COMPLETED and job.job_id not in badly:
                reasons.append(f"job {job.job_id} did not complete ({job.state})")
    if soak.state == Soak.State.RUNNING:
        verdict = "running"
    else:
        verdict = "pass" if soak.state == Soak.State.PASSED else "fail"
        if verdict == "fail" and not reasons and soak.state_reason:
            reasons.append(soak.state_reason)
    return SoakSummary(soak=soak, jobs=jobs, interventions=interventions, verdict=verdict,
                       reasons=reasons, baseline_job=baseline.job_id if baseline else None,
                       baseline_output_tokens_per_s=base_tps, min_output_tokens_per_s=floor,
                       slo_error_rate=slo, latency_margin_pct=margin,
                       passes_so_far=not reasons, notes=notes)


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
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": [f"Say why you {what} (it goes in the soak's "
                                          f"timeline, and the soak fails on it)."]})
    if len(reason) > 2000:
        raise ValidationError({"reason": ["At most 2,000 characters."]})
    return reason


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
        said = ", ".join(f"{name} {before[name]} → {after[name]}" for name in changes
                         if before[name] != after[name]) or "no change"
        _soak_event(locked, "edited", actor.label, manual=True,
                    message=f"{actor.label} edited the soak ({said}): {reason}",
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


def cost_rejudge(plan: Plan) -> Evidence | None:
    """The plan's predicted cost changed: judge the last finished soak's measured cost against
    the prediction now in force and record it as a new `cost-arbitrage` row (the stage-3
    check reads the newest; an approval bound to the old row is voided by the usual refresh).
    Nothing when no soak of the plan has ended."""
    soak = (plan.soaks.exclude(state=Soak.State.RUNNING).select_related("pool")
            .order_by(F("finished_at").desc(nulls_last=True), "-id").first())
    if soak is None:
        return None
    arbitrage = plan_arbitrage(plan, soak)
    return evidence_record(
        actor=Actor.for_system(EVIDENCE_ACTOR), pool=soak.pool, kind=COST_KIND,
        verdict=arbitrage.verdict, summary=arbitrage.message[:300], data=arbitrage.as_json(),
        url=f"/batch/soaks/{soak.pk}/",
        source=f"batch soak {soak.pk}, judged again: the plan's predicted cost changed")
