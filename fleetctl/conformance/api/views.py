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
from fleetctl.conformance import selectors, services
from fleetctl.conformance.api import serializers as s
from fleetctl.conformance.filters import RunFilter
from fleetctl.conformance.models import ConformanceRun


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


__all__ = ["ConformanceRunViewSet"]
