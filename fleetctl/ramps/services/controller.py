"""The controller: `ramps_tick` (beat) drives each running ramp one step at a time from
telemetry, rolls back or finishes it and records evidence; drains end the ramps they take
weight from (`ramps_lock_for_drain`, `ramps_end_for_drain`, traffic's holds)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool
from fleetctl.ramps import guard
from fleetctl.ramps.evidence import KIND as EVIDENCE_KIND
from fleetctl.ramps.models import ACTIVE_STATES, Ramp, RampEvent
from fleetctl.ramps.services._shared import Kind, _bp, _drain, _event, _finish, _set_state, log
from fleetctl.ramps.services.watch import watches_hand_over
from fleetctl.traffic.gateways.base import TOTAL_WEIGHT
from fleetctl.traffic.models import Drain, Route, SplitRevision
from fleetctl.traffic.split import as_percentages

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
    """Drive every due running ramp (or only `only`, due or not) one step, and judge every
    due paused one (_guard_paused); returns how many this call took. Never raises for one
    ramp's trouble: it is logged and recorded as an ERROR event, and the next tick tries
    again."""
    now = now or timezone.now()
    owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    due = Ramp.objects.filter(free, state__in=ACTIVE_STATES)
    due = due.filter(pk=only) if only is not None else due.filter(next_check_at__lte=now)
    driven = 0
    for pk in list(due.order_by("next_check_at").values_list("pk", flat=True)):
        lease = now + timedelta(seconds=settings.RAMP_LEASE_S)
        if not Ramp.objects.filter(free, pk=pk, state__in=ACTIVE_STATES).update(
                lease_owner=owner, lease_until=lease):
            continue  # another controller holds it
        driven += 1
        try:
            ramp = (Ramp.objects.select_related("route__primary_pool", "pool", "plan")
                    .get(pk=pk))
            if ramp.state == Ramp.State.PAUSED:
                _guard_paused(ramp, now=now)
            else:
                _drive(ramp, now=now, owner=owner)
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
    if _counted(ramp, judgement, now=now, state=Ramp.State.RUNNING):
        return  # a hold whose latest window fails is not judged whole, let alone passed
    if now < ramp.step_started_at + timedelta(seconds=float(step["hold_s"])):
        _note(ramp, judgement)
        return
    # The hold is over: judge all of it (that judgement is the one recorded).
    whole = _judge(ramp, route, since=ramp.step_started_at, now=now)
    if whole.decision == guard.WAIT:
        _note(ramp, whole)
    elif whole.decision == guard.FAIL:
        _rollback(ramp, whole, "The hold failed: " + " ".join(whole.reasons), now=now)
    elif whole.decision == guard.WARN:
        with transaction.atomic():
            if not _still_running(ramp):
                return
            evidence = _evidence(ramp, whole, now=now)
            _set_state(ramp, Ramp.State.PAUSED, "warn: " + " ".join(whole.reasons))
            _event(ramp, Kind.WARN, message="The hold warned, so a person decides (resume, "
                                            "skip or abort): " + " ".join(whole.reasons),
                   numbers=whole.numbers, evidence_id=evidence)
    else:
        with transaction.atomic():
            if not _still_running(ramp):
                return
            evidence = _evidence(ramp, whole, now=now)
            _event(ramp, Kind.PASS, message=f"Hold at {step['percent']:g} % passed: "
                                            + " ".join(whole.reasons),
                   numbers=whole.numbers, evidence_id=evidence)
        _next(ramp, route, now=now, skipped=False)


def _guard_paused(ramp: Ramp, *, now: datetime) -> None:
    """A paused ramp's pool keeps the weight it had, so the guard keeps judging it (as Argo
    Rollouts' background analysis runs through a pause): checks that fail `failure_threshold`
    times in a row roll it back, paused or not. Nothing else is recorded while it waits for a
    person: no step, no pass, no routine check."""
    route = Route.objects.select_related("primary_pool").get(pk=ramp.route_id)
    judgement = _judge(ramp, route, since=now - timedelta(seconds=ramp.window_s), now=now)
    _counted(ramp, judgement, now=now, state=Ramp.State.PAUSED)


def _counted(ramp: Ramp, judgement: guard.Judgement, *, now: datetime, state: str) -> bool:
    """Count a failing check of a ramp in `state` — rolled back at `failure_threshold` in a
    row, else on the timeline — and say True; or, on a judgement that knows something (not
    a wait), reset the count and say False. The one rule for running and paused ramps."""
    failures = guard.failures_after(ramp.consecutive_failures, judgement.decision)
    if judgement.decision != guard.FAIL:
        if failures != ramp.consecutive_failures:
            Ramp.objects.filter(pk=ramp.pk, state=state).update(consecutive_failures=failures)
            ramp.consecutive_failures = failures
        return False
    Ramp.objects.filter(pk=ramp.pk, state=state).update(consecutive_failures=failures)
    ramp.consecutive_failures = failures
    paused = " while paused" if state == Ramp.State.PAUSED else ""
    message = (f"Check failed{paused} ({failures} of {ramp.failure_threshold} in a row): "
               + " ".join(judgement.reasons))
    if failures >= ramp.failure_threshold:
        _rollback(ramp, judgement, message, now=now, state=state)
        return True
    with transaction.atomic():
        if _still_running(ramp, state=state):
            _event(ramp, Kind.FAIL, message=message, numbers=judgement.numbers)
    return True


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
            # The guard never sleeps: a standing watch of every pool carrying weight.
            watches_hand_over(ramp, route, now=now)
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


def _rollback(ramp: Ramp, judgement: guard.Judgement, message: str, *, now: datetime,
              state: str = Ramp.State.RUNNING) -> None:
    from fleetctl.traffic import push

    system = Actor.for_system(f"ramp-{ramp.pk}")
    with transaction.atomic():
        if not _still_running(ramp, state=state):
            return
        evidence = _evidence(ramp, judgement, decision=guard.FAIL, now=now)
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


def _still_running(ramp: Ramp, state: str = Ramp.State.RUNNING) -> bool:
    """Lock the ramp's row (inside the caller's transaction) and say whether it is still in
    `state` (running, unless said) at the step this driver read. A drive that outlived its
    lease (a slow database, a stalled worker) may meet a second controller driving the same
    step; whichever writes second sees the step moved on and does nothing, rather than
    judging the hold again and pausing the ramp on the revision the first one set."""
    at_step = Ramp.objects.select_for_update().filter(
        pk=ramp.pk, state=state, step_index=ramp.step_index)
    if ramp.step_started_at is None:
        return at_step.filter(step_started_at__isnull=True).exists()
    return at_step.filter(step_started_at=ramp.step_started_at).exists()


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


def _evidence(ramp: Ramp, judgement: guard.Judgement, *, now: datetime,
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
              "decision": verdict,
              # How long the step held, on the clock (its set → this judgement).
              "held_s": max(0.0, (now - ramp.step_started_at).total_seconds())
              if ramp.step_started_at else 0.0,
              "window_s": float(numbers.get("window", {})
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


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        if hasattr(exc, "message_dict"):
            return " ".join(m for msgs in exc.message_dict.values() for m in msgs)
        return " ".join(exc.messages)
    return getattr(exc, "message", str(exc))
