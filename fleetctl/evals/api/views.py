"""Eval suites and runs over REST. Reading needs `read`; uploading, retiring and installing
suites, starting and cancelling runs need `jobs` (checked by the services, which audit
refusals). A suite upload is streamed to the service line by line; its errors name the line."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import HttpResponse, StreamingHttpResponse
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404  # an id of the wrong type: 404, not 500
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.api.renderers import (
    NDJSON,
    CSVRenderer,
    ExportFormatNegotiation,
    JsonDownloadErrors,
    NDJSONRenderer,
)
from fleetctl.core.errors import DomainError
from fleetctl.core.idempotency import action_body
from fleetctl.evals import selectors, services
from fleetctl.evals.api import diff
from fleetctl.evals.api import serializers as s
from fleetctl.evals.filters import DiffFilter, ItemFilter, ResultFilter, RunFilter, SuiteFilter
from fleetctl.evals.models import EvalRun, EvalSuite

EXPORT_FORMATS = ("json", "csv")
DEFAULT_MAX_UPLOAD_BYTES = 64 * 1024 * 1024


def max_upload_bytes() -> int:
    return int(getattr(settings, "EVAL_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES))


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB" if size >= 1024 * 1024 else f"{size:,} bytes"


class EvalSuiteViewSet(JsonDownloadErrors, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Eval suites: versioned, immutable, pinned by the SHA-256 of their canonical JSONL. POST
    a multipart upload (name, description, file) or …/bundled/ to install fleetctl's own;
    both need `jobs`, as does …/retire/."""

    serializer_class = s.EvalSuiteSerializer
    filterset_class = SuiteFilter
    ordering_fields = ["name", "version", "created_at", "item_count"]
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[EvalSuite]:
        if getattr(self, "queryset", None) is not None:
            # An action's own queryset: what its filters (and their schema) read.
            return super().get_queryset()
        return selectors.suites()

    def _suite(self, pk: str) -> EvalSuite:
        return get_object_or_404(selectors.suites(), pk=pk)

    @extend_schema(
        request={"multipart/form-data": s.EvalSuiteUploadSerializer},
        responses={201: OpenApiResponse(s.EvalSuiteUploadedSerializer,
                                        description="A new version was stored."),
                   200: OpenApiResponse(s.EvalSuiteUploadedSerializer,
                                        description="Identical content already existed under "
                                                    "this name: that version, nothing new.")})
    def create(self, request: Request) -> Response:
        """Upload a suite (multipart: name, description, file). It is read line by line as it
        is stored; every bad line is reported with its number (up to 20) and nothing is kept.
        The same content as a stored version of that name answers that version (200)."""
        data = action_body(request, s.EvalSuiteUploadSerializer)
        upload = data["file"]
        limit = max_upload_bytes()
        if upload.size is not None and upload.size > limit:
            raise ValidationError({"file": [
                f"The file is {_mib(upload.size)}; a suite upload may be at most "
                f"{_mib(limit)} (EVAL_MAX_UPLOAD_BYTES). Split it into several suites."]})
        # The uploaded file object itself (memory or a temporary file on disk), never .read().
        suite, created = services.suite_upload(
            actor=actor_from_request(request), name=data["name"], fileobj=upload,
            description=data["description"])
        answer = s.EvalSuiteUploadedSerializer(suite, context={"created": created}).data
        return Response(answer, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: s.EvalItemSerializer(many=True)},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH,
                                                description="The suite's id.")])
    @action(detail=True, methods=["get"], filterset_class=ItemFilter,
            filter_backends=[DjangoFilterBackend], queryset=selectors.items_none())
    def items(self, request: Request, pk: str) -> Response:
        """The suite's items in order (paginated; `page_size` up to 500); `tag=` and
        `scorer=` filter."""
        suite = self._suite(pk)
        page = self.paginate_queryset(self.filter_queryset(selectors.suite_items(suite)))
        return self.get_paginated_response(s.EvalItemSerializer(page, many=True).data)

    @extend_schema(
        responses={(200, NDJSON): OpenApiResponse(
            OpenApiTypes.BINARY,
            description="The canonical JSONL; its SHA-256 is the suite's `sha256` (also in "
                        "the X-Suite-SHA256 header).")})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None,
            renderer_classes=[renderers.JSONRenderer, NDJSONRenderer])
    def download(self, request: Request, pk: str) -> HttpResponse:
        """The suite as canonical JSONL (header line, then one item per line, keys sorted):
        exactly the bytes the suite's SHA-256 pins; upload it again and it is the same
        version."""
        suite = self._suite(pk)
        body = services.suite_jsonl(suite)
        response = HttpResponse(body, content_type=NDJSON)
        response["Content-Disposition"] = (f'attachment; filename="{suite.name}-v'
                                           f'{suite.version}.jsonl"')
        response["X-Suite-SHA256"] = suite.sha256
        return response

    @extend_schema(request=None, responses={200: s.EvalSuiteSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, pk: str) -> Response:
        """Retire the suite: it cannot start runs any more (its runs and download stay).
        Retiring a retired suite changes nothing."""
        suite = services.suite_retire(actor=actor_from_request(request), suite=self._suite(pk))
        return Response(s.EvalSuiteSerializer(self._suite(str(suite.pk))).data)

    @extend_schema(request=s.EvalSuiteBundledSerializer,
                   responses={200: s.EvalSuiteSerializer(many=True)})
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def bundled(self, request: Request) -> Response:
        """Install fleetctl's bundled suites (generated from fixed seeds, nothing downloaded):
        the same bytes every time, so installing again answers the same versions."""
        body = action_body(request, s.EvalSuiteBundledSerializer)
        suites = services.suite_install_bundled(actor=actor_from_request(request),
                                                names=body["names"] or None)
        return Response(s.EvalSuiteSerializer(suites, many=True).data)


def _suite_ref(ref: str) -> EvalSuite:
    """The suite a run names: an id, a name (its newest unretired version) or name@version;
    anything that does not name one is a 400 on `suite`."""
    try:
        return services.suite_lookup(ref)
    except DjangoValidationError:
        raise  # {"suite": [what to give, and the suites there are]}
    except (ObjectDoesNotExist, DomainError, ValueError) as exc:
        message = getattr(exc, "message", "") if isinstance(exc, DomainError) else ""
        raise ValidationError({"suite": [
            message or f"No suite {ref[:80]!r}; give a suite id, a name (its newest version) "
                       "or name@version; see GET /api/v1/eval-suites/."]}) from exc


class EvalRunViewSet(ExportFormatNegotiation, JsonDownloadErrors, mixins.ListModelMixin,
                     mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Eval runs: a suite version sent to each named pool directly (never through a route),
    every answer scored; the candidate judged against the primary item by item. POST starts
    one (`jobs`); the answer comes at once, poll the run for progress."""

    serializer_class = s.EvalRunSerializer
    filterset_class = RunFilter
    ordering_fields = ["created_at", "id", "status"]

    def get_queryset(self) -> QuerySet[EvalRun]:
        if getattr(self, "queryset", None) is not None:
            # An action's own queryset: what its filters (and their schema) read.
            return super().get_queryset()
        return selectors.runs()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.EvalRunDetailSerializer if self.action == "retrieve" else s.EvalRunSerializer

    def _run(self, pk: str) -> EvalRun:
        # Not self.get_queryset(): the results, diff and export actions set their own (for
        # their filters' schema).
        return get_object_or_404(selectors.runs(), pk=pk)

    def _detail(self, run: EvalRun, code: int = status.HTTP_200_OK) -> Response:
        return Response(s.EvalRunDetailSerializer(self._run(str(run.pk))).data, status=code)

    @extend_schema(request=s.EvalRunCreateSerializer, responses={201: s.EvalRunDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a run. 400 names the field at fault: an unknown or retired suite, an unknown
        pool or plan, the same pool twice, a pool that does not serve the model, a value out
        of range. The run is queued for a worker of the `evals` queue."""
        data = dict(action_body(request, s.EvalRunCreateSerializer))
        suite = _suite_ref(data.pop("suite"))
        margin_pct = data.pop("margin_pct")
        if margin_pct is not None:
            data["margin"] = margin_pct / 100
        try:
            run = services.run_create(actor=actor_from_request(request), suite=suite,
                                         model_id=data.pop("model"), **data)
        except DjangoValidationError as exc:
            # The service names its own argument; the request's field is margin_pct.
            if hasattr(exc, "error_dict") and "margin" in exc.error_dict:
                exc.error_dict["margin_pct"] = exc.error_dict.pop("margin")
            raise
        return self._detail(run, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.EvalRunDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Stop a queued or running run (409 otherwise); the items scored so far are kept."""
        run = services.run_cancel(actor=actor_from_request(request), run=self._run(pk))
        return self._detail(run)

    @extend_schema(responses={200: s.EvalResultSerializer(many=True)},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH,
                                                description="The run's id.")])
    # queryset: what the results' filters (and their schema) apply to; the run's results are
    # filtered, never this.
    @action(detail=True, methods=["get"], filterset_class=ResultFilter,
            filter_backends=[DjangoFilterBackend], queryset=selectors.results_none())
    def results(self, request: Request, pk: str) -> Response:
        """Every item on every pool, in the run's interleaved order (paginated; `page_size` up
        to 500): the answer, its score and reason, tokens, latency and every attempt."""
        run = self._run(pk)
        page = self.paginate_queryset(self.filter_queryset(selectors.results(run)))
        return self.get_paginated_response(s.EvalResultSerializer(page, many=True).data)

    @extend_schema(responses={200: s.EvalDiffSerializer(many=True)},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH,
                                                description="The run's id.")])
    @action(detail=True, methods=["get"], filterset_class=DiffFilter,
            filter_backends=[DjangoFilterBackend], queryset=selectors.results_none())
    def diff(self, request: Request, pk: str) -> Response:
        """The items the candidate and the primary scored differently, side by side, in suite
        order (paginated): `direction=regressed` for the candidate's losses, `improved` for
        its gains, `tag=`, `q=` (text in the item id, prompt or either answer). 400 when the
        run has no primary."""
        run = self._run(pk)
        diff.require_primary(run)
        page = self.paginate_queryset(self.filter_queryset(selectors.diff(run)))
        return self.get_paginated_response(selectors.diff_rows(run, page or []))

    @extend_schema(
        description="The item diff (with the same filters as …/diff/), streamed: "
                    "`?format=json` ({run, diff: [...]}) or `?format=csv` (columns documented "
                    "in fleetctl/evals/api/diff.py; formula-like text cells start with a "
                    "quote).",
        parameters=[OpenApiParameter("format", str, enum=list(EXPORT_FORMATS),
                                     default="json", description="json or csv")],
        responses={(200, "application/json"): OpenApiResponse(
                       OpenApiTypes.OBJECT, description="{run, diff: [...]}"),
                   (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)})
    @action(detail=True, methods=["get"], filterset_class=DiffFilter,
            filter_backends=[DjangoFilterBackend], queryset=selectors.results_none(),
            pagination_class=None, renderer_classes=[renderers.JSONRenderer, CSVRenderer])
    def export(self, request: Request, pk: str, format: str | None = None
               ) -> StreamingHttpResponse:
        run = self._run(pk)
        diff.require_primary(run)
        results = self.filter_queryset(selectors.diff(run))
        if request.accepted_renderer.format == "csv":
            response = StreamingHttpResponse(diff.csv_lines(run, results),
                                             content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = (f'attachment; filename="eval-run-{run.pk}-'
                                               'diff.csv"')
            return response
        head = dict(s.EvalRunSerializer(run).data)
        response = StreamingHttpResponse(diff.json_chunks(run, head, results),
                                         content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="eval-run-{run.pk}-diff.json"'
        return response


__all__ = ["EvalRunViewSet", "EvalSuiteViewSet"]
