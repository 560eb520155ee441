"""Writes for batch jobs: uploading an input file, creating a job on a pool, a person's
pause / resume / cancel / edit, and the tick's expiry of jobs past their completion window.

A job is split into chunks when it is created (one streamed scan of the stored file); the
worker processes (fleetctl/batch/worker.py) claim and run them, writing results through the
checkpoint store (fleetctl/batch/store.py). Nothing here sends a request.

Every person's action is a BatchJobEvent with manual=True (a soak with one fails) and an
audit record, in one transaction with the state change. Refusals store nothing: options are
checked before anything is written, and the uploaded file is deleted unless its row is kept.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.batch import inputs, targets
from fleetctl.batch.models import (
    ACTIVE_STATES,
    DEFAULT_CHUNK_SIZE,
    BatchChunk,
    BatchFile,
    BatchJob,
    BatchJobEvent,
    Soak,
)
from fleetctl.core.errors import ConflictError, NotFoundError, required_reason
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic.models import Route
from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.batch")

Kind = BatchJobEvent.Kind
SYSTEM_ACTOR = "system:batch"
CHUNK_INSERT_BATCH = 2000
MAX_NAME = 200
# Ranges of the options (the model's validators say the same; the messages here say why).
LIMITS: dict[str, tuple[float, float]] = {
    "concurrency": (1, 256),
    "completion_window_s": (10, 7 * 86400),
    "chunk_size": (1, 10_000),
    "max_attempts": (1, 20),
    "request_timeout_s": (1, 3600),
    "drill_at": (0.05, 0.95),
    "compare_sample": (0, 500),
}
INTEGER_OPTIONS = ("concurrency", "completion_window_s", "chunk_size", "max_attempts",
                   "compare_sample")


def files_dir() -> Path:
    return Path(settings.BATCH_FILES_DIR)


def file_path(batch_file: BatchFile) -> Path:
    """Where a stored input file is on this machine."""
    return files_dir() / batch_file.path


# --- input files -------------------------------------------------------------------------------

def file_upload(*, actor: Actor, name: str, stream: Any) -> BatchFile:
    """Validate and store an input file (OpenAI Batch JSONL) read from `stream` (a binary
    file object, or an iterable of lines). Any bad line refuses the whole file: a
    ValidationError on `file` lists "line N: ..." (at most 20), and nothing is kept."""
    actor.require(roles.JOBS, action="batch.file_upload")
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": ["Give the file a name (the upload's file name)."]})
    if len(name) > MAX_NAME:
        raise ValidationError({"name": [f"The name is {len(name)} characters; at most "
                                        f"{MAX_NAME}."]})
    try:
        summary = inputs.read_input(stream, dest_dir=files_dir())
    except inputs.InputError as error:
        raise ValidationError({"file": error.messages()}) from None
    try:
        with transaction.atomic():
            batch_file = BatchFile.objects.create(
                name=name, sha256=summary.sha256,
                path=str(summary.path.relative_to(files_dir())),
                size_bytes=summary.size_bytes, requests=summary.requests,
                url_lines=summary.url_lines, model_lines=summary.model_lines,
                uploaded_by=actor.label)
            audit_record(actor=actor, action="batch.file_upload", target=batch_file,
                         after={"name": name, "sha256": summary.sha256,
                                "requests": summary.requests,
                                "size_bytes": summary.size_bytes,
                                "models": sorted(summary.model_lines)})
    except BaseException:
        summary.path.unlink(missing_ok=True)
        raise
    return batch_file


def file_delete(*, actor: Actor, batch_file: BatchFile) -> BatchFile:
    """Delete an input file (DELETE /openai/v1/files/{id}): its bytes go and no new job may
    use it; the row stays for the finished jobs that ran it. Refused (409, naming them) while
    a job that is not finished, or a running soak, reads it."""
    actor.require(roles.JOBS, action="batch.file_delete", target=batch_file)
    with transaction.atomic():
        locked = BatchFile.objects.select_for_update().get(pk=batch_file.pk)
        if locked.deleted_at is not None:
            raise NotFoundError(f"Input file {locked.pk} ({locked.name}) was deleted already.")
        jobs = list(BatchJob.objects.filter(input_file=locked, state__in=ACTIVE_STATES)
                    .order_by("id"))
        soaks = list(Soak.objects.filter(input_file=locked, state=Soak.State.RUNNING)
                     .order_by("id"))
        if jobs or soaks:
            users = [f"{job.public_id} ({job.state})" for job in jobs[:5]]
            users += [f"soak {soak.pk} (running)" for soak in soaks[:5]]
            more = len(jobs) + len(soaks) - len(users)
            raise ConflictError(
                f"Input file file-{locked.pk} ({locked.name}) is still used by "
                f"{', '.join(users)}{f' and {more} more' if more else ''}: cancel it, or let "
                f"it finish, before deleting the file.")
        locked.deleted_at, locked.deleted_by = timezone.now(), actor.label
        locked.save(update_fields=["deleted_at", "deleted_by"])
        audit_record(actor=actor, action="batch.file_delete", target=locked,
                     before={"name": locked.name, "sha256": locked.sha256,
                             "requests": locked.requests},
                     after={"deleted": True})
        path = file_path(locked)
        # The bytes go once the row says so (a rolled-back delete keeps them).
        transaction.on_commit(lambda: path.unlink(missing_ok=True))
    return locked


# --- jobs --------------------------------------------------------------------------------------

def _option_problems(options: dict[str, Any]) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    for name, (low, high) in LIMITS.items():
        value = options[name]
        integer = name in INTEGER_OPTIONS
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                integer and not float(value).is_integer()) or not math.isfinite(value):
            kind = "a whole number" if integer else "a number"
            problems[name] = [f"Give {kind} from {low:g} to {high:g}, not {value!r}."]
        elif not low <= value <= high:
            problems[name] = [f"{value:g} is out of range: from {low:g} to {high:g}."]
    rate = options["rate_limit_rps"]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not math.isfinite(rate) or rate < 0.01):
        problems["rate_limit_rps"] = [
            f"Give requests per second of at least 0.01, or nothing for no limit; not "
            f"{rate!r}."]
    if options["drill"] not in BatchJob.Drill.values:
        problems["drill"] = [f"{options['drill']!r} is not a drill; use kill-worker, "
                             f"fault-pool or nothing."]
    return problems


def _model_problems(input_file: BatchFile, pool: Pool) -> list[str]:
    served = set(PoolModel.objects.filter(pool=pool).values_list("model_id", flat=True))
    for model, line in sorted(input_file.model_lines.items(), key=lambda item: item[1]):
        if model not in served:
            return [f"line {line}: model {model!r} is not served by pool {pool.name} (it "
                    f"serves {', '.join(sorted(served)) or 'no model'}); pick a pool that "
                    f"serves it, or change the file."]
    for url, line in sorted(input_file.url_lines.items(), key=lambda item: item[1]):
        if url not in inputs.URLS:
            return [f"line {line}: url {url!r} is not supported; use "
                    f"{', '.join(inputs.URLS)}."]
    return []


def _target_refusal(pool: Pool) -> str | None:
    """The stage rule (fleetctl/batch/targets.py): a plan's candidate below stage 3 runs no
    batch jobs. Imported plainly: a rule that failed to import must fail the call, never
    let the job through."""
    return targets.job_target_refusal(pool)


def plan_for_pool(pool: Pool) -> Plan | None:
    """The open plan the pool belongs to, the newest: as its candidate first, else as its
    primary (a job on the primary is the comparison's baseline)."""
    open_plans = Plan.objects.exclude(state__in=Plan.CLOSED_STATES).order_by("-created_at",
                                                                              "-id")
    return (open_plans.filter(candidate_pool=pool).first()
            or open_plans.filter(primary_pool=pool).first())


def job_create(*, actor: Actor, input_file: BatchFile, pool: Pool, concurrency: int = 8,
               rate_limit_rps: float | None = None, completion_window_s: int = 86400,
               chunk_size: int = DEFAULT_CHUNK_SIZE, max_attempts: int = 5,
               request_timeout_s: float = 120, drill: str = "", drill_at: float = 0.4,
               compare_sample: int = 20, soak: Soak | None = None,
               route: Route | None = None, endpoint: str = "",
               metadata: dict[str, str] | None = None) -> BatchJob:
    """Run `input_file` on `pool` (`route`, `endpoint`, `metadata`: a batch of the OpenAI
    Batch API, placed through that route; batch_create). Refused (ValidationError naming the
    field, nothing stored) for an option out of range, a model the pool does not serve (the
    first line naming it), or a pool the stage rules keep from batch work. The job is
    queued: a worker claims its first chunk."""
    actor.require(roles.JOBS, action="batch.job_create", target=pool)
    drill = drill or ""
    options: dict[str, Any] = {
        "concurrency": concurrency, "rate_limit_rps": rate_limit_rps,
        "completion_window_s": completion_window_s, "chunk_size": chunk_size,
        "max_attempts": max_attempts, "request_timeout_s": request_timeout_s,
        "drill": drill, "drill_at": drill_at, "compare_sample": compare_sample}
    problems = _option_problems(options)
    if problems:
        raise ValidationError(problems)
    for name in INTEGER_OPTIONS:
        options[name] = int(options[name])
    if options["rate_limit_rps"] is not None:
        options["rate_limit_rps"] = float(options["rate_limit_rps"])
    input_file = BatchFile.objects.get(pk=input_file.pk)
    pool = Pool.objects.get(pk=pool.pk)
    path = file_path(input_file)
    if input_file.deleted_at is not None:
        raise ValidationError({"input_file": [
            f"Input file {input_file.pk} ({input_file.name}) was deleted by "
            f"{input_file.deleted_by}; upload it again."]})
    if not path.is_file():
        raise ValidationError({"input_file": [
            f"Input file {input_file.pk} ({input_file.name}) is no longer on disk "
            f"({input_file.path} under BATCH_FILES_DIR); upload it again."]})
    model_problems = _model_problems(input_file, pool)
    if model_problems:
        raise ValidationError({"input_file": model_problems})
    refusal = _target_refusal(pool)
    if refusal:
        raise ValidationError({"pool": [refusal]})
    now = timezone.now()
    plan = plan_for_pool(pool)
    with transaction.atomic():
        job = BatchJob.objects.create(
            input_file=input_file, pool=pool, plan=plan, soak=soak, total=input_file.requests,
            route=route, endpoint=endpoint, metadata=metadata or {},
            created_by=actor.label, created_at=now,
            expires_at=now + timedelta(seconds=options["completion_window_s"]), **options)
        chunks = _create_chunks(job, path)
        job_event(job, Kind.CREATED, actor.label, at=now,
                  message=f"{actor.label} created the job: {job.total} requests of "
                          f"{input_file.name} on {pool.name} in {chunks} chunks"
                          + (f" (plan {plan.name})" if plan else "")
                          + (f", soak {soak.pk}" if soak else "")
                          + (f", through route {route.name} (OpenAI Batch API, {endpoint})"
                             if route else ""),
                  data={"chunks": chunks, **options})
        audit_record(actor=actor, action="batch.job_create", target=job,
                     after={"input_file": input_file.pk, "pool": pool.name,
                            "route": route.name if route else None,
                            "plan": plan.name if plan else None,
                            "soak": soak.pk if soak else None, "total": job.total,
                            "chunks": chunks, **options})
    return job


# --- the OpenAI Batch API ----------------------------------------------------------------------

OPENAI_ENDPOINTS = inputs.URLS
OPENAI_WINDOWS = {"24h": 86400}
METADATA_MAX = 16


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "metadata must be an object of string keys and values."
    if len(metadata) > METADATA_MAX:
        return f"metadata holds {len(metadata)} keys; at most {METADATA_MAX}."
    for key, value in metadata.items():
        if not isinstance(key, str) or not key or len(key) > 64:
            return f"metadata key {key!r} must be a string of 1 to 64 characters."
        if not isinstance(value, str) or len(value) > 512:
            return f"metadata.{key} must be a string of at most 512 characters."
    return None


def batch_create(*, actor: Actor, input_file: BatchFile, endpoint: str,
                 completion_window: str, metadata: dict[str, str] | None = None,
                 rng: Any = None) -> BatchJob:
    """A batch of the OpenAI Batch API: `input_file` run as a job on a pool of a batch-class
    route (metadata.route, or the file's model's one batch-class route; metadata.pool pins a
    pool of its split, otherwise one is drawn by the split's weights: targets.batch_placement).
    Every line must ask for `endpoint`, as OpenAI requires. Refused with a ValidationError
    keyed by the request's field (input_file_id, endpoint, completion_window, metadata);
    nothing is stored then."""
    actor.require(roles.JOBS, action="batch.job_create", target="batch.openai")
    if endpoint not in OPENAI_ENDPOINTS:
        raise ValidationError({"endpoint": [
            f"endpoint {endpoint!r} is not supported; use {', '.join(OPENAI_ENDPOINTS)}."]})
    if completion_window not in OPENAI_WINDOWS:
        raise ValidationError({"completion_window": [
            f"completion_window {completion_window!r} is not supported; use "
            f"{', '.join(OPENAI_WINDOWS)}."]})
    problem = _metadata_problem(metadata)
    if problem:
        raise ValidationError({"metadata": [problem]})
    metadata = dict(metadata or {})
    for url, line in sorted(input_file.url_lines.items(), key=lambda item: item[1]):
        if url != endpoint:
            raise ValidationError({"input_file_id": [
                f"line {line}: url {url!r} is not the batch's endpoint {endpoint!r}; every "
                f"request of a batch must ask for its endpoint."]})
    try:
        placed = targets.batch_placement(models=sorted(input_file.model_lines),
                                         route_name=metadata.get("route"),
                                         pool_name=metadata.get("pool"), rng=rng)
    except targets.PlacementError as error:
        raise ValidationError({error.param: [error.message]}) from None
    try:
        return job_create(actor=actor, input_file=input_file, pool=placed.pool,
                          completion_window_s=OPENAI_WINDOWS[completion_window],
                          route=placed.route, endpoint=endpoint, metadata=metadata)
    except ValidationError as exc:
        if hasattr(exc, "error_dict"):
            for name in ("input_file", "pool"):
                if name in exc.error_dict:
                    exc.error_dict["input_file_id"] = exc.error_dict.pop(name)
        raise


def job_submit(*, actor: Actor, name: str, stream: Any, pool: Pool,
               **options: Any) -> BatchJob:
    """Upload and create in one step (REST multipart, the CLI's `batch submit FILE`): the
    file is stored only if the job is created; a refusal of either keeps nothing (its
    ValidationError names `file` for the file's lines)."""
    actor.require(roles.JOBS, action="batch.job_create", target=pool)
    with transaction.atomic():
        batch_file = file_upload(actor=actor, name=name, stream=stream)
        try:
            return job_create(actor=actor, input_file=batch_file, pool=pool, **options)
        except BaseException as exc:
            file_path(batch_file).unlink(missing_ok=True)
            if isinstance(exc, ValidationError) and hasattr(exc, "error_dict") \
                    and "input_file" in exc.error_dict:
                exc.error_dict["file"] = exc.error_dict.pop("input_file")
            raise


def _create_chunks(job: BatchJob, path: Path) -> int:
    batch: list[BatchChunk] = []
    number = 0
    covered = 0
    for first_index, last_index, first_line, byte_start, byte_end in inputs.chunk_ranges(
            path, job.chunk_size):
        batch.append(BatchChunk(job=job, number=number, first_index=first_index,
                                last_index=last_index, first_line=first_line,
                                byte_start=byte_start, byte_end=byte_end))
        number += 1
        covered += last_index - first_index + 1
        if len(batch) >= CHUNK_INSERT_BATCH:
            BatchChunk.objects.bulk_create(batch)
            batch = []
    if batch:
        BatchChunk.objects.bulk_create(batch)
    if covered != job.total:  # the file changed on disk since it was validated
        raise ValidationError({"input_file": [
            f"The stored file holds {covered} requests, not the {job.total} it was validated "
            f"with; upload it again."]})
    return number


def job_event(job: BatchJob, kind: str, actor_label: str, *, manual: bool = False,
              message: str = "", data: dict[str, Any] | None = None,
              at: datetime | None = None) -> BatchJobEvent:
    """One entry of the job's timeline. `manual`: a person's action (a soak with one fails)."""
    return BatchJobEvent.objects.create(job_id=job.pk, kind=kind, actor=actor_label,
                                        manual=manual, message=message, data=data or {},
                                        at=at or timezone.now())


def person_reason(reason: str, say: str) -> str:
    """The reason for a person's action on a job or a soak, stripped; a blank one is refused
    with `say` (why it is asked for), one over 2,000 characters too."""
    reason = required_reason(reason, say)
    if len(reason) > 2000:
        raise ValidationError({"reason": ["At most 2,000 characters."]})
    return reason


def _need_reason(reason: str, what: str) -> str:
    return person_reason(reason, f"Say why you {what} (it goes in the job's timeline and the "
                                 f"audit log).")


def _locked(job: BatchJob) -> BatchJob:
    return BatchJob.objects.select_for_update(of=("self",)).select_related(
        "pool", "input_file").get(pk=job.pk)


def _release_chunks(job: BatchJob) -> int:
    """Chunks of an ended (or paused) job back to pending with no lease: no worker claims a
    chunk of a job that is not queued or running, and a holder's next renewal fails."""
    return BatchChunk.objects.filter(job=job, state=BatchChunk.State.RUNNING).update(
        state=BatchChunk.State.PENDING, lease_owner="", lease_until=None)


def changes_said(before: dict[str, Any], after: dict[str, Any]) -> str:
    """An edit as its timeline says it: "name old → new" for each field that changed (in
    `before`'s order), or "no change"."""
    return ", ".join(f"{name} {before[name]} → {after[name]}" for name in before
                     if before[name] != after[name]) or "no change"


def _moved_by(actor: Actor, locked: BatchJob, reason: str, *, to: str, kind: str,
              action: str, did: str, state_reason: str | None = None,
              also: tuple[str, ...] = ()) -> None:
    """A person's move of the (locked) job to state `to`, saved with the fields in `also`:
    an entry on its timeline (manual) and one in the audit log, both with the reason. The
    job keeps the reason as its state's reason unless `state_reason` says otherwise."""
    before = locked.state
    locked.state = to
    locked.state_reason = reason if state_reason is None else state_reason
    locked.save(update_fields=["state", "state_reason", *also])
    job_event(locked, kind, actor.label, manual=True,
              message=f"{actor.label} {did} the job: {reason}")
    audit_record(actor=actor, action=action, target=locked, message=reason,
                 before={"state": before}, after={"state": to})


def job_pause(*, actor: Actor, job: BatchJob, reason: str) -> BatchJob:
    """Stop handing out the job's requests: its holder stops dispatching, waits for the
    requests in flight and releases its chunk. A person's action (manual)."""
    actor.require(roles.JOBS, action="batch.job_pause", target=job)
    reason = _need_reason(reason, "pause the job")
    with transaction.atomic():
        locked = _locked(job)
        if locked.state not in (BatchJob.State.QUEUED, BatchJob.State.RUNNING):
            raise ConflictError(f"Job {locked.pk} is {locked.state}; only a queued or running "
                                f"job can be paused.")
        _moved_by(actor, locked, reason, to=BatchJob.State.PAUSED, kind=Kind.PAUSED,
                  action="batch.job_pause", did="paused")
    return locked


def job_resume(*, actor: Actor, job: BatchJob, reason: str) -> BatchJob:
    """Hand out a paused job's requests again (running if it had started, else queued)."""
    actor.require(roles.JOBS, action="batch.job_resume", target=job)
    reason = _need_reason(reason, "resume the job")
    with transaction.atomic():
        locked = _locked(job)
        if locked.state != BatchJob.State.PAUSED:
            raise ConflictError(f"Job {locked.pk} is {locked.state}; only a paused job can be "
                                f"resumed.")
        if locked.expires_at <= timezone.now():
            raise ConflictError(f"Job {locked.pk}'s completion window ended at "
                                f"{locked.expires_at:%Y-%m-%d %H:%M:%S} UTC; it will expire, "
                                f"not resume. Submit the file again.")
        refusal = _target_refusal(locked.pool)  # a plan sent back below stage 3 meanwhile
        if refusal is not None:
            raise ConflictError(f"Job {locked.pk} cannot resume: {refusal}")
        target = BatchJob.State.RUNNING if locked.started_at else BatchJob.State.QUEUED
        _moved_by(actor, locked, reason, to=target, kind=Kind.RESUMED,
                  action="batch.job_resume", did="resumed", state_reason="")
    return locked


def job_cancel(*, actor: Actor, job: BatchJob, reason: str) -> BatchJob:
    """End an active job now; the results written so far stay (partial output)."""
    actor.require(roles.JOBS, action="batch.job_cancel", target=job)
    reason = _need_reason(reason, "cancel the job")
    with transaction.atomic():
        locked = _locked(job)
        if locked.state not in ACTIVE_STATES:
            raise ConflictError(f"Job {locked.pk} is {locked.state}; only a queued, running "
                                f"or paused job can be cancelled.")
        locked.finished_at = timezone.now()
        _moved_by(actor, locked, reason, to=BatchJob.State.CANCELLED, kind=Kind.CANCELLED,
                  action="batch.job_cancel", did="cancelled", also=("finished_at",))
        _release_chunks(locked)
    return locked


def job_edit(*, actor: Actor, job: BatchJob, reason: str, concurrency: int | None = None,
             rate_limit_rps: float | None = None) -> BatchJob:
    """Change an active job's concurrency or rate limit (rate_limit_rps=0: no limit); the
    holder picks them up at its next chunk. A person's action (manual)."""
    actor.require(roles.JOBS, action="batch.job_edit", target=job)
    reason = _need_reason(reason, "edit the job")
    if concurrency is None and rate_limit_rps is None:
        raise ValidationError({"concurrency": [
            "Give concurrency or rate_limit_rps (0 for no limit) to change."]})
    problems: dict[str, list[str]] = {}
    if concurrency is not None and (isinstance(concurrency, bool)
                                    or not isinstance(concurrency, int)
                                    or not 1 <= concurrency <= 256):
        problems["concurrency"] = [f"Give a whole number from 1 to 256, not {concurrency!r}."]
    if rate_limit_rps is not None and (isinstance(rate_limit_rps, bool)
                                       or not isinstance(rate_limit_rps, int | float)
                                       or not math.isfinite(rate_limit_rps)
                                       or (rate_limit_rps != 0 and rate_limit_rps < 0.01)):
        problems["rate_limit_rps"] = [f"Give requests per second of at least 0.01 (0: no "
                                      f"limit), not {rate_limit_rps!r}."]
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        locked = _locked(job)
        if locked.state not in ACTIVE_STATES:
            raise ConflictError(f"Job {locked.pk} is {locked.state}; only a queued, running "
                                f"or paused job can be edited.")
        before = {"concurrency": locked.concurrency, "rate_limit_rps": locked.rate_limit_rps}
        if concurrency is not None:
            locked.concurrency = concurrency
        if rate_limit_rps is not None:
            locked.rate_limit_rps = float(rate_limit_rps) or None
        after = {"concurrency": locked.concurrency, "rate_limit_rps": locked.rate_limit_rps}
        locked.save(update_fields=["concurrency", "rate_limit_rps"])
        job_event(locked, Kind.EDITED, actor.label, manual=True,
                  message=f"{actor.label} edited the job ({changes_said(before, after)}): "
                          f"{reason}",
                  data={"before": before, "after": after})
        audit_record(actor=actor, action="batch.job_edit", target=locked, message=reason,
                     before=before, after=after)
    return locked


def jobs_expire(now: datetime | None = None) -> int:
    """Expire every active job whose completion window has ended (the tick calls this):
    state expired, an EXPIRED event, its chunks released. Results written so far stay
    downloadable. Returns how many jobs expired."""
    now = now or timezone.now()
    due = list(BatchJob.objects.filter(state__in=ACTIVE_STATES, expires_at__lte=now)
               .values_list("pk", flat=True))
    expired = 0
    system = Actor.for_system("batch")
    for pk in due:
        with transaction.atomic():
            job = BatchJob.objects.select_for_update(skip_locked=True).filter(
                Q(pk=pk), Q(state__in=ACTIVE_STATES), Q(expires_at__lte=now)).first()
            if job is None:  # ended meanwhile, or another tick holds it
                continue
            before = job.state
            done = job.results.count()
            job.state = BatchJob.State.EXPIRED
            job.state_reason = (f"the completion window ended at "
                                f"{job.expires_at:%Y-%m-%d %H:%M:%S} UTC with {done} of "
                                f"{job.total} requests done")
            job.finished_at = now
            job.save(update_fields=["state", "state_reason", "finished_at"])
            _release_chunks(job)
            job_event(job, Kind.EXPIRED, SYSTEM_ACTOR, at=now,
                      message=f"Expired: {job.state_reason}; the partial output stays.",
                      data={"done": done, "total": job.total})
            audit_record(actor=system, action="batch.job_expire", target=job,
                         before={"state": before}, after={"state": "expired", "done": done})
            expired += 1
    if expired:
        log.info("expired %d batch job(s)", expired)
    return expired
