"""Request traces: the fleetctl trace format, importers for public traces, a synthetic
generator and a one-pass summary.

Pure Python, no Django: the bench services, the upload view and the CLI all call this module.
Every reader streams — it holds one line at a time (plus, for Mooncake, a bounded table of
prefix groups), so a multi-gigabyte upload never sits in memory. The format is documented in
`TRACES.md` next to this file.

Reading contract (all parsers): requests are yielded as they are validated. After the first
bad line nothing more is yielded; the reader keeps scanning only to report up to `max_errors`
problems, then raises `TraceError`. A trace is valid only if iteration finishes without
`TraceError`, so a caller that stores requests while reading must discard them on error.
"""

from __future__ import annotations

import bisect
import io
import itertools
import json
import math
import random
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import IO, Any, Literal

from fleetctl.core import jsonl
from fleetctl.core.jsonl import JSON_DECODER as JSON_DECODER  # re-exported (benchmarks print it)
from fleetctl.core.jsonl import (
    MAX_LINE_BYTES,
    OVERLONG,
    OVERLONG_MESSAGE,
    SKIP,
    JsonlError,
    LineErrors,
    Replay,
    decoded,
    line_reader,
    retry,
)
from fleetctl.core.jsonl import MESSAGE_ROLES as MESSAGE_ROLES  # re-exported for callers
from fleetctl.core.jsonl import show as _show

MAX_TOKENS = 10_000_000
MAX_GROUP_ID_CHARS = 200
LATENCY_CLASSES = ("interactive", "standard", "batch")
FORMAT_VERSION = 1
MOONCAKE_BLOCK_TOKENS = 512
# Mooncake prefix groups remembered at once; the oldest is forgotten first (see TRACES.md).
MOONCAKE_GROUP_MEMORY = 65_536

TraceFormat = Literal["fleetctl", "mooncake", "azure-csv"]

REQUIRED_KEYS = frozenset({"prompt_tokens", "completion_tokens", "arrival_s"})
OPTIONAL_KEYS = frozenset(
    {"prompt", "messages", "prefix_group", "prefix_tokens", "latency_class"})
REQUEST_KEYS = REQUIRED_KEYS | OPTIONAL_KEYS
HEADER_KEYS = frozenset({"fleetctl_trace", "name", "description"})
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


# The line plumbing (streamed reading, UTF-8, the fast JSON decoder with the standard library
# deciding and wording errors, the error cap) is shared with every JSONL upload:
# fleetctl/core/jsonl.py. The decoders are module attributes here so that the hot loop reads
# them once per parse, and a test or benchmark can swap in the standard library's.
_stdlib_loads = jsonl.stdlib_loads
_fast_loads = jsonl.fast_loads
NO_REQUESTS = "the trace has no requests"


class TraceError(JsonlError):
    """A trace that cannot be used. `errors` holds (line number, message) pairs; line 0 means
    the file as a whole (for example "the trace has no requests")."""


# --- the request ------------------------------------------------------------------------------


def _positive_int(name: str, value: object) -> str | None:
    if type(value) is not int or value < 1:
        return f"{name} must be a positive integer, got {_show(value)}"
    if value > MAX_TOKENS:
        return f"{name} must be at most {MAX_TOKENS:,}, got {value:,}"
    return None


def _message_problem(messages: object) -> str | None:
    problem = jsonl.message_problem(messages)
    return f"{problem[0]} {problem[1]}" if problem else None


def request_problem(prompt_tokens: object, completion_tokens: object, arrival_s: object,
                    prompt: object = None, messages: object = None, prefix_group: object = None,
                    prefix_tokens: object = 0, latency_class: object = None) -> str | None:
    """What is wrong with these request fields, or None. Ordered so the common case (valid
    counts, no text) costs a handful of comparisons: parsers call this for every line."""
    if type(prompt_tokens) is not int or not 0 < prompt_tokens <= MAX_TOKENS:
        return _positive_int("prompt_tokens", prompt_tokens)
    if type(completion_tokens) is not int or not 0 < completion_tokens <= MAX_TOKENS:
        return _positive_int("completion_tokens", completion_tokens)
    if type(arrival_s) is float:
        if not 0.0 <= arrival_s < math.inf:  # also true for NaN
            return _arrival_problem(arrival_s)
    elif type(arrival_s) is not int or arrival_s < 0:
        return _arrival_problem(arrival_s)
    if prompt is not None or messages is not None:
        problem = _text_problem(prompt, messages)
        if problem:
            return problem
    if prefix_group is not None or type(prefix_tokens) is not int or prefix_tokens:
        problem = _prefix_problem(prompt_tokens, prefix_group, prefix_tokens)
        if problem:
            return problem
    if latency_class is not None and latency_class not in LATENCY_CLASSES:
        return (f"latency_class must be one of {', '.join(LATENCY_CLASSES)}, "
                f"got {_show(latency_class)}")
    return None


