"""A soak's figures and verdict, read from the rows: its jobs with their throughput and
error rate, every manual intervention, and the rules that judge them (fleetctl/batch/soak.py
says what a soak is and when it passes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from fleetctl.batch.models import BatchChunk, BatchJob, BatchJobEvent, BatchResend, Soak
from fleetctl.traffic.models import Drain
from migrations_plan.models import Plan, StageMove

ENDED_BADLY = (BatchJob.State.FAILED, BatchJob.State.EXPIRED, BatchJob.State.CANCELLED)
# Stage moves made by a person that interrupt a soak.
INTERRUPTING_MOVES = (StageMove.Kind.PAUSE, StageMove.Kind.REGRESS, StageMove.Kind.ABANDON)


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
    reasons, badly = _interruptions(soak, jobs, interventions)
    slo = float(plan.slo_error_rate)
    margin = float(plan.latency_margin_pct)
    reasons += _error_rate_reasons(jobs, slo)
    notes: list[str] = []
    baseline, floor = _throughput(jobs, margin, reasons, notes)
    base_tps = baseline.output_tokens_per_s if baseline else None
    if final:
        reasons += _end_reasons(jobs, badly)
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


def _interruptions(soak: Soak, jobs: list[JobFigures], interventions: list[Intervention]
                   ) -> tuple[list[str], set[int]]:
    """What a person or the platform did to the soak: the interventions, a stop, jobs that
    ended badly, the plan leaving stage 3. Returns the reasons and the jobs that ended badly."""
    plan = soak.plan
    reasons = [f"manual intervention by {item.text}" for item in interventions]
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
    return reasons, badly


def _error_rate_reasons(jobs: list[JobFigures], slo: float) -> list[str]:
    """Each job whose failed share is over the plan's error-rate SLO."""
    reasons = []
    for job in jobs:
        rate = job.error_rate
        if job.failed and rate is not None and rate > slo:
            reasons.append(f"job {job.job_id}: error rate {rate:.2%} ({job.failed} of "
                           f"{job.total} failed) over the plan's {slo:.2%}")
    return reasons


def _throughput(jobs: list[JobFigures], margin: float, reasons: list[str], notes: list[str]
                ) -> tuple[JobFigures | None, float | None]:
    """The no-degradation rule: every completed job at least (1 − margin) × the first one's
    output tokens per second (drills left out when there are other jobs). Adds to `reasons`
    and `notes`; returns the baseline job and the floor."""
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
    return baseline, floor


def _end_reasons(jobs: list[JobFigures], badly: set[int]) -> list[str]:
    """The end's rules: at least two jobs, every one completed."""
    reasons = []
    if len(jobs) < 2:
        reasons.append(f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} ran; a soak "
                       f"needs at least 2 to show the candidate holds up")
    for job in jobs:
        if job.state != BatchJob.State.COMPLETED and job.job_id not in badly:
            reasons.append(f"job {job.job_id} did not complete ({job.state})")
    return reasons
