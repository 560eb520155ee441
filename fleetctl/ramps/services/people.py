"""What a person (or an API client) does to a ramp: start, pause, resume, skip or abort it.
Each checks the permission, wants a reason, and commits its change, event and audit row in
one transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import ConflictError, required_reason
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.ramps.models import ACTIVE_STATES, Ramp
from fleetctl.ramps.services._shared import (
    DEFAULT_LATENCY_MARGIN_PCT,
    MAX_STEPS,
    OPTIONAL_THRESHOLDS,
    THRESHOLD_FIELDS,
    Kind,
    _bp,
    _drain,
    _event,
    _finish,
    _locked,
    _set_state,
)
from fleetctl.traffic import policy
from fleetctl.traffic import selectors as traffic_selectors
from fleetctl.traffic.capacity_split import route_capacity_split
from fleetctl.traffic.models import Route
from fleetctl.traffic.split import as_percentages
from migrations_plan.models import Plan

# A last step's percent that is resolved when the ramp starts: the pool's capacity share.
CAPACITY = "capacity"

# --- a person's actions ------------------------------------------------------------------------

def ramp_create(*, actor: Actor, route: Route, pool: Pool, steps: list[dict[str, Any]],
                plan: Plan | None = None, min_samples: int = 50, window_s: int = 30,
                failure_threshold: int = 2, slo_ttft_p95_ms: float | None = None,
                slo_tpot_p95_ms: float | None = None, slo_error_rate: float | None = None,
                latency_margin_pct: float | None = None, slo_e2e_p95_ms: float | None = None,
                reason: str = "", metric_checks: list[dict[str, Any]] | None = None) -> Ramp:
    """Start a guarded ramp of `pool` on `route`. Everything is checked before anything is
    stored; the first step is set by the controller's first tick, queued after the commit."""
    actor.require(roles.RAMP, action="ramp.create", target=route)
    steps, capacity = _capacity_step(route, pool, steps)
    clean_steps, route, pool = _checked(route=route, pool=pool, steps=steps,
                                        min_samples=min_samples, window_s=window_s,
                                        failure_threshold=failure_threshold)
    plan = _plan_for(route, pool, plan)
    given = {"slo_ttft_p95_ms": slo_ttft_p95_ms, "slo_tpot_p95_ms": slo_tpot_p95_ms,
             "slo_error_rate": slo_error_rate, "latency_margin_pct": latency_margin_pct,
             "slo_e2e_p95_ms": slo_e2e_p95_ms}
    thresholds = _thresholds(given, plan)
    from fleetctl.prometheus.services import ramp_metrics_problems

    problems = ramp_metrics_problems(metric_checks)
    if problems:
        raise ValidationError({"metric_checks": problems})
    with transaction.atomic():
        locked = Route.objects.select_for_update().get(pk=route.pk)
        base = _base_weights(locked, pool, clean_steps)
        ramp = Ramp(route=locked, pool=pool, plan=plan, steps=clean_steps,
                    min_samples=min_samples, window_s=window_s,
                    failure_threshold=failure_threshold, base_weights=base,
                    revision_number=locked.revision_number, created_by=actor.label,
                    state=Ramp.State.RUNNING, step_index=-1,
                    metric_checks=list(metric_checks or []), **thresholds)
        try:
            with transaction.atomic():
                ramp.save()
        except IntegrityError:  # the database's own one-active-ramp constraint
            raise ConflictError(f"Route {locked.name} already has an active ramp.") from None
        _event(ramp, Kind.START, actor=actor,
               message=f"{actor.label} started a ramp of {pool.name} on {locked.name}: "
                       f"{_steps_text(clean_steps)}" + (f" ({reason})" if reason else "")
                       + (f"; plan {plan.name}" if plan else "")
                       + (f"; its last step is {pool.name}'s share of the capacity split "
                          f"at revision {capacity['revision']}: {capacity['reason']}"
                          if capacity else ""),
               numbers={"steps": clean_steps, "thresholds": thresholds,
                        "base_weights": as_percentages(base),
                        **({"capacity": capacity} if capacity else {})},
               revision_number=locked.revision_number)
        audit_record(actor=actor, action="ramp.create", target=ramp, message=reason,
                     after={"route": locked.name, "pool": pool.name, "steps": clean_steps,
                            "plan": plan.name if plan else None, **thresholds,
                            "min_samples": min_samples, "window_s": window_s,
                            "failure_threshold": failure_threshold,
                            **({"metric_checks": ramp.metric_checks}
                               if ramp.metric_checks else {}),
                            **({"capacity": capacity} if capacity else {})})
        _queue_run(ramp.pk)
    return ramp


