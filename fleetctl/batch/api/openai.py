"""The OpenAI Batch API over fleetctl's batch jobs, at /openai/v1/ (the official client's
`base_url`): `files` (upload with purpose `batch`, retrieve, list, content, delete) and `batches`
(create, retrieve, list, cancel), in OpenAI's object shapes and error objects.

Authentication is a fleetctl API token as the client's `api_key` (`Authorization: Bearer`);
reading needs scope `read`, uploading, creating and cancelling `jobs` (checked by the same
services as /api/v1/batch/). An upload goes through the one batch upload path
(services.file_upload: line-numbered, all-or-nothing, the same size limits; a request longer
than BATCH_MAX_UPLOAD_BYTES is refused from its Content-Length, before its body is read). A
batch becomes a fleetctl job on a pool of a batch-class route (services.batch_create), so the
stage rules apply.

Ids: `file-<n>` is input file n; `file-batch_<n>-output` and `file-batch_<n>-errors` are job
n's output and error files (made from its result rows when downloaded, as /api/v1/batch/
does); `batch_<n>` is job n.

Statuses: a queued, running or paused job is `in_progress` (fleetctl validates a file when
it is uploaded, so there is no `validating` time); completed, failed, expired and cancelled
are themselves (a cancel takes effect at once: `cancelling` is never seen). There is no
`finalizing`: the output file is read from the rows whenever it is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import FileResponse, Http404, StreamingHttpResponse
from rest_framework import exceptions, renderers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from fleetctl.accounts.authentication import TokenAuthentication
from fleetctl.accounts.permissions import IsAuthenticatedActor, actor_from_request
from fleetctl.batch import outputs, selectors, services
from fleetctl.batch.api.views import check_body_length, check_size
from fleetctl.batch.models import BatchFile, BatchJob
from fleetctl.core.api.errors import openai_error_body
from fleetctl.core.errors import DomainError

FILE_ID = re.compile(r"^file-(\d{1,12})$")
OUTPUT_ID = re.compile(r"^file-batch_(\d{1,12})-(output|errors)$")
BATCH_ID = re.compile(r"^batch_(\d{1,12})$")
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
CANCEL_REASON = "cancelled through the OpenAI Batch API (POST /openai/v1/batches/{id}/cancel)"
# fleetctl's own error codes, as OpenAI's client-facing ones.
CODES = {401: "invalid_api_key", 403: "permission_denied", 404: "not_found",
         409: "conflict", 429: "rate_limit_exceeded"}


def _ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


# --- errors ---------------------------------------------------------------------------------

class OpenAIError(exceptions.APIException):
    def __init__(self, status_code: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message, self.param, self.code, self.type = message, param, code, type


def _validation(fields: dict[str, Any]) -> Response:
    param, messages = next(iter(fields.items()), (None, ["The request is not valid."]))
    flat = [str(m) for m in (messages if isinstance(messages, list) else [messages])]
    message = "; ".join(flat) if len(flat) <= 3 else "; ".join(flat[:3]) + \
        f"; and {len(flat) - 3} more"
    # input_file_id problems are the file's: OpenAI's invalid_file; the others, a bad value.
    code = "invalid_file" if param in ("file", "input_file_id") else "invalid_value"
    if param in ("non_field_errors", "__all__"):
        param = None
    if "is at most" in message or "may be at most" in message:
        code = "file_too_large"
    return Response(openai_error_body(message, param=param, code=code), status=400)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every refusal as OpenAI's error object, with the status the official client maps
    (400 BadRequestError, 401 AuthenticationError, 403 PermissionDeniedError, 404
    NotFoundError, 409 ConflictError, 429 RateLimitError)."""
    set_rollback()
    if isinstance(exc, OpenAIError):
        return Response(openai_error_body(exc.message, type=exc.type, param=exc.param,
                                          code=exc.code), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            return _validation({k: [str(m) for m in v] for k, v in exc.message_dict.items()})
        return _validation({"__all__": [str(m) for m in exc.messages]})
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"__all__": exc.detail}
        return _validation({str(k): v if isinstance(v, list) else [v]
                            for k, v in detail.items()})
    if isinstance(exc, DomainError):
        return Response(openai_error_body(exc.message, code=CODES.get(exc.status_code,
                                                                       exc.code)),
                        status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("No such object.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        code = exc.status_code
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            code = 401
        headers = {}
        wait = getattr(exc, "wait", None)
        if isinstance(exc, exceptions.Throttled) and wait:
            headers["Retry-After"] = str(int(wait))
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return Response(openai_error_body(str(message), code=CODES.get(code)), status=code,
                        headers=headers)
    return None


# --- objects ------------------------------------------------------------------------------

def file_object(batch_file: BatchFile) -> dict[str, Any]:
    return {"id": f"file-{batch_file.pk}", "object": "file", "bytes": batch_file.size_bytes,
            "created_at": _ts(batch_file.created_at), "filename": batch_file.name,
            "purpose": "batch", "status": "processed", "status_details": None,
            "expires_at": None}


def _lines(job: BatchJob, kind: str) -> Iterator[bytes]:
    return outputs.blocks(outputs.output_lines(job) if kind == "output"
                          else outputs.error_lines(job))


def output_file_object(job: BatchJob, kind: str) -> dict[str, Any]:
    size = sum(len(block) for block in _lines(job, kind))
    return {"id": f"file-batch_{job.pk}-{kind}", "object": "file", "bytes": size,
            "created_at": _ts(job.finished_at or job.created_at),
            "filename": f"{job.public_id}_{kind}.jsonl", "purpose": "batch_output",
            "status": "processed", "status_details": None, "expires_at": None}


STATUS: dict[str, str] = {
    BatchJob.State.QUEUED: "in_progress", BatchJob.State.RUNNING: "in_progress",
    BatchJob.State.PAUSED: "in_progress", BatchJob.State.COMPLETED: "completed",
    BatchJob.State.FAILED: "failed", BatchJob.State.EXPIRED: "expired",
    BatchJob.State.CANCELLED: "cancelled"}


def _endpoint(job: BatchJob) -> str:
    if job.endpoint:
        return job.endpoint
    urls = list(job.input_file.url_lines)  # a job made through fleetctl's own REST
    return urls[0] if len(urls) == 1 else ""


def _window(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def batch_object(job: BatchJob, sums: dict[str, int]) -> dict[str, Any]:
    ended = not job.is_active
    state = job.state
    finished = _ts(job.finished_at)
    succeeded, failed = sums.get("succeeded", 0), sums.get("failed", 0)
    errors = None
    if state == BatchJob.State.FAILED:
        errors = {"object": "list", "data": [{"code": "job_failed",
                                              "message": job.state_reason or "The job failed.",
                                              "param": None, "line": None}]}
    return {
        "id": job.public_id, "object": "batch", "endpoint": _endpoint(job), "errors": errors,
        "input_file_id": f"file-{job.input_file_id}",
        "completion_window": _window(job.completion_window_s),
        "status": STATUS.get(state, "in_progress"),
        "output_file_id": f"file-batch_{job.pk}-output" if ended and succeeded else None,
        "error_file_id": f"file-batch_{job.pk}-errors" if ended and failed else None,
        "created_at": _ts(job.created_at),
        # Validated when the file was uploaded: in progress from its creation.
        "in_progress_at": _ts(job.created_at),
        "expires_at": _ts(job.expires_at),
        "finalizing_at": None,
        "completed_at": finished if state == BatchJob.State.COMPLETED else None,
        "failed_at": finished if state == BatchJob.State.FAILED else None,
        "expired_at": finished if state == BatchJob.State.EXPIRED else None,
        "cancelling_at": finished if state == BatchJob.State.CANCELLED else None,
        "cancelled_at": finished if state == BatchJob.State.CANCELLED else None,
        "request_counts": {"total": job.total, "completed": succeeded, "failed": failed},
        "metadata": job.metadata or None,
    }


# --- ids and paging -------------------------------------------------------------------------

def _number(pattern: re.Pattern[str], value: str) -> int | None:
    match = pattern.match(value or "")
    return int(match.group(1)) if match else None


def _job(batch_id: str) -> BatchJob:
    pk = _number(BATCH_ID, batch_id)
    job = selectors.job_get(pk) if pk is not None else None
    if job is None:
        raise OpenAIError(404, f"No batch found with id '{batch_id[:80]}'.", param="batch_id",
                          code="not_found")
    return job


def _not_a_file(file_id: str, param: str = "file_id") -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id[:80]}", param=param,
                       code="not_found")


def _input_file(file_id: str, param: str = "file_id") -> BatchFile:
    pk = _number(FILE_ID, file_id)
    batch_file = selectors.file_get(pk) if pk is not None else None
    if batch_file is None:
        raise _not_a_file(file_id, param)
    return batch_file


def _output_of(file_id: str) -> tuple[BatchJob, str] | None:
    match = OUTPUT_ID.match(file_id or "")
    if match is None:
        return None
    job = selectors.job_get(int(match.group(1)))
    if job is None:
        raise _not_a_file(file_id)
    return job, match.group(2)


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise OpenAIError(400, f"limit must be a whole number from 1 to {MAX_LIMIT}, not "
                               f"{raw[:20]!r}.", param="limit", code="invalid_value")
    return int(raw)


def _after(request: Request, pattern: re.Pattern[str]) -> int | None:
    raw = request.query_params.get("after")
    if raw is None or raw == "":
        return None
    pk = _number(pattern, raw)
    if pk is None:
        raise OpenAIError(400, f"after must be an id from a previous page, not "
                               f"{raw[:80]!r}.", param="after", code="invalid_value")
    return pk


def _page(rows: list[Any], limit: int, shape: Callable[[Any], dict[str, Any]]) -> Response:
    data = [shape(row) for row in rows[:limit]]
    return Response({"object": "list", "data": data,
                     "first_id": data[0]["id"] if data else None,
                     "last_id": data[-1]["id"] if data else None,
                     "has_more": len(rows) > limit})


# --- views ----------------------------------------------------------------------------------

class AnyAccept(BaseContentNegotiation):
    """JSON whatever Accept says: the official client asks for file content with
    `Accept: application/binary`, and OpenAI answers what it has."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]
                      ) -> BaseParser | None:
        for parser in parsers:
            if request.content_type.startswith(parser.media_type):
                return parser
        return None

    def select_renderer(self, request: Request, renderers: Iterable[BaseRenderer],
                        format_suffix: str | None = None) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, first.media_type


class OpenAIView(APIView):
    """Bearer tokens only (no session: the client sends its api_key), OpenAI error objects,
    JSON answers."""

    content_negotiation_class = AnyAccept
    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticatedActor]
    renderer_classes = [renderers.JSONRenderer]
    parser_classes = [JSONParser, MultiPartParser, FormParser]
    schema = None  # not part of /api/v1/'s schema: OpenAI's own documents it

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return exception_handler


class FilesView(OpenAIView):
    def get(self, request: Request) -> Response:
        """GET /files: input files, newest first (cursor `after`, `limit`; `purpose`
        batch or nothing). Output and error files are reached from their batch."""
        purpose = request.query_params.get("purpose")
        if purpose not in (None, "", "batch"):
            return _page([], 1, file_object)
        limit = _limit(request)
        return _page(selectors.file_page(before=_after(request, FILE_ID), limit=limit), limit,
                     file_object)

    def post(self, request: Request) -> Response:
        """POST /files (multipart `file`, `purpose=batch`): the batch upload path."""
        check_body_length(request, "file")
        form: Any = request.data
        purpose = form.get("purpose")
        if purpose != "batch":
            raise OpenAIError(400, f"purpose {str(purpose)[:40]!r} is not supported here; "
                                   f"fleetctl stores batch input files: use 'batch'.",
                              param="purpose", code="invalid_value")
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise OpenAIError(400, "Missing required parameter: 'file' (the JSONL input, as "
                                   "a multipart file).", param="file",
                              code="missing_required_parameter")
        check_size(upload, "file")
        batch_file = services.file_upload(actor=actor_from_request(request),
                                          name=upload.name or "input.jsonl", stream=upload)
        return Response(file_object(batch_file), status=status.HTTP_200_OK)


class FileView(OpenAIView):
    def get(self, request: Request, file_id: str) -> Response:
        output = _output_of(file_id)
        if output is not None:
            return Response(output_file_object(*output))
        return Response(file_object(_input_file(file_id)))

    def delete(self, request: Request, file_id: str) -> Response:
        """Delete an input file (scope `jobs`): 409 while a batch that is not finished (or a
        running soak) reads it, naming it. A batch's output and error files are its result
        rows, not stored files: they go with nothing but the batch."""
        if _output_of(file_id) is not None:
            raise OpenAIError(400, f"{file_id[:80]} is a batch's output, read from its result "
                                   f"rows: it cannot be deleted on its own (only input files "
                                   f"can).", param="file_id", code="invalid_value")
        batch_file = services.file_delete(actor=actor_from_request(request),
                                          batch_file=_input_file(file_id))
        return Response({"id": f"file-{batch_file.pk}", "object": "file", "deleted": True})


class FileContentView(OpenAIView):
    def get(self, request: Request, file_id: str) -> FileResponse | StreamingHttpResponse:
        """The file's bytes: an input file as stored; a batch's output or error file
        streamed from its rows (OpenAI's batch output lines)."""
        output = _output_of(file_id)
        if output is not None:
            job, kind = output
            response = StreamingHttpResponse(_lines(job, kind),
                                             content_type="application/jsonl")
            response["Content-Disposition"] = (f'attachment; filename="{job.public_id}_'
                                               f'{kind}.jsonl"')
            return response
        batch_file = _input_file(file_id)
        path = services.file_path(batch_file)
        if not path.is_file():
            raise OpenAIError(404, f"{file_id} ({batch_file.name}) is no longer on disk.",
                              param="file_id", code="not_found")
        return FileResponse(path.open("rb"), content_type="application/jsonl",
                            as_attachment=True, filename=batch_file.name)


class BatchesView(OpenAIView):
    def get(self, request: Request) -> Response:
        """GET /batches: every batch job, newest first (cursor `after`, `limit`)."""
        limit = _limit(request)
        jobs = selectors.job_page(before=_after(request, BATCH_ID), limit=limit)
        sums = selectors.chunk_sums([job.pk for job in jobs[:limit]])
        return _page(jobs, limit, lambda job: batch_object(job, sums.get(job.pk, {})))

    def post(self, request: Request) -> Response:
        """POST /batches: input_file_id, endpoint, completion_window ("24h"), metadata
        (`route` names the batch-class route, `pool` pins a pool of its split)."""
        data = request.data if isinstance(request.data, dict) else {}
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(data.get(name), str) or not data.get(name):
                raise OpenAIError(400, f"Missing required parameter: '{name}'.", param=name,
                                  code="missing_required_parameter")
        input_file = _input_file(data["input_file_id"], "input_file_id")
        job = services.batch_create(actor=actor_from_request(request), input_file=input_file,
                                    endpoint=data["endpoint"],
                                    completion_window=data["completion_window"],
                                    metadata=data.get("metadata"))
        return Response(batch_object(job, {}))


class BatchView(OpenAIView):
    def get(self, request: Request, batch_id: str) -> Response:
        job = _job(batch_id)
        return Response(batch_object(job, selectors.chunk_sums([job.pk]).get(job.pk, {})))


class BatchCancelView(OpenAIView):
    def post(self, request: Request, batch_id: str) -> Response:
        """Cancel an active batch (409 once it has ended); results so far stay."""
        job = _job(batch_id)
        if not job.is_active:
            raise OpenAIError(409, f"Cannot cancel batch {job.public_id}: it is "
                                   f"{STATUS.get(job.state, job.state)}.", code="conflict")
        job = services.job_cancel(actor=actor_from_request(request), job=job,
                                  reason=CANCEL_REASON)
        return Response(batch_object(job, selectors.chunk_sums([job.pk]).get(job.pk, {})))
