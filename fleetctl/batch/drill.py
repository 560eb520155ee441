"""The interruption drill's verdict and its `checkpoint-resume` evidence, from the rows only.

A drill job interrupts its own run (fleetctl/batch/executor.py fires it: kill-worker kills
the holder with SIGKILL, fault-pool takes the pool down through its fault hook). When the job
ends, `drill_record` judges it (the store calls it when the job completes, `batch.tick` for
jobs that ended otherwise) and records one evidence row about the job's pool.

It passes only when all of these hold, each checked from the database, not from what a
worker believed:
- the drill fired (drill_fired_at committed before the interruption);
- the work went on afterwards without a person: kill-worker — a worker other than the killed
  one wrote a result (drill_resumed_at); fault-pool — a request succeeded after the fault was
  cleared;
- the job completed, and every custom_id of the input file has exactly one result: the
  input's lines and the result rows are read side by side in index order (bounded memory,
  however long the file), so a missing, extra or mismatched result is named.
The resends (requests in flight at the interruption, sent again) and the second writes the
database refused are reported, not failed: both are the design working.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Count

from fleetctl.accounts.actor import Actor
from fleetctl.batch.evidence import DRILL_KIND
from fleetctl.batch.models import BatchJob, BatchJobEvent, BatchResend, BatchResult
from fleetctl.batch.store import FAULT_CLEARED, input_path
from migrations_plan.models import Evidence

log = logging.getLogger("fleetctl.batch")

SAMPLE = 10  # custom_ids named per problem


@dataclass
class DrillVerdict:
    verdict: str  # "pass" | "fail"
    summary: str  # one line, for the evidence row and the job page
    reasons: list[str] = field(default_factory=list)  # why it failed; empty on a pass
    data: dict[str, Any] = field(default_factory=dict)  # the evidence row's data

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class _Tally:
    results: int = 0
    missing: int = 0
    mismatched: int = 0
    extra: int = 0
    missing_sample: list[str] = field(default_factory=list)
    mismatched_sample: list[str] = field(default_factory=list)
    file_problem: str = ""


def _input_ids(job: BatchJob) -> Iterator[str]:
    from fleetctl.batch.inputs import read_lines

    path = input_path(job)
    for _, request in read_lines(path, 0, path.stat().st_size):
        yield str(request.get("custom_id", ""))


def _tally(job: BatchJob) -> _Tally:
    """Each input line against the result at its index, in one ordered pass over both."""
    tally = _Tally()
    rows = BatchResult.objects.filter(job=job).order_by("index").values_list(
        "index", "custom_id").iterator(chunk_size=2000)
    row = next(rows, None)
    try:
        for index, custom_id in enumerate(_input_ids(job)):
            while row is not None and row[0] < index:  # cannot happen with the constraint
                tally.extra += 1
                row = next(rows, None)
            if row is None or row[0] != index:
                tally.missing += 1
                if len(tally.missing_sample) < SAMPLE:
                    tally.missing_sample.append(custom_id)
                continue
            tally.results += 1
            if row[1] != custom_id:
                tally.mismatched += 1
                if len(tally.mismatched_sample) < SAMPLE:
                    tally.mismatched_sample.append(custom_id)
            row = next(rows, None)
    except OSError as exc:
        tally.file_problem = f"the input file could not be read ({exc.__class__.__name__})"
    while row is not None:
        tally.extra += 1
        row = next(rows, None)
    return tally


def _seconds(later: Any, earlier: Any) -> float | None:
    if later is None or earlier is None:
        return None
    return round((later - earlier).total_seconds(), 3)


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _resumed_by(job: BatchJob, cleared: BatchJobEvent | None) -> str:
    """The worker that wrote the first result counted as the resume (see store._note_resume)."""
    if job.drill_fired_at is None:
        return ""
    after = BatchResult.objects.filter(job=job, finished_at__gte=job.drill_fired_at)
    if job.drill == BatchJob.Drill.KILL_WORKER:
        after = after.exclude(worker=job.drill_worker)
    else:
        after = after.filter(status_code__gte=200, status_code__lt=300)
        if cleared is not None:
            after = after.filter(finished_at__gte=cleared.at)
    first = after.order_by("finished_at", "id").first()
    return first.worker if first else ""


def drill_verify(job: BatchJob) -> DrillVerdict:
    """Judge the drill from the rows (see the module docstring)."""
    tally = _tally(job)
    repeated_ids = (BatchResult.objects.filter(job=job).values("custom_id")
                    .annotate(n=Count("id")).filter(n__gt=1).count())
    resends = BatchResend.objects.filter(job=job).count()
    events = list(BatchJobEvent.objects.filter(job=job, kind=BatchJobEvent.Kind.DRILL_FIRED)
                  .order_by("at", "id"))
    no_hook = next((e for e in events if e.data.get("phase") == "no-hook"), None)
    cleared = next((e for e in events if e.data.get("phase") == FAULT_CLEARED), None)
    fired = next((e for e in events if e.data.get("phase") == "fired"), None)
    resumed_by = _resumed_by(job, cleared)
    reasons: list[str] = []
    if job.drill_fired_at is None:
        reasons.append("the drill never fired (the job ended before "
                       f"{job.drill_at:.0%} of its requests were done, or no worker ran it)")
    if no_hook is not None:
        reasons.append(no_hook.message)
    if job.drill_fired_at is not None and job.drill_resumed_at is None and no_hook is None:
        reasons.append("no other worker resumed the work after the kill"
                       if job.drill == BatchJob.Drill.KILL_WORKER else
                       "no request succeeded after the fault was cleared")
    if job.state != BatchJob.State.COMPLETED:
        reasons.append(f"the job ended {job.state}, not completed")
    if tally.file_problem:
        reasons.append(tally.file_problem)
    if tally.missing:
        reasons.append(f"{tally.missing} of {job.total} custom_ids have no result (e.g. "
                       f"{', '.join(tally.missing_sample[:3])})")
    if tally.mismatched:
        reasons.append(f"{tally.mismatched} results name another custom_id than their line "
                       f"(e.g. {', '.join(tally.mismatched_sample[:3])})")
    if tally.extra or repeated_ids:
        reasons.append(f"{tally.extra + repeated_ids} custom_ids have more than one result")

    resume_s = _seconds(job.drill_resumed_at, job.drill_fired_at)
    data: dict[str, Any] = {
        "job": job.pk, "drill": job.drill, "state": job.state, "total": job.total,
        "results": tally.results + tally.extra, "missing": tally.missing,
        "missing_sample": tally.missing_sample, "mismatched": tally.mismatched,
        "repeated": tally.extra + repeated_ids, "resends": resends,
        "duplicates_refused": job.duplicates_refused,
        "fired_at": _iso(job.drill_fired_at), "resumed_at": _iso(job.drill_resumed_at),
        "resume_s": resume_s, "killed_worker": job.drill_worker,
        "resumed_by": resumed_by,
        "in_flight_at_drill": (fired.data.get("in_flight") if fired else None),
        # Answers back but not yet committed at the kill (group commit): lost, sent again.
        "uncommitted_at_drill": (fired.data.get("unflushed_count", 0) if fired else None),
        "fault_cleared_at": _iso(cleared.at) if cleared else None,
        "reasons": reasons,
    }
    if reasons:
        summary = "Drill failed: " + "; ".join(reasons)
        return DrillVerdict("fail", summary[:300], reasons, data)
    if job.drill == BatchJob.Drill.KILL_WORKER:
        uncommitted = data["uncommitted_at_drill"]
        what = (f"kill -9 of {job.drill_worker} with {data['in_flight_at_drill']} request(s) "
                f"in flight" + (f" and {uncommitted} answer(s) not yet committed"
                                if uncommitted else "")
                + f"; {resumed_by} resumed after {resume_s:g} s")
    else:
        what = f"pool faulted for the drill; work resumed {resume_s:g} s after it began"
    summary = (f"{what}; all {job.total} custom_ids have exactly one result; {resends} "
               f"resent, {job.duplicates_refused} duplicate write(s) refused")
    return DrillVerdict("pass", summary[:300], [], data)


def drill_record(job: BatchJob) -> Evidence | None:
    """Judge an ended drill job once and record its checkpoint-resume evidence (about the
    job's pool); sets the job's drill_verdict/summary/evidence and a DRILL_VERDICT event.
    A job already judged is left as it is (the store and the tick may both call this)."""
    from fleetctl.batch.services import job_event
    from migrations_plan.services import evidence_record

    with transaction.atomic():
        locked = BatchJob.objects.select_for_update(of=("self",)).select_related(
            "pool", "input_file").get(pk=job.pk)
        if not locked.drill or locked.drill_verdict:
            return locked.evidence
        verdict = drill_verify(locked)
        evidence = evidence_record(
            actor=Actor.for_system("batch"), pool=locked.pool, kind=DRILL_KIND,
            verdict=verdict.verdict, summary=verdict.summary, data=verdict.data,
            url=f"/batch/jobs/{locked.pk}/", source=f"batch job {locked.pk}")
        BatchJob.objects.filter(pk=locked.pk).update(
            drill_verdict=verdict.verdict, drill_summary=verdict.summary, evidence=evidence)
        job_event(locked, BatchJobEvent.Kind.DRILL_VERDICT, "system:batch",
                  message=verdict.summary, data={"verdict": verdict.verdict,
                                                 "reasons": verdict.reasons})
        if verdict.passed:  # a newer drill prices the pool's interruption tax
            from functools import partial

            from fleetctl.fleet.hooks import tax_hooks_run
            transaction.on_commit(partial(
                tax_hooks_run, locked.pool_id,
                f"a drill of batch job {locked.pk} on {locked.pool.name} passed"))
    log.info("job %s drill %s: %s", job.pk, verdict.verdict, verdict.summary)
    job.refresh_from_db()
    return evidence


def drill_measures(pools: list[Any], since: Any, until: Any) -> dict[int, Any]:
    """Each pool's newest passed drill observed in [since, until] and not expired, as the
    interruption tax prices a reclaim with it (fleet.interruption.DRILL_SOURCES): re-warm =
    its resume_s, lost work = its resends × the drill job's mean measured request latency.
    Two reads however many pools."""
    from django.db.models import Avg, Q

    from fleetctl.fleet.interruption import DrillMeasure

    rows = (Evidence.objects.filter(kind=DRILL_KIND, verdict=Evidence.Verdict.PASS,
                                    pool__in=[pool.pk for pool in pools],
                                    observed_at__gte=since, observed_at__lte=until)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=until))
            .exclude(data__resume_s=None)
            .order_by("pool_id", "-observed_at", "-id"))
    newest: dict[int, Evidence] = {}
    for row in rows:  # the first of each pool (no DISTINCT ON: SQLite has none)
        newest.setdefault(row.pool_id, row)
    jobs = [row.data.get("job") for row in newest.values()]
    latency = dict(BatchResult.objects.filter(job_id__in=[j for j in jobs if j])
                   .exclude(latency_ms=None).order_by().values("job_id")
                   .annotate(mean=Avg("latency_ms")).values_list("job_id", "mean"))
    out = {}
    for pool_id, row in newest.items():
        mean_ms = latency.get(row.data.get("job"))
        out[pool_id] = DrillMeasure(
            evidence_id=row.pk, observed_at=row.observed_at, source=row.source, url=row.url,
            rewarm_s=float(row.data["resume_s"]), redone=int(row.data.get("resends") or 0),
            mean_request_s=None if mean_ms is None else mean_ms / 1000)
    return out
