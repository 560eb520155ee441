"""GET/PUT /api/v1/plans/{name}/business-case/: the plan's business case judged now, and its
inputs changed (scope `fleet.manage`). A PUT is one service call (economics.services), which
checks, audits on the plan and re-judges."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.idempotency import action_body
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
