"""Reads for ramps: the list, one ramp with its timeline, the active ramp of a route, the
per-step spans a chart draws, and the guard's judgement right now."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from fleetctl.ramps import guard
from fleetctl.ramps.models import ACTIVE_STATES, Ramp, RampEvent
from fleetctl.traffic.holds import Hold
from fleetctl.traffic.models import Drain, Route
from migrations_plan.models import Plan

# The event that ends a step's span, and how the span ended.
_OUTCOMES: dict[str, str] = {RampEvent.Kind.PASS: "passed", RampEvent.Kind.SKIP: "skipped",
             RampEvent.Kind.WARN: "warned", RampEvent.Kind.ROLLBACK: "rolled back",
             RampEvent.Kind.ABORT: "aborted", RampEvent.Kind.PAUSE: "paused",
             RampEvent.Kind.MANUAL_CHANGE: "paused (manual change)",
             RampEvent.Kind.COMPLETE: "complete"}


def ramp_list() -> QuerySet[Ramp]:
    return Ramp.objects.select_related("route", "pool", "plan", "drain")


def ramps_filtered(*, state: str = "", route: str = "", pool: str = "") -> QuerySet[Ramp]:
    """The list page's ramps: by state ("active": running or paused), route and pool name;
    an empty value does not filter."""
    ramps = ramp_list()
    if state == "active":
        ramps = ramps.filter(state__in=ACTIVE_STATES)
    elif state:
        ramps = ramps.filter(state=state)
    if route:
        ramps = ramps.filter(route__name=route)
    if pool:
        ramps = ramps.filter(pool__name=pool)
    return ramps


def stage4_plans(route: Route) -> list[Plan]:
    """Plans at stage 4 (live) that list the route, by name, with their candidates."""
    return list(Plan.objects.filter(routes=route, state=Plan.State.STAGE_4)
                .select_related("candidate_pool").order_by("name"))


def ramp_detail(pk: int) -> Ramp | None:
    """One ramp with its events (oldest first) prefetched."""
    return (ramp_list().prefetch_related(
        Prefetch("events", queryset=RampEvent.objects.select_related("drain")
                 .order_by("at", "id"))).filter(pk=pk).first())


def ramp_active_for(route: Route) -> Ramp | None:
    return ramp_list().filter(route=route, state__in=ACTIVE_STATES).first()


def ramp_timeline(ramp: Ramp) -> dict[str, Any]:
    """The events, and one span per step set (a resumed step is a new span): start, end
    (None while it holds), percent, and how it ended ("holding" while it holds)."""
    events = list(ramp.events.all())
    events.sort(key=lambda e: (e.at, e.id))
    spans: list[dict[str, Any]] = []
    for event in events:
        open_span = spans[-1] if spans and spans[-1]["end"] is None else None
        if event.kind == RampEvent.Kind.STEP:
            if open_span is not None:  # passed or skipped ends when the next step starts
                open_span["end"] = event.at
                if open_span["outcome"] == "holding":
                    open_span["outcome"] = "stepped up"
            spans.append({"step": event.step_index, "percent": event.percent,
                          "start": event.at, "end": None, "outcome": "holding"})
        elif open_span is not None and event.kind in _OUTCOMES:
            open_span["outcome"] = _OUTCOMES[event.kind]
            if event.kind not in (RampEvent.Kind.PASS, RampEvent.Kind.SKIP):
                open_span["end"] = event.at
    if spans and spans[-1]["end"] is None and not ramp.active:
        spans[-1]["end"] = ramp.finished_at
    return {"events": events, "spans": spans}


def ramp_judgement(ramp: Ramp, route: Route, *, since: datetime, now: datetime
                   ) -> guard.Judgement:
    """The guard's judgement of the ramp's pool on `route` against the primary over [since,
    now), never reaching back before the step's own telemetry (services.step_data_start)."""
    from fleetctl.ramps.services import step_data_start, thresholds_of
    from fleetctl.telemetry.selectors import pool_stats

    if ramp.step_started_at is not None:
        since = max(since, step_data_start(ramp.step_started_at))
    candidate = pool_stats(pool=ramp.pool.name, route=route.name, since=since, until=now)
    primary = pool_stats(pool=route.primary_pool.name, route=route.name, since=since,
                         until=now)
    return guard.judge(candidate=candidate, primary=primary, thresholds=thresholds_of(ramp),
                       min_samples=ramp.min_samples, now=now,
                       stale_after_s=3 * settings.TELEMETRY_WINDOW_S)


def ramp_numbers_now(ramp: Ramp) -> dict[str, Any] | None:
    """The guard's judgement of the current step's window right now (not stored), for the
    API and the page; None when no step is holding."""
    if not ramp.active or ramp.step_started_at is None:
        return None
    now = timezone.now()
    judgement = ramp_judgement(ramp, ramp.route, now=now,
                               since=now - timedelta(seconds=ramp.window_s))
    return {"decision": judgement.decision, "reasons": judgement.reasons,
            "at": now.isoformat(), "consecutive_failures": ramp.consecutive_failures,
            **judgement.numbers}


def ramp_holds(*, route_ids: list[int], drain: Drain | None = None) -> list[Hold]:
    """The ramps holding a pool's weight on these routes, as traffic's drains and restores
    see them (traffic/holds.py): the active ones, and those `drain` ended (aborted by it, or
    whose own abort or rollback it is)."""
    held = Q(state__in=ACTIVE_STATES) | (Q(drain=drain) if drain is not None else Q())
    ramps = (Ramp.objects.select_related("pool").filter(held, route_id__in=route_ids)
             .order_by("pk"))
    return [Hold(route_id=ramp.route_id, pool=ramp.pool.name, owner=f"ramp {ramp.pk}",
                 url=f"/ramps/{ramp.pk}/", state=_hold_state(ramp), active=ramp.active)
            for ramp in ramps]


def _hold_state(ramp: Ramp) -> str:
    step = ramp.current_step
    at = f" at {step['percent']:g} %" if step else " before its first step"
    if ramp.active:
        return f"{ramp.state}{at}"
    if ramp.state == Ramp.State.ROLLED_BACK:
        return f"rolled back by its guard{at} (drain {ramp.drain_id})"
    return f"aborted{at} (drain {ramp.drain_id})"
