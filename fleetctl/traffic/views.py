"""Traffic dashboard: routes and gateways, a route's split and history with the ramp form,
drains (confirm by typing the name, then live progress) and restores.

Function views that call selectors (reads) and services (writes, through the view kit:
`form_page`, `form_action`, `call_service`).
htmx asks for a block of the same page by targeting its id; the view then renders only that
block's partial template.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.charts import figure_data, pool_colours
from fleetctl.core.views import (
    Outcome,
    call_service,
    form_action,
    form_page,
    get_or_404,
    page_or_block,
)
from fleetctl.fleet.models import Pool
from fleetctl.traffic import charts, selectors, services
from fleetctl.traffic.capacity_split import route_capacity_split
from fleetctl.traffic.forms import (
    DrainForm,
    HealthPolicyForm,
    RampForm,
    RestoreForm,
    ReverifyPolicyForm,
)
from fleetctl.traffic.gateways.base import PROMPT_TOKENS_UNKNOWN
from fleetctl.traffic.holds import Hold, holds_on
from fleetctl.traffic.models import ContextTier, Drain, GatewayPush, Route, SplitRevision
from fleetctl.traffic.push import drain_push_now
from fleetctl.traffic.split import as_percentages
from fleetctl.traffic.tiers import TierPools, route_tier_live, route_tier_pools

# The ids of the blocks htmx refreshes; the view picks the partial by HX-Target.
GATEWAYS_ID = "gateways"
RECENT_DRAINS_ID = "recent-drains"
PROGRESS_ID = "drain-progress"
CAPACITY_ID = "capacity"  # the route page's Capacity card, loaded after the page
HISTORY_LIMIT = 50
DRAINS_PAGE_SIZE = 50
TERMINAL = (Drain.Status.COMPLETE, Drain.Status.FAILED)


def _route_policy_set(request: HttpRequest, name: str, form_class: type[forms.Form], *,
                      choose: str, setter: Any, said: str, display: str) -> HttpResponse:
    """A route policy's form post (fleet-manage): validated, set by the service, said."""
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    form = form_class(request.POST)
    if not form.is_valid():
        messages.error(request, choose)
        return redirect("traffic:route-detail", name=name)
    actor = actor_from_request(request)
    done = call_service(request, lambda: setter(actor=actor, route=route, **form.cleaned_data))
    if done.result is not None:
        messages.success(request, f"{said} of {name}: "
                                  f"{getattr(done.result, display)()}.")
    return redirect("traffic:route-detail", name=name)


@dashboard_view
@require_POST
def route_health_policy(request: HttpRequest, name: str) -> HttpResponse:
    """What the health policy does on this route (fleet-manage); applies from the next flip."""
    return _route_policy_set(request, name, HealthPolicyForm,
                             choose="Choose off, drain or drain-restore.",
                             setter=services.route_health_policy_set, said="Health policy",
                             display="get_health_policy_display")


@dashboard_view
@require_POST
def route_reverify_policy(request: HttpRequest, name: str) -> HttpResponse:
    """What happens on this route while a changed pool is re-verified (fleet-manage)."""
    return _route_policy_set(request, name, ReverifyPolicyForm,
                             choose="Re-verification policy: choose hold or drain.",
                             setter=services.route_reverify_policy_set,
                             said="Re-verification policy",
                             display="get_reverify_policy_display")


@dashboard_view
@require_POST
def route_affinity(request: HttpRequest, name: str) -> HttpResponse:
    """Set the route's prefix affinity (fleet-manage); a refusal names the field."""
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    actor = actor_from_request(request)
    data: dict[str, Any] = {"source": request.POST.get("source") or None}
    size = str(request.POST.get("prefix_bytes", "")).strip()
    if size and data["source"] == Route.PrefixAffinity.PROMPT:
        data["prefix_bytes"] = int(size) if size.isdigit() else size

    def affinity_set() -> Route:
        try:
            return services.route_affinity_set(actor=actor, route=route, data=data)
        except ValidationError as exc:  # said as a message naming the field
            raise ValidationError([f"{field}: {message}" for field, messages_ in
                                   exc.message_dict.items() for message in messages_]) from exc

    done = call_service(request, affinity_set)
    if done.result is not None:
        messages.success(request, f"Prefix affinity of {name}: "
                                  f"{done.result.get_prefix_affinity_display()}.")
    return redirect("traffic:route-detail", name=name)


TIER_ROWS_BLANK = 2  # empty rows the tiers form offers below the route's tiers


