"""Schedules dashboard: the list (/schedules/), a schedule's page with its history, the add
and edit forms, enable / disable and delete. The plan page's Schedules panel
(templates/schedules/_plan_panel.html) links here. Writes need `jobs` (the services check);
notes and refusals are free text, shown through autoescape."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.views import button_action, form_page, get_or_404
from fleetctl.schedules import selectors, services
from fleetctl.schedules.forms import ScheduleEditForm, ScheduleForm
from fleetctl.schedules.models import Schedule

RUNS_PER_PAGE = 50


def _schedule(schedule_id: int) -> Schedule:
    return get_or_404(selectors.schedule_get, schedule_id,
                      what=f"schedule with id {schedule_id}")


def _detail_url(schedule: Schedule) -> str:
    return reverse("schedules:detail", kwargs={"schedule_id": schedule.pk})


@dashboard_view
@require_GET
def schedule_list(request: HttpRequest) -> HttpResponse:
    return render(request, "schedules/list.html", {"schedules": selectors.schedule_list()})


@dashboard_view
@require_http_methods(["GET", "POST"])
def schedule_create(request: HttpRequest) -> HttpResponseBase:
    """The add form; `?plan=<name>` (the plan page's link) preselects the plan."""
    initial = {"plan": request.GET.get("plan", ""), "kind": request.GET.get("kind", "")}
    form = ScheduleForm(request.POST if request.method == "POST" else None, initial=initial)
    return form_page(
        request, form, lambda _data: services.schedule_create(
            actor=actor_from_request(request), **form.service_kwargs()),
        success=lambda made: f"Added schedule {made.pk}: {made.get_kind_display()} of "
                             f"{made.target_name} at {made.cron} ({made.timezone}).",
        then=_detail_url, template="schedules/form.html")


@dashboard_view
@require_http_methods(["GET", "POST"])
def schedule_edit(request: HttpRequest, schedule_id: int) -> HttpResponseBase:
    schedule = _schedule(schedule_id)
    initial = {"cron": schedule.cron, "timezone": schedule.timezone,
               "window_minutes": schedule.window_minutes, "enabled": schedule.enabled,
               "note": schedule.note,
               "eval_suite": str(schedule.eval_suite_id or "")}
    form = ScheduleEditForm(request.POST if request.method == "POST" else None,
                            initial=initial)
    return form_page(
        request, form, lambda _data: services.schedule_update(
            actor=actor_from_request(request), schedule=schedule, **form.service_kwargs()),
        success=lambda saved: f"Saved schedule {saved.pk}.", then=_detail_url,
        template="schedules/form.html", context=lambda: {"schedule": schedule})


@dashboard_view
@require_POST
def schedule_toggle(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _schedule(schedule_id)
    page = _detail_url(schedule)
    return button_action(
        request, lambda: services.schedule_update(actor=actor_from_request(request),
                                                  schedule=schedule,
                                                  enabled=not schedule.enabled),
        success=lambda saved: f"Schedule {saved.pk} "
                              f"{'enabled' if saved.enabled else 'disabled'}.",
        then=lambda _: page, back=page)


@dashboard_view
@require_POST
def schedule_delete(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _schedule(schedule_id)
    page = _detail_url(schedule)
    if request.POST.get("confirm") != "yes":
        messages.error(request, f"Tick the box to confirm deleting schedule {schedule.pk} and "
                                f"its history.")
        return redirect(page)
    back = (reverse("plans:detail", kwargs={"name": schedule.plan.name})
            if schedule.plan is not None
            else reverse("schedules:list"))
    return button_action(
        request, lambda: services.schedule_delete(actor=actor_from_request(request),
                                                  schedule=schedule),
        success=lambda _: f"Deleted schedule {schedule_id}.", then=lambda _: back, back=page)


@dashboard_view
@require_GET
def schedule_detail(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = _schedule(schedule_id)
    page = Paginator(selectors.runs_of(schedule), RUNS_PER_PAGE).get_page(
        request.GET.get("page"))
    rows = [(run, selectors.job_url(run)) for run in page]
    return render(request, "schedules/detail.html",
                  {"schedule": schedule, "page": page, "rows": rows})
