"""Writes for ramps: a person starts, pauses, resumes, skips or aborts one; the controller
(`ramps_tick`, beat every RAMP_TICK_INTERVAL_S) drives each running ramp one step at a time.

The controller keeps no state of its own: a tick claims a ramp with a conditional UPDATE of
its lease (free or expired), does one step of the state machine from the ramp's rows, and
releases it. A worker killed mid-tick leaves a lease that expires after RAMP_LEASE_S, and the
next tick takes over. Splits change only through traffic's own services (`revision_create`,
`drain_request` + `push.drain_push_now`), so every rule of a split (residency, health,
live-weight guards, the stale-revision check) holds for a ramp exactly as for a person, and
a ramp never fights a manual change: another revision on the route pauses it.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, DomainError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.ramps import guard
from fleetctl.ramps.evidence import KIND as EVIDENCE_KIND
from fleetctl.ramps.models import ACTIVE_STATES, Ramp, RampEvent
from fleetctl.traffic import policy
from fleetctl.traffic import selectors as traffic_selectors
from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.models import Drain, Route, SplitRevision
from fleetctl.traffic.split import as_percentages
from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.ramps")

MAX_STEPS = 20
THRESHOLD_FIELDS = ("slo_ttft_p95_ms", "slo_tpot_p95_ms", "slo_error_rate",
                    "latency_margin_pct")
# Without a plan, how much slower than the primary the candidate may be: a plan's default.
DEFAULT_LATENCY_MARGIN_PCT = 10.0
Kind = RampEvent.Kind
# Kinds that tell the people subscribed to "ramp.decision" something happened.
NOTIFIED = {Kind.STEP, Kind.PASS, Kind.WARN, Kind.FAIL, Kind.ROLLBACK, Kind.PAUSE,
            Kind.RESUME, Kind.ABORT, Kind.COMPLETE, Kind.MANUAL_CHANGE}


# --- a person's actions ------------------------------------------------------------------------

def ramp_create(*, actor: Actor, route: Route, pool: Pool, steps: list[dict[str, Any]],
                plan: Plan | None = None, min_samples: int = 50, window_s: int = 30,
                failure_threshold: int = 2, slo_ttft_p95_ms: float | None = None,
                slo_tpot_p95_ms: float | None = None, slo_error_rate: float | None = None,
                latency_margin_pct: float | None = None, reason: str = "") -> Ramp:
    """Start a guarded ramp of `pool` on `route`. Everything is checked before anything is
    stored; the first step is set by the controller's first tick, queued after the commit."""
    actor.require(roles.RAMP, action="ramp.create", target=route)
    problems: dict[str, list[str]] = {}
    clean_steps = _steps_problems(steps, window_s, problems)
    _settings_problems(min_samples, window_s, failure_threshold, problems)
    if problems:
        raise ValidationError(problems)
    route = Route.objects.select_related("primary_pool").get(pk=route.pk)
    pool = Pool.objects.select_related("region").get(pk=pool.pk)
    _pool_problems(route, pool, problems)
    if problems:
        raise ValidationError(problems)
    plan = _plan_for(route, pool, plan)
    given = {"slo_ttft_p95_ms": slo_ttft_p95_ms, "slo_tpot_p95_ms": slo_tpot_p95_ms,
             "slo_error_rate": slo_error_rate, "latency_margin_pct": latency_margin_pct}
    thresholds = _thresholds(given, plan)
    with transaction.atomic():
        locked = Route.objects.select_for_update().get(pk=route.pk)
        active = Ramp.objects.filter(route=locked, state__in=ACTIVE_STATES).first()
        if active is not None:
            raise ConflictError(
                f"Route {locked.name} already has an active ramp: ramp {active.pk} of "
                f"{active.pool.name} ({active.state}). Abort or finish it first "
                f"(/ramps/{active.pk}/).", fields={"active_ramp": [str(active.pk)]})
        current = traffic_selectors.revision_current(route=locked)
        base = dict(current.weights) if current else {}
        held = base.get(pool.name, 0)
        first_bp = _bp(clean_steps[0]["percent"])
        if first_bp < held:
            raise ValidationError({"steps": [
                f"{pool.name} already carries {held / 100:g} % of {locked.name}; the first "
                f"step ({clean_steps[0]['percent']:g} %) would lower it. A ramp only raises "
                f"weight: start at {held / 100:g} % or above, or drain it instead."]})
        ramp = Ramp(route=locked, pool=pool, plan=plan, steps=clean_steps,
                    min_samples=min_samples, window_s=window_s,
                    failure_threshold=failure_threshold, base_weights=base,
                    revision_number=locked.revision_number, created_by=actor.label,
                    state=Ramp.State.RUNNING, step_index=-1, **thresholds)
        try:
            with transaction.atomic():
                ramp.save()
        except IntegrityError:  # the database's own one-active-ramp constraint
            raise ConflictError(f"Route {locked.name} already has an active ramp.") from None
        _event(ramp, Kind.START, actor=actor,
               message=f"{actor.label} started a ramp of {pool.name} on {locked.name}: "
                       f"{_steps_text(clean_steps)}" + (f" ({reason})" if reason else "")
                       + (f"; plan {plan.name}" if plan else ""),
               numbers={"steps": clean_steps, "thresholds": thresholds,
                        "base_weights": as_percentages(base)},
               revision_number=locked.revision_number)
        audit_record(actor=actor, action="ramp.create", target=ramp, message=reason,
                     after={"route": locked.name, "pool": pool.name, "steps": clean_steps,
                            "plan": plan.name if plan else None, **thresholds,
                            "min_samples": min_samples, "window_s": window_s,
                            "failure_threshold": failure_threshold})
        _queue_run(ramp.pk)
    return ramp