def _arrival_problem(arrival: object) -> str:
    return f"arrival_s must be a finite number of seconds ≥ 0, got {_show(arrival)}"


def _text_problem(prompt: object, messages: object) -> str | None:
    if prompt is not None:
        if type(prompt) is not str or not prompt:
            return f"prompt must be a non-empty string, got {_show(prompt)}"
        if messages is not None:
            return "give either prompt or messages, not both"
    if messages is not None:
        # The one place a trace line can nest (every other value is a number or a string);
        # a line over 200 levels never gets here (jsonl.retry refuses it).
        if jsonl.too_deep(messages, jsonl.MAX_DEPTH - 1):
            return jsonl.DEPTH_MESSAGE
        return _message_problem(messages)
    return None


def _prefix_problem(prompt_tokens: int, group: object, tokens: object) -> str | None:
    if group is not None and (type(group) is not str or not group
                              or len(group) > MAX_GROUP_ID_CHARS):
        return (f"prefix_group must be a non-empty string of at most "
                f"{MAX_GROUP_ID_CHARS} characters, got {_show(group)}")
    if type(tokens) is not int or tokens < 0:
        return f"prefix_tokens must be an integer ≥ 0, got {_show(tokens)}"
    if tokens > prompt_tokens:
        return f"prefix_tokens ({tokens}) cannot exceed prompt_tokens ({prompt_tokens})"
    if tokens and group is None:
        return "prefix_tokens needs a prefix_group naming the requests that share it"
    return None


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. Construction validates; a bad field raises ValueError with a
    message that names it. `arrival_s` is the offset from the trace start in seconds."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None

    def __post_init__(self) -> None:
        problem = request_problem(self.prompt_tokens, self.completion_tokens, self.arrival_s,
                                  self.prompt, self.messages, self.prefix_group,
                                  self.prefix_tokens, self.latency_class)
        if problem:
            raise ValueError(problem)
        if type(self.arrival_s) is int:
            object.__setattr__(self, "arrival_s", float(self.arrival_s))

    def to_json(self) -> dict[str, Any]:
        """The trace-format object: required keys always, optional keys only when set."""
        out: dict[str, Any] = {"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.messages is not None:
            out["messages"] = self.messages
        if self.prefix_group is not None:
            out["prefix_group"] = self.prefix_group
        if self.prefix_tokens:
            out["prefix_tokens"] = self.prefix_tokens
        if self.latency_class is not None:
            out["latency_class"] = self.latency_class
        return out


def _validated_builder() -> Callable[..., TraceRequest]:
    """A constructor for fields request_problem() has already passed. The frozen dataclass
    __init__ (eight object.__setattr__ calls, then __post_init__ validating again) is about
    half the cost of parsing a line; the slot descriptors set the same fields directly."""
    new = object.__new__
    setters = [getattr(TraceRequest, name).__set__ for name in TraceRequest.__slots__]
    s0, s1, s2, s3, s4, s5, s6, s7 = setters

    def build(prompt_tokens: int, completion_tokens: int, arrival_s: float, prompt: Any,
              messages: Any, prefix_group: Any, prefix_tokens: int,
              latency_class: Any) -> TraceRequest:
        request = new(TraceRequest)
        s0(request, prompt_tokens)
        s1(request, completion_tokens)
        s2(request, arrival_s)
        s3(request, prompt)
        s4(request, messages)
        s5(request, prefix_group)
        s6(request, prefix_tokens)
        s7(request, latency_class)
        return request

    assert TraceRequest.__slots__ == tuple(REQUEST_FIELDS)
    return build


REQUEST_FIELDS = ("prompt_tokens", "completion_tokens", "arrival_s", "prompt", "messages",
                  "prefix_group", "prefix_tokens", "latency_class")
_build_validated = _validated_builder()


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The optional first line of a fleetctl trace."""

    name: str = ""
    description: str = ""
    version: int = FORMAT_VERSION


# --- streaming plumbing -----------------------------------------------------------------------


class _Errors(LineErrors):
    """Line errors of a trace (raised as TraceError), with the trace's request limit."""

    def __init__(self, max_errors: int) -> None:
        super().__init__(max_errors, what="trace", error=TraceError)

    def counted(self, lineno: int, count: int, max_requests: int) -> int:
        """One more request (on line `lineno`); past `max_requests` the trace is refused."""
        count += 1
        if count > max_requests:
            self.add(lineno, _too_many(max_requests))
            raise TraceError(self.items)
        return count

    def finish(self, count: int, *, empty: str = NO_REQUESTS) -> None:
        super().finish(count, empty=empty)


def _imported(errors: _Errors, lineno: int, names: tuple[str, str],
              **fields: Any) -> TraceRequest | None:
    """A request from an importer's row, or None with the error recorded in the format's own
    names for the prompt and completion token counts (`names`)."""
    try:
        return TraceRequest(**fields)
    except ValueError as exc:
        errors.add(lineno, str(exc).replace("prompt_tokens", names[0])
                   .replace("completion_tokens", names[1]))
        return None


def _check_limits(max_errors: int, max_requests: int) -> None:
    if type(max_errors) is not int or max_errors < 1:
        raise ValueError(f"max_errors must be a positive integer, got {max_errors!r}")
    if type(max_requests) is not int or max_requests < 1:
        raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")


def _too_many(max_requests: int) -> str:
    return (f"the trace has more than {max_requests:,} requests, the limit; "
            f"split it into smaller traces")


class TraceStream(Iterator[TraceRequest]):
    """What the parsers return: an iterator of requests that also tells what it read.
    `header` is set once the first request (or the end) has been reached."""

    def __init__(self, trace_format: TraceFormat) -> None:
        self.format: TraceFormat = trace_format
        self.header: TraceHeader | None = None
        self._requests: Iterator[TraceRequest] = iter(())

    def __iter__(self) -> TraceStream:
        return self

    def __next__(self) -> TraceRequest:
        return next(self._requests)


# --- the fleetctl format ----------------------------------------------------------------------


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
    loads, check, build = _fast_loads, request_problem, _build_validated
    inf, top, group_chars = math.inf, MAX_TOKENS, MAX_GROUP_ID_CHARS
    keys, classes = REQUEST_KEYS, LATENCY_CLASSES
    count, prev_arrival, prev_line, first = 0, 0.0, 0, True
    reader, finish = line_reader(lines)
    for lineno, raw in enumerate(reader, 1):
        if len(raw) > MAX_LINE_BYTES:
            raw = finish(raw)
        try:
            obj = loads(raw)
        except (ValueError, TypeError):
            obj = retry(lineno, raw, errors)
            if obj is SKIP:
                continue
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


def _backwards(name: str, value: float, previous: float, prev_line: int) -> str:
    return (f"{name} {value:g} is earlier than {previous:g} on line {prev_line}; "
            f"arrival offsets must not decrease (sort the trace by arrival)")


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


# --- importers --------------------------------------------------------------------------------


def parse_mooncake(lines: Iterable[bytes | str], *, max_errors: int = 20,
                   max_requests: int = 5_000_000,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> TraceStream:
    """Stream a Mooncake (FAST'25) trace: JSONL objects with timestamp (ms), input_length,
    output_length and hash_ids. Keys other than those are ignored."""
    _check_limits(max_errors, max_requests)
    if type(block_tokens) is not int or block_tokens < 1:
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    stream = TraceStream("mooncake")
    stream._requests = _mooncake_requests(lines, _Errors(max_errors), max_requests, block_tokens)
    return stream


def _mooncake_requests(lines: Iterable[bytes | str], errors: _Errors, max_requests: int,
                       block_tokens: int) -> Iterator[TraceRequest]:
    # first hash id -> the group's first request's hash ids, oldest group first
    groups: OrderedDict[int, list[int]] = OrderedDict()
    count, first_ms, prev_ms, prev_line = 0, None, 0.0, 0
    loads = _fast_loads
    reader, finish = line_reader(lines)
    for lineno, raw in enumerate(reader, 1):
        if len(raw) > MAX_LINE_BYTES:
            raw = finish(raw)
        try:
            obj = loads(raw)
        except (ValueError, TypeError):
            obj = retry(lineno, raw, errors)
            if obj is SKIP:
                continue
        problem, ms = _mooncake_problem(obj)
        if problem:
            errors.add(lineno, problem)
            continue
        if first_ms is None:
            first_ms = ms
        elif ms < prev_ms:
            errors.add(lineno, _backwards("timestamp", ms, prev_ms, prev_line))
            continue
        prev_ms, prev_line = ms, lineno
        group, prefix = _mooncake_prefix(groups, obj.get("hash_ids") or [], block_tokens,
                                         obj["input_length"])
        request = _imported(errors, lineno, ("input_length", "output_length"),
                            prompt_tokens=obj["input_length"],
                            completion_tokens=obj["output_length"],
                            arrival_s=round((ms - first_ms) / 1000, 6),
                            prefix_group=group, prefix_tokens=prefix)
        if request is None:
            continue
        count = errors.counted(lineno, count, max_requests)
        if not errors:
            yield request
    errors.finish(count)


def _mooncake_problem(obj: object) -> tuple[str | None, float]:
    if type(obj) is not dict:
        return f"must be a JSON object, got {_show(obj)}", 0.0
    if len(obj) > 4 and jsonl.too_deep(obj):  # only the keys it ignores can nest
        return jsonl.DEPTH_MESSAGE, 0.0
    missing = sorted({"timestamp", "input_length", "output_length"} - obj.keys())
    if missing:
        return f"missing required key{'s' if len(missing) > 1 else ''} {', '.join(missing)}", 0.0
    ms = obj["timestamp"]
    if type(ms) not in (int, float) or not 0 <= ms < math.inf:
        return f"timestamp must be milliseconds ≥ 0, got {_show(ms)}", 0.0
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None and (type(hash_ids) is not list
                                 or not all(type(h) is int for h in hash_ids)):
        return f"hash_ids must be a list of integers, got {_show(hash_ids)}", 0.0
    return None, float(ms)


def _mooncake_prefix(groups: OrderedDict[int, list[int]], hash_ids: list[int], block_tokens: int,
                     input_length: int) -> tuple[str | None, int]:
    """Group by the first hash id; the shared prefix is the run of leading hash ids equal to
    the group's first request's, in blocks. The group's first request shares nothing yet."""
    if not hash_ids:
        return None, 0
    first_seen = groups.get(hash_ids[0])
    if first_seen is None:
        if len(groups) >= MOONCAKE_GROUP_MEMORY:
            groups.popitem(last=False)
        groups[hash_ids[0]] = hash_ids
        return None, 0
    shared = 0
    for mine, theirs in zip(hash_ids, first_seen, strict=False):
        if mine != theirs:
            break
        shared += 1
    tokens = min(shared * block_tokens, input_length) if type(input_length) is int else 0
    return f"mooncake-{hash_ids[0]}", max(tokens, 0)


_Minutes = dict[str, tuple[int, int]]  # "YYYY-MM-DD HH:MM" -> (day number, seconds into day)
_AZURE_TIME = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)?")


def parse_azure_csv(lines: Iterable[bytes | str], *, max_errors: int = 20,
                    max_requests: int = 5_000_000) -> TraceStream:
    """Stream an Azure LLM inference trace (2023/2024) CSV with the header
    TIMESTAMP,ContextTokens,GeneratedTokens. Arrival is relative to the first row."""
    _check_limits(max_errors, max_requests)
    stream = TraceStream("azure-csv")
    stream._requests = _azure_requests(lines, _Errors(max_errors), max_requests)
    return stream


def _azure_requests(lines: Iterable[bytes | str], errors: _Errors,
                    max_requests: int) -> Iterator[TraceRequest]:
    minutes: _Minutes = {}
    count, header_seen, origin, prev, prev_line = 0, False, None, 0.0, 0
    reader, finish = line_reader(lines)
    for lineno, raw in enumerate(reader, 1):
        if len(raw) > MAX_LINE_BYTES:
            raw = finish(raw)
        try:
            text = decoded(raw, "trace").strip()
        except ValueError as exc:
            errors.add(lineno, str(exc))
            continue
        if not text:
            continue
        if not header_seen:
            header_seen = True
            if text.lstrip("\ufeff") != AZURE_HEADER:
                errors.add(lineno, f"the first line must be the header {AZURE_HEADER}, "
                                   f"got {_show(text)}")
                raise TraceError(errors.items)
            continue
        try:
            (day, seconds), prompt_tokens, completion_tokens = _azure_row(text, minutes)
        except ValueError as exc:
            errors.add(lineno, str(exc))
            continue
        if origin is None:
            origin = (day, seconds)
        # Days and seconds apart: one float of seconds since year 1 would keep only ~8 µs.
        arrival = round((day - origin[0]) * 86400 + (seconds - origin[1]), 7)
        if arrival < prev:
            errors.add(lineno, _backwards("TIMESTAMP", arrival, prev, prev_line))
            continue
        prev, prev_line = arrival, lineno
        request = _imported(errors, lineno, ("ContextTokens", "GeneratedTokens"),
                            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            arrival_s=arrival)
        if request is None:
            continue
        count = errors.counted(lineno, count, max_requests)
        if not errors:
            yield request
    errors.finish(count)


def _azure_row(text: str, minutes: _Minutes) -> tuple[tuple[int, float], int, int]:
    fields = text.split(",")
    if len(fields) != 3:
        raise ValueError(f"must have 3 comma-separated fields ({AZURE_HEADER}), "
                         f"got {len(fields)}")
    stamp, context, generated = (f.strip() for f in fields)
    return _azure_time(stamp, minutes), _csv_int("ContextTokens", context), \
        _csv_int("GeneratedTokens", generated)


def _csv_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {_show(text)}") from None


def _azure_time(stamp: str, minutes: _Minutes) -> tuple[int, float]:
    """(day number, seconds into that day in UTC) of a TIMESTAMP. The public files repeat
    each minute thousands of times, so the minute is parsed once and cached; only the seconds
    are parsed per row. Anything else (a zone suffix) takes the regular expression."""
    minute = minutes.get(stamp[:16])
    rest = stamp[17:]
    if minute is not None and stamp[16:17] == ":" and rest.isascii() and rest[:2].isdigit() \
            and rest[:2] <= "60" and (len(rest) == 2 or (
                rest[2:3] == "." and rest[3:].isdigit() and len(rest) <= 12)):
        return minute[0], minute[1] + float(rest)
    return _azure_time_slowly(stamp, minutes)


def _azure_time_slowly(stamp: str, minutes: _Minutes) -> tuple[int, float]:
    match = _AZURE_TIME.fullmatch(stamp)
    if match is None:
        raise ValueError(f"TIMESTAMP must look like 2023-11-16 18:15:46.6805900, got "
                         f"{_show(stamp)}")
    y, mo, d, h, mi, s, frac, zone = match.groups()
    try:
        day = date(int(y), int(mo), int(d)).toordinal()
    except ValueError:
        raise ValueError(f"TIMESTAMP has an impossible date: {stamp[:10]}") from None
    if int(h) > 23 or int(mi) > 59 or int(s) > 60:
        raise ValueError(f"TIMESTAMP has an impossible time of day: {_show(stamp)}")
    minute_s = int(h) * 3600 + int(mi) * 60
    seconds = minute_s + int(s) + (int(frac) / 10 ** len(frac) if frac else 0)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "+" else 1
        seconds += sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    elif len(minutes) < 100_000:  # a bound for hostile files; real ones have a minute a row
        minutes[stamp[:16]] = (day, minute_s)
    return day, seconds


# --- detection --------------------------------------------------------------------------------


def detect_format(first_line: bytes | str) -> TraceFormat:
    """Which reader a trace needs, from its first non-blank line."""
    text = first_line.decode("utf-8", "replace") if isinstance(first_line, bytes) else first_line
    text = text.strip().lstrip("\ufeff")
    if text == AZURE_HEADER:
        return "azure-csv"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what json can read
        obj = None
    if type(obj) is dict:
        if "fleetctl_trace" in obj or "prompt_tokens" in obj:
            return "fleetctl"
        if "input_length" in obj and "timestamp" in obj:
            return "mooncake"
    raise TraceError([(1, "is not a trace format fleetctl reads: expected a fleetctl trace "
                          "(JSONL with prompt_tokens), a Mooncake trace (JSONL with "
                          f"input_length and timestamp) or an Azure CSV ({AZURE_HEADER})")])


PARSERS: dict[str, Callable[..., TraceStream]] = {
    "fleetctl": parse_jsonl, "mooncake": parse_mooncake, "azure-csv": parse_azure_csv,
}


def parse_trace(lines: Iterable[bytes | str], *, trace_format: TraceFormat | None = None,
                max_errors: int = 20, max_requests: int = 5_000_000) -> TraceStream:
    """Detect the format from the first non-blank line (unless given) and stream the trace.
    Line numbers in errors stay those of the file."""
    reader, finish = line_reader(lines)
    leading: list[bytes | str] = []
    for raw in reader:
        if len(raw) > MAX_LINE_BYTES and finish(raw) is OVERLONG:
            raise TraceError([(len(leading) + 1, OVERLONG_MESSAGE)])
        leading.append(raw)
        if raw.strip():
            break
    if trace_format is None:
        if not leading or not leading[-1].strip():
            raise TraceError([(0, NO_REQUESTS)])
        try:
            trace_format = detect_format(leading[-1])
        except TraceError as exc:
            raise TraceError([(len(leading), exc.errors[0][1])]) from None
    if trace_format not in PARSERS:
        raise ValueError(f"trace_format must be one of {', '.join(PARSERS)}, "
                         f"got {trace_format!r}")
    replay = Replay(itertools.chain(leading, reader), finish)
    return PARSERS[trace_format](replay, max_errors=max_errors, max_requests=max_requests)


# --- synthetic traces -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution of token counts (integers ≥ 1). Build with the class methods."""

    kind: Literal["constant", "uniform", "lognormal", "empirical"]
    params: tuple[float, ...]
    values: tuple[int, ...] = ()

    @classmethod
    def constant(cls, value: int) -> Dist:
        _need_tokens("constant value", value)
        return cls("constant", (value,))

    @classmethod
    def uniform(cls, lo: int, hi: int) -> Dist:
        _need_tokens("uniform lo", lo)
        _need_tokens("uniform hi", hi)
        if lo > hi:
            raise ValueError(f"uniform needs lo ≤ hi, got lo={lo}, hi={hi}")
        return cls("uniform", (lo, hi))

    @classmethod
    def lognormal(cls, median: float, sigma: float, *, lo: int = 1,
                  hi: int = MAX_TOKENS) -> Dist:
        """exp(N(ln median, sigma²)), rounded and clipped to [lo, hi]."""
        if not (isinstance(median, int | float) and 1 <= median <= MAX_TOKENS):
            raise ValueError(f"lognormal median must be a number in [1, {MAX_TOKENS:,}], "
                             f"got {median!r}")
        if not (isinstance(sigma, int | float) and 0 <= sigma <= 10):
            raise ValueError(f"lognormal sigma must be a number in [0, 10], got {sigma!r}")
        _need_tokens("lognormal lo", lo)
        _need_tokens("lognormal hi", hi)
        if lo > hi:
            raise ValueError(f"lognormal needs lo ≤ hi, got lo={lo}, hi={hi}")
        return cls("lognormal", (math.log(median), sigma, lo, hi))

    @classmethod
    def empirical(cls, values: Sequence[int]) -> Dist:
        """Draw uniformly from observed values (repeat a value to weight it)."""
        if not values:
            raise ValueError("empirical needs at least one value")
        for v in values:
            _need_tokens("empirical value", v)
        return cls("empirical", (), tuple(values))

    def sample(self, rng: random.Random) -> int:
        if self.kind == "constant":
            return int(self.params[0])
        if self.kind == "uniform":
            return rng.randint(int(self.params[0]), int(self.params[1]))
        if self.kind == "lognormal":
            mu, sigma, lo, hi = self.params
            return int(min(max(round(math.exp(rng.gauss(mu, sigma))), lo), hi))
        return self.values[rng.randrange(len(self.values))]


def _need_tokens(name: str, value: object) -> None:
    problem = _positive_int(name, value)
    if problem:
        raise ValueError(problem)


def _need_rate(name: str, value: object) -> float:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive number of requests per second, "
                         f"got {value!r}")
    return float(value)


