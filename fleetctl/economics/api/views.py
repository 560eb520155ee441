"""GET/PUT /api/v1/plans/{name}/business-case/: the plan's business case judged now, and its
inputs changed (scope `fleet.manage`). A PUT is one service call (economics.services), which
checks, audits on the plan and re-judges. GET /api/v1/plans/{name}/report/: the plan's
migration report (`?format=pdf|html|json`), for whoever may read the plan."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.api.renderers import OnlyRepresentation
from fleetctl.core.idempotency import action_body
from fleetctl.economics import report as reports
from fleetctl.economics import selectors, services
from fleetctl.economics.api.serializers import BusinessCaseInputSerializer, BusinessCaseSerializer
from fleetctl.economics.services import EDITABLE
from migrations_plan import selectors as plans
from migrations_plan.models import Plan


def _answer(plan: Plan) -> dict[str, Any]:
    inputs, case = selectors.case_of(plan)
    values = {name: getattr(inputs, name) for name in EDITABLE}
    return {"plan": plan.name,
            "inputs": {k: (str(v) if v is not None and not isinstance(v, str | int) else v)
                       for k, v in values.items()},
            **case.as_json(), "recorded_verdict": inputs.verdict,
            "judged_at": inputs.judged_at}


class BusinessCaseView(APIView):
    """A plan's business case: does the measured arbitrage pay for a second backend's ops
    burden at the plan's volume (docs/cost.md, "The business case")."""

    def _plan(self, name: str) -> Plan:
        return get_object_or_404(plans.plan_list(), name=name)

    @extend_schema(responses={200: BusinessCaseSerializer}, operation_id="plans_business_case")
    def get(self, request: Request, name: str) -> Response:
        """The case judged now: verdict, headline, numbers, what would change it, the
        capacity forecast, and the inputs (stored, or the defaults)."""
        return Response(BusinessCaseSerializer(_answer(self._plan(name))).data)

    @extend_schema(request=BusinessCaseInputSerializer, responses={200: BusinessCaseSerializer},
                   operation_id="plans_business_case_update")
    def put(self, request: Request, name: str) -> Response:
        """Change any of the inputs (the others keep their value); the case is judged again
        and a changed verdict recorded on the plan's timeline (scope `fleet.manage`)."""
        plan = self._plan(name)
        body = action_body(request, BusinessCaseInputSerializer)
        services.business_case_update(actor=actor_from_request(request), plan=plan, **body)
        return Response(BusinessCaseSerializer(_answer(plan)).data)


REPORT_FORMATS = {"pdf": "application/pdf", "html": "text/html; charset=utf-8",
                  "json": "application/json"}


class _FormatIsAParameter(OnlyRepresentation):
    """`?format=` picks the report's form here (the view reads it), not a DRF renderer;
    errors are answered in JSON."""


class ReportView(APIView):
    """A plan's migration report (docs/cost.md, "The migration report")."""

    renderer_classes = [JSONRenderer]
    content_negotiation_class = _FormatIsAParameter

    @extend_schema(
        operation_id="plans_report",
        description="The plan's migration report built from the rows now: method (traces, "
                    "SLO, sweep), per-backend conformance, evals and the divergence catalogue, "
                    "soak and drill, ramps and drain timings, costs and the business case, "
                    "every approval with the evidence hash it saw. `?format=pdf` (default; "
                    "WeasyPrint), `html` (the same document as a page) or `json` (its sections "
                    "as data). The same rows give the same bytes but for the generation time. "
                    "503 when the PDF's system libraries are missing (the message names them; "
                    "html and json still work).",
        parameters=[OpenApiParameter("format", str, enum=list(REPORT_FORMATS), default="pdf",
                                     description="pdf, html or json")],
        responses={(200, "application/pdf"): OpenApiResponse(OpenApiTypes.BINARY),
                   (200, "text/html"): OpenApiResponse(OpenApiTypes.STR),
                   (200, "application/json"): OpenApiResponse(
                       OpenApiTypes.OBJECT, description="{plan, title, generated_at, "
                                                        "rows_sha256, sections: [...]}"),
                   503: OpenApiResponse(
                       OpenApiTypes.OBJECT,
                       description="The PDF was asked and WeasyPrint cannot run here: the "
                                   "error's message names the packages to install.")})
    def get(self, request: Request, name: str) -> HttpResponse | Response:
        fmt = request.query_params.get("format", "pdf")
        if fmt not in REPORT_FORMATS:
            raise ValidationError({"format": [f"Unknown format {fmt[:40]!r}: use pdf, html or "
                                              f"json."]})
        plan = get_object_or_404(plans.plan_list(), name=name)
        at = timezone.now()
        if fmt == "pdf":
            body, filename = reports.pdf_download(plan, at)
            response = HttpResponse(body, content_type="application/pdf")
            response["Content-Disposition"] = f'attachment; filename="{filename}"'
            return response
        report = reports.build(plan, at)
        if fmt == "json":
            return Response(report.as_json())
        return HttpResponse(reports.render_html(report, at, links=reports.links(plan.name)),
                            content_type=REPORT_FORMATS["html"])
