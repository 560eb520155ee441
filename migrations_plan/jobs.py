"""The evidence jobs' lifecycle: one kernel for bench, conformance, shadow and eval runs.

The row every job has is fleetctl/core/jobs.py (`Job`: status, error, worker, the times, who
cancelled it); here is its plan-bound form (`PlanJob`: `plan`, `plan_stage`) and what every
kind does with it, each once:

- `resolve_plan_targets`: the plan's candidate and primary (or the pools named), the model
  and the endpoints, with one set of refusals, each filed under the field the caller named.
- `take`: queued → running for one worker, by one conditional UPDATE (one taker wins); with
  `resume_after_s`, a running run whose heartbeat stopped is taken over too.
- `heartbeat`: the driver's beat; False once the run is no longer its own (cancelled, taken
  over, reaped), which is when the driver stops.
- `cancel`: queued or running → cancelled, by a person with the `jobs` permission.
- `fail`: an active run → failed, with why.
- `finish`: running → complete (or a kind's own end, e.g. bench `partial`), once, in one
  transaction with the evidence it records (the kind's hook) and its audit event.
- `reap`: beat's sweep of runs no worker drives, with each kind's policy written where the
  kind calls it: FAIL (bench, conformance: a run whose worker died is failed, keeping what it
  measured; it records no evidence) or RESUME (evals: enqueued again, and the next worker
  takes it over from its rows). Shadow runs are not reaped: a mirror run has no worker to die
  (the gateways copy, the collector samples, and beat's judge is its pulse), and a replay
  that stops keeps its run running until a person stops it (as it always did).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError
from fleetctl.core.jobs import ACTIVE, Job, JobStatus
from fleetctl.fleet.models import Pool, PoolModel
from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.jobs")
J = TypeVar("J", bound=Job)


class PlanJob(Job):
    """A job that may record evidence for a plan: the plan, and its stage when the run was
    created."""

    plan = models.ForeignKey(Plan, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="%(app_label)s_runs")
    plan_stage = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The plan's stage when the run was created.")

    class Meta(Job.Meta):
        abstract = True


# --- targets ----------------------------------------------------------------------------------

CANDIDATE, PRIMARY, OTHER = "candidate", "primary", "other"


@dataclass(frozen=True)
class Target:
    """A pool a run sends to, in its role, under the name the caller gave it (`field`)."""

    field: str
    pool: Pool
    role: str


@dataclass(frozen=True)
class Targets:
    """What a run is about: the pools in their roles (candidate first), and the model."""

    plan: Plan | None
    model_id: str
    targets: tuple[Target, ...]

    @property
    def candidate(self) -> Pool:
        return self.targets[0].pool

    @property
    def primary(self) -> Pool | None:
        return next((t.pool for t in self.targets if t.role == PRIMARY), None)


def endpoints_of(pool: Pool) -> list[str]:
    """The pool's base URLs worth sending to (blank ones left out)."""
    return [u.strip() for u in (pool.base_urls or []) if isinstance(u, str) and u.strip()]


def models_served(pool: Pool) -> set[str]:
    return set(PoolModel.objects.filter(pool=pool).values_list("model_id", flat=True))


def plan_models(plan: Plan | None) -> list[str]:
    """The models the plan's routes carry, sorted."""
    return sorted({r.model_id for r in plan.routes.all()}) if plan is not None else []


def _refuse(field: str, message: str) -> ValidationError:
    return ValidationError({field: [message]})


def require_open(plan: Plan, noun: str, *, optional: bool = True) -> None:
    """Evidence jobs feed open plans: a closed one (abandoned, completed) is a 409."""
    if not plan.is_open:
        raise ConflictError(f"Plan {plan.name} is {plan.state}: {noun} are for open plans"
                            + ("; leave the plan out." if optional else "."))


