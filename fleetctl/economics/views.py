"""The business case page of a plan (/plans/<name>/business-case/): the verdict with its
numbers and what would change it, the capacity forecast, and the editable burden table
(writes need `fleet.manage`, the service checks). The plan's migration report
(/plans/<name>/report/ and /plans/<name>/report.pdf): whoever may read the plan."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.errors import UnavailableError
from fleetctl.core.views import form_page, get_or_404
from fleetctl.economics import report as reports
from fleetctl.economics import selectors, services
from fleetctl.economics.forms import BusinessCaseForm, initial_of
from migrations_plan import selectors as plans


@dashboard_view
@require_http_methods(["GET", "POST"])
def business_case_page(request: HttpRequest, name: str) -> HttpResponseBase:
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    inputs = selectors.business_case_of(plan)
    form = BusinessCaseForm(request.POST if request.method == "POST" else None,
                            initial=initial_of(inputs))
    page = reverse("economics:business-case", kwargs={"name": plan.name})

    def context() -> dict[str, object]:
        row, case = selectors.case_of(plan)
        return {"plan": plan, "case": case, "inputs": row,
                "burden_fields": [form[r["field"]] for r in case.burden_rows]}

    return form_page(
        request, form, lambda _data: services.business_case_update(
            actor=actor_from_request(request), plan=plan, **form.service_kwargs()),
        success=lambda case: f"Saved. The business case now: {case.verdict_words}.",
        then=lambda _case: page, template="economics/page.html", context=context)


@dashboard_view
@require_GET
def report_page(request: HttpRequest, name: str) -> HttpResponse:
    """The migration report as a printable page (the PDF's template, with a print
    stylesheet and links back)."""
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    at = timezone.now()
    return HttpResponse(reports.render_html(reports.build(plan, at), at,
                                            links=reports.links(plan.name)))


@dashboard_view
@require_GET
def report_pdf(request: HttpRequest, name: str) -> HttpResponse:
    """The migration report as a PDF; 503 naming the packages when WeasyPrint cannot run."""
    plan = get_or_404(plans.plan_get, name=name, what=f"plan named {name!r}")
    try:
        body, filename = reports.pdf_download(plan, timezone.now())
    except UnavailableError as exc:
        return HttpResponse(exc.message, status=503, content_type="text/plain; charset=utf-8")
    response = HttpResponse(body, content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
