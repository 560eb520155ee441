"""The fleetctl trace format (JSONL, documented in fleetctl/bench/TRACES.md): its reader,
the hot loop of every upload, and its writer."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import IO, Any

from fleetctl.bench.traces import reading
from fleetctl.bench.traces.reading import TraceStream, _backwards, _check_limits, _Errors
from fleetctl.bench.traces.request import (
    FORMAT_VERSION,
    HEADER_KEYS,
    LATENCY_CLASSES,
    MAX_GROUP_ID_CHARS,
    MAX_TOKENS,
    REQUEST_KEYS,
    REQUIRED_KEYS,
    TraceHeader,
    TraceRequest,
    _build_validated,
    request_problem,
)
from fleetctl.core.jsonl import decoded_lines
from fleetctl.core.jsonl import show as _show


def parse_jsonl(lines: Iterable[bytes | str], *, max_errors: int = 20,
                max_requests: int = 5_000_000) -> TraceStream:
    """Stream and validate a fleetctl trace (JSONL). `lines` is any iterable of lines — a file
    opened in binary mode is best. Raises TraceError as described in the module docstring."""
    _check_limits(max_errors, max_requests)
    stream = TraceStream("fleetctl")
    stream._requests = _fleetctl_requests(lines, stream, _Errors(max_errors), max_requests)
    return stream


def _fleetctl_requests(lines: Iterable[bytes | str], stream: TraceStream, errors: _Errors,
                       max_requests: int) -> Iterator[TraceRequest]:
    # The hot loop of every upload: locals instead of globals, and the common line (valid
    # counts, few keys) decided with a handful of comparisons before any function call.
    check, build = request_problem, _build_validated
    inf, top, group_chars = math.inf, MAX_TOKENS, MAX_GROUP_ID_CHARS
    keys, classes = REQUEST_KEYS, LATENCY_CLASSES
    count, prev_arrival, prev_line, first = 0, 0.0, 0, True
    for lineno, _raw, obj in decoded_lines(lines, errors, loads=reading._fast_loads):
        try:
            pt, ct, at = obj["prompt_tokens"], obj["completion_tokens"], obj["arrival_s"]
        except (KeyError, TypeError, IndexError):
            if first and type(obj) is dict and "fleetctl_trace" in obj:
                stream.header = _header(lineno, obj, errors)
            else:
                errors.add(lineno, _shape_problem(obj))
            first = False
            continue
        first = False
        if len(obj) == 3:
            prompt = messages = group = latency = None
            prefix = 0
        elif obj.keys() <= keys:
            get = obj.get
            prompt, messages, group = get("prompt"), get("messages"), get("prefix_group")
            prefix, latency = get("prefix_tokens", 0), get("latency_class")
        else:
            errors.add(lineno, _shape_problem(obj))
            continue
        # The fast test accepts only what request_problem() would accept; anything else
        # (int arrival, text, a doubtful field) gets the full check and its message.
        if not (type(pt) is int and type(ct) is int and type(at) is float
                and 0 < pt <= top and 0 < ct <= top and 0.0 <= at < inf
                and prompt is None and messages is None
                and (latency is None or latency in classes) and type(prefix) is int
                and ((group is None and not prefix)
                     or (type(group) is str and 0 < len(group) <= group_chars
                         and 0 <= prefix <= pt))):
            problem = check(pt, ct, at, prompt, messages, group, prefix, latency)
            if problem:
                errors.add(lineno, problem)
                continue
            at = float(at)
        if at < prev_arrival:
            errors.add(lineno, _backwards("arrival_s", at, prev_arrival, prev_line))
            continue
        prev_arrival, prev_line = at, lineno
        count = errors.counted(lineno, count, max_requests)
        if not errors:
            yield build(pt, ct, at, prompt, messages, group, prefix, latency)
    errors.finish(count)


def _shape_problem(obj: object) -> str:
    if type(obj) is not dict:
        return f"must be a JSON object, got {_show(obj)}"
    if "fleetctl_trace" in obj:
        return "a header line is only allowed as the first line"
    unknown = sorted(obj.keys() - REQUEST_KEYS)
    missing = sorted(REQUIRED_KEYS - obj.keys())
    parts = []
    if missing:
        parts.append(f"missing required key{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(missing)}")
    if unknown:
        parts.append(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                     f"(allowed: {', '.join(sorted(REQUEST_KEYS))})")
    return "; ".join(parts)


def _header(lineno: int, obj: dict[str, Any], errors: _Errors) -> TraceHeader | None:
    unknown = sorted(obj.keys() - HEADER_KEYS)
    version, name, description = (obj.get("fleetctl_trace"), obj.get("name", ""),
                                  obj.get("description", ""))
    if unknown:
        errors.add(lineno, f"unknown header key{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(unknown)} (allowed: {', '.join(sorted(HEADER_KEYS))})")
    elif version != FORMAT_VERSION or type(version) is not int:
        errors.add(lineno, f"fleetctl_trace must be {FORMAT_VERSION} (the format version this "
                           f"fleetctl reads), got {_show(version)}")
    elif type(name) is not str or type(description) is not str:
        errors.add(lineno, "header name and description must be strings")
    else:
        return TraceHeader(name=name, description=description, version=version)
    return None


def write_jsonl(requests: Iterable[TraceRequest], fp: IO[Any], *,
                header: TraceHeader | None = None) -> int:
    """Write requests as a fleetctl trace to a text or binary file; returns the count."""
    binary = not isinstance(fp, io.TextIOBase)
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode
    count = 0

    def put(obj: dict[str, Any]) -> None:
        line = dumps(obj) + "\n"
        fp.write(line.encode("utf-8") if binary else line)

    if header is not None:
        head: dict[str, Any] = {"fleetctl_trace": header.version, "name": header.name}
        if header.description:
            head["description"] = header.description
        put(head)
    for request in requests:
        put(request.to_json())
        count += 1
    return count