@contextmanager
def _person_action(actor: Actor, ramp: Ramp, *, action: str, reason: str, what: str,
                   states: tuple[str, ...], refusal: str,
                   role: str = roles.RAMP) -> Iterator[Ramp]:
    """What a person's action on a ramp (pause, resume, skip, abort) starts with: the
    permission, a reason, then, in one transaction, the ramp locked and in one of `states`,
    else a conflict saying why (`refusal`) and nothing changes. Yields the locked ramp; the
    caller's changes, event and audit row commit with it."""
    actor.require(role, action=action, target=ramp)
    _need_reason(reason, what)
    with transaction.atomic():
        locked = _locked(ramp)
        if locked.state not in states:
            raise ConflictError(f"Ramp {locked.pk} is {locked.state}; {refusal}")
        yield locked


def ramp_pause(*, actor: Actor, ramp: Ramp, reason: str) -> Ramp:
    with _person_action(actor, ramp, action="ramp.pause", reason=reason, what="pause",
                        states=(Ramp.State.RUNNING,),
                        refusal="only a running ramp can be paused.") as locked:
        _set_state(locked, Ramp.State.PAUSED, reason)
        _event(locked, Kind.PAUSE, actor=actor, message=f"{actor.label} paused: {reason}")
        audit_record(actor=actor, action="ramp.pause", target=locked, message=reason,
                     before={"state": "running"}, after={"state": "paused"})
    return locked


def ramp_resume(*, actor: Actor, ramp: Ramp, reason: str) -> Ramp:
    """Resume a paused ramp: it adopts the route's current revision (whatever changed it),
    its next tick sets the current step's split again and restarts that step's hold."""
    with _person_action(actor, ramp, action="ramp.resume", reason=reason, what="resume",
                        states=(Ramp.State.PAUSED,),
                        refusal="only a paused ramp can be resumed.") as locked:
        route = Route.objects.get(pk=locked.route_id)
        before = locked.revision_number
        locked.revision_number = route.revision_number
        locked.consecutive_failures = 0
        # No step start: the next tick sets the current step's split again, and its hold
        # starts anew.
        locked.step_started_at = None
        locked.state = Ramp.State.RUNNING
        locked.state_reason = ""
        locked.next_check_at = timezone.now()
        locked.save(update_fields=["revision_number", "consecutive_failures",
                                   "step_started_at", "state", "state_reason",
                                   "next_check_at"])
        _event(locked, Kind.RESUME, actor=actor,
               message=f"{actor.label} resumed at revision {route.revision_number}: {reason}",
               revision_number=route.revision_number)
        audit_record(actor=actor, action="ramp.resume", target=locked, message=reason,
                     before={"state": "paused", "revision": before},
                     after={"state": "running", "revision": route.revision_number})
        _queue_run(locked.pk)
    return locked


def ramp_skip(*, actor: Actor, ramp: Ramp, reason: str) -> Ramp:
    """End the current hold now: the next tick steps up without judging it."""
    with _person_action(actor, ramp, action="ramp.skip", reason=reason, what="skip the hold",
                        states=(Ramp.State.RUNNING,),
                        refusal="only a running ramp's hold can be skipped (resume it "
                                "first).") as locked:
        if locked.current_step is None:
            raise ConflictError(f"Ramp {locked.pk} has not set its first step yet; nothing "
                                f"to skip.")
        _event(locked, Kind.SKIP, actor=actor,
               message=f"{actor.label} skipped the hold at "
                       f"{locked.current_step['percent']:g} %: {reason}")
        Ramp.objects.filter(pk=locked.pk).update(next_check_at=timezone.now())
        audit_record(actor=actor, action="ramp.skip", target=locked, message=reason,
                     after={"step": locked.step_index})
        _queue_run(locked.pk)
    return locked


