"""Shadow runs over REST. Reading needs `read`; starting, adjusting and stopping a run need
`jobs` (checked by the services, which audit refusals). Stop is the kill switch: one call,
the collector stops sampling within a second."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404  # an id of the wrong type: 404, not 500
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.api.renderers import (
    CSVRenderer,
    ExportFormatNegotiation,
    JsonDownloadErrors,
)
from fleetctl.core.idempotency import action_body
from fleetctl.shadow import selectors, services
from fleetctl.shadow.api import exports
from fleetctl.shadow.api import serializers as s
from fleetctl.shadow.filters import PairFilter, RunFilter
from fleetctl.shadow.models import ShadowRun

EXPORT_FORMATS = ("json", "csv")  # the export's renderers' formats


class ShadowRunViewSet(ExportFormatNegotiation, JsonDownloadErrors, mixins.ListModelMixin,
                       mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Shadow runs: a plan's candidate judged against its primary on live traffic mirrored at
    the route's gateways (or a replayed trace), primary vs primary again as the noise floor.
    POST starts one (`jobs`), PATCH adjusts its sampling and caps, …/stop/ stops it."""

    serializer_class = s.ShadowRunSerializer
    filterset_class = RunFilter
    ordering_fields = ["created_at", "id", "status"]

    def get_queryset(self) -> QuerySet[ShadowRun]:
        if getattr(self, "queryset", None) is not None:
            # An action's own queryset: what its filters (and their schema) read.
            return super().get_queryset()
        return selectors.run_list()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        if self.action == "retrieve":
            return s.ShadowRunDetailSerializer
        return s.ShadowRunSerializer

    def retrieve(self, request: Request, pk: str) -> Response:
        """The run with its live counters, the latest judgement per metric, its verdict and
        evidence, and whether the route's gateways can mirror."""
        return self._detail(self._run(pk))

    def _run(self, pk: str) -> ShadowRun:
        return get_object_or_404(selectors.run_list(), pk=pk)

    def _detail(self, run: ShadowRun, code: int = status.HTTP_200_OK) -> Response:
        fresh = self._run(str(run.pk))
        context = {"live_counters": selectors.live_counters(fresh),
                   "latest_judgement": selectors.judgements(fresh).last()}
        return Response(s.ShadowRunDetailSerializer(fresh, context=context).data, status=code)

    @extend_schema(request=s.ShadowRunCreateSerializer,
                   responses={201: s.ShadowRunDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a run for a plan. 400 names the field at fault: an unknown or closed plan, a
        route not of the plan, a candidate outside the route's residency pin, a mirror on a
        route only HAProxy carries (replay instead), a replay without a trace with prompt
        texts, a value out of range; 409 while the plan has a running run."""
        body = action_body(request, s.ShadowRunCreateSerializer)
        run = services.run_create(actor=actor_from_request(request), **body)
        return self._detail(run, status.HTTP_201_CREATED)

    @extend_schema(request=s.ShadowRunAdjustSerializer,
                   responses={200: s.ShadowRunDetailSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        """Adjust a running run: sample_percent, max_rps, max_tokens_per_day, content,
        retention_hours, min_pairs (409 once it stopped)."""
        run = self._run(pk)
        body = action_body(request, s.ShadowRunAdjustSerializer)
        run = services.run_adjust(actor=actor_from_request(request), run=run, **body)
        return self._detail(run)

    @extend_schema(request=s.ShadowRunStopSerializer,
                   responses={200: s.ShadowRunDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        """The kill switch: the collector stops sampling the route within a second, the
        gateways stop mirroring it, the run is stopped (409 when it is not running)."""
        run = self._run(pk)
        body = action_body(request, s.ShadowRunStopSerializer)
        run = services.run_stop(actor=actor_from_request(request), run=run, reason=body["reason"])
        return self._detail(run)

    @extend_schema(responses={200: s.ShadowPairSerializer(many=True)},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH,
                                                description="The run's id.")])
    # queryset: what the pairs' filters (and their schema) apply to; the run's pairs are
    # filtered, never this.
    @action(detail=True, methods=["get"], filterset_class=PairFilter,
            filter_backends=[DjangoFilterBackend], queryset=selectors.pairs_none())
    def pairs(self, request: Request, pk: str) -> Response:
        """The run's pairs (paginated; `page_size` up to 500), newest first; `diverged=true`,
        `candidate_error=true`, `order=-divergence_score` for the most divergent. Text only
        as the run's content policy stored it, within its retention."""
        run = self._run(pk)
        page = self.paginate_queryset(self.filter_queryset(selectors.pairs(run)))
        return self.get_paginated_response(s.ShadowPairSerializer(page, many=True).data)

    @extend_schema(responses={200: s.ShadowJudgementSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def judgements(self, request: Request, pk: str) -> Response:
        """The judge's looks at the run, oldest first: per metric the candidate's rate, the
        noise floor's, their difference with its confidence bounds, and the verdict."""
        page = self.paginate_queryset(selectors.judgements(self._run(pk)))
        return self.get_paginated_response(s.ShadowJudgementSerializer(page, many=True).data)

    @extend_schema(
        description="Every pair's metrics (never prompt or answer text), streamed: "
                    "`?format=json` (the run and its pairs) or `?format=csv` (columns "
                    "documented in fleetctl/shadow/api/exports.py).",
        parameters=[OpenApiParameter("format", str, enum=list(EXPORT_FORMATS),
                                     default="json", description="json or csv")],
        responses={(200, "application/json"): OpenApiResponse(
                       OpenApiTypes.OBJECT, description="{run, pairs: [...]}"),
                   (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None,
            renderer_classes=[renderers.JSONRenderer, CSVRenderer])
    def export(self, request: Request, pk: str, format: str | None = None
               ) -> StreamingHttpResponse:
        run = self._run(pk)
        if request.accepted_renderer.format == "csv":
            response = StreamingHttpResponse(exports.csv_lines(run),
                                             content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="shadow-run-{run.pk}.csv"'
            return response
        head = s.ShadowRunSerializer(run).data
        response = StreamingHttpResponse(exports.json_chunks(run, dict(head)),
                                         content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="shadow-run-{run.pk}.json"'
        return response


__all__ = ["ShadowRunViewSet"]
