"""Batch input files and jobs over REST (/api/v1/batch/). Reading needs `read`; uploading,
creating, editing, pausing, resuming and cancelling need `jobs` (checked by the services,
which audit refusals). Uploads are streamed: Django spools a large upload to a temporary
file, and the service reads it line by line; every bad line is a 400 naming it, and nothing
is stored. Output and error files are streamed from the rows as JSONL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from fleetctl.accounts.permissions import actor_from_request
from fleetctl.batch import outputs, selectors, services
from fleetctl.batch.api import serializers as s
from fleetctl.batch.filters import FileFilter, JobFilter
from fleetctl.batch.models import BatchFile, BatchJob
from fleetctl.core import idempotency
from fleetctl.core.api.renderers import NDJSON, JsonDownloadErrors, NDJSONRenderer
from fleetctl.core.errors import NotFoundError

ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The job's id.")


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB" if size >= 1024 * 1024 else f"{size:,} bytes"


# What a multipart body may hold besides the file (boundaries, the other fields): a request
# longer than the limit by more than this is refused from its Content-Length, before its body
# is read (Django would spool a large upload to a temporary file first).
MULTIPART_SLACK = 64 * 1024


def too_large_message(size: int) -> str:
    limit = int(settings.BATCH_MAX_UPLOAD_BYTES)
    return (f"The file is {_mib(size)}; an input file may be at most {_mib(limit)} "
            f"(BATCH_MAX_UPLOAD_BYTES). Split it into several jobs.")


def check_body_length(request: Request, field: str) -> None:
    """Refuse an upload whose request is longer than BATCH_MAX_UPLOAD_BYTES allows, from its
    Content-Length alone: nothing of it is read or stored."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return  # Django's own parsing answers a malformed length
    if length > int(settings.BATCH_MAX_UPLOAD_BYTES) + MULTIPART_SLACK:
        raise ValidationError({field: [too_large_message(length)]})


def check_size(upload: Any, field: str) -> None:
    limit = int(settings.BATCH_MAX_UPLOAD_BYTES)
    if upload.size is not None and upload.size > limit:
        raise ValidationError({field: [too_large_message(upload.size)]})


class BatchFileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Batch input files (OpenAI Batch JSONL), validated whole when uploaded. POST a
    multipart upload (`file`, optional `name`) with scope `jobs`."""

    serializer_class = s.BatchFileSerializer
    filterset_class = FileFilter
    ordering_fields = ["created_at", "id", "requests", "size_bytes"]
    parser_classes = [MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[BatchFile]:
        return selectors.file_list()

    @extend_schema(request={"multipart/form-data": s.FileUploadSerializer},
                   responses={201: s.BatchFileSerializer})
    def create(self, request: Request) -> Response:
        """Upload an input file. Read line by line as it is stored; a bad line (not JSON, no
        custom_id, method not POST, unknown url, a body over BATCH_MAX_BODY_BYTES, a
        duplicate custom_id, ...) is a 400 naming it ("line N: ..."), and nothing is kept."""
        check_body_length(request, "file")
        body = idempotency.action_body(request, s.FileUploadSerializer)
        upload = body["file"]
        check_size(upload, "file")
        batch_file = services.file_upload(
            actor=actor_from_request(request),
            name=body.get("name") or upload.name or "input.jsonl",
            stream=upload)
        return Response(s.BatchFileSerializer(batch_file).data, status=status.HTTP_201_CREATED)


class BatchJobViewSet(JsonDownloadErrors, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      viewsets.GenericViewSet):
    """Batch jobs: an input file run on one pool by the batch workers, with a concurrency
    limit, a rate limit and a completion window. Scope `jobs` to create, edit, pause, resume
    or cancel; `read` for the rest. Output and error files in the OpenAI Batch output
    format."""

    serializer_class = s.BatchJobSerializer
    filterset_class = JobFilter
    ordering_fields = ["created_at", "id", "state"]
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[BatchJob]:
        return selectors.job_list()

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.BatchJobDetailSerializer if self.action == "retrieve" else s.BatchJobSerializer

    def _job(self, pk: str) -> BatchJob:
        job = selectors.job_get(int(pk)) if str(pk).isdigit() else None
        if job is None:
            raise NotFoundError(f"No batch job {str(pk)[:40]}. See /api/v1/batch/jobs/ for "
                                f"the jobs there are.")
        return job

    def _detail(self, job: BatchJob, code: int = status.HTTP_200_OK) -> Response:
        job = self._job(str(job.pk))
        job.progress = selectors.job_progress(job)  # type: ignore[attr-defined]
        job.task_cost = selectors.job_task_cost(  # type: ignore[attr-defined]
            job, job.progress).as_dict()  # type: ignore[attr-defined]
        return Response(s.BatchJobDetailSerializer(job).data, status=code)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A job with its progress (from its chunks' counters)."""
        return self._detail(self._job(str(kwargs["pk"])))

    @extend_schema(request={"application/json": s.JobCreateSerializer,
                            "multipart/form-data": s.JobCreateSerializer},
                   parameters=[idempotency.PARAMETER],
                   responses={201: s.BatchJobDetailSerializer})
    def create(self, request: Request) -> Response:
        """Create a job (scope `jobs`): JSON with `input_file` (an uploaded file's id), or
        multipart with `file` and the options as fields (upload and create in one step;
        nothing kept if refused). 400 names the field, or the line: a model the pool does
        not serve names the first line asking for it. An Idempotency-Key is honoured on
        the JSON form (upload first, then create, to retry safely)."""
        if request.content_type.startswith("multipart/"):
            check_body_length(request, "file")
            if request.headers.get(idempotency.HEADER):
                raise ValidationError({idempotency.HEADER: [
                    "An Idempotency-Key is honoured on the JSON form only: upload the file "
                    "to /api/v1/batch/files/, then create the job with its input_file id."]})
            return self._create(request)
        return self._create_keyed(request)

    @idempotency.idempotent
    def _create_keyed(self, request: Request) -> Response:
        return self._create(request)

    def _create(self, request: Request) -> Response:
        data = dict(idempotency.action_body(request, s.JobCreateSerializer))
        upload, input_file, name = data.pop("file", None), data.pop("input_file", None), \
            data.pop("name", "")
        actor = actor_from_request(request)
        if upload is not None:
            check_size(upload, "file")
            job = services.job_submit(actor=actor, name=name or upload.name or "input.jsonl",
                                      stream=upload, **data)
        else:
            job = services.job_create(actor=actor, input_file=input_file, **data)
        return self._detail(job, status.HTTP_201_CREATED)

    @extend_schema(request=s.JobEditSerializer, responses={200: s.BatchJobDetailSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        """Change an active job's concurrency or rate limit (0: no limit) with a reason: a
        person's action, on the job's timeline (manual). 409 once the job has ended."""
        body = idempotency.action_body(request, s.JobEditSerializer)
        job = services.job_edit(actor=actor_from_request(request), job=self._job(pk), **body)
        return self._detail(job)

    def _act(self, request: Request, pk: str, service: Callable[..., BatchJob]) -> Response:
        body = idempotency.action_body(request, s.JobActionSerializer)
        job = service(actor=actor_from_request(request), job=self._job(pk), reason=body["reason"])
        return self._detail(job)

    @idempotency.object_action(request=s.JobActionSerializer, response=s.BatchJobDetailSerializer)
    def pause(self, request: Request, pk: str) -> Response:
        """Pause a queued or running job (409 otherwise): the worker stops dispatching,
        lets the requests in flight finish and releases its chunk."""
        return self._act(request, pk, services.job_pause)

    @idempotency.object_action(request=s.JobActionSerializer, response=s.BatchJobDetailSerializer)
    def resume(self, request: Request, pk: str) -> Response:
        """Resume a paused job (409 otherwise, or once its window has ended)."""
        return self._act(request, pk, services.job_resume)

    @idempotency.object_action(request=s.JobActionSerializer, response=s.BatchJobDetailSerializer)
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel an active job (409 otherwise); its results so far stay downloadable."""
        return self._act(request, pk, services.job_cancel)

    def _download(self, pk: str, lines: Callable[[BatchJob], Any], suffix: str
                  ) -> StreamingHttpResponse:
        job = self._job(pk)
        response = StreamingHttpResponse(outputs.blocks(lines(job)), content_type=NDJSON)
        response["Content-Disposition"] = (f'attachment; filename="{job.public_id}_'
                                           f'{suffix}.jsonl"')
        return response

    @extend_schema(parameters=[ID], responses={(200, NDJSON): OpenApiResponse(
        OpenApiTypes.BINARY, description="One line per successful request, by index: "
        '{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": '
        "null}.")})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None,
            renderer_classes=[renderers.JSONRenderer, NDJSONRenderer])
    def output(self, request: Request, pk: str) -> StreamingHttpResponse:
        """The output file (OpenAI Batch output format), streamed; partial while the job
        runs or when it expired or was cancelled."""
        return self._download(pk, outputs.output_lines, "output")

    @extend_schema(parameters=[ID], responses={(200, NDJSON): OpenApiResponse(
        OpenApiTypes.BINARY, description="One line per request that ended without a 2xx "
        'answer: {"id", "custom_id", "response": {...} | null, "error": {"code", '
        '"message"}}.')})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None,
            renderer_classes=[renderers.JSONRenderer, NDJSONRenderer])
    def errors(self, request: Request, pk: str) -> StreamingHttpResponse:
        """The error file (OpenAI Batch format), streamed."""
        return self._download(pk, outputs.error_lines, "errors")

    def _page(self, rows: Any, serializer: Any) -> Response:
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(serializer(page, many=True).data)

    @extend_schema(parameters=[ID], responses={200: s.BatchJobEventSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request: Request, pk: str) -> Response:
        """The job's timeline, oldest first (paginated); `manual` marks a person's action."""
        return self._page(selectors.job_events(self._job(pk)), s.BatchJobEventSerializer)

    @extend_schema(parameters=[ID], responses={200: s.BatchResendSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def resends(self, request: Request, pk: str) -> Response:
        """Requests that may have been sent twice: in flight when their chunk's holder lost
        its lease (killed, or stalled), sent again by the new holder; each still has exactly
        one result."""
        return self._page(selectors.job_resends(self._job(pk)), s.BatchResendSerializer)

    @extend_schema(parameters=[ID], responses={200: s.BatchComparisonSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def comparisons(self, request: Request, pk: str) -> Response:
        """The sampled requests answered by the plan's primary too, and how the answers
        compare (empty until the comparison has run, or when the job has no plan)."""
        return self._page(selectors.job_comparisons(self._job(pk)),
                          s.BatchComparisonSerializer)


__all__ = ["BatchFileViewSet", "BatchJobViewSet"]
