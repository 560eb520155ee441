"""Conformance dashboard: the runs, starting one, the run page (every case side by side on
the pool's endpoints and the reference, what failed and why, a plain summary) and the
button on a plan's stage-1 gate. htmx re-polls the run's live block every 2 s while it can
still change."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.conformance import routing_services, selectors, services
from fleetctl.conformance.filters import RunFilter
from fleetctl.conformance.forms import RunForm
from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.views import (
    button_action,
    filtered_page,
    form_page,
    get_or_404,
    page_or_block,
    run_cancel_view,
)
from migrations_plan import selectors as plans

LIVE_ID = "conformance-live"
PAGE_SIZE = 25


def _run(run_id: int) -> ConformanceRun:
    return get_or_404(selectors.run_get, run_id=run_id,
                      what=f"conformance run with id {run_id}")


@dashboard_view
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    runs, page = filtered_page(request, RunFilter, selectors.run_list(), PAGE_SIZE)
    return render(request, "conformance/home.html", {
        "filter": runs, "page": page, "suite": selectors.suite_table()})


def _run_page(run: ConformanceRun) -> str:
    return reverse("conformance:run-detail", kwargs={"run_id": run.pk})


@dashboard_view
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest) -> HttpResponseBase:
    initial = {k: request.GET[k] for k in ("pool", "plan", "primary", "model") if k in request.GET}
    form = RunForm(request.POST if request.method == "POST" else None, initial=initial)
    return form_page(
        request, form, lambda _: services.run_create(actor=actor_from_request(request),
                                                     **form.service_kwargs()),
        success=lambda run: f"Started conformance run {run.pk} of {run.pool.name}.",
        then=_run_page, template="conformance/run_form.html", flash_refusals=True)


@dashboard_view
@require_POST
def plan_run(request: HttpRequest, name: str) -> HttpResponse:
    """The stage-1 gate's button: the plan's candidate against its primary, on the model its
    routes serve."""
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    return button_action(
        request, lambda: services.run_create(actor=actor_from_request(request),
                                             pool=plan.candidate_pool, plan=plan),
        success=lambda run: f"Started conformance run {run.pk} of "
                            f"{plan.candidate_pool.name} against {plan.primary_pool.name}.",
        then=_run_page, back=reverse("plans:detail", args=[plan.name]))


@dashboard_view
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(run_id)
    context = {"run": run, "lines": selectors.case_lines(run=run),
               "progress": selectors.progress(run=run), "live_id": LIVE_ID,
               "polling": run.status in ConformanceRun.ACTIVE,
               "endpoints": list(run.pool.base_urls or [])}
    return page_or_block(request, "conformance/run_detail.html", "conformance/_run_live.html",
                         context, block_id=LIVE_ID)


@dashboard_view
@require_POST
def plan_routing_probe(request: HttpRequest, name: str) -> HttpResponse:
    """The stage-4 gate's button: a routing probe of each of the plan's routes."""
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    back = reverse("plans:detail", args=[plan.name])
    return button_action(
        request, lambda: routing_services.plan_probes_create(actor=actor_from_request(request),
                                                             plan=plan),
        success=lambda probes: "Started routing probe " + ", ".join(
            f"{p.pk} of {p.route.name}" for p in probes) + ".",
        then=lambda probes: (reverse("conformance:routing-probe-detail", args=[probes[0].pk])
                             if len(probes) == 1 else back), back=back)


@dashboard_view
@require_GET
def routing_probe_detail(request: HttpRequest, probe_id: int) -> HttpResponse:
    probe = get_or_404(selectors.routing_probe_get, probe_id=probe_id,
                       what=f"routing probe with id {probe_id}")
    return render(request, "conformance/routing_probe.html", {"probe": probe})


run_cancel = dashboard_view(run_cancel_view(
    _run, lambda request, run: services.run_cancel(actor=actor_from_request(request), run=run),
    detail="conformance:run-detail",
    said=lambda run: f"Cancelled conformance run {run.pk}; the cases judged so far are kept."))