def _tier_rows(post: Any) -> list[dict[str, Any]]:
    """The tiers form's rows as the service takes them: numbers where digits were typed
    (anything else as typed, for the service to name), fully blank rows left out."""
    columns = ("max_prompt_tokens", "behaviour", "queue_max", "retry_after_s")
    lists = [post.getlist(column) for column in columns]
    rows = []
    for values in zip(*lists, strict=False):
        cells = [str(value).strip() for value in values]
        if not any(cells):
            continue
        row: dict[str, Any] = {}
        for column, cell in zip(columns, cells, strict=True):
            if column == "behaviour":
                row[column] = cell or None
            elif cell:
                row[column] = int(cell) if cell.isdigit() else cell
        rows.append(row)
    return rows


@dashboard_view
@require_POST
def route_tiers(request: HttpRequest, name: str) -> HttpResponse:
    """Replace the route's context tiers (fleet-manage); a refusal names the tier."""
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    actor = actor_from_request(request)
    rows = _tier_rows(request.POST)

    def tiers_set() -> list[TierPools]:
        try:
            return services.route_tiers_set(actor=actor, route=route, tiers=rows)
        except ValidationError as exc:  # said as a message naming the tier and its field
            raise ValidationError([f"{field}: {message}" for field, messages_ in
                                   exc.message_dict.items() for message in messages_]) from exc

    done = call_service(request, tiers_set)
    if done.result is not None:
        said = ", ".join(f"{view.tier.label}: {view.tier.behaviour}" for view in done.result)
        messages.success(request, f"Context tiers of {name}: {said or 'none'}.")
    return redirect(reverse("traffic:route-detail", args=[name]) + "#tiers")


@dashboard_view
@require_POST
def route_capacity_apply(request: HttpRequest, name: str) -> HttpResponse:
    """Store the route's capacity split (ramp permission), based on the revision the page
    showed: a stale one is refused (409) and the page shows the split now."""
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    raw = str(request.POST.get("base_revision", "")).strip()
    base = int(raw) if raw.isdigit() else raw
    actor = actor_from_request(request)
    done = call_service(request, lambda: services.route_capacity_split_apply(
        actor=actor, route=route, base_revision=base,  # type: ignore[arg-type]
        note=str(request.POST.get("note", ""))))
    revision = done.result
    if revision is not None and getattr(revision, "unchanged", False):
        messages.info(request, f"The capacity split of {name} is in force already "
                               f"(revision {revision.number}); nothing changed.")
    elif revision is not None:
        messages.success(request, f"Route {name} is now at revision {revision.number}, its "
                                  f"capacity split; pushing to its gateways.")
    return redirect(reverse("traffic:route-detail", args=[name]) + f"?capacity#{CAPACITY_ID}")


# --- routes ----------------------------------------------------------------------------------

@dashboard_view
@require_GET
def route_list(request: HttpRequest) -> HttpResponse:
    if request.htmx.target == GATEWAYS_ID:  # type: ignore[attr-defined]
        return render(request, "traffic/_gateways.html",
                      {"gateways": selectors.gateway_list_with_envoys()})
    if request.htmx.target == RECENT_DRAINS_ID:  # type: ignore[attr-defined]
        return render(request, "traffic/_recent_drains.html",
                      {"drains": selectors.drains_recent()})
    routes = list(selectors.route_list())
    current = selectors.revisions_current(routes=routes)
    splits = {route.pk: current[route.pk].percentages() if route.pk in current else {}
              for route in routes}
    colours = pool_colours(pool for split in splits.values() for pool in split)
    rows = [
        {"route": route,
         "split": [(pool, share, colours[pool]) for pool, share in splits[route.pk].items()],
         # A route drain sends everything to the primary: nothing to do when it already has it.
         "drainable": any(pool != route.primary_pool.name for pool in splits[route.pk])}
        for route in routes
    ]
    # Which routes each pool carries, for the pool-drain links under the routes table.
    carrying: dict[str, list[str]] = {}
    for route in routes:
        for pool in splits[route.pk]:
            carrying.setdefault(pool, []).append(route.name)
    return render(request, "traffic/routes.html", {
        "rows": rows,
        "carrying": [(pool, colours[pool], names) for pool, names in sorted(carrying.items())],
        "gateways": selectors.gateway_list_with_envoys(),
        "drains": selectors.drains_recent(),
    })


@dataclass
class RevisionDiff:
    """One revision against its parent, per pool: before % → after %."""

    revision: SplitRevision
    changes: list[tuple[str, float, float]]  # (pool, before, after), every pool in either


