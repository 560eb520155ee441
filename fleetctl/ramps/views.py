"""Ramps dashboard: the list of ramps, a ramp's page (its state and why, the weight stepped
over time with every decision marked, the candidate against the primary with the SLO drawn,
the guard's decisions with the numbers behind them, the pause/resume/skip/abort buttons and
the rollback drain), and the start form that the route page's Ramps panel posts to.

The ramp page's live block (state, the figures the guard reads now) and its decisions are
re-polled by htmx every 2 s while the ramp is running or paused; the charts every 10 s.
A poll that sees the state changed since the page loaded asks htmx to reload the page once,
so the buttons offered match the state (the action forms sit outside the polled block, so a
reason being typed is not wiped by a poll).

Reasons, event messages and gateway errors are free text: every one reaches the page through
the template's autoescape or `json_script`, never `|safe`.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.charts import figure_data
from fleetctl.core.views import form_action, form_page, get_or_404, refresh_if_changed
from fleetctl.fleet import selectors as fleet
from fleetctl.fleet.models import Pool
from fleetctl.ramps import charts, selectors, services
from fleetctl.ramps.forms import (
    RampActionForm,
    RampFilterForm,
    RampStartForm,
    WatchActionForm,
    steps_text,
)
from fleetctl.ramps.models import ACTIVE_STATES, Ramp, RampEvent, Watch
from fleetctl.telemetry import selectors as telemetry
from fleetctl.traffic import selectors as traffic
from fleetctl.traffic.models import Route

LIVE_ID = "ramp-live"
CHARTS_ID = "ramp-charts"
DECISIONS_ID = "ramp-decisions"
PAGE_SIZE = 50
# The service's argument names the start form calls otherwise.
FORM_FIELDS = {"slo_error_rate": "slo_error_pct"}
ACTIONS = {"pause": services.ramp_pause, "resume": services.ramp_resume,
           "skip": services.ramp_skip, "abort": services.ramp_abort}
ACTION_DONE = {"pause": "Paused", "resume": "Resumed", "skip": "Skipped the hold of",
               "abort": "Aborted"}
# Which state each action is offered in.
ACTION_STATES = {"pause": ("running",), "resume": ("paused",), "skip": ("running",),
                 "abort": ACTIVE_STATES}


def _ramp(ramp_id: int) -> Ramp:
    return get_or_404(selectors.ramp_detail, ramp_id, what=f"ramp with id {ramp_id}")


def _pool(name: str) -> Pool:
    return get_or_404(fleet.pool_get, name=name, what=f"pool named {name!r}")


def _route(name: str) -> Route:
    return get_or_404(traffic.route_get, name=name, what=f"route named {name!r}")


# ---- the start form (also rendered by the route page's Ramps panel) --------------------------

def start_pools(route: Route) -> list[str]:
    """The pools a ramp on `route` may step up: eligible for it, other than its primary."""
    return sorted(traffic.pools_eligible(route=route) - {route.primary_pool.name})


# The steps a new ramp is offered (those above the pool's current weight), percent → hold.
LADDER = ((1, 60), (5, 60), (10, 120), (25, 300), (50, 300))


def start_form(route: Route, data: Any = None) -> RampStartForm:
    """The form prefilled for the likeliest ramp: a stage-4 plan's candidate with its
    thresholds, else the pool already holding the most weight besides the primary, with the
    usual steps above that weight (a ramp only raises weight)."""
    pools = start_pools(route)
    current = traffic.revision_current(route=route)
    split = current.percentages() if current else {}
    # A stage-4 plan's candidate and thresholds prefill the form (the service uses the plan
    # of the pool chosen).
    plans = [plan for plan in selectors.stage4_plans(route) if plan.candidate_pool.name in pools]
    initial: dict[str, Any] = {}
    if plans:
        plan = plans[0]
        initial.update(pool=plan.candidate_pool.name, slo_ttft_p95_ms=plan.slo_ttft_p95_ms,
                       slo_tpot_p95_ms=plan.slo_tpot_p95_ms,
                       slo_error_pct=round(plan.slo_error_rate * 100, 4),
                       latency_margin_pct=plan.latency_margin_pct,
                       slo_e2e_p95_ms=plan.slo_e2e_p95_ms)
    elif holding := sorted((p for p in pools if split.get(p)), key=lambda p: -split[p]):
        initial["pool"] = holding[0]
    now = split.get(initial.get("pool", ""), 0.0)
    initial["steps"] = steps_text([{"percent": p, "hold_s": h} for p, h in LADDER if p > now])
    form = RampStartForm(data, pools=pools, initial=initial)
    form.plans = plans  # type: ignore[attr-defined]
    return form


@dashboard_view
@require_http_methods(["GET", "POST"])
def ramp_start(request: HttpRequest, route: str) -> HttpResponseBase:
    """The form on a page of its own (the route page's panel posts here): a refused start is
    shown with the service's message and what was typed."""
    the_route = _route(route)
    form = start_form(the_route, request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: services.ramp_create(
            actor=actor_from_request(request), route=the_route,
            pool=_pool(form.cleaned_data["pool"]), **form.service_kwargs()),
        success=lambda ramp: (f"Started ramp {ramp.pk}: {ramp.pool.name} on {the_route.name}, "
                              f"{len(ramp.steps)} steps."),
        then=detail_url, template="ramps/start.html", renamed=FORM_FIELDS,
        context=lambda: {"route": the_route, "active": selectors.ramp_active_for(the_route)})


# ---- list ------------------------------------------------------------------------------------

@dashboard_view
@require_GET
def ramp_list(request: HttpRequest) -> HttpResponse:
    form = RampFilterForm(request.GET or None)
    if not form.is_bound:
        ramps = selectors.ramp_list()
    elif form.is_valid():
        data = form.cleaned_data
        ramps = selectors.ramps_filtered(state=data.get("state") or "",
                                         route=data.get("route") or "",
                                         pool=data.get("pool") or "")
    else:  # a filter it cannot read lists nothing, and says why
        ramps = selectors.ramp_list().none()
    page = Paginator(ramps, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "ramps/list.html", {"filter_form": form, "page": page})


# ---- the ramp page ---------------------------------------------------------------------------

def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    number = float(value)
    if unit == "rate":
        return f"{number * 100:.2f} %"
    if unit == "ms":
        return f"{number:,.0f} ms" if number >= 10 else f"{number:.1f} ms"
    return f"{number:g}"


METRIC_ROWS = (("error_rate", "error rate", "rate"), ("ttft_p95", "TTFT p95", "ms"),
               ("tpot_p95", "TPOT p95", "ms"))


def number_rows(numbers: Any) -> list[dict[str, str]]:
    """The figures a decision used, one row each: whose, what, the estimate with its
    interval and sample count, and where it came from. Reads the shape the guard stores
    (per role a PoolStats as a dict, the thresholds, the window) and skips what is absent."""
    rows: list[dict[str, str]] = []
    if not isinstance(numbers, dict):
        return rows
    for role in ("candidate", "primary"):
        stats = numbers.get(role)
        if not isinstance(stats, dict):
            continue
        pool = str(stats.get("pool") or "")
        if stats.get("requests") is not None:
            rows.append({"who": f"{role} {pool}".strip(), "what": "requests",
                         "value": f"{stats['requests']:,}" if isinstance(stats["requests"], int)
                         else str(stats["requests"]),
                         "interval": "", "n": "", "source": ", ".join(
                             str(s) for s in stats.get("sources") or [])})
        if stats.get("client_disconnects") is not None:  # decisions stored before had none
            share = stats.get("disconnect_rate") or {}
            rows.append({"who": f"{role} {pool}".strip(), "what": "client disconnects",
                         "value": f"{stats['client_disconnects']:,}"
                         + (f" ({_fmt(share['value'], 'rate')})"
                            if share.get("value") is not None else ""),
                         "interval": "", "n": "",
                         "source": "requests the client abandoned: not counted against the "
                                   "pool"})
        for key, label, unit in METRIC_ROWS:
            figure = stats.get(key)
            if not isinstance(figure, dict):
                continue
            low, high = figure.get("low"), figure.get("high")
            rows.append({
                "who": f"{role} {pool}".strip(), "what": label,
                "value": _fmt(figure.get("value"), unit),
                "interval": (f"[{_fmt(low, unit)}, {_fmt(high, unit)}]"
                             if low is not None or high is not None else ""),
                "n": str(figure.get("n", "")), "source": str(figure.get("source") or "")})
    thresholds = numbers.get("thresholds")
    if isinstance(thresholds, dict):
        for key, value in thresholds.items():
            unit = "rate" if "error" in key else "ms" if key.endswith("_ms") else ""
            text = _fmt(value, unit) if isinstance(value, int | float) else str(value)
            if key.endswith("_pct"):
                text += " %"
            rows.append({"who": "threshold", "what": key.removeprefix("slo_").replace("_", " "),
                         "value": text, "interval": "", "n": "", "source": ""})
    return rows


def _decisions(events: list[RampEvent]) -> list[dict[str, Any]]:
    return [{"event": event, "rows": number_rows(event.numbers),
             "raw": json.dumps(event.numbers, indent=1, sort_keys=True, default=str)
             if event.numbers else ""}
            for event in reversed(events)]


def _numbers_now(ramp: Ramp) -> dict[str, Any] | None:
    """What the guard would decide on the current step's window right now (not stored):
    the decision, its reasons, and each pool's figures in the order the table shows them."""
    judged = selectors.ramp_numbers_now(ramp)
    if judged is None:
        return None
    pools = [(role, judged.get(role)) for role in ("candidate", "primary")]
    return {**judged, "pools": [(role, stats) for role, stats in pools if stats]}


def _step(ramp: Ramp, now: datetime) -> dict[str, Any]:
    step = ramp.current_step
    held = ((now - ramp.step_started_at).total_seconds()
            if ramp.step_started_at is not None else None)
    return {"number": ramp.step_index + 1, "of": len(ramp.steps),
            "percent": step["percent"] if step else None,
            "hold_s": step["hold_s"] if step else None,
            "held_s": held,
            "left_s": max(0.0, float(step["hold_s"]) - held) if step and held is not None
            else None}


def _live(ramp: Ramp, events: list[RampEvent]) -> dict[str, Any]:
    now = timezone.now()
    numbers_now = _numbers_now(ramp)
    return {"ramp": ramp, "live_id": LIVE_ID, "polling": ramp.active, "now": now,
            "step": _step(ramp, now), "numbers_now": numbers_now, "drain": ramp.drain,
            "reported": _reported_now(ramp, now) if numbers_now else []}


def _reported_now(ramp: Ramp, now: datetime) -> list[dict[str, Any]]:
    """Beside what the guard reads: each Prometheus telemetry source's figures of the two
    pools over the guard's window (pool-wide, every route; shown, never judged)."""
    from fleetctl.ramps.templatetags.ramps import ReportedRow

    pools = [(ramp.pool.name, "candidate"), (ramp.route.primary_pool.name, "primary")]
    found = telemetry.reported_of([name for name, _ in pools],
                                  since=now - timedelta(seconds=ramp.window_s), until=now)
    return [{"pool": name, "role": role, "source": ReportedRow.of(r)}
            for name, role in pools for r in found[name]]


def _decisions_block(ramp: Ramp, events: list[RampEvent]) -> dict[str, Any]:
    return {"ramp": ramp, "decisions_id": DECISIONS_ID, "polling": ramp.active,
            "decisions": _decisions(events)}


def _event_dicts(events: list[RampEvent]) -> list[dict[str, Any]]:
    return [{"kind": e.kind, "at": e.at, "percent": e.percent, "message": e.message}
            for e in events]


def _charts(ramp: Ramp, events: list[RampEvent]) -> dict[str, Any]:
    now = timezone.now()
    until = ramp.finished_at or now
    dicts = _event_dicts(events)
    points = charts.weight_points(
        start=ramp.created_at, start_percent=float((ramp.base_weights or {}).get(
            ramp.pool.name, 0.0)), events=dicts, until=until)
    timeline = charts.timeline_figure(points=points, events=dicts, pool=ramp.pool.name,
                                      planned=[float(s["percent"]) for s in ramp.steps])
    primary = ramp.route.primary_pool.name
    series = {pool: telemetry.pool_series(pool=pool, route=ramp.route.name,
                                          since=ramp.created_at, until=until)
              for pool in (ramp.pool.name, primary)}
    has_data = any(row.get("requests") for rows in series.values() for row in rows)
    pools = charts.pools_figure(
        candidate=ramp.pool.name, primary=primary, series=series,
        thresholds={"ttft": ramp.slo_ttft_p95_ms, "tpot": ramp.slo_tpot_p95_ms,
                    "error_rate": ramp.slo_error_rate},
        steps_at=[(e["at"], e["percent"]) for e in dicts if e["kind"] == "step"])
    return {"ramp": ramp, "charts_id": CHARTS_ID, "polling": ramp.active,
            "timeline_figure": figure_data(timeline),
            "pools_figure": figure_data(pools) if has_data else None}


def _render_detail(request: HttpRequest, ramp: Ramp, *, action_form: RampActionForm | None = None,
                   status: int = 200) -> HttpResponse:
    events = list(ramp.events.all())
    return render(request, "ramps/detail.html", {
        **_live(ramp, events), **_charts(ramp, events), **_decisions_block(ramp, events),
        "steps_text": steps_text(ramp.steps),
        "action_form": action_form,
        "offered": [a for a, states in ACTION_STATES.items() if ramp.state in states],
    }, status=status)


@dashboard_view
@require_GET
def ramp_detail(request: HttpRequest, ramp_id: int) -> HttpResponse:
    ramp = _ramp(ramp_id)
    target = request.htmx.target  # type: ignore[attr-defined]
    blocks = {LIVE_ID: ("ramps/_live.html", _live), CHARTS_ID: ("ramps/_charts.html", _charts),
              DECISIONS_ID: ("ramps/_decisions.html", _decisions_block)}
    if target in blocks:
        name, context = blocks[target]
        return refresh_if_changed(
            request, render(request, name, context(ramp, list(ramp.events.all()))), ramp.state)
    return _render_detail(request, ramp)


@dashboard_view
@require_POST
def ramp_action(request: HttpRequest, ramp_id: int) -> HttpResponseBase:
    """Pause, resume, skip (the ramp role) or abort (the drain role), always with a reason.
    A refusal (a role missing, the ramp no longer in a state that allows it) is shown on the
    page with its status; nothing changed."""
    ramp = _ramp(ramp_id)
    form = RampActionForm(request.POST)
    return form_action(
        request, form, lambda data: ACTIONS[data["action"]](
            actor=actor_from_request(request), ramp=ramp, reason=data["reason"]),
        success=lambda _: f"{ACTION_DONE[form.cleaned_data['action']]} ramp {ramp.pk}.",
        then=lambda _: detail_url(ramp), renamed=FORM_FIELDS,
        invalid=lambda done: _render_detail(request, _ramp(ramp_id), action_form=form,
                                            status=done.status))


def detail_url(ramp: Ramp) -> str:
    return reverse("ramps:detail", args=[ramp.pk])


# ---- standing watches ---------------------------------------------------------------------------

def _watch(watch_id: int) -> Watch:
    return get_or_404(lambda pk: selectors.watch_list().filter(pk=pk).first(), watch_id,
                      what=f"watch with id {watch_id}")


def _render_watch(request: HttpRequest, watch: Watch, *, form: WatchActionForm | None = None,
                  status: int = 200) -> HttpResponse:
    verdicts = selectors.watch_verdicts(watch, limit=200)
    counts: dict[str, int] = {}
    for row in watch.verdicts.values_list("verdict", flat=True):
        counts[row] = counts.get(row, 0) + 1
    return render(request, "ramps/watch.html", {
        "watch": watch, "verdicts": verdicts, "counts": counts, "form": form}, status=status)


@dashboard_view
@require_GET
def watch_detail(request: HttpRequest, watch_id: int) -> HttpResponse:
    return _render_watch(request, _watch(watch_id))


@dashboard_view
@require_POST
def watch_action(request: HttpRequest, watch_id: int) -> HttpResponseBase:
    """Change a watch's policy or end it (the ramp role), with a reason; a refusal is shown
    on the page with its status, nothing changed."""
    watch = _watch(watch_id)
    form = WatchActionForm(request.POST)

    def call(data: dict[str, Any]) -> Watch:
        actor = actor_from_request(request)
        if data["action"] == "end":
            return services.watch_end(actor=actor, watch=watch, reason=data["reason"])
        return services.watch_set_policy(actor=actor, watch=watch, policy=data["policy"],
                                         reason=data["reason"])

    return form_action(
        request, form, call,
        success=lambda w: (f"Ended watch {w.pk}." if form.cleaned_data["action"] == "end"
                           else f"Watch {w.pk}: policy {w.policy}."),
        then=lambda w: reverse("ramps:watch", args=[w.pk]),
        invalid=lambda done: _render_watch(request, _watch(watch_id), form=form,
                                           status=done.status))
