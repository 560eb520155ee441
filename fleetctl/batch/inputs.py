"""Batch input files (the OpenAI Batch format): validated while they are stored, then read
back by byte range.

One request per JSONL line:

    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "llama-3.1-8b-instruct", "messages": [...], "max_tokens": 64}}

`read_input` reads an upload once, line by line (fleetctl/core/jsonl.py: line-numbered,
all-or-nothing, at most 20 problems reported), writing its bytes to a temporary file in
BATCH_FILES_DIR and hashing them on the way; the file gets its final name only when every
line is good, and is deleted on any error. Nothing of a line is kept after it is checked, so
memory does not grow with the file — except the duplicate check: one 8-byte hash per
custom_id (8 MB for a million lines) in a numpy array, sorted once at the end. Equal hashes
are rare; only then is the file read a second time, comparing the real ids of the colliding
hashes, so a duplicate is reported with both its lines and a hash collision is never one.

`chunk_ranges` splits a stored file into chunks of requests (byte ranges, one streamed scan);
`read_lines` reads one range back.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from fleetctl.core.jsonl import (
    MAX_LINE_BYTES,
    JsonlError,
    LineErrors,
    message_problem,
    objects,
    show,
)
from fleetctl.inference.schema import request_schema_problem

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
KEYS = ("custom_id", "method", "url", "body")
MAX_CUSTOM_ID = 200
# Different models named in one file: a batch job runs on one pool, so a file naming more
# than a handful is a mistake, and the per-model first lines are kept in memory.
MAX_MODELS = 100
_HASH_BLOCK = 1 << 16
_WRITE_BUFFER = 1 << 20


class InputError(JsonlError):
    """An input file that cannot be used; `messages()` reads "line N: ..."."""


@dataclass
class InputSummary:
    """What a valid input holds. `path` is its final place (in `dest_dir`)."""

    path: Path
    sha256: str
    size_bytes: int
    requests: int
    url_lines: dict[str, int] = field(default_factory=dict)
    model_lines: dict[str, int] = field(default_factory=dict)


def _settings_int(name: str, default: int) -> int:
    try:
        from django.conf import settings

        return int(getattr(settings, name, default))
    except Exception:  # outside Django (a script): the defaults
        return default


class _Tee:
    """The upload's lines, each written to `out` and hashed as it is read. A line longer
    than jsonl's limit is read (and kept) in pieces; its first piece stands for it, which
    jsonl reports as too long. `last_len` is the length of the line last handed out."""

    def __init__(self, stream: Any, out: IO[bytes]) -> None:
        # Not named `readline`: jsonl would read the stream itself, past the tee.
        self._readline = getattr(stream, "readline", None)
        self.stream = stream
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0
        self.last_len = 0

    def _keep(self, piece: bytes | str) -> bytes:
        data = piece.encode("utf-8") if isinstance(piece, str) else piece
        self.out.write(data)
        self.hash.update(data)
        self.size += len(data)
        return data

    def _pieces(self) -> Iterator[bytes]:
        limit = MAX_LINE_BYTES + 2
        if self._readline is not None:
            readline = self._readline
            while True:
                piece = readline(limit)
                if not piece:
                    return
                yield self._keep(piece)
        else:  # any iterable of lines (tests, generators)
            for piece in self.stream:
                yield self._keep(piece)

    def __iter__(self) -> Iterator[bytes]:
        limit = MAX_LINE_BYTES + 2
        pieces = self._pieces()
        for line in pieces:
            if len(line) >= limit and not line.endswith(b"\n"):
                for rest in pieces:  # the rest of an overlong line: stored, never decoded
                    if rest.endswith(b"\n"):
                        break
            self.last_len = len(line)
            yield line


class _Hashes:
    """8-byte BLAKE2b hashes of custom_ids in a numpy array grown in blocks."""

    def __init__(self) -> None:
        self.values = np.empty(_HASH_BLOCK, dtype=np.uint64)
        self.count = 0

    @staticmethod
    def of(custom_id: str) -> int:
        digest = hashlib.blake2b(custom_id.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def add(self, custom_id: str) -> None:
        if self.count == len(self.values):
            grown = np.empty(len(self.values) + max(_HASH_BLOCK, len(self.values) // 2),
                             dtype=np.uint64)
            grown[:self.count] = self.values[:self.count]
            self.values = grown
        self.values[self.count] = self.of(custom_id)
        self.count += 1

    def repeated(self) -> set[int]:
        """The hashes seen more than once (sorted once; usually none)."""
        ordered = np.sort(self.values[:self.count])
        self.values = np.empty(0, dtype=np.uint64)
        same = ordered[1:][ordered[1:] == ordered[:-1]]
        return {int(v) for v in np.unique(same)}


def request_problem(value: Any, max_body_bytes: int, line_len: int) -> str | None:
    """What is wrong with one decoded line as a batch request, or None."""
    if type(value) is not dict:
        return f"must be a JSON object with custom_id, method, url and body; got {show(value)}"
    unknown = [key for key in value if key not in KEYS]
    if unknown:
        return (f"unknown key {show(unknown[0])}; a request line has only custom_id, method, "
                f"url and body")
    custom_id = value.get("custom_id")
    if custom_id is None:
        return "has no custom_id (a string naming the request in the output file)"
    if type(custom_id) is not str or not custom_id:
        return f"custom_id must be a non-empty string, got {show(custom_id)}"
    if len(custom_id) > MAX_CUSTOM_ID:
        return f"custom_id is {len(custom_id)} characters; at most {MAX_CUSTOM_ID}"
    method = value.get("method")
    if method != "POST":
        return f'method must be "POST", got {show(method)}'
    url = value.get("url")
    if url not in URLS:
        return (f"url {show(url)} is not supported; use {URLS[0]}, {URLS[1]} or {URLS[2]}")
    body = value.get("body")
    if type(body) is not dict:
        return f"body must be a JSON object (the request), got {show(body)}"
    model = body.get("model")
    if type(model) is not str or not model:
        return f"body.model must name the model (a non-empty string), got {show(model)}"
    if body.get("stream") is True:
        return ('body.stream is true; batch requests are answered whole: remove "stream" or '
                'set it to false')
    if url == URLS[0]:
        problem = message_problem(body.get("messages"))
        if problem:
            return f"body.{problem[0]}: {problem[1]}"
    elif url == URLS[2]:
        if not isinstance(body.get("input"), str | list) or not body.get("input"):
            return (f"body.input must be a non-empty string or list (what to embed), got "
                    f"{show(body.get('input'))}")
    elif not isinstance(body.get("prompt"), str | list) or not body.get("prompt"):
        return f"body.prompt must be a non-empty string or list, got {show(body.get('prompt'))}"
    schema = request_schema_problem(body)  # a comparison with the primary compiles them
    if schema is not None:
        return f"body.{schema[0]}: {schema[1]}"
    if line_len > max_body_bytes:  # the body is part of the line: only then measure it
        size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
        if size > max_body_bytes:
            return (f"body is {size:,} bytes; at most {max_body_bytes:,} "
                    f"(BATCH_MAX_BODY_BYTES)")
    return None


def read_input(stream: Any, *, dest_dir: Path | str, max_errors: int = 20,
               max_requests: int | None = None,
               max_body_bytes: int | None = None) -> InputSummary:
    """Validate an input while storing it in `dest_dir`. `stream` is a binary file object
    (read with readline) or an iterable of lines. Raises InputError ("line N: ...", at most
    `max_errors`) and leaves nothing behind when any line is bad."""
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    max_requests = max_requests or _settings_int("BATCH_MAX_REQUESTS", 5_000_000)
    max_body_bytes = max_body_bytes or _settings_int("BATCH_MAX_BODY_BYTES", 256 * 1024)
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=".upload-", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb", buffering=_WRITE_BUFFER) as out:
            tee = _Tee(stream, out)
            summary = _validate(tee, max_errors, max_requests, max_body_bytes, tmp)
        summary.sha256 = tee.hash.hexdigest()
        summary.size_bytes = tee.size
        final = dest / f"{summary.sha256[:16]}-{secrets.token_hex(4)}.jsonl"
        os.replace(tmp, final)
        summary.path = final
        return summary
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _validate(tee: _Tee, max_errors: int, max_requests: int, max_body_bytes: int,
              tmp: Path) -> InputSummary:
    errors = LineErrors(max_errors, what="input file", error=InputError)
    hashes = _Hashes()
    url_lines: dict[str, int] = {}
    model_lines: dict[str, int] = {}
    count = 0
    for lineno, value in objects(tee, errors):
        count += 1
        if count > max_requests:
            errors.stop(lineno, f"the file holds more than {max_requests:,} requests "
                                f"(BATCH_MAX_REQUESTS); split it into several jobs")
        problem = request_problem(value, max_body_bytes, tee.last_len)
        if problem:
            errors.add(lineno, problem)
            continue
        hashes.add(value["custom_id"])
        url_lines.setdefault(value["url"], lineno)
        model = value["body"]["model"]
        if model not in model_lines:
            if len(model_lines) >= MAX_MODELS:
                errors.stop(lineno, f"names a {MAX_MODELS + 1}th model ({show(model)}); a "
                                    f"job runs on one pool: at most {MAX_MODELS} models")
            model_lines[model] = lineno
    repeated = hashes.repeated()
    if repeated and not errors.items:
        tee.out.flush()
        _duplicates(tmp, repeated, errors)
    errors.items.sort()
    errors.finish(count, empty="the file holds no requests (every line is blank)")
    return InputSummary(path=tmp, sha256="", size_bytes=0, requests=count,
                        url_lines=url_lines, model_lines=model_lines)


def _duplicates(path: Path, repeated: set[int], errors: LineErrors) -> None:
    """The second pass: the real ids of the hashes seen twice, each duplicate named with the
    line it repeats. Only ids with a repeated hash are remembered."""
    first: dict[str, int] = {}
    with path.open("rb") as stream:
        for lineno, value in objects(stream, LineErrors(max_errors=1)):
            custom_id = value["custom_id"]
            if _Hashes.of(custom_id) not in repeated:
                continue
            seen = first.setdefault(custom_id, lineno)
            if seen != lineno:
                errors.add(lineno, f"custom_id {show(custom_id)} is already on line {seen}; "
                                   f"each request needs its own custom_id")


# --- reading a stored file back -----------------------------------------------------------

def chunk_ranges(path: Path | str, chunk_size: int
                 ) -> Iterator[tuple[int, int, int, int, int]]:
    """(first_index, last_index, first_line, byte_start, byte_end) for each chunk of
    `chunk_size` requests of a validated file, in one streamed scan. Indices count requests
    from 0; lines count file lines from 1 (blank ones included); [byte_start, byte_end)
    covers the chunk's lines (and any blank lines between them)."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    index = -1
    offset = 0
    first_index = first_line = byte_start = byte_end = -1
    with Path(path).open("rb") as stream:
        for lineno, line in enumerate(stream, 1):
            start, offset = offset, offset + len(line)
            # In a validated file every line is blank or a JSON object: "{" marks a request.
            if b"{" not in line:
                continue
            index += 1
            if first_index < 0:
                first_index, first_line, byte_start = index, lineno, start
            byte_end = offset
            if index - first_index + 1 == chunk_size:
                yield first_index, index, first_line, byte_start, byte_end
                first_index = -1
    if first_index >= 0:
        yield first_index, index, first_line, byte_start, byte_end


def read_lines(path: Path | str, byte_start: int, byte_end: int, *, first_line: int = 1
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(file line number, request) for each request stored in [byte_start, byte_end) of a
    validated file; `first_line` is the line number at byte_start (a chunk's first_line)."""
    with Path(path).open("rb") as stream:
        stream.seek(byte_start)
        offset = byte_start
        lineno = first_line
        while offset < byte_end:
            line = stream.readline()
            if not line:
                return
            offset += len(line)
            if b"{" in line:
                if byte_start == 0 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]
                yield lineno, json.loads(line)
            lineno += 1