def _plan_pools(plan: Plan, candidate: Pool | None, primary: Pool | None,
                fields: dict[str, str]) -> tuple[Pool, Pool]:
    """The plan's pools; one named besides must be the plan's own."""
    if candidate is not None and candidate.pk != plan.candidate_pool_id:
        raise _refuse(fields[CANDIDATE], (
            f"Plan {plan.name} migrates to {plan.candidate_pool.name}, not {candidate.name}: "
            f"name {plan.candidate_pool.name}, or leave the plan out."))
    if primary is not None and primary.pk != plan.primary_pool_id:
        raise _refuse(fields[PRIMARY], (
            f"Plan {plan.name}'s primary is {plan.primary_pool.name}; leave primary out to "
            f"compare with it, or leave the plan out to compare with {primary.name}."))
    return candidate or plan.candidate_pool, primary or plan.primary_pool


def _choose_model(plan: Plan | None, targets: Sequence[Target],
                  served: dict[int, set[str]]) -> str:
    """No model named: the one every pool serves (the plan's routes' first when several
    are); failing that, the candidate's only one (a pool lacking it is refused by name)."""
    candidate = targets[0].pool
    mine = served[candidate.pk]
    if not mine:
        raise _refuse("model", f"{candidate.name} serves no model yet; add one to the pool "
                               f"first.")
    common = set.intersection(*(served[t.pool.pk] for t in targets))
    in_plan = plan_models(plan)
    for pool_set in (common, mine):
        choices = [m for m in in_plan if m in pool_set] or sorted(pool_set)
        if len(choices) == 1:
            return choices[0]
    if not common:
        raise _refuse("model", f"No model is served by all of "
                               f"{', '.join(t.pool.name for t in targets)}; name the model "
                               f"and pools that serve it.")
    listed = ", ".join(sorted(common))
    raise _refuse("model", f"The pools serve {listed} in common: name the model."
                  if len(targets) > 1 else f"{candidate.name} serves {listed}: name the model.")


def resolve_plan_targets(plan: Plan | None, *, noun: str, candidate: Pool | None = None,
                         primary: Pool | None = None, others: Sequence[Pool] = (),
                         model_id: str = "", fields: dict[str, str] | None = None
                         ) -> Targets:
    """The pools a run sends to and the model it asks for, or the refusal that says why not
    (a ValidationError under the field the caller named the pool by, `fields`: role → field;
    a closed plan is a ConflictError). With a plan, the candidate and the primary are the
    plan's (a pool named besides must be the plan's own). Every pool once, each with an
    endpoint, each serving the model; no model named: `_choose_model`."""
    names = {CANDIDATE: CANDIDATE, PRIMARY: PRIMARY, OTHER: "others", **(fields or {})}
    if plan is not None:
        require_open(plan, noun)
        candidate, primary = _plan_pools(plan, candidate, primary, names)
    if candidate is None:
        raise _refuse(names[CANDIDATE], "Name the candidate pool, or a plan (its candidate "
                                        "is used).")
    targets = [Target(names[CANDIDATE], candidate, CANDIDATE)]
    if primary is not None:
        targets.append(Target(names[PRIMARY], primary, PRIMARY))
    targets += [Target(names[OTHER], pool, OTHER) for pool in others]
    seen: dict[int, str] = {}
    for target in targets:
        pool = target.pool
        if pool.pk in seen:
            raise _refuse(target.field, (
                f"Pool {pool.name} is named twice (as {seen[pool.pk]} and {target.field}): "
                f"each pool takes one part in a run; name another pool."))
        seen[pool.pk] = target.field
        if not endpoints_of(pool):
            raise _refuse(target.field, f"Pool {pool.name} has no endpoints (base URLs) to "
                                        f"send to; add one to the pool first.")
    served = {t.pool.pk: models_served(t.pool) for t in targets}
    model_id = model_id or _choose_model(plan, targets, served)
    for target in targets:
        if model_id not in served[target.pool.pk]:
            raise _refuse(target.field, (
                f"Pool {target.pool.name} does not serve {model_id} (it serves "
                f"{', '.join(sorted(served[target.pool.pk])) or 'no model'}); pick a pool "
                f"that does, or another model."))
    return Targets(plan=plan, model_id=model_id, targets=tuple(targets))


