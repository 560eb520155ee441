"""The business case page of a plan (/plans/<name>/business-case/): the verdict with its
numbers and what would change it, the capacity forecast, and the editable burden table
(writes need `fleet.manage`, the service checks)."""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.views import form_page, get_or_404
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