def _capacity_step(route: Route, pool: Pool, steps: Any
                   ) -> tuple[Any, dict[str, Any] | None]:
    """A last step of percent "capacity" is the pool's share of the route's capacity split
    (traffic/capacity_split.py), resolved now, when the ramp starts: the steps with that
    share in its place, and what it came from (the split's revision, reason and runs), which
    the ramp's start event and audit record keep. Only the last step may say "capacity"."""
    if not isinstance(steps, list) or not any(
            isinstance(step, dict) and step.get("percent") == CAPACITY for step in steps):
        return steps, None
    last = len(steps)
    early = [i for i, step in enumerate(steps[:-1], start=1)
             if isinstance(step, dict) and step.get("percent") == CAPACITY]
    if early:
        raise ValidationError({"steps": [
            f"Step {early[0]}: only the last step may be \"capacity\" (the pool's share of "
            f"the route's capacity split); give the steps before it as numbers."]})
    split = route_capacity_split(route=route)
    share = split.weights.get(pool.name, 0)
    why = next((row.left_out for row in split.rows if row.pool == pool.name), "")
    if split.refusal or not share:
        raise ValidationError({"steps": [
            f"Step {last}: \"capacity\" cannot be resolved: " + (
                split.refusal or f"{pool.name} has no share of {route.name}'s capacity "
                                 f"split ({why or 'it does not serve the route'}).")]})
    percent = share / 100
    numbers = [step.get("percent") for step in steps[:-1] if isinstance(step, dict)]
    before = numbers[-1] if numbers else None
    if isinstance(before, int | float) and not isinstance(before, bool) and percent <= before:
        raise ValidationError({"steps": [
            f"Step {last}: \"capacity\" is {pool.name}'s share of the capacity split, "
            f"{percent:g} %, not above step {last - 1} ({before:g} %). Lower the steps "
            f"before it, or end at a number."]})
    runs = {row.pool: row.capacity.run for row in split.rows if row.suggested_bp}
    resolved = [*steps[:-1], {**steps[-1], "percent": percent}]
    return resolved, {"step": last, "percent": percent, "revision": split.revision,
                      "weights": as_percentages(split.weights), "runs": runs,
                      "reason": split.reason}


def _checked(*, route: Route, pool: Pool, steps: list[dict[str, Any]], min_samples: int,
             window_s: int, failure_threshold: int
             ) -> tuple[list[dict[str, Any]], Route, Pool]:
    """A new ramp's steps and settings, then its route and pool as stored now: every
    problem found is refused at once (400) before anything is stored. Returns the clean
    steps and the route and pool read again."""
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
    return clean_steps, route, pool


def _base_weights(locked: Route, pool: Pool, clean_steps: list[dict[str, Any]]
                  ) -> dict[str, int]:
    """The split a new ramp starts from, read under the route's lock. Refused while another
    ramp is active on the route (409), or when the first step would lower the pool's
    weight (400): a ramp only raises it."""
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
    return base


@contextmanager
def _person_action(actor: Actor, ramp: Ramp, *, action: str, reason: str, what: str,
                   states: tuple[str, ...], refusal: str,
                   role: str = roles.RAMP) -> Iterator[Ramp]:
    """What a person's action on a ramp (pause, resume, skip, abort) starts with: the
    permission, a reason, then, in one transaction, the ramp locked and in one of `states`,
    else a conflict saying why (`refusal`) and nothing changes. Yields the locked ramp; the
    caller's changes, event and audit row commit with it."""
    actor.require(role, action=action, target=ramp)
    required_reason(reason, f"Say why you {what} (it goes in the record).")
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


def ramps_hold_for_report(*, pool_id: int, changes: list[str]) -> list[Ramp]:
    """A pool reports a change nobody registered (fleet's report hooks): its running ramps
    pause, by `system:reverify`, until a person has seen the re-verification — a ramp must not
    step an upgraded server up on evidence measured on the old one. The guard keeps judging
    the paused ramp (a failing pool still rolls back)."""
    from django.core.exceptions import ValidationError

    from fleetctl.core.errors import DomainError

    actor = Actor.for_system("reverify")
    held = []
    for ramp in Ramp.objects.filter(pool_id=pool_id, state=Ramp.State.RUNNING).order_by("pk"):
        try:
            held.append(ramp_pause(
                actor=actor, ramp=ramp,
                reason=f"the pool reports {'; '.join(changes)} (nobody registered it): held "
                       f"until it is re-verified"[:2000]))
        except (ValidationError, DomainError):  # ended or paused meanwhile
            continue
    return held


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


def _thresholds(given: dict[str, float | None], plan: Plan | None
                ) -> dict[str, float | None]:
    values: dict[str, float | None] = {}
    missing: list[str] = []
    problems: dict[str, list[str]] = {}
    for name in THRESHOLD_FIELDS:
        value = given[name]
        if value is None and plan is not None:
            value = getattr(plan, name)
        if value is None and name == "latency_margin_pct":
            value = DEFAULT_LATENCY_MARGIN_PCT
        if value is None and name in OPTIONAL_THRESHOLDS:
            values[name] = None
            continue
        if value is None:
            missing.append(name)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                name == "slo_error_rate" and value > 1) or (
                name in OPTIONAL_THRESHOLDS and value < 1):
            problems[name] = [f"{value!r} is not a valid {name}" + (
                " (a rate 0–1, 0.01 = 1 %)." if name == "slo_error_rate" else
                " (milliseconds, 1 or more; leave it out to judge no whole-answer latency)."
                if name in OPTIONAL_THRESHOLDS else " (a number, 0 or more).")]
            continue
        values[name] = float(value)
    if missing:
        problems["non_field_errors"] = [
            f"Without a stage-4 migration plan for this pool and route, give the guard's "
            f"thresholds: {', '.join(missing)}."]
    if problems:
        raise ValidationError(problems)
    return values


def _queue_run(pk: int) -> None:
    from fleetctl.ramps.tasks import run

    transaction.on_commit(lambda: run.delay(pk))


def _steps_text(steps: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['percent']:g} % for {s['hold_s']:g} s" for s in steps)