def _need_seconds(name: str, value: object) -> float:
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Arrival:
    """An arrival process. Build with the class methods:

    - constant(rate): one request every 1/rate seconds.
    - poisson(rate): exponential gaps with mean 1/rate.
    - bursty(rate, burstiness): Gamma gaps with mean 1/rate and shape `burstiness`, as
      vLLM's `bench serve --burstiness` (1 = Poisson, < 1 burstier, > 1 more even).
    - on_off(base_rate, burst_rate, on_s, off_s): a Poisson process whose rate is
      burst_rate for on_s seconds, then base_rate for off_s seconds, repeating.
    """

    kind: Literal["constant", "poisson", "bursty", "on_off"]
    params: tuple[float, ...]

    @classmethod
    def constant(cls, rate: float) -> Arrival:
        return cls("constant", (_need_rate("constant rate", rate),))

    @classmethod
    def poisson(cls, rate: float) -> Arrival:
        return cls("poisson", (_need_rate("poisson rate", rate),))

    @classmethod
    def bursty(cls, rate: float, burstiness: float) -> Arrival:
        rate = _need_rate("bursty rate", rate)
        if not (isinstance(burstiness, int | float) and 0 < burstiness <= 1000):
            raise ValueError(f"burstiness must be a number in (0, 1000], got {burstiness!r}")
        return cls("bursty", (rate, float(burstiness)))

    @classmethod
    def on_off(cls, base_rate: float, burst_rate: float, on_s: float, off_s: float) -> Arrival:
        return cls("on_off", (_need_rate("base_rate", base_rate),
                              _need_rate("burst_rate", burst_rate),
                              _need_seconds("on_s", on_s), _need_seconds("off_s", off_s)))

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival offsets in seconds, starting with 0."""
        t = 0.0
        if self.kind == "on_off":
            yield from self._on_off_times(rng)
            return
        while True:
            yield t
            t += self._gap(rng)

    def _gap(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return 1.0 / self.params[0]
        if self.kind == "poisson":
            return rng.expovariate(self.params[0])
        rate, shape = self.params
        return rng.gammavariate(shape, 1.0 / (rate * shape))

    def _on_off_times(self, rng: random.Random) -> Iterator[float]:
        # The exponential is memoryless, so a gap that crosses a phase boundary can be
        # redrawn from the boundary at the new rate: this samples the modulated process exactly.
        base, burst, on_s, off_s = self.params
        t, phase_end, bursting = 0.0, on_s, True
        yield t
        while True:
            candidate = t + rng.expovariate(burst if bursting else base)
            while candidate > phase_end:
                t, bursting = phase_end, not bursting
                phase_end += on_s if bursting else off_s
                candidate = t + rng.expovariate(burst if bursting else base)
            t = candidate
            yield t


def generate(*, n: int, seed: int, prompt_tokens: Dist, completion_tokens: Dist,
             arrival: Arrival, shared_prefix_groups: int = 0, shared_prefix_tokens: int = 0,
             latency_class: str | None = None) -> Iterator[TraceRequest]:
    """A synthetic trace of n requests, identical for the same arguments.

    With shared prefix groups, each request joins one group at random and its prompt is the
    group's shared_prefix_tokens followed by a unique part drawn from `prompt_tokens`.
    """
    _check_generate(n, seed, prompt_tokens, completion_tokens, arrival,
                    shared_prefix_groups, shared_prefix_tokens, latency_class)
    return _generated(n, random.Random(seed), prompt_tokens, completion_tokens, arrival,
                      shared_prefix_groups, shared_prefix_tokens, latency_class)


def _check_generate(n: int, seed: int, prompt_tokens: Dist, completion_tokens: Dist,
                    arrival: Arrival, groups: int, prefix: int,
                    latency_class: str | None) -> None:
    if type(n) is not int or not 1 <= n <= 100_000_000:
        raise ValueError(f"n must be an integer in [1, 100,000,000], got {n!r}")
    if type(seed) is not int:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(prompt_tokens, Dist) or not isinstance(completion_tokens, Dist):
        raise ValueError("prompt_tokens and completion_tokens must be Dist "
                         "(Dist.constant, Dist.uniform, Dist.lognormal, Dist.empirical)")
    if not isinstance(arrival, Arrival):
        raise ValueError("arrival must be an Arrival (Arrival.constant, Arrival.poisson, "
                         "Arrival.bursty, Arrival.on_off)")
    if type(groups) is not int or groups < 0:
        raise ValueError(f"shared_prefix_groups must be an integer ≥ 0, got {groups!r}")
    if type(prefix) is not int or not 0 <= prefix <= MAX_TOKENS:
        raise ValueError(f"shared_prefix_tokens must be an integer in [0, {MAX_TOKENS:,}], "
                         f"got {prefix!r}")
    if bool(groups) != bool(prefix):
        raise ValueError("shared_prefix_groups and shared_prefix_tokens go together: set both "
                         f"or neither (got {groups} groups of {prefix} tokens)")
    if latency_class is not None and latency_class not in LATENCY_CLASSES:
        raise ValueError(f"latency_class must be one of {', '.join(LATENCY_CLASSES)}, "
                         f"got {latency_class!r}")


def _generated(n: int, rng: random.Random, prompt_tokens: Dist, completion_tokens: Dist,
               arrival: Arrival, groups: int, prefix: int,
               latency_class: str | None) -> Iterator[TraceRequest]:
    times = arrival.times(rng)
    for _ in range(n):
        at = round(next(times), 6)
        group = f"group-{rng.randrange(groups)}" if groups else None
        unique = prompt_tokens.sample(rng)
        yield TraceRequest(prompt_tokens=min(prefix + unique, MAX_TOKENS),
                           completion_tokens=completion_tokens.sample(rng), arrival_s=at,
                           prefix_group=group, prefix_tokens=prefix,
                           latency_class=latency_class)


# --- summary ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace looks like. Percentiles are nearest-rank (always an observed value);
    the mean rate is (count − 1) / duration, None when every request arrives at once."""

    request_count: int
    duration_s: float
    mean_request_rate_per_s: float | None
    prompt_tokens_p50: int
    prompt_tokens_p95: int
    prompt_tokens_max: int
    prompt_tokens_total: int
    completion_tokens_p50: int
    completion_tokens_p95: int
    completion_tokens_max: int
    completion_tokens_total: int
    prefix_group_share: float
    prefix_token_share: float
    with_text_share: float
    latency_classes: dict[str, int] = field(default_factory=dict)


