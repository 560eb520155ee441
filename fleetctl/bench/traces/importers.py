"""Importers for public traces: Mooncake (FAST'25) JSONL and the Azure LLM inference CSV.
Each streams its rows into fleetctl trace requests, as parse_jsonl does."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import date

from fleetctl.bench.traces import reading
from fleetctl.bench.traces.reading import (
    TraceStream,
    _backwards,
    _check_limits,
    _Errors,
    _imported,
)
from fleetctl.bench.traces.request import TraceError, TraceRequest
from fleetctl.core import jsonl
from fleetctl.core.jsonl import MAX_LINE_BYTES, decoded, line_reader
from fleetctl.core.jsonl import show as _show

MOONCAKE_BLOCK_TOKENS = 512
# Mooncake prefix groups remembered at once; the oldest is forgotten first (see TRACES.md).
MOONCAKE_GROUP_MEMORY = 65_536
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def parse_mooncake(lines: Iterable[bytes | str], *, max_errors: int = 20,
                   max_requests: int = 5_000_000,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> TraceStream:
    """Stream a Mooncake (FAST'25) trace: JSONL objects with timestamp (ms), input_length,
    output_length and hash_ids. Keys other than those are ignored."""
    _check_limits(max_errors, max_requests)
    if type(block_tokens) is not int or block_tokens < 1:
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    stream = TraceStream("mooncake")
    errors = _Errors(max_errors)
    stream._requests = _counted(_mooncake_requests(lines, errors, block_tokens), errors,
                                max_requests)
    return stream


def _counted(requests: Iterator[tuple[int, TraceRequest | None]], errors: _Errors,
             max_requests: int) -> Iterator[TraceRequest]:
    """The requests (line number, request; None for a bad line) while no line is bad, each
    counted against `max_requests`; the trace's end checked once they are read."""
    count = 0
    for lineno, request in requests:
        if request is None:
            continue
        count = errors.counted(lineno, count, max_requests)
        if not errors:
            yield request
    errors.finish(count)


def _mooncake_requests(lines: Iterable[bytes | str], errors: _Errors,
                       block_tokens: int) -> Iterator[tuple[int, TraceRequest | None]]:
    # first hash id -> the group's first request's hash ids, oldest group first
    groups: OrderedDict[int, list[int]] = OrderedDict()
    first_ms, prev_ms, prev_line = None, 0.0, 0
    for lineno, _raw, obj in jsonl.decoded_lines(lines, errors, loads=reading._fast_loads):
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
        yield lineno, request


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
    errors = _Errors(max_errors)
    stream._requests = _counted(_azure_requests(lines, errors), errors, max_requests)
    return stream


def _azure_requests(lines: Iterable[bytes | str],
                    errors: _Errors) -> Iterator[tuple[int, TraceRequest | None]]:
    minutes: _Minutes = {}
    header_seen, origin, prev, prev_line = False, None, 0.0, 0
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
        yield lineno, request


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