def _diff(revision: SplitRevision) -> RevisionDiff:
    before = revision.parent.percentages() if revision.parent else {}
    after = revision.percentages()
    pools = sorted(set(before) | set(after))
    return RevisionDiff(revision, [(p, before.get(p, 0.0), after.get(p, 0.0)) for p in pools])


@dataclass
class RouteNow:
    """A route's current revision and who may carry it, read once per request."""

    current: SplitRevision | None
    split: dict[str, float]
    eligible: set[str]

    @classmethod
    def read(cls, route: Route) -> RouteNow:
        current = selectors.revision_current(route=route)
        return cls(current, current.percentages() if current else {},
                   selectors.pools_eligible(route=route))


def _ramp_form(route: Route, now: RouteNow, data: Any = None, *,
               initial: dict[str, Any] | None = None) -> RampForm:
    return RampForm(data, pools=selectors.ramp_pools(eligible=now.eligible,
                                                     holding=set(now.split)),
                    current=now.split,
                    initial=initial or {"base_revision": route.revision_number})


def _render_route_detail(request: HttpRequest, route: Route, *, now: RouteNow | None = None,
                         form: RampForm | None = None, status: int = 200,
                         capacity: bool = False) -> HttpResponse:
    now = now or RouteNow.read(route)
    current, split, eligible = now.current, now.split, now.eligible
    form = form or _ramp_form(route, now)
    colours = pool_colours([*split, *(pool.name for pool in form.pools)])
    rates = selectors.route_pool_rates(route=route, pools=eligible | set(split))
    tier_pools = route_tier_pools(route)
    tier_live = route_tier_live(route, tier_pools)
    context: dict[str, Any] = {
        "route": route,
        "current": current,
        "split": [(pool, share, colours[pool]) for pool, share in split.items()],
        "split_figure": figure_data(charts.split_figure(
            split, colours=colours, revision=route.revision_number)) if split else None,
        "history": [_diff(rev) for rev in selectors.revision_history(
            route=route, limit=HISTORY_LIMIT)],
        "history_limit": HISTORY_LIMIT,
        "gateway_pushes": selectors.route_gateway_pushes(route=route),
        "form": form,
        "not_eligible": {pool.name for pool in form.pools} - eligible,
        "outside_pin": selectors.pools_outside_pin(route=route),
        "tiers": tier_pools,
        "tier_live": tier_live,
        "tier_unknown": tier_live["tiers"].get(PROMPT_TOKENS_UNKNOWN),
        # Read per pool (evidence, stage): loaded after the page (htmx), or with ?capacity.
        "capacity": route_capacity_split(route=route) if capacity else None,
        "tier_behaviours": ContextTier.Behaviour.choices,
        "tier_blank_rows": range(TIER_ROWS_BLANK),
        "rates_figure": figure_data(charts.pool_rates_figure(rates, colours=colours))
        if rates else None,
        "rate_rows": sorted(((point["at"], pool, point) for pool, points in rates.items()
                             for point in points), key=lambda row: (row[0], row[1]),
                            reverse=True),
    }
    return render(request, "traffic/route_detail.html", context, status=status)


@dashboard_view
@require_GET
def route_detail(request: HttpRequest, name: str) -> HttpResponse:
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    if request.htmx.target == CAPACITY_ID:  # type: ignore[attr-defined]
        return render(request, "traffic/_capacity.html",
                      {"route": route, "capacity": route_capacity_split(route=route)})
    return _render_route_detail(request, route, capacity="capacity" in request.GET)


@dashboard_view
@require_POST
def route_ramp(request: HttpRequest, name: str) -> HttpResponseBase:
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    now = RouteNow.read(route)
    form = _ramp_form(route, now, request.POST)

    def refused(done: Outcome[SplitRevision]) -> HttpResponse:
        if done.status != 409:
            return _render_route_detail(request, route, now=now, form=form,
                                        status=done.status)
        # Someone changed the split meanwhile: show the fresh split, and keep what this
        # person typed (now based on the fresh revision) so they can compare and decide.
        fresh = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
        fresh_now = RouteNow.read(fresh)
        typed = form.cleaned_data
        retyped = _ramp_form(fresh, fresh_now, initial={
            "weights": {pool: f"{share:g}" for pool, share in typed["weights"].items()},
            "reason": typed["reason"], "force": typed["force"],
            "base_revision": fresh.revision_number,
        })
        retyped.stale = True
        return _render_route_detail(request, fresh, now=fresh_now, form=retyped,
                                    status=done.status)

    return form_action(
        request, form, lambda data: services.revision_create(
            actor=actor_from_request(request), route=route, weights=data["weights"],
            base_revision=data["base_revision"], reason=data["reason"], force=data["force"]),
        success=lambda revision: f"Route {route.name} is now at revision {revision.number}; "
                                 f"pushing to its gateways.",
        then=lambda _revision: reverse("traffic:route-detail", args=[route.name]),
        invalid=refused, flash_refusals=True)