def ramp_abort(*, actor: Actor, ramp: Ramp, reason: str) -> Ramp:
    """Stop the ramp and drain its pool off the route (the drain's own record times it)."""
    from fleetctl.traffic import push

    with _person_action(actor, ramp, action="ramp.abort", reason=reason, what="abort",
                        states=ACTIVE_STATES, refusal="it is not active.",
                        role=roles.DRAIN) as locked:
        # Ended before its drain is asked for, so the drain finds no active ramp of the pool
        # to end (drain_request ends those: ramps_end_for_drain).
        _set_state(locked, Ramp.State.ABORTED, reason)
        drain = _drain(locked, actor=actor, reason=f"ramp {locked.pk} aborted: {reason}")
        _finish(locked, Ramp.State.ABORTED, reason, drain=drain)
        _event(locked, Kind.ABORT, actor=actor, drain=drain,
               message=f"{actor.label} aborted: {reason}" + (
                   f"; drain {drain.pk} moves {locked.pool.name}'s share back" if drain else
                   f"; {locked.pool.name} had no weight on the route, nothing to drain"))
        audit_record(actor=actor, action="ramp.abort", target=locked, message=reason,
                     after={"state": "aborted", "drain": drain.pk if drain else None})
    if drain is not None:
        push.drain_push_now(drain)
    return locked


# --- a drain of a ramp's pool (traffic/holds.py) ------------------------------------------------

def ramps_lock_for_drain(*, pool: Pool | None, route: Route | None,
                         routes: list[Route] | None) -> None:
    """Lock the active ramps a drain of `pool` (or of `route`) could end, before the drain
    locks their routes: the order a ramp's own step takes (its row, then its route's)."""
    ramps = Ramp.objects.select_for_update(of=("self",)).filter(state__in=ACTIVE_STATES)
    if pool is not None:
        ramps = ramps.filter(pool=pool)
    if route is not None:
        ramps = ramps.filter(route=route)
    if routes is not None:
        ramps = ramps.filter(route__in=[r.pk for r in routes])
    list(ramps.order_by("pk").values_list("pk", flat=True))


def ramps_end_for_drain(*, actor: Actor, drain: Drain, removed: dict[int, set[str]]
                        ) -> list[Ramp]:
    """A drain that took a ramp's pool off its route ends the ramp ("aborted by drain N"),
    in the drain's transaction: the on-call pulled the pool's traffic, and a ramp that
    resumed (or a restore that gave its share back) would put it there again with nobody
    deciding so. Its guard stops; nothing more is drained (the drain is the rollback). To
    give the pool weight again, start a new ramp: it begins at its first step, under the
    guard (as Argo Rollouts restarts an aborted rollout from its first step)."""
    ended = []
    candidates = (Ramp.objects.select_for_update(of=("self",)).select_related("route", "pool")
                  .filter(state__in=ACTIVE_STATES, route_id__in=list(removed)).order_by("pk"))
    for ramp in candidates:
        if ramp.pool.name not in removed[ramp.route_id]:
            continue
        was = ramp.state
        why = f"aborted by drain {drain.pk} ({actor.label}): {drain.reason}"
        _finish(ramp, Ramp.State.ABORTED, why, drain=drain)
        _event(ramp, Kind.ABORT, actor=actor, drain=drain,
               message=f"Aborted by drain {drain.pk}, which {actor.label} requested "
                       f"({drain.reason}): it took {ramp.pool.name} off {ramp.route.name}. "
                       f"The guard stops. A restore of that drain does not give "
                       f"{ramp.pool.name} this ramp's share back; start a new ramp for that.")
        audit_record(actor=actor, action="ramp.abort", target=ramp, message=why,
                     before={"state": was}, after={"state": Ramp.State.ABORTED,
                                                   "drain": drain.pk})
        ended.append(ramp)
    return ended


# --- the controller ----------------------------------------------------------------------------

