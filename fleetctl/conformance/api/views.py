"""Conformance runs over REST. Reading needs `read`; starting and cancelling a run need
`jobs` (checked by the services, which audit refusals)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.conformance import routing_services, selectors, services
from fleetctl.conformance.api import serializers as s
from fleetctl.conformance.filters import RunFilter
from fleetctl.conformance.models import ConformanceRun, RoutingProbe


class ConformanceRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                            viewsets.GenericViewSet):
    """OpenAI-contract conformance runs: a pool (every endpoint) probed case by case, side by
    side with a reference pool. POST starts one (`jobs`); the answer comes at once with the
    run queued, poll it for its cases and verdict."""

    serializer_class = s.ConformanceRunSerializer
    filterset_class = RunFilter
    ordering_fields = ["created_at", "id", "status"]

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        if self.action == "retrieve":
            return s.ConformanceRunDetailSerializer
        return s.ConformanceRunSerializer

    def get_queryset(self) -> QuerySet[ConformanceRun]:
        if self.action == "retrieve":
            return selectors.runs_with_cases()
        return selectors.run_list()

    def _detail(self, run: ConformanceRun, code: int = status.HTTP_200_OK) -> Response:
        fresh = get_object_or_404(selectors.runs_with_cases(), pk=run.pk)
        return Response(s.ConformanceRunDetailSerializer(fresh).data, status=code)

    @extend_schema(request=s.ConformanceRunCreateSerializer,
                   responses={202: s.ConformanceRunDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a run. 400 names an unknown pool or plan, a pool with no endpoints, a plan
        whose candidate is another pool, a model the pools do not serve or an unknown case
        key; 409 when a run of the pool is still queued or running."""
        body = s.ConformanceRunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = services.run_create(actor=actor_from_request(request), pool=data["pool"],
                                  plan=data["plan"], primary=data["primary"],
                                  model_id=data["model"],
                                  include_saturation=data["include_saturation"],
                                  required_keys=data["required"])
        return self._detail(run, status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.ConformanceRunDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Stop a queued or running run (409 otherwise); the cases judged so far are kept."""
        run = services.run_cancel(actor=actor_from_request(request),
                                  run=get_object_or_404(selectors.run_list(), pk=pk))
        return self._detail(run)

    # A plain list, as answered: not paginated, and the run list's filters do not apply.
    @extend_schema(responses={200: s.ConformanceSuiteCaseSerializer(many=True)})
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def suite(self, request: Request) -> Response:
        """Every case of the suite: what it sends, how it judges, whether it is required."""
        return Response(s.suite_data())


class RoutingProbeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    """Routing probes: a route's routing policy checked through its gateways, each request
    judged by the pool that answered it. POST starts one (`jobs`); the answer comes at once
    with the probe queued, poll it for its results and verdict."""

    serializer_class = s.RoutingProbeSerializer
    ordering_fields = ["created_at", "id", "status"]

    def get_queryset(self) -> QuerySet[RoutingProbe]:
        return selectors.routing_probe_list()

    @extend_schema(request=s.RoutingProbeCreateSerializer,
                   responses={202: s.RoutingProbeSerializer})
    def create(self, request: Request) -> Response:
        """Start a probe. 400 names an unknown route, plan or gateway, a route that is not
        the plan's, a gateway that does not carry it, or a route no gateway with a
        `listen_url` carries; 409 when a probe of the route is still queued or running, or
        the plan is closed."""
        body = s.RoutingProbeCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        probe = routing_services.probe_create(actor=actor_from_request(request),
                                              route=data["route"], plan=data["plan"],
                                              gateway=data["gateway"])
        fresh = self.get_queryset().get(pk=probe.pk)
        return Response(s.RoutingProbeSerializer(fresh).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.RoutingProbeSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Stop a queued or running probe (409 otherwise)."""
        probe = routing_services.probe_cancel(
            actor=actor_from_request(request),
            probe=get_object_or_404(self.get_queryset(), pk=pk))
        return Response(s.RoutingProbeSerializer(probe).data)


__all__ = ["ConformanceRunViewSet", "RoutingProbeViewSet"]