# --- driving ----------------------------------------------------------------------------------

def _quiet(stale_at: Any) -> Q:
    """No heartbeat since `stale_at` (or never)."""
    return Q(heartbeat_at__lt=stale_at) | Q(heartbeat_at__isnull=True)


def take(model: type[J], run_id: int, *, worker: str, resume_after_s: float | None = None,
         **on_resume: Any) -> bool:
    """Queued → running for `worker`. With `resume_after_s`, a running run whose heartbeat is
    older than that (its worker died) is taken over: `worker` set, `on_resume` updated
    (e.g. a takeover count). Conditional UPDATEs: of two takers one wins, the other gets
    False."""
    now = timezone.now()
    if model._default_manager.filter(pk=run_id, status=JobStatus.QUEUED).update(
            status=JobStatus.RUNNING, worker=worker, started_at=now, heartbeat_at=now):
        return True
    if resume_after_s is None:
        return False
    stale = _quiet(now - timedelta(seconds=resume_after_s))
    previous = (model._default_manager.filter(stale, pk=run_id, status=JobStatus.RUNNING)
                .values("worker", "heartbeat_at").first())
    if previous is None:
        return False
    took = model._default_manager.filter(
        stale, pk=run_id, status=JobStatus.RUNNING, worker=previous["worker"]).update(
        worker=worker, heartbeat_at=now, **on_resume) == 1
    if took:
        log.warning("%s %s: taken over from worker %s (no heartbeat since %s)",
                    model._meta.verbose_name, run_id, previous["worker"] or "-",
                    previous["heartbeat_at"])
    return took


def heartbeat(run: Job, doing: str | None = None, *, worker: str | None = None) -> bool:
    """The driver's beat: True while the run is running (for `worker`, when given); False
    once it is not (cancelled, taken over, reaped, finished) and the driver should stop.
    `doing` is kept where the kind shows it (a `progress` column: bench)."""
    changes: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if doing is not None and any(f.name == "progress" for f in type(run)._meta.fields):
        changes["progress"] = {"doing": doing}
    rows = type(run)._default_manager.filter(pk=run.pk, status=JobStatus.RUNNING)
    if worker is not None:
        rows = rows.filter(worker=worker)
    return rows.update(**changes) == 1


# --- ending -----------------------------------------------------------------------------------

def cancel(actor: Actor, run: J, *, action: str, noun: str,
           after: Callable[[J], dict[str, Any]] | None = None) -> J:
    """Queued or running → cancelled, once: the driver sees it at its next heartbeat and
    stops; what it measured is kept and no evidence is recorded. `noun` names the run in
    the refusal ("Eval run"), `after` adds to the audit event."""
    actor.require(roles.JOBS, action=action, target=run)
    model = type(run)
    with transaction.atomic():
        changed = model._default_manager.filter(pk=run.pk, status__in=ACTIVE).update(
            status=JobStatus.CANCELLED, finished_at=timezone.now(),
            cancelled_by=actor.label, error=f"cancelled by {actor.label}")
        fresh = model._default_manager.get(pk=run.pk)
        if not changed:
            raise ConflictError(f"{noun} {fresh.pk} is {fresh.status}; only a queued or "
                                f"running run can be cancelled.")
        audit_record(actor=actor, action=action, target=fresh,
                     before={"status": run.status},
                     after={"status": fresh.status, **(after(fresh) if after else {})})
    return fresh