def ramps_tick(*, now: datetime | None = None, owner: str | None = None,
               only: int | None = None) -> int:
    """Drive every due running ramp (or only `only`, due or not) one step; returns how many
    this call drove. Never raises for one ramp's trouble: it is logged and recorded as an
    ERROR event, and the next tick tries again."""
    now = now or timezone.now()
    owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    due = Ramp.objects.filter(free, state=Ramp.State.RUNNING)
    due = due.filter(pk=only) if only is not None else due.filter(next_check_at__lte=now)
    driven = 0
    for pk in list(due.order_by("next_check_at").values_list("pk", flat=True)):
        lease = now + timedelta(seconds=settings.RAMP_LEASE_S)
        if not Ramp.objects.filter(free, pk=pk, state=Ramp.State.RUNNING).update(
                lease_owner=owner, lease_until=lease):
            continue  # another controller holds it
        driven += 1
        try:
            _drive(Ramp.objects.select_related("route__primary_pool", "pool", "plan")
                   .get(pk=pk), now=now, owner=owner)
        except Exception as exc:  # one ramp's trouble must not stop the others
            log.exception("ramp %s: tick failed", pk)
            record_error(pk, exc)
        finally:
            Ramp.objects.filter(pk=pk, lease_owner=owner).update(
                lease_owner="", lease_until=None,
                next_check_at=now + timedelta(seconds=settings.RAMP_TICK_INTERVAL_S / 2))
    return driven


def _drive(ramp: Ramp, *, now: datetime, owner: str) -> None:
    route = Route.objects.select_related("primary_pool").get(pk=ramp.route_id)
    if route.revision_number != ramp.revision_number:
        _manual_change(ramp, route)
        return
    if ramp.step_started_at is None:  # just created, or resumed
        _step(ramp, route, max(ramp.step_index, 0), now=now)
        return
    if _skipped(ramp):
        _next(ramp, route, now=now, skipped=True)
        return
    step = ramp.steps[ramp.step_index]
    since = max(ramp.step_started_at, now - timedelta(seconds=ramp.window_s))
    judgement = _judge(ramp, route, since=since, now=now)
    if judgement.decision == guard.FAIL:
        failures = ramp.consecutive_failures + 1
        Ramp.objects.filter(pk=ramp.pk).update(consecutive_failures=failures)
        ramp.consecutive_failures = failures
        message = (f"Check failed ({failures} of {ramp.failure_threshold} in a row): "
                   + " ".join(judgement.reasons))
        if failures >= ramp.failure_threshold:
            _rollback(ramp, judgement, message)
            return
        _event(ramp, Kind.FAIL, message=message, numbers=judgement.numbers)
        return  # a hold whose latest window fails is not judged whole, let alone passed
    if ramp.consecutive_failures and judgement.decision != guard.WAIT:  # a wait knows nothing
        Ramp.objects.filter(pk=ramp.pk).update(consecutive_failures=0)
        ramp.consecutive_failures = 0
    if now < ramp.step_started_at + timedelta(seconds=float(step["hold_s"])):
        _note(ramp, judgement)
        return
    # The hold is over: judge all of it (that judgement is the one recorded).
    whole = _judge(ramp, route, since=ramp.step_started_at, now=now)
    if whole.decision == guard.WAIT:
        _note(ramp, whole)
    elif whole.decision == guard.FAIL:
        _rollback(ramp, whole, "The hold failed: " + " ".join(whole.reasons))
    elif whole.decision == guard.WARN:
        with transaction.atomic():
            if not _still_running(ramp):
                return
            evidence = _evidence(ramp, whole)
            _set_state(ramp, Ramp.State.PAUSED, "warn: " + " ".join(whole.reasons))
            _event(ramp, Kind.WARN, message="The hold warned, so a person decides (resume, "
                                            "skip or abort): " + " ".join(whole.reasons),
                   numbers=whole.numbers, evidence_id=evidence)
    else:
        with transaction.atomic():
            if not _still_running(ramp):
                return
            evidence = _evidence(ramp, whole)
            _event(ramp, Kind.PASS, message=f"Hold at {step['percent']:g} % passed: "
                                            + " ".join(whole.reasons),
                   numbers=whole.numbers, evidence_id=evidence)
        _next(ramp, route, now=now, skipped=False)


def _next(ramp: Ramp, route: Route, *, now: datetime, skipped: bool) -> None:
    if ramp.step_index + 1 >= len(ramp.steps):
        with transaction.atomic():
            if not _still_running(ramp):
                return
            _finish(ramp, Ramp.State.COMPLETE, "every step held")
            _event(ramp, Kind.COMPLETE,
                   message=f"Complete: {ramp.pool.name} carries "
                           f"{ramp.steps[-1]['percent']:g} % of {route.name}"
                           + (" (last hold skipped)" if skipped else "") + ".")
        return
    _step(ramp, route, ramp.step_index + 1, now=now)


