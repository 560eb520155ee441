"""Benchmarks over REST. Reading needs `read`; uploading or generating a trace, starting and
cancelling a run need `jobs` (checked by the services, which audit refusals)."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import FileResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404  # an id of the wrong type: 404, not 500
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.bench import selectors, services
from fleetctl.bench.api import exports
from fleetctl.bench.api import serializers as s
from fleetctl.bench.filters import RunFilter, TraceFilter
from fleetctl.bench.models import Run, Trace
from fleetctl.core.api.renderers import CSVRenderer, JsonDownloadErrors
from fleetctl.core.errors import NotFoundError
from fleetctl.core.idempotency import action_body


class TraceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Request traces (fleetctl JSONL, stored normalised). POST a multipart upload or
    …/generate/ a synthetic one; both need `jobs`."""

    serializer_class = s.TraceSerializer
    filterset_class = TraceFilter
    ordering_fields = ["name", "created_at", "requests"]
    lookup_field = "name"
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[Trace]:
        return selectors.trace_list()

    @extend_schema(request={"multipart/form-data": s.TraceUploadSerializer},
                   responses={201: s.TraceSerializer})
    def create(self, request: Request) -> Response:
        """Upload a trace (multipart: name, description, source, file). It is read line by
        line as it is stored; any bad line is reported with its number and nothing is kept."""
        data = action_body(request, s.TraceUploadSerializer)
        # The uploaded file object itself (memory or a temporary file on disk), never .read().
        trace = services.trace_upload(actor=actor_from_request(request), name=data["name"],
                                      description=data["description"], source=data["source"],
                                      fileobj=data["file"])
        return Response(s.TraceSerializer(trace).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TraceGenerateSerializer, responses={201: s.TraceSerializer})
    @action(detail=False, methods=["post"])
    def generate(self, request: Request) -> Response:
        """A synthetic trace: length distributions, shared prefixes, Poisson/bursty arrivals."""
        body = action_body(request, s.TraceGenerateSerializer)
        trace = services.trace_generate(actor=actor_from_request(request), **body)
        return Response(s.TraceSerializer(trace).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={(200, "application/x-ndjson"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def download(self, request: Request, name: str) -> FileResponse:
        """The stored trace as fleetctl JSONL, streamed from disk."""
        trace: Trace = self.get_object()
        path = selectors.trace_path(trace)
        if not path.exists():
            raise NotFoundError(f"The file of trace {trace.name} is missing on this machine "
                                f"({trace.path}); upload it again.")
        return FileResponse(path.open("rb"), as_attachment=True,
                            filename=f"{trace.name}.jsonl", content_type="application/x-ndjson")


class RunViewSet(JsonDownloadErrors, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """Benchmark runs: a trace against one or more pools, levels interleaved. POST starts one
    (`jobs`); the answer comes at once, poll the run for progress."""

    serializer_class = s.RunSerializer
    filterset_class = RunFilter
    ordering_fields = ["created_at", "id", "status"]

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.run_list()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.RunDetailSerializer if self.action == "retrieve" else s.RunSerializer

    def _run(self, pk: str) -> Run:
        return get_object_or_404(selectors.run_list(), pk=pk)

    def _detail(self, run: Run, code: int = status.HTTP_200_OK) -> Response:
        fresh = self._run(str(run.pk))
        return Response(s.RunDetailSerializer(fresh, context={}).data, status=code)

    @extend_schema(request=s.RunCreateSerializer, responses={202: s.RunDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a run: pools and trace by name; 400 naming an unknown one, a pool that does
        not serve the model, SLO values out of range or levels that are not whole numbers."""
        data = dict(action_body(request, s.RunCreateSerializer))
        run = services.run_create(actor=actor_from_request(request),
                                  pools=list(data.pop("pools")), **data)
        return self._detail(run, status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.RunDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Stop a queued or running run (409 otherwise); levels measured so far are kept."""
        run = services.run_cancel(actor=actor_from_request(request), run=self._run(pk))
        return self._detail(run)

    @extend_schema(responses={200: s.LevelSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def levels(self, request: Request, pk: str) -> Response:
        """Every level of the run, per pool and concurrency, with its verdict and summary."""
        page = self.paginate_queryset(selectors.run_levels(run=self._run(pk)))
        return self.get_paginated_response(s.LevelSerializer(page, many=True).data)

    @extend_schema(responses={200: s.SampleSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def samples(self, request: Request, pk: str) -> Response:
        """Per-request rows (paginated; `page_size` up to 500). For all of them use export."""
        page = self.paginate_queryset(selectors.run_samples(run=self._run(pk)))
        return self.get_paginated_response(s.SampleSerializer(page, many=True).data)

    @extend_schema(
        description="Every per-request row, streamed: `…/export.json` (the run, its results, "
                    "levels and samples) or `…/export.csv` (columns documented in "
                    "fleetctl/bench/api/exports.py).",
        responses={(200, "application/json"): s.RunExportSerializer,
                   (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)})
    @action(detail=True, methods=["get"],
            renderer_classes=[renderers.JSONRenderer, CSVRenderer])
    def export(self, request: Request, pk: str, format: str | None = None
               ) -> StreamingHttpResponse:
        run = self._run(pk)
        if (format or request.query_params.get("format")) == "csv":
            response = StreamingHttpResponse(exports.csv_lines(run),
                                             content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="bench-run-{run.pk}.csv"'
            return response
        head = dict(self._detail(run).data)
        response = StreamingHttpResponse(exports.json_chunks(run, head),
                                         content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="bench-run-{run.pk}.json"'
        return response


__all__ = ["RunViewSet", "TraceViewSet"]
