"""Which reader a trace needs, told from its first non-blank line, and the one entry point
that detects and reads."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable

from fleetctl.bench.traces.fleetctl_format import parse_jsonl
from fleetctl.bench.traces.importers import AZURE_HEADER, parse_azure_csv, parse_mooncake
from fleetctl.bench.traces.reading import TraceStream
from fleetctl.bench.traces.request import NO_REQUESTS, TraceError, TraceFormat
from fleetctl.core.jsonl import (
    MAX_LINE_BYTES,
    OVERLONG,
    OVERLONG_MESSAGE,
    Replay,
    line_reader,
)


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