def _step(ramp: Ramp, route: Route, index: int, *, now: datetime) -> None:
    """Set step `index`'s split through traffic's own service. A refusal (the pool turned
    unhealthy, a plan's guard, a change that raced this one) pauses the ramp with the reason."""
    step = ramp.steps[index]
    weights = split_for(ramp.base_weights, candidate=ramp.pool.name,
                        primary=route.primary_pool.name, percent=float(step["percent"]))
    system = Actor.for_system(f"ramp-{ramp.pk}")
    from fleetctl.traffic.services import revision_create

    label = f"ramp {ramp.pk}: step {index + 1}/{len(ramp.steps)} → {step['percent']:g} %"
    try:
        with transaction.atomic():
            # The ramp's row before the route's, as a person's abort takes them: a pause or
            # abort that got in first is seen, and the two never deadlock.
            if not _still_running(ramp):
                return
            revision = revision_create(actor=system, route=route,
                                       weights=as_percentages(weights),
                                       base_revision=ramp.revision_number, reason=label)
            Ramp.objects.filter(pk=ramp.pk).update(
                step_index=index, step_started_at=now, revision_number=revision.number,
                consecutive_failures=0)
            ramp.step_index, ramp.step_started_at = index, now
            ramp.revision_number, ramp.consecutive_failures = revision.number, 0
            _event(ramp, Kind.STEP, actor=system,
                   message=f"Step {index + 1} of {len(ramp.steps)}: {ramp.pool.name} to "
                           f"{step['percent']:g} % for {float(step['hold_s']):g} s "
                           f"(revision {revision.number}).",
                   numbers={"weights": as_percentages(weights), "hold_s": step["hold_s"]},
                   revision_number=revision.number)
    except (ValidationError, DomainError) as exc:
        why = _error_text(exc)
        with transaction.atomic():
            if not _still_running(ramp):
                return
            _set_state(ramp, Ramp.State.PAUSED, f"step {index + 1} refused: {why}")
            _event(ramp, Kind.PAUSE, actor=system,
                   message=f"Paused: the split for step {index + 1} ({step['percent']:g} %) "
                           f"was refused: {why}")


def _manual_change(ramp: Ramp, route: Route) -> None:
    revision = SplitRevision.objects.filter(route=route, number=route.revision_number).first()
    who = revision.created_by if revision else "unknown"
    split = ", ".join(f"{p} {w:g} %" for p, w in
                      as_percentages(revision.weights if revision else {}).items())
    message = (f"Paused: revision {route.revision_number} of {route.name} by {who} "
               f"({split}) changed the split this ramp set (revision {ramp.revision_number}). "
               f"A ramp never fights a manual change: resume to carry on from there.")
    with transaction.atomic():
        if not _still_running(ramp):
            return
        _set_state(ramp, Ramp.State.PAUSED, message)
        _event(ramp, Kind.MANUAL_CHANGE, message=message,
               numbers={"revision": route.revision_number, "author": who,
                        "weights": as_percentages(revision.weights if revision else {})},
               revision_number=route.revision_number)


def _rollback(ramp: Ramp, judgement: guard.Judgement, message: str) -> None:
    from fleetctl.traffic import push

    system = Actor.for_system(f"ramp-{ramp.pk}")
    with transaction.atomic():
        if not _still_running(ramp):
            return
        evidence = _evidence(ramp, judgement, decision=guard.FAIL)
        _event(ramp, Kind.FAIL, actor=system, message=message, numbers=judgement.numbers,
               evidence_id=evidence)
        _set_state(ramp, Ramp.State.ROLLED_BACK, message)  # before its drain, as an abort
        drain = _drain(ramp, actor=system,
                       reason=f"ramp {ramp.pk} rolled back by the guard at "
                              f"{ramp.steps[ramp.step_index]['percent']:g} %")
        _finish(ramp, Ramp.State.ROLLED_BACK, message, drain=drain)
        _event(ramp, Kind.ROLLBACK, actor=system, drain=drain, numbers=judgement.numbers,
               message="Rolled back: " + (f"drain {drain.pk} moves {ramp.pool.name}'s share "
                                           f"back." if drain else
                                           f"{ramp.pool.name} had no weight left to drain."))
    if drain is not None:
        push.drain_push_now(drain)


def _still_running(ramp: Ramp) -> bool:
    """Lock the ramp's row (inside the caller's transaction) and say whether it still runs."""
    return Ramp.objects.select_for_update().filter(pk=ramp.pk,
                                                   state=Ramp.State.RUNNING).exists()


def _drain(ramp: Ramp, *, actor: Actor, reason: str) -> Drain | None:
    from fleetctl.traffic.services import drain_request

    try:
        with transaction.atomic():
            return drain_request(actor=actor, pool=ramp.pool, routes=[ramp.route],
                                 reason=reason)
    except ConflictError:  # nothing to drain: the pool has no weight on the route
        return None


