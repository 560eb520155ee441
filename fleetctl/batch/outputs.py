"""A job's output and error files, in the OpenAI Batch output format, streamed from its
BatchResult rows in request order (`.iterator()`: a million results never sit in memory).

Output file (answers with a 2xx status), one JSON line each:

    {"id": "batch_req_<job>_<index>", "custom_id": "...",
     "response": {"status_code": 200, "request_id": "", "body": {...the answer...}},
     "error": null}

Error file (everything else: a 4xx/5xx the pool answered, or no answer at all):

    {"id": "batch_req_<job>_<index>", "custom_id": "...",
     "response": {"status_code": 429, "request_id": "", "body": {...} | null} | null,
     "error": {"code": "retries_exhausted", "message": "..."}}

`response` is null when the pool gave no answer (status 0: a transport error, a timeout);
its `body` is null when the answer was not JSON. A partial job (expired, cancelled) has
partial files: the requests without a result are in neither.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from fleetctl.batch.models import BatchJob, BatchResult
from fleetctl.core.jsonl import fast_loads

FIELDS = ("index", "custom_id", "status_code", "body", "error_code", "error_message")
ROWS_PER_FETCH = 2000
STREAM_BLOCK_BYTES = 64 * 1024


def _body(text: str) -> Any:
    """The stored answer as JSON, or None when there is none or it is not JSON."""
    if not text:
        return None
    try:
        return fast_loads(text)
    except (ValueError, TypeError):
        try:
            return json.loads(text)
        except ValueError:
            return None


def _line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, ensure_ascii=False, separators=(", ", ": ")) + "\n").encode()


def _rows(job: BatchJob, ok: bool) -> Iterator[BatchResult]:
    results = BatchResult.objects.filter(job_id=job.pk)
    if ok:
        results = results.filter(status_code__gte=200, status_code__lt=300)
    else:
        results = results.exclude(status_code__gte=200, status_code__lt=300)
    return results.only(*FIELDS).order_by("index").iterator(chunk_size=ROWS_PER_FETCH)


def error_code(result: BatchResult) -> str:
    """The error's code: the one the worker recorded, else one from the status."""
    if result.error_code:
        return result.error_code
    return "no_response" if result.status_code == 0 else f"http_{result.status_code}"


def output_lines(job: BatchJob) -> Iterator[bytes]:
    """The output file: one line per successful request, by index."""
    prefix = f"batch_req_{job.pk}_"
    for result in _rows(job, ok=True):
        yield _line({"id": f"{prefix}{result.index}", "custom_id": result.custom_id,
                     "response": {"status_code": result.status_code, "request_id": "",
                                  "body": _body(result.body)},
                     "error": None})


def error_lines(job: BatchJob) -> Iterator[bytes]:
    """The error file: one line per request that ended without a 2xx answer, by index."""
    prefix = f"batch_req_{job.pk}_"
    for result in _rows(job, ok=False):
        response = None if result.status_code == 0 else {
            "status_code": result.status_code, "request_id": "", "body": _body(result.body)}
        message = result.error_message or (
            "no answer from the pool" if result.status_code == 0
            else f"the pool answered HTTP {result.status_code}")
        yield _line({"id": f"{prefix}{result.index}", "custom_id": result.custom_id,
                     "response": response,
                     "error": {"code": error_code(result), "message": message}})


def blocks(lines: Iterable[bytes], size: int = STREAM_BLOCK_BYTES) -> Iterator[bytes]:
    """Lines joined into blocks of about `size` bytes, so a streamed download is not one
    write per line."""
    buffer: list[bytes] = []
    held = 0
    for line in lines:
        buffer.append(line)
        held += len(line)
        if held >= size:
            yield b"".join(buffer)
            buffer, held = [], 0
    if buffer:
        yield b"".join(buffer)
