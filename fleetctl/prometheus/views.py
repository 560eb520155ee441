"""Metric-source pages: the list (with each source's last outcome and who reads it), a form
to add or change one (administrators), its page with a test query, and delete (refused while
a gate check or a ramp reads it). The services decide; these pages only call them."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.views import button_action, call_for_form, form_page, get_or_404
from fleetctl.prometheus import selectors, services
from fleetctl.prometheus.forms import MetricSourceForm, TestQueryForm
from fleetctl.prometheus.models import MetricSource


def _detail_url(source: MetricSource) -> str:
    return reverse("metric_sources:detail", args=[source.name])


def _get(name: str) -> MetricSource:
    return get_or_404(selectors.source_by_name, name, what=f"metric source named {name}")


@dashboard_view
@require_GET
def source_list(request: HttpRequest) -> HttpResponse:
    users = selectors.source_users_by_name()
    rows = [(source, users.get(source.name, [])) for source in selectors.source_list()]
    return render(request, "prometheus/list.html", {"rows": rows})


@dashboard_view
@require_http_methods(["GET", "POST"])
def source_create(request: HttpRequest) -> HttpResponseBase:
    actor = actor_from_request(request)
    form = MetricSourceForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda _data: services.source_create(actor=actor, **form.changes()),
        success=lambda source: f"Added metric source {source.name}.", then=_detail_url,
        template="prometheus/form.html")


@dashboard_view
@require_http_methods(["GET", "POST"])
def source_edit(request: HttpRequest, name: str) -> HttpResponseBase:
    source = _get(name)
    actor = actor_from_request(request)
    initial = {"name": source.name, "kind": source.kind, "base_url": source.base_url,
               "timeout_s": source.timeout_s}
    form = MetricSourceForm(request.POST if request.method == "POST" else None,
                            initial=initial, editing=True)

    def save(_data: object) -> MetricSource:
        changes = form.changes()
        changes.pop("name", None)
        return services.source_update(actor=actor, source=source, **changes)

    return form_page(request, form, save,
                     success=lambda saved: f"Saved metric source {saved.name}.",
                     then=_detail_url, template="prometheus/form.html",
                     context=lambda: {"source": source})


def _detail(request: HttpRequest, source: MetricSource, test_form: TestQueryForm,
            result: object = None, status: int = 200) -> HttpResponse:
    return render(request, "prometheus/detail.html", {
        "source": source, "users": selectors.source_users(source), "test_form": test_form,
        "result": result}, status=status)


@dashboard_view
@require_GET
def source_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _detail(request, _get(name), TestQueryForm())


@dashboard_view
@require_POST
def source_test(request: HttpRequest, name: str) -> HttpResponse:
    """Ask the source now, through the checks' own query path, and show what it answered
    (or why it did not) on the source's page."""
    source = _get(name)
    form = TestQueryForm(request.POST)
    if not form.is_valid():
        return _detail(request, source, form, status=400)
    done = call_for_form(lambda: services.source_test(
        actor=actor_from_request(request), source=source, **form.cleaned_data), form)
    source.refresh_from_db()
    return _detail(request, source, form, result=done.result, status=done.status)


@dashboard_view
@require_POST
def source_delete(request: HttpRequest, name: str) -> HttpResponse:
    source = _get(name)
    page = _detail_url(source)
    if request.POST.get("confirm") != "yes":
        messages.error(request, f"Tick the box to confirm deleting metric source {name}.")
        return redirect(page)
    return button_action(
        request, lambda: services.source_delete(actor=actor_from_request(request),
                                                source=source),
        success=lambda _: f"Deleted metric source {name}.",
        then=lambda _: reverse("metric_sources:list"), back=page)