def step_data_start(step_started_at: datetime) -> datetime:
    """Where a step's own telemetry starts: the first window boundary at or after the step
    was set. Telemetry is kept in whole windows (TELEMETRY_WINDOW_S), and a window that began
    before the step also holds requests of the previous split (or of the fault a previous
    ramp rolled back): the guard never judges a step on them. It loses up to one window of
    the step's own requests instead."""
    from fleetctl.telemetry.services import window_start

    width = settings.TELEMETRY_WINDOW_S
    start = window_start(step_started_at.timestamp(), width)
    return start if start >= step_started_at else start + timedelta(seconds=width)


def _judge(ramp: Ramp, route: Route, *, since: datetime, now: datetime) -> guard.Judgement:
    from fleetctl.ramps.selectors import ramp_judgement

    return ramp_judgement(ramp, route, since=since, now=now)


def _note(ramp: Ramp, judgement: guard.Judgement) -> None:
    """A check's outcome on the timeline only when it changes (wait for another reason, pass
    after warn...): every tick writing a row would bury the decisions."""
    kind = Kind.WAIT if judgement.decision == guard.WAIT else Kind.CHECK
    text = f"{judgement.decision}: " + " ".join(judgement.reasons)
    last = (RampEvent.objects.filter(ramp=ramp, step_index=ramp.step_index)
            .exclude(kind=Kind.SKIP).order_by("-id").first())
    if last is not None and last.kind == kind and _gist(last.message) == _gist(text):
        return
    _event(ramp, kind, message=text, numbers=judgement.numbers)


def _gist(text: str) -> str:
    """What a check said without its numbers, to tell a changed reason from changed counts."""
    return "".join(c for c in text if not c.isdigit())[:120]


def _skipped(ramp: Ramp) -> bool:
    """A SKIP after the event that set the current step (a resumed step is set anew, and a
    skip of its earlier hold does not carry over)."""
    stepped = (RampEvent.objects.filter(ramp=ramp, kind=Kind.STEP).order_by("-id")
               .values_list("id", flat=True).first())
    return RampEvent.objects.filter(ramp=ramp, kind=Kind.SKIP, step_index=ramp.step_index,
                                    id__gt=stepped or 0).exists()


def _evidence(ramp: Ramp, judgement: guard.Judgement, *,
              decision: str | None = None) -> int | None:
    if ramp.plan_id is None:
        return None
    from migrations_plan.services import evidence_record

    verdict = decision or judgement.decision
    step = ramp.steps[ramp.step_index]
    numbers = judgement.numbers
    row = evidence_record(
        actor=Actor.for_system("ramp"), pool=ramp.pool, kind=EVIDENCE_KIND, verdict=verdict,
        summary=(f"ramp {ramp.pk} step {ramp.step_index + 1}/{len(ramp.steps)} at "
                 f"{step['percent']:g} %: {verdict}: " + " ".join(judgement.reasons))[:300],
        data={"ramp": ramp.pk, "route": ramp.route.name, "step": ramp.step_index,
              "percent": float(step["percent"]), "steps_total": len(ramp.steps),
              "decision": verdict, "window_s": float(numbers.get("window", {})
                                                      .get("seconds", ramp.window_s)),
              "candidate": numbers.get("candidate") or {},
              "primary": numbers.get("primary") or {},
              "thresholds": numbers.get("thresholds") or {},
              "reasons": list(judgement.reasons)},
        url=f"/ramps/{ramp.pk}/", route=ramp.route, source=f"ramp {ramp.pk}")
    return row.pk


def record_error(pk: int, exc: Exception) -> None:
    try:
        ramp = Ramp.objects.get(pk=pk)
        _event(ramp, Kind.ERROR, message=f"The tick failed: {type(exc).__name__}: {exc}"[:2000])
    except Exception:
        log.exception("ramp %s: could not record the error", pk)


# --- pieces ------------------------------------------------------------------------------------