class TraceSummariser:
    """One-pass summary: add() each request as it streams by, then result(). Token counts are
    kept as histograms (value → count), so percentiles are exact and memory stays small."""

    def __init__(self) -> None:
        self.count = 0
        self.first_arrival_s = 0.0
        self.last_arrival_s = 0.0
        self.prompt: Counter[int] = Counter()
        self.completion: Counter[int] = Counter()
        self.in_group = 0
        self.prefix_tokens = 0
        self.with_text = 0
        self.latency: Counter[str] = Counter()

    def add(self, request: TraceRequest) -> TraceRequest:
        if not self.count:
            self.first_arrival_s = request.arrival_s
        self.count += 1
        self.last_arrival_s = request.arrival_s
        self.prompt[request.prompt_tokens] += 1
        self.completion[request.completion_tokens] += 1
        if request.prefix_tokens:
            self.in_group += 1
            self.prefix_tokens += request.prefix_tokens
        if request.prompt is not None or request.messages is not None:
            self.with_text += 1
        if request.latency_class is not None:
            self.latency[request.latency_class] += 1
        return request

    def result(self) -> TraceSummary:
        if not self.count:
            raise TraceError([(0, NO_REQUESTS)])
        duration = self.last_arrival_s - self.first_arrival_s
        prompt_total = sum(v * c for v, c in self.prompt.items())
        return TraceSummary(
            request_count=self.count, duration_s=duration,
            mean_request_rate_per_s=(self.count - 1) / duration if duration > 0 else None,
            prompt_tokens_p50=_rank(self.prompt, 0.50), prompt_tokens_p95=_rank(self.prompt, 0.95),
            prompt_tokens_max=max(self.prompt), prompt_tokens_total=prompt_total,
            completion_tokens_p50=_rank(self.completion, 0.50),
            completion_tokens_p95=_rank(self.completion, 0.95),
            completion_tokens_max=max(self.completion),
            completion_tokens_total=sum(v * c for v, c in self.completion.items()),
            prefix_group_share=self.in_group / self.count,
            prefix_token_share=self.prefix_tokens / prompt_total,
            with_text_share=self.with_text / self.count,
            latency_classes=dict(sorted(self.latency.items())),
        )


def _rank(histogram: Counter[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least q of the count at or below."""
    values = sorted(histogram)
    cumulative = list(itertools.accumulate(histogram[v] for v in values))
    target = max(1, math.ceil(q * cumulative[-1]))
    return values[bisect.bisect_left(cumulative, target)]


def summarise(requests: Iterable[TraceRequest]) -> TraceSummary:
    """Summarise in one pass (the iterable is consumed, not stored)."""
    summariser = TraceSummariser()
    for request in requests:
        summariser.add(request)
    return summariser.result()


def length_spec(text: str) -> int | dict[str, Any]:
    """A token-length distribution as people type it: '512' → 512 (constant); '64-512' →
    uniform; '{…}' → that JSON object (checked when the generator builds it). ValueError
    otherwise. Shared by the dashboard form and the CLI."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    match = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if match:
        return {"kind": "uniform", "lo": int(match[1]), "hi": int(match[2])}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{text!r}: give a number, a range like 64-512, or JSON such as "
                         '\'{"kind": "lognormal", "median": 800, "sigma": 0.9}\'')
    return value