# --- drains ----------------------------------------------------------------------------------

def _drain_confirm(request: HttpRequest, *, route: Route | None, pool: Pool | None
                   ) -> HttpResponseBase:
    """The confirm page for a route or a pool drain: what would move, then type the name."""
    target = route or pool
    assert target is not None
    what = "route" if route is not None else "pool"
    form = DrainForm(request.POST if request.method == "POST" else None,
                     expected=target.name, what=what)

    def shown() -> dict[str, Any]:
        preview = selectors.drain_preview(route=route, pool=pool)
        return {"what": what, "target": target, "route": route, "pool": pool,
                "preview": preview, "ramps_ended": _ramps_a_drain_ends(preview)}

    return form_page(
        request, form, lambda data: _pushed(services.drain_request(
            actor=actor_from_request(request), reason=data["reason"], route=route, pool=pool,
            force=bool(data.get("force")), stepping=True)),
        template="traffic/drain_confirm.html", context=shown,
        # A fact, not a progress report: this message stays on the page while the
        # progress block below follows the drain to its end.
        success=lambda drain: f"Drain {drain.pk} of {what} {target.name} requested.",
        then=_drain_url, flash_refusals=True)


def _pushed(drain: Drain) -> Drain:
    """A drain or restore the service committed, with its first attempt at every gateway
    made here (the converge task makes it should this process die first)."""
    drain_push_now(drain)
    return drain


def _drain_url(drain: Drain) -> str:
    return reverse("traffic:drain-detail", args=[drain.pk])


def _ramps_a_drain_ends(preview: list[selectors.DrainPreview]) -> list[tuple[Route, Hold]]:
    """The active ramps whose pool this drain takes off their route: it ends them."""
    routes = {row.route.pk: row for row in preview}
    return [(routes[hold.route_id].route, hold)
            for hold in holds_on(route_ids=list(routes))
            if hold.active and hold.pool in routes[hold.route_id].removed]


@dashboard_view
@require_http_methods(["GET", "POST"])
def route_drain(request: HttpRequest, name: str) -> HttpResponseBase:
    route = get_or_404(selectors.route_get, name=name, what=f"route named {name!r}")
    return _drain_confirm(request, route=route, pool=None)


@dashboard_view
@require_http_methods(["GET", "POST"])
def pool_drain(request: HttpRequest, name: str) -> HttpResponseBase:
    pool = get_or_404(selectors.pool_get, name=name, what=f"pool named {name!r}")
    return _drain_confirm(request, route=None, pool=pool)


def _ms_since(start: datetime, at: datetime | None) -> float | None:
    return None if at is None else (at - start).total_seconds() * 1000


@dataclass
class Step:
    """One line of a drain's timeline; `at` None means not reached yet."""

    label: str
    at: datetime | None
    ms: float | None
    state: str  # done | waiting | failing | gone (its gateway was deleted)
    detail: str = ""