def split_for(base: dict[str, int], *, candidate: str, primary: str,
              percent: float) -> dict[str, int]:
    """The split at `percent` % for the candidate, in basis points summing to 10,000: the
    other pools share the rest in proportion to their weights in `base` (rounded down), and
    the primary takes the rounding (or, without weight in `base`, the largest other pool)."""
    cand = _bp(percent)
    rest = TOTAL_WEIGHT - cand
    others = {p: w for p, w in base.items() if p != candidate and w > 0}
    total = sum(others.values())
    if not others:
        others, total = {primary: 1}, 1
    shares = {p: rest * w // total for p, w in others.items()}
    taker = primary if primary in others else max(others, key=lambda p: (others[p], p))
    shares[taker] += rest - sum(shares.values())
    shares[candidate] = cand
    return {p: w for p, w in sorted(shares.items()) if w > 0}


def thresholds_of(ramp: Ramp) -> guard.Thresholds:
    return guard.Thresholds(slo_ttft_p95_ms=ramp.slo_ttft_p95_ms,
                            slo_tpot_p95_ms=ramp.slo_tpot_p95_ms,
                            slo_error_rate=ramp.slo_error_rate,
                            latency_margin_pct=ramp.latency_margin_pct)


def _bp(percent: float) -> int:
    return round(float(percent) * 100)


def _steps_problems(steps: Any, window_s: Any, problems: dict[str, list[str]]
                    ) -> list[dict[str, Any]]:
    minimum = max(settings.TELEMETRY_WINDOW_S,
                  window_s if isinstance(window_s, int) and not isinstance(window_s, bool)
                  else 0)
    if not isinstance(steps, list) or not steps:
        problems["steps"] = ['Give the steps as a list, e.g. [{"percent": 5, "hold_s": 60}, '
                             '{"percent": 25, "hold_s": 120}].']
        return []
    if len(steps) > MAX_STEPS:
        problems["steps"] = [f"{len(steps)} steps; at most {MAX_STEPS}."]
        return []
    clean: list[dict[str, Any]] = []
    errors: list[str] = []
    previous = 0.0
    for i, step in enumerate(steps, start=1):
        if not isinstance(step, dict) or set(step) - {"percent", "hold_s"}:
            errors.append(f"Step {i}: give percent and hold_s (only), not {step!r}.")
            continue
        percent, hold = step.get("percent"), step.get("hold_s")
        if (isinstance(percent, bool) or not isinstance(percent, int | float)
                or not 0 < percent <= 100):
            errors.append(f"Step {i}: percent must be above 0 and at most 100, not "
                          f"{percent!r}.")
            continue
        if abs(percent * 100 - round(percent * 100)) > 1e-6:
            errors.append(f"Step {i}: {percent} % is finer than the 0.01 % step.")
            continue
        if percent <= previous:
            errors.append(f"Step {i}: {percent:g} % is not above the step before "
                          f"({previous:g} %); percents must strictly increase.")
        previous = float(percent)
        if isinstance(hold, bool) or not isinstance(hold, int | float) or hold < minimum:
            errors.append(f"Step {i}: hold_s must be at least {minimum:g} s (one telemetry "
                          f"window of {settings.TELEMETRY_WINDOW_S} s and the guard's window "
                          f"of {window_s} s), not {hold!r}.")
            continue
        clean.append({"percent": round(float(percent), 2), "hold_s": float(hold)})
    if errors:
        problems["steps"] = errors
    return clean


def _settings_problems(min_samples: Any, window_s: Any, failure_threshold: Any,
                       problems: dict[str, list[str]]) -> None:
    def whole(value: Any, low: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    if not whole(min_samples, 1):
        problems["min_samples"] = [f"A whole number of requests, at least 1, not "
                                   f"{min_samples!r}."]
    if not whole(window_s, settings.TELEMETRY_WINDOW_S):
        problems["window_s"] = [f"Whole seconds, at least one telemetry window "
                                f"({settings.TELEMETRY_WINDOW_S} s), not {window_s!r}."]
    if not whole(failure_threshold, 1):
        problems["failure_threshold"] = [f"A whole number of checks, at least 1, not "
                                         f"{failure_threshold!r}."]


def _pool_problems(route: Route, pool: Pool, problems: dict[str, list[str]]) -> None:
    if pool.pk == route.primary_pool_id:
        problems["pool"] = [f"{pool.name} is {route.name}'s primary; ramp another pool onto "
                            f"it."]
        return
    if route.residency and pool.region.jurisdiction != route.residency:
        problems["pool"] = [f"Residency: pool {pool.name} is in jurisdiction "
                            f"{pool.region.jurisdiction}, but route {route.name} is pinned to "
                            f"{route.residency}. Refused."]
        return
    if not PoolModel.objects.filter(pool=pool, model_id=route.model_id).exists():
        problems["pool"] = [f"Pool {pool.name} does not serve model {route.model_id} of route "
                            f"{route.name}; add the model to the pool first."]
        return
    refusal = policy.live_weight_refusal(pool, route)
    if refusal:
        problems["pool"] = [f"Pool {pool.name}: {refusal}."]
        return
    if pool.health_state != Pool.Health.HEALTHY:
        problems["pool"] = [f"Pool {pool.name} is {pool.health_state}; a ramp gives it live "
                            f"traffic only when healthy."]


def _plan_for(route: Route, pool: Pool, plan: Plan | None) -> Plan | None:
    if plan is None:
        return (Plan.objects.filter(candidate_pool=pool, routes=route,
                                    state=Plan.State.STAGE_4)
                .order_by("-created_at", "-id").first())
    if plan.candidate_pool_id != pool.pk:
        raise ValidationError({"plan": [f"Plan {plan.name}'s candidate is "
                                        f"{plan.candidate_pool.name}, not {pool.name}."]})
    if not plan.routes.filter(pk=route.pk).exists():
        raise ValidationError({"plan": [f"Plan {plan.name} does not list route {route.name}; "
                                        f"add the route to the plan first."]})
    if plan.state != Plan.State.STAGE_4:
        raise ValidationError({"plan": [f"Plan {plan.name} is {plan.state}; a ramp of its "
                                        f"candidate needs stage 4 (live)."]})
    return plan


def _thresholds(given: dict[str, float | None], plan: Plan | None) -> dict[str, float]:
    values: dict[str, float] = {}
    missing: list[str] = []
    problems: dict[str, list[str]] = {}
    for name in THRESHOLD_FIELDS:
        value = given[name]
        if value is None and plan is not None:
            value = getattr(plan, name)
        if value is None and name == "latency_margin_pct":
            value = DEFAULT_LATENCY_MARGIN_PCT
        if value is None:
            missing.append(name)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                name == "slo_error_rate" and value > 1):
            problems[name] = [f"{value!r} is not a valid {name}" + (
                " (a rate 0–1, 0.01 = 1 %)." if name == "slo_error_rate" else
                " (a number, 0 or more).")]
            continue
        values[name] = float(value)
    if missing:
        problems["non_field_errors"] = [
            f"Without a stage-4 migration plan for this pool and route, give the guard's "
            f"thresholds: {', '.join(missing)}."]
    if problems:
        raise ValidationError(problems)
    return values


def _need_reason(reason: str, what: str) -> None:
    if not (reason or "").strip():
        raise ValidationError({"reason": [f"Say why you {what} (it goes in the record)."]})


def _locked(ramp: Ramp) -> Ramp:
    return (Ramp.objects.select_for_update(of=("self",))
            .select_related("route", "pool", "plan").get(pk=ramp.pk))


def _set_state(ramp: Ramp, state: str, reason: str) -> None:
    ramp.state, ramp.state_reason = state, reason[:5000]
    Ramp.objects.filter(pk=ramp.pk).update(state=state, state_reason=ramp.state_reason)


def _finish(ramp: Ramp, state: str, reason: str, *, drain: Drain | None = None) -> None:
    now = timezone.now()
    ramp.state, ramp.state_reason, ramp.finished_at = state, reason[:5000], now
    ramp.drain = drain if drain is not None else ramp.drain
    Ramp.objects.filter(pk=ramp.pk).update(state=state, state_reason=ramp.state_reason,
                                           finished_at=now, drain=ramp.drain)


def _event(ramp: Ramp, kind: str, *, message: str, actor: Actor | None = None,
           numbers: dict[str, Any] | None = None, revision_number: int | None = None,
           drain: Drain | None = None, evidence_id: int | None = None,
           at: datetime | None = None) -> RampEvent:
    step = ramp.current_step
    event = RampEvent.objects.create(
        ramp=ramp, kind=kind, step_index=ramp.step_index, at=at or timezone.now(),
        percent=float(step["percent"]) if step else None, message=message[:10_000],
        numbers=numbers or {}, actor=(actor or Actor.for_system(f"ramp-{ramp.pk}")).label,
        revision_number=revision_number, drain=drain, evidence_id=evidence_id)
    if kind in NOTIFIED:
        _notify(ramp, event)
    return event


def _notify(ramp: Ramp, event: RampEvent) -> None:
    from fleetctl.webhooks.services import notify

    payload = {"ramp": ramp.pk, "route": ramp.route.name, "pool": ramp.pool.name,
               "kind": event.kind, "state": ramp.state, "step": ramp.step_index + 1,
               "steps_total": len(ramp.steps), "percent": event.percent,
               "message": event.message, "actor": event.actor,
               "drain": event.drain_id, "at": event.at.isoformat(), "url": f"/ramps/{ramp.pk}/"}
    notify("ramp.decision", payload,
           text=f"Ramp {ramp.pk} ({ramp.pool.name} on {ramp.route.name}) {event.kind}: "
                f"{event.message}"[:500])


def _queue_run(pk: int) -> None:
    from fleetctl.ramps.tasks import run

    transaction.on_commit(lambda: run.delay(pk))


def _steps_text(steps: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['percent']:g} % for {s['hold_s']:g} s" for s in steps)


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        if hasattr(exc, "message_dict"):
            return " ".join(m for msgs in exc.message_dict.values() for m in msgs)
        return " ".join(exc.messages)
    return getattr(exc, "message", str(exc))
