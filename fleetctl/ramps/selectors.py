"""Reads for ramps: the list, one ramp with its timeline, the active ramp of a route, the
per-step spans a chart draws, and the guard's judgement right now."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Prefetch, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from fleetctl.ramps import guard
from fleetctl.ramps.models import ACTIVE_STATES, Ramp, RampEvent, Watch, WatchVerdict
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


def plan_ramps(plan: Plan) -> list[Ramp]:
    """The plan's ramps, oldest first (created, then id), each with its events oldest first."""
    return list(ramp_list().filter(plan=plan).prefetch_related(
        Prefetch("events", queryset=RampEvent.objects.order_by("at", "id")))
        .order_by("created_at", "id"))


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

    if ramp.step_started_at is not None:
        since = max(since, step_data_start(ramp.step_started_at))
    judgement = pool_judgement(pool=ramp.pool.name, route=route.name,
                               primary=route.primary_pool.name, thresholds=thresholds_of(ramp),
                               min_samples=ramp.min_samples, since=since, until=now, now=now)
    if not ramp.metric_checks:
        return judgement
    # The ramp's extra guard metrics (Prometheus queries), measured now beside its telemetry.
    from fleetctl.prometheus.services import ramp_metrics_measure

    measured = ramp_metrics_measure(ramp.metric_checks, pool=ramp.pool.name, route=route.name,
                                    model=route.model_id)
    return guard.with_metrics(judgement, [m.as_dict() for m in measured])


def pool_judgement(*, pool: str, route: str, primary: str | None,
                   thresholds: guard.Thresholds, min_samples: int, since: datetime,
                   until: datetime, now: datetime) -> guard.Judgement:
    """The guard's one judgement of `pool` on `route` over [since, until): its telemetry
    against the thresholds and, when `primary` is given (and is another pool), against the
    primary's over the same span. The ramp guard and the standing watch both judge through
    here, so there is one set of statistics (guard.judge)."""
    from fleetctl.telemetry.selectors import pool_stats

    candidate = pool_stats(pool=pool, route=route, since=since, until=until)
    other = (pool_stats(pool=primary, route=route, since=since, until=until)
             if primary and primary != pool else None)
    return guard.judge(candidate=candidate, primary=other, thresholds=thresholds,
                       min_samples=min_samples, now=now,
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


# --- standing watches -------------------------------------------------------------------------

def watch_list() -> QuerySet[Watch]:
    return Watch.objects.select_related("route", "pool", "plan", "drain", "ramp")


def watches_of_route(route: Route) -> list[Watch]:
    """The route's watches: the active ones first, then the newest ended (at most 10)."""
    return list(watch_list().filter(route=route)
                .order_by("state", "-started_at", "-id")[:10])


def watches_with_verdicts(route: Route, limit: int = 5) -> list[dict[str, Any]]:
    """The route's watches, each with its newest `limit` judged windows: two queries, however
    many watches (the verdicts of all of them in one, ranked per watch by the database)."""
    watches = watches_of_route(route)
    if not watches:
        return []
    ranked = (WatchVerdict.objects.filter(watch__in=watches)
              .annotate(rank=Window(RowNumber(), partition_by=[F("watch_id")],
                                    order_by=[F("window_start").desc(), F("id").desc()]))
              .filter(rank__lte=limit).order_by("watch_id", "rank"))
    newest: dict[int, list[WatchVerdict]] = {}
    for verdict in ranked:
        newest.setdefault(verdict.watch_id, []).append(verdict)
    return [{"watch": w, "verdicts": newest.get(w.pk, [])} for w in watches]


def watch_verdicts(watch: Watch, limit: int = 20) -> list[WatchVerdict]:
    """A watch's newest judged windows, newest first."""
    return list(watch.verdicts.order_by("-window_start", "-id")[:limit])