def _timeline(drain: Drain, pushes: list[GatewayPush]) -> list[Step]:
    start = drain.requested_at
    steps = [Step("requested", start, 0.0, "done", f"by {drain.requested_by}")]
    for push in pushes:
        where = f"{push.gateway_label} · {push.revision.route.name} r{push.revision.number}"
        failing = push.status in (GatewayPush.Status.RETRYING, GatewayPush.Status.FAILED)
        if push.status == GatewayPush.Status.ABANDONED:
            steps.append(Step(f"{where}: deleted before verifying", push.gateway_deleted_at,
                              _ms_since(start, push.gateway_deleted_at), "gone",
                              "the gateway was deleted; nothing verified this revision on it"))
            continue
        if push.status == GatewayPush.Status.SUPERSEDED:
            steps.append(Step(f"{where}: superseded", None, None, "done",
                              "a later push carried a newer state"))
            continue
        steps.append(Step(f"{where}: applied", push.applied_at,
                          _ms_since(start, push.applied_at),
                          "done" if push.applied_at else "failing" if failing else "waiting",
                          push.last_error if failing else ""))
        steps.append(Step(f"{where}: verified", push.verified_at,
                          _ms_since(start, push.verified_at),
                          "done" if push.verified_at else "failing" if failing else "waiting"))
    gone = sorted({p.gateway_label for p in pushes
                   if p.status == GatewayPush.Status.ABANDONED})
    steps.append(Step("every remaining gateway verified" if gone else "every gateway verified",
                      drain.verified_at, drain.verified_ms,
                      "done" if drain.verified_at else "waiting",
                      f"{', '.join(gone)} deleted before verifying" if gone
                      else "" if pushes else "no gateway carries these routes"))
    steps.append(Step("in-flight requests to drained pools at zero", drain.in_flight_zero_at,
                      _ms_since(start, drain.in_flight_zero_at),
                      "done" if drain.in_flight_zero_at else "waiting"))
    if drain.status == Drain.Status.FAILED:
        steps.append(Step("failed", None, None, "failing", drain.failure_reason))
        return steps
    steps.append(Step("complete", drain.completed_at, drain.duration_ms,
                      "done" if drain.completed_at else "waiting"))
    return steps


def _still_watched(drain: Drain) -> bool:
    """Poll while the record can still change: an open drain is followed until it completes
    (the converge task looks at every open drain every few seconds, however old)."""
    return drain.status not in TERMINAL


@dashboard_view
@require_GET
def drain_detail(request: HttpRequest, drain_id: int) -> HttpResponse:
    drain = get_or_404(selectors.drain_get, drain_id=drain_id,
                       what=f"drain with id {drain_id}")
    pushes = selectors.drain_gateway_times(drain=drain)
    restored_by = list(drain.restored_by.all())
    # The ramps this drain ended (or, for a restore, whose share it did not give back).
    ended_by = drain.restores if drain.action == Drain.Action.RESTORE else drain
    ramps_ended = [hold for hold in holds_on(
        route_ids=selectors.drain_route_ids(drain=ended_by),
        drain=ended_by) if not hold.active] if ended_by is not None else []
    context: dict[str, Any] = {
        "drain": drain,
        "ramps_ended": ramps_ended,
        "pushes": pushes,
        "steps": _timeline(drain, pushes),
        "gateways_gone": [p for p in pushes if p.status == GatewayPush.Status.ABANDONED],
        "polling": _still_watched(drain),
        "restored_by": restored_by,
        "restorable": (drain.action == Drain.Action.DRAIN
                       and drain.status == Drain.Status.COMPLETE and not restored_by),
    }
    return page_or_block(request, "traffic/drain_detail.html", "traffic/_drain_progress.html",
                         context, block_id=PROGRESS_ID)


@dashboard_view
@require_http_methods(["GET", "POST"])
def drain_restore(request: HttpRequest, drain_id: int) -> HttpResponseBase:
    drain = get_or_404(selectors.drain_get, drain_id=drain_id,
                       what=f"drain with id {drain_id}")
    form = RestoreForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: _pushed(services.drain_restore(
            actor=actor_from_request(request), drain=drain, reason=data["reason"])),
        template="traffic/drain_restore.html", context=lambda: _restore_context(drain),
        success=lambda restore: f"Restore {restore.pk} of the split from before drain "
                                f"{drain.pk} requested.",
        then=_drain_url, flash_refusals=True)


def _restore_context(drain: Drain) -> dict[str, Any]:
    """The restore page: per route, the split it goes back to and what a ramp keeps back."""
    revisions = selectors.drain_revisions(drain=drain)
    holds = holds_on(route_ids=[rev.route_id for rev in revisions], drain=drain)
    rows = []
    for rev in revisions:
        weights, withheld = selectors.restore_target(revision=rev, route=rev.route,
                                                     holds=holds)
        before = rev.parent.weights if rev.parent else {}
        rows.append({"revision": rev, "parent": rev.parent,
                     "withheld": [(hold, before.get(hold.pool, 0) / 100) for hold in withheld],
                     "back_to": as_percentages(weights), "unchanged": weights == rev.weights})
    return {"drain": drain, "rows": rows, "already": list(drain.restored_by.all())}


@dashboard_view
@require_GET
def drain_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.drain_list(with_restores=True),
                     DRAINS_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "traffic/drain_list.html", {
        "page": page,
        "drains_url": reverse("traffic:drain-detail", args=[0]).removesuffix("0/"),
    })
