"""Metric sources (administrators change them), the generated alerting rules and dashboards
of a pool and of a plan (downloads), and turning a plan's dashboards check measured."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleetctl.accounts.api.viewsets import ServiceModelViewSet
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.idempotency import action_body
from fleetctl.fleet import selectors as fleet
from fleetctl.prometheus import generate, selectors, services
from fleetctl.prometheus.api import serializers
from migrations_plan import selectors as plans


class MetricSourceViewSet(ServiceModelViewSet):
    """Where query checks read: a Prometheus or an HTTP JSON endpoint (administrators add,
    change and remove them; everyone who reads sees them, never their token)."""

    queryset = selectors.source_list()
    serializer_class = serializers.MetricSourceSerializer
    filterset_fields = ["kind"]
    lookup_field = "name"
    instance_kwarg = "source"
    create_service = services.source_create
    update_service = services.source_update
    delete_service = services.source_delete


def _download(body: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# A Prometheus rule file: YAML, whose document is {groups: [{name, rules: [...]}]}.
_YAML = {(200, "application/yaml"): OpenApiResponse(
    {"type": "object", "required": ["groups"], "properties": {"groups": {
        "type": "array", "items": {"type": "object", "additionalProperties": True}}}},
    description="A Prometheus rule file (YAML): load it with rule_files.")}
_JSON = {200: OpenApiResponse(OpenApiTypes.OBJECT, description="A Grafana dashboard (JSON "
                                                               "model).")}


class PoolAlertRulesView(APIView):
    @extend_schema(operation_id="pools_alert_rules", responses=_YAML)
    def get(self, request: Request, name: str) -> HttpResponse:
        """The pool's generated alerting rules (six alerts, group fleetctl-pool-<name>)."""
        pool = get_object_or_404(fleet.pool_list(), name=name)
        return _download(selectors.pool_rules_yaml(pool), "application/yaml",
                         f"{generate.group_name(pool.name)}.rules.yml")


class PoolDashboardView(APIView):
    @extend_schema(operation_id="pools_dashboard", responses=_JSON)
    def get(self, request: Request, name: str) -> Response:
        """The pool's generated Grafana dashboard."""
        pool = get_object_or_404(fleet.pool_list(), name=name)
        return Response(selectors.pool_dashboard(pool), headers={
            "Content-Disposition": f'attachment; filename="fleetctl-pool-{pool.name}.json"'})


class PlanAlertRulesView(APIView):
    @extend_schema(operation_id="plans_alert_rules", responses=_YAML)
    def get(self, request: Request, name: str) -> HttpResponse:
        """The plan's generated alerting rules: the candidate's and the primary's groups on
        the plan's SLO."""
        plan = get_object_or_404(plans.plan_list(), name=name)
        return _download(selectors.plan_rules_yaml(plan), "application/yaml",
                         f"fleetctl-plan-{plan.name}.rules.yml")


class PlanDashboardView(APIView):
    @extend_schema(operation_id="plans_dashboard", responses=_JSON)
    def get(self, request: Request, name: str) -> Response:
        """The plan's generated Grafana dashboard (candidate and primary side by side)."""
        plan = get_object_or_404(plans.plan_list(), name=name)
        return Response(selectors.plan_dashboard(plan), headers={
            "Content-Disposition": f'attachment; filename="fleetctl-plan-{plan.name}.json"'})


class DashboardsMeasuredView(APIView):
    @extend_schema(operation_id="plans_dashboards_measured",
                   request=serializers.DashboardsMeasuredSerializer,
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT)})
    def post(self, request: Request, name: str) -> Response:
        """Stage 2's dashboards check becomes measured: the source's rules API is asked for
        the candidate's generated alerts (scope: approve)."""
        plan = get_object_or_404(plans.plan_list(), name=name)
        body = action_body(request, serializers.DashboardsMeasuredSerializer)
        check = services.dashboards_measured(actor=actor_from_request(request), plan=plan,
                                             source=body["source"])
        return Response({"plan": plan.name, "stage": check.stage, "key": check.key,
                         "rule": check.rule, "params": check.params, "title": check.title})