def fail(run: Job, error: str, *, worker: str | None = None, **changes: Any) -> bool:
    """An active run (driven by `worker`, when given) → failed, saying why. False when it
    had ended already (cancelled meanwhile, finished by another)."""
    rows = type(run)._default_manager.filter(pk=run.pk, status__in=ACTIVE)
    if worker is not None:
        rows = rows.filter(worker=worker)
    return rows.update(status=JobStatus.FAILED, finished_at=timezone.now(),
                       error=error[:2000], **changes) == 1


def finish(run: J, *, actor: Actor, action: str, status: str = JobStatus.COMPLETE,
           fields: dict[str, Any] | None = None,
           evidence: Callable[[J], dict[str, Any]] | None = None, message: str = "",
           after: dict[str, Any] | None = None) -> J:
    """Running → `status` with `fields`, once, in one transaction with its evidence and its
    audit event. `evidence(locked)` records what the run found (and the ids on the row) and
    returns what the audit event says of it. A run no longer running (cancelled meanwhile,
    finished by another worker) is returned as it is, and records nothing."""
    model = type(run)
    with transaction.atomic():
        now = timezone.now()
        if not model._default_manager.filter(pk=run.pk, status=JobStatus.RUNNING).update(
                status=status, finished_at=now, heartbeat_at=now, **(fields or {})):
            return model._default_manager.get(pk=run.pk)
        locked = model._default_manager.select_for_update().get(pk=run.pk)
        recorded = evidence(locked) if evidence is not None else {}
        audit_record(actor=actor, action=action, target=locked, message=message[:2000],
                     after={"status": status, **(after or {}), **recorded})
    return locked


# --- reaping ----------------------------------------------------------------------------------

class Reap(enum.Enum):
    """What beat does with a run no worker drives."""

    FAIL = "fail"  # failed, keeping what it measured (bench, conformance)
    RESUME = "resume"  # enqueued again: the next worker takes it over (evals)


def reap(model: type[J], *, policy: Reap, stale_after_s: float, queued_after_s: float,
         queue: str = "", kept: str = "", on_failed: Callable[[J], object] | None = None,
         resume: Callable[[int], object] | None = None) -> int:
    """Runs whose heartbeat is older than `stale_after_s` (their worker died), and queued
    runs no worker took within `queued_after_s`. FAIL: each is failed, saying so (`kept`:
    what stays of it; `queue`: whose workers to look at) and `on_failed(run)` tidies what it
    left; RESUME: each is handed to `resume(run_id)` (queued ones at most once per stale
    period: their heartbeat marks when). Returns how many."""
    now = timezone.now()
    if policy is Reap.RESUME:
        assert resume is not None
        quiet = _quiet(now - timedelta(seconds=stale_after_s))
        ids = list(model._default_manager.filter(
            (Q(status=JobStatus.RUNNING) & quiet)
            | (Q(status=JobStatus.QUEUED, worker="",
                 created_at__lt=now - timedelta(seconds=queued_after_s)) & quiet)
        ).values_list("pk", flat=True))
        for run_id in ids:
            # A running one's heartbeat is left alone: it is what a taker checks.
            model._default_manager.filter(pk=run_id, status=JobStatus.QUEUED).update(
                heartbeat_at=now)
            log.warning("%s %s: no worker drives it; enqueued again",
                        model._meta.verbose_name, run_id)
            resume(run_id)
        return len(ids)
    count = 0
    cutoff = now - timedelta(seconds=stale_after_s)
    stale = model._default_manager.filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff),
        status=JobStatus.RUNNING)
    for run in stale:
        since = (f"since {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC" if run.heartbeat_at
                 else "at all")
        if fail(run, f"the worker running it stopped (no heartbeat {since}); {kept}"):
            count += 1
            if on_failed is not None:
                on_failed(run)
    count += model._default_manager.filter(
        status=JobStatus.QUEUED,
        created_at__lt=now - timedelta(seconds=queued_after_s)).update(
        status=JobStatus.FAILED, finished_at=now,
        error=f"no worker started it within {queued_after_s / 60:g} minutes: is a Celery "
              f"worker consuming the {queue} queue?")
    return count
